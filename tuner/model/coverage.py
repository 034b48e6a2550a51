"""Coverage: how often a held-out level falls inside the model's interval.

Leave one concurrency level out (every configuration measured there), refit on the rest, predict
the level, and count the measured points that fall inside their intervals. With a 90 % interval
an honest model covers about 90 % of them; a model whose intervals only describe the fitted
points covers far fewer. Pure: it refits with tuner.model.fitting.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.model.data import FitData
from tuner.model.fitting import LAUNCH_NOISE_FLOOR, fit
from tuner.policy import Policy


@dataclass(frozen=True)
class HeldOutPoint:
    """One measured point of a left-out level against its prediction from the other levels."""

    policy: Policy
    concurrency: int
    measured: float
    predicted: float
    lower: float
    upper: float

    @property
    def inside(self) -> bool:
        return self.lower <= self.measured <= self.upper

    @property
    def error_pct(self) -> float:
        """(predicted - measured) / measured, in %."""
        return 100 * (self.predicted / self.measured - 1)


@dataclass(frozen=True)
class Coverage:
    """Every held-out point, and the share inside its interval."""

    points: tuple[HeldOutPoint, ...]
    interval: float

    @property
    def inside(self) -> int:
        return sum(p.inside for p in self.points)

    @property
    def fraction(self) -> float:
        return self.inside / len(self.points) if self.points else float("nan")

    @property
    def mean_abs_error_pct(self) -> float:
        if not self.points:
            return float("nan")
        return sum(abs(p.error_pct) for p in self.points) / len(self.points)

    def summary(self) -> str:
        return (
            f"{self.inside} of {len(self.points)} held-out points inside their "
            f"{100 * self.interval:.0f} % intervals ({100 * self.fraction:.0f} %), "
            f"mean absolute error {self.mean_abs_error_pct:.1f} %"
        )


def leave_one_level_out(
    data: FitData,
    *,
    replicates: int = 100,
    seed: int = 0,
    launch_noise: float = LAUNCH_NOISE_FLOOR,
    form_uncertainty: bool = True,
) -> Coverage:
    """Refit without each level in turn (where two levels of plain and spec remain) and predict
    every configuration measured there: plain, always draft and thresholds."""
    both = sorted({lv.concurrency for lv in data.plain} & {lv.concurrency for lv in data.always})
    points: list[HeldOutPoint] = []
    interval = 0.9
    for c in both:
        rest = tuple(lv for lv in data.levels if lv.concurrency != c)
        left = FitData(
            data.n_parallel, data.n_max, rest, data.kernel, data.accept_rates, data.accept_len
        )
        if min(len({lv.concurrency for lv in kind}) for kind in (left.plain, left.always)) < 2:
            continue
        model = fit(
            left,
            seed=seed,
            replicates=replicates,
            launch_noise=launch_noise,
            form_uncertainty=form_uncertainty,
        ).model
        interval = model.interval
        for lv in data.levels:
            if lv.concurrency != c or not lv.repeats:
                continue
            policy = lv.policy if lv.policy.is_plain else lv.policy.with_n_max(None)
            pred = model.predict(policy, concurrency=[c])
            points.append(
                HeldOutPoint(
                    lv.policy,
                    c,
                    lv.tokens_per_second,
                    pred.tokens_per_second[0],
                    pred.lower[0],
                    pred.upper[0],
                )
            )
    return Coverage(tuple(points), interval)
