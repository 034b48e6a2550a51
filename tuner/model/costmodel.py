"""The cost model: step time and acceptance, fitted separately, give tok/s at every concurrency.

Pure numpy/scipy, no I/O. The equations (tuner/ARCHITECTURE.md has them with their reasons):

- A server step at c streams costs T(c). Plain decode: plain(c) = c / T_plain(c).
- A speculative step at draft length n costs T_spec(c, n) (verify c x (n+1) rows plus n draft
  steps plus overhead) and yields L(n) tokens per stream: spec(c, n) = c * L(n) / T_spec(c, n).
- L(n) = rho * (1 + a_1 + ... + a_n), a_i being the share of drafts whose first i draft tokens
  were all accepted (pooled `/metrics` per-position counts), rho the measured tokens per step at
  the profiled n_max over that expectation (steps without a draft: first token, last steps).
  Without per-position counts the rates are inferred (geometric) from the measured tokens per
  step; imported tables carry only tok/s, so their spec curve folds acceptance in (L = 1 unit).
- Threshold policy N: spec(c) for c <= N; above N the threshold server (draft loaded, not
  drafting) is its own regime, off(c) = c / T_off(c), T_off fitted from threshold rows above
  their N ("off" rows: the profiler's off arm, threshold c-1 at c, and any validation's
  threshold rows above N) as plain is from plain rows. With off rows at one level only, the
  regime is plain(c) * (1 + overhead), the overhead that level's ratio to plain; with none,
  plain itself (overhead 0, the fit says so). N = 0 drafts always.
- Which N: thresholds N and N+1 differ only at c = N+1, where N+1 drafts and N does not, so
  the gain that decides between them is spec(c) / off(c) - 1 (`gain(against="off")`), two
  regimes of one drafting server; spec against plain is the separate question of drafting at
  all (`gain()`). At one stream every threshold drafts, so "off" there means plain.

What is fitted is the effective step time of each level, T = c * L_measured / tok/s (it equals the
server's step time up to the aggregate window, and it is stable where tok/s of a speculative run
is not: acceptance is random, step cost is a property of the machine). Each curve T(c) is one of a
few functional forms, chosen by leave-one-out error: linear, power law, knee (flat then linear,
memory-bound then compute-bound), quadratic, and -- when `llama-batched-bench` rows exist --
"kernel": the kernel-level cost at the same shape plus a linear server-side term. Where the
levels were repeated, the form is then calibrated towards the measured medians by as much of its
residual as the repeats' noise does not explain (so a precisely measured level is honoured, while
noise is smoothed); between levels the form gives the shape.

Draft lengths below the profiled n_max: T_spec(c, n) = T_plain(c) + [V(c, n+1) - V(c, 1)]
+ (n / n_max) * D(c), with V the kernel verify cost of c sequences x k tokens (interpolated in k)
and D(c) = T_spec(c, n_max) - T_plain(c) - [V(c, n_max+1) - V(c, 1)] the draft cost. Without
kernel rows the verify cost is taken as linear in k, and T_spec is linear in n between T_plain
(n = 0) and the measured T_spec.

Uncertainty: bootstrap replicates of the whole fit, over the repeats of each level when they were
repeated (whole passes at once when the configurations were interleaved, so a drift of the
machine hits plain, spec and off of a replicate alike), else over the curves' residuals
(leverage-inflated). Each replicate also draws its curve form (weighted by leave-one-out error),
an error away from the measured levels (one of the form's leave-one-out errors) and a
launch-to-launch offset (a floor; spec and off share theirs: one launch serves both regimes).
Every prediction, gain and the crossover come with the percentile interval over the replicates,
as it falls: it need not contain the point estimate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal

import numpy as np

from tuner.model.acceptance import Acceptance
from tuner.model.arrivals import ArrivalCosts
from tuner.model.curves import Curve, verify_extra
from tuner.model.trend import AcceptanceTrend
from tuner.policy import Policy

VERSION = "costmodel-5"  # 5: arrival costs and the acceptance trend beside the curves
DEFAULT_INTERVAL = 0.9

#: What spec is compared with: plain (whether to draft at all) or the threshold server's
#: not-drafting regime ("off": which N, the step from N to N+1).
Against = Literal["plain", "off"]


@dataclass(frozen=True)
class Prediction:
    """Predicted aggregate tok/s per concurrency, with a percentile interval."""

    concurrency: list[int]
    tokens_per_second: list[float]
    lower: list[float]
    upper: list[float]
    interval: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "tokens_per_second": self.tokens_per_second,
            "lower": self.lower,
            "upper": self.upper,
            "interval": self.interval,
        }


@dataclass(frozen=True)
class Gain:
    """spec / reference - 1 per concurrency (reference: plain, or the threshold server not
    drafting): point, interval bounds and replicate standard deviation."""

    concurrency: list[int]
    point: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    sd: np.ndarray
    against: Against = "plain"

    def at(self, c: int) -> tuple[float, float, float, float]:
        i = self.concurrency.index(c)
        return float(self.point[i]), float(self.lower[i]), float(self.upper[i]), float(self.sd[i])


@dataclass(frozen=True)
class Crossover:
    """Where spec stops beating its reference (plain, or the threshold server not drafting).

    streams: the continuous concurrency where spec(c) = reference(c) first turns against spec
    (None if spec loses already at 1 stream or still wins at n_parallel); spec_wins_upto: the
    largest integer c with spec ahead at every level 1..c (0: never; n_parallel: always).
    """

    streams: float | None
    lower: float
    upper: float
    spec_wins_upto: int
    spec_wins_upto_interval: tuple[int, int]
    interval: float
    against: Against = "plain"

    def to_dict(self) -> dict[str, Any]:
        return {
            "streams": self.streams,
            "lower": self.lower,
            "upper": self.upper,
            "spec_wins_upto": self.spec_wins_upto,
            "spec_wins_upto_interval": list(self.spec_wins_upto_interval),
            "interval": self.interval,
            "against": self.against,
        }


@dataclass
class CostModel:
    """A fitted model of one server: step costs, acceptance and bootstrap replicates."""

    n_parallel: int
    n_max: int
    plain: Curve
    spec: Curve
    acceptance: Acceptance
    verify: dict[int, Curve] = field(default_factory=dict)  # kernel V(c, k), k=1 is decode
    replicates: list[dict[str, Any]] = field(default_factory=list)
    interval: float = DEFAULT_INTERVAL
    version: str = VERSION
    # The threshold server above N against plain, tok/s ratio - 1: what threshold_tps uses
    # without an off curve; with one, the median over its measured levels (for display).
    threshold_overhead: float = 0.0
    threshold_rows: int = 0  # how many measured rows set it (0: assumed to equal plain)
    off: Curve | None = None  # T_off(c): the threshold server not drafting, fitted from off rows
    # False where plain was not measured and the off rows stand in for it (FitData.plain): the
    # model then compares thresholds and cannot say whether to draft at all
    plain_measured: bool = True
    # what a request costs beyond its decode steps (None: not fitted, a closed-loop model)
    arrivals: ArrivalCosts | None = None
    # accepted tokens a draft by drafting slots (None: no per-position counts)
    trend: AcceptanceTrend | None = None
    # level_tps's curves at levels 1..n_parallel, per regime: a search scores every policy on
    # the same model and its replicates, and the curves are the whole cost of a score
    _at_levels: dict[tuple[str, int], np.ndarray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    # -- step costs and throughput --

    @property
    def levels(self) -> np.ndarray:
        return np.arange(1, self.n_parallel + 1)

    def n_values(self) -> list[int]:
        """Draft lengths the model can predict: 1..n_max when acceptance allows, else n_max."""
        if self.acceptance.supports_other_n:
            return list(range(1, self.n_max + 1))
        return [self.n_max]

    def plain_step(self, c: Any) -> np.ndarray:
        return self.plain(np.asarray(c, dtype=float))

    def spec_step(self, c: Any, n: int | None = None) -> np.ndarray:
        c = np.asarray(c, dtype=float)
        n = self.n_max if n is None else n
        measured = self.spec(c)
        if n == self.n_max:
            return measured
        if not 1 <= n < self.n_max:
            raise ValueError(f"n_max {n} is outside 1..{self.n_max} (the profiled n_max)")
        if not self.acceptance.supports_other_n:
            raise ValueError("this fit has no acceptance data: only the profiled n_max is known")
        plain = self.plain(c)
        full = verify_extra(self.verify, c, self.n_max + 1)
        step: np.ndarray
        if full is None:
            step = plain + (n / self.n_max) * (measured - plain)
            return step
        part = verify_extra(self.verify, c, n + 1)
        assert part is not None
        draft = np.maximum(measured - plain - full, 0.0)
        step = plain + part + (n / self.n_max) * draft
        return step

    def plain_tps(self, c: Any) -> np.ndarray:
        c = np.asarray(c, dtype=float)
        tps: np.ndarray = 1000.0 * c / self.plain_step(c)
        return tps

    def spec_tps(self, c: Any, n: int | None = None) -> np.ndarray:
        """tok/s of c drafting streams: c tokens a step at the acceptance at c (the trend's,
        where acceptance moves with the drafting slots) over the step time."""
        c = np.asarray(c, dtype=float)
        length: float | np.ndarray = self.acceptance.length(n)
        if self.trend is not None and self.trend.moving:
            length = length * self.trend.factor(c)
        tps: np.ndarray = 1000.0 * c * length / self.spec_step(c, n)
        return tps

    def policy_tps(self, c: Any, policy: Policy) -> np.ndarray:
        """tok/s under a policy: plain, always draft, or draft while c <= N (at its n_max, the
        profiled one when None)."""
        c = np.asarray(c, dtype=float)
        if policy.is_plain:
            return self.plain_tps(c)
        spec = self.spec_tps(c, policy.n_max)
        if policy.is_always:
            return spec
        return np.where(policy.drafts_at(c), spec, self.threshold_tps(c))

    def level_tps(self, policy: Policy) -> np.ndarray:
        """policy_tps at levels 1..n_parallel, each regime's curve computed once per model (the
        same figures: plain, spec at the policy's n_max, and the threshold server above N)."""
        if policy.is_plain:
            return self._regime("plain", 0, self.plain_tps)
        n = -1 if policy.n_max is None else policy.n_max  # None: the profiled n_max, as given
        spec = self._regime("spec", n, lambda c: self.spec_tps(c, policy.n_max))
        if policy.is_always:
            return spec
        off = self._regime("off", 0, self.threshold_tps)
        return np.where(policy.drafts_at(self.levels), spec, off)

    def _regime(self, kind: str, n: int, tps: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        key = (kind, n)
        if key not in self._at_levels:
            values = np.asarray(tps(np.asarray(self.levels, dtype=float)), dtype=float)
            values.setflags(write=False)  # shared by every caller
            self._at_levels[key] = values
        return self._at_levels[key]

    def threshold_tps(self, c: Any) -> np.ndarray:
        """tok/s of a threshold server above its N: its own fitted curve where off rows were
        measured, else plain with the overhead (0 where nothing measured it)."""
        c = np.asarray(c, dtype=float)
        if self.off is not None:
            tps: np.ndarray = 1000.0 * c / self.off(c)
            return tps
        return self.plain_tps(c) * (1.0 + self.threshold_overhead)

    def reference_tps(self, c: Any, against: Against = "plain") -> np.ndarray:
        """What spec is compared with at c: plain, or the threshold server not drafting ("off").

        No threshold stops drafting at one stream, so "off" is plain there, and off from two
        streams on; between 1 and 2 (the crossover's continuous grid) the two are blended
        linearly so the reference has no jump."""
        c = np.asarray(c, dtype=float)
        plain = self.plain_tps(c)
        if against == "plain":
            return plain
        off = self.threshold_tps(c)
        share = np.clip(c - 1.0, 0.0, 1.0)
        blend = (1.0 - share) * plain + share * off
        return np.where(c <= 1.0, plain, np.where(c >= 2.0, off, blend))

    # -- replicates and intervals --

    def with_params(self, rep: dict[str, Any]) -> CostModel:
        """This model with one replicate's parameters (and no replicates of its own)."""
        acceptance = self.acceptance
        if rep.get("rates") is not None or rep.get("mean_length") is not None:
            acceptance = Acceptance(
                self.acceptance.n_max,
                float(rep.get("mean_length", self.acceptance.mean_length)),
                tuple(rep["rates"]) if rep.get("rates") is not None else self.acceptance.rates,
                self.acceptance.source,
            )
        curves = {
            key: curve.with_params(
                rep[key],
                rep.get(f"{key}_corr"),
                form=rep.get(f"{key}_form"),
                shift=rep.get(f"{key}_shift", 0.0),
                gap_shift=rep.get(f"{key}_gap", 0.0),
            )
            for key, curve in (("plain", self.plain), ("spec", self.spec), ("off", self.off))
            if curve is not None and (key != "off" or key in rep)
        }
        return CostModel(
            self.n_parallel,
            self.n_max,
            curves["plain"],
            curves["spec"],
            acceptance,
            self.verify,
            [],
            self.interval,
            self.version,
            float(rep.get("threshold_overhead", self.threshold_overhead)),
            self.threshold_rows,
            curves.get("off", self.off),
            plain_measured=self.plain_measured,
            arrivals=self.arrivals,
            trend=self.trend.with_slope(rep["trend_slope"])
            if self.trend is not None and "trend_slope" in rep
            else self.trend,
        )

    def with_acceptance(
        self, rates: Sequence[float], draws: Sequence[Sequence[float]], source: str
    ) -> CostModel:
        """This model with other per-position acceptance rates (observed on the server's own
        traffic) at every level it drafts: the step times stay as fitted, each replicate takes
        one of `draws` (the rates' own sampling spread) in place of its own, and both keep
        their realisation ratio (tokens per step over the rates' expectation: steps without a
        draft)."""
        if not self.acceptance.supports_other_n or self.acceptance.rates is None:
            raise ValueError("this fit folds acceptance into its spec curve: it cannot be replaced")
        own = self.acceptance
        acceptance = replace(own.with_rates(rates), source=source)
        reps = []
        for rep, drawn in zip(self.replicates, draws, strict=False):
            had = rep.get("rates")
            rho = (
                float(rep["mean_length"]) / (1.0 + sum(had[: own.n_max]))
                if had is not None and rep.get("mean_length") is not None
                else own.mean_length / own.expected(own.n_max)
            )
            reps.append(
                {**rep, "rates": list(drawn), "mean_length": rho * (1.0 + sum(drawn[: own.n_max]))}
            )
        return dataclasses.replace(
            self, acceptance=acceptance, replicates=reps or list(self.replicates)
        )

    @cached_property
    def replicate_models(self) -> list[CostModel]:
        return [self.with_params(rep) for rep in self.replicates]

    def bounds(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        alpha = (1.0 - self.interval) / 2
        return (
            np.quantile(samples, alpha, axis=0),
            np.quantile(samples, 1.0 - alpha, axis=0),
        )

    def samples(self, fn: Callable[[CostModel], np.ndarray]) -> np.ndarray:
        """fn over every replicate, stacked (replicates x ...); the point estimate if none."""
        models = self.replicate_models or [self]
        return np.stack([np.asarray(fn(m), dtype=float) for m in models])

    def predict(self, policy: Policy, concurrency: Sequence[int] | None = None) -> Prediction:
        """Predicted tok/s of a policy at each level (default 1..n_parallel), with intervals."""
        c = np.asarray(concurrency if concurrency is not None else self.levels, dtype=float)
        point = self.policy_tps(c, policy)
        lo, hi = self.bounds(self.samples(lambda m: m.policy_tps(c, policy)))
        return Prediction(
            [int(v) for v in c],
            [float(v) for v in point],
            [float(v) for v in lo],
            [float(v) for v in hi],
            self.interval,
        )

    def gain(self, n: int | None = None, against: Against = "plain") -> Gain:
        """spec / reference - 1 at each level 1..n_parallel, with interval and replicate spread.

        against="plain": whether drafting pays at all; "off": spec against the threshold server
        not drafting, what decides N (N and N+1 differ only at c = N+1)."""
        c = self.levels.astype(float)

        def rel(m: CostModel) -> np.ndarray:
            share: np.ndarray = m.spec_tps(c, n) / m.reference_tps(c, against) - 1.0
            return share

        point = rel(self)
        samples = self.samples(rel)
        lo, hi = self.bounds(samples)
        return Gain(
            [int(v) for v in c],
            point,
            lo,
            hi,
            samples.std(axis=0, ddof=1) if len(samples) > 1 else np.zeros_like(point),
            against,
        )

    def _crossing(self, n: int | None, against: Against = "plain") -> tuple[float | None, int]:
        grid = np.linspace(1.0, float(self.n_parallel), 1 + 100 * (self.n_parallel - 1))
        diff = self.spec_tps(grid, n) - self.reference_tps(grid, against)
        ints = self.levels.astype(float)
        ahead = self.spec_tps(ints, n) >= self.reference_tps(ints, against)
        upto = int(np.argmin(ahead)) if not ahead.all() else self.n_parallel
        if diff[0] < 0 or np.all(diff >= 0):
            return None, upto
        i = int(np.argmax(diff < 0))
        x0, x1, d0, d1 = grid[i - 1], grid[i], diff[i - 1], diff[i]
        return float(x0 + (x1 - x0) * d0 / (d0 - d1)), upto

    def crossover(self, n: int | None = None, against: Against = "plain") -> Crossover:
        """Where spec stops beating its reference (see `gain`), with an interval over the
        replicates."""
        streams, upto = self._crossing(n, against)
        reps = [m._crossing(n, against) for m in (self.replicate_models or [self])]

        def as_number(s: float | None, u: int) -> float:
            if s is not None:
                return s
            return 1.0 if u == 0 else float(self.n_parallel)

        values = np.array([as_number(s, u) for s, u in reps])
        uptos = np.array([u for _, u in reps], dtype=float)
        lo, hi = self.bounds(values[:, None])
        ulo, uhi = self.bounds(uptos[:, None])
        return Crossover(
            streams,
            float(lo[0]),
            float(hi[0]),
            upto,
            (round(ulo[0]), round(uhi[0])),
            self.interval,
            # without a plain server the plain curve is the drafting server not drafting
            # (FitData.plain): the crossover is against that, and must be named so
            against if self.plain_measured else "off",
        )

    # -- serialisation --

    @property
    def form(self) -> str:
        off = f" off={self.off.form}" if self.off is not None else ""
        return f"plain={self.plain.form} spec={self.spec.form}{off}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "n_parallel": self.n_parallel,
            "n_max": self.n_max,
            "plain": self.plain.to_dict(),
            "spec": self.spec.to_dict(),
            "acceptance": self.acceptance.to_dict(),
            "verify": {str(k): v.to_dict() for k, v in sorted(self.verify.items())},
            "replicates": self.replicates,
            "interval": self.interval,
            "threshold_overhead": self.threshold_overhead,
            "threshold_rows": self.threshold_rows,
            "off": self.off.to_dict() if self.off is not None else None,
            "plain_measured": self.plain_measured,
            "arrivals": self.arrivals.to_dict() if self.arrivals is not None else None,
            "trend": self.trend.to_dict() if self.trend is not None else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        """A stored model; costmodel-3 and older have no off curve (their threshold server is
        plain with the stored overhead, as they were fitted)."""
        return cls(
            n_parallel=int(data["n_parallel"]),
            n_max=int(data["n_max"]),
            plain=Curve.from_dict(data["plain"]),
            spec=Curve.from_dict(data["spec"]),
            acceptance=Acceptance.from_dict(data["acceptance"]),
            verify={int(k): Curve.from_dict(v) for k, v in data.get("verify", {}).items()},
            replicates=list(data.get("replicates", [])),
            interval=float(data.get("interval", DEFAULT_INTERVAL)),
            version=str(data.get("version", VERSION)),
            threshold_overhead=float(data.get("threshold_overhead", 0.0)),
            threshold_rows=int(data.get("threshold_rows", 0)),
            off=Curve.from_dict(data["off"]) if data.get("off") else None,
            plain_measured=bool(data.get("plain_measured", True)),
            arrivals=ArrivalCosts.from_dict(data["arrivals"]) if data.get("arrivals") else None,
            trend=AcceptanceTrend.from_dict(data["trend"]) if data.get("trend") else None,
        )
