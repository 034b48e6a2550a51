"""What a request costs beyond its decode steps, fitted with intervals: the figures an open-loop
answer needs and closed levels never show.

- Prompt processing per prompt token by the target (`prefill`) and, on a server started with a
  draft model, by the draft model too (`draft_prefill`). Every closed round starts its c streams
  together, so their prompts are one batch and the round's time to first token rises with the
  round's prompt tokens: the slope over the plain rounds is the target's cost a token, the slope
  over the drafting server's rounds (always draft and the off arm: the draft model is loaded in
  both) the target's and the draft model's together; `draft_prefill` is the difference.
- Draft catch-up (`catch_up`): a drafter that does not re-evaluate every target batch processes,
  when a slot drafts again, the tokens the slot generated while it did not draft. The profile's
  catch-up probe (tuner.measure.probes) lets a slot generate without drafting for a known number
  of tokens, then resume alone; the resume step's excess over the slot's next drafting steps,
  regressed on the tokens it was behind, is the cost a token.
- A slot joining a running batch (`join`): the join probe sends short requests into one running
  stream; what the running stream's step pays beyond the join's prompt tokens at the prefill
  rates above is the fixed cost of a join (reported beside the rest; a twin world has no such
  term, so the open-loop simulation leaves it out and says so).

Slopes are Theil-Sen (robust to the slow spells a busy machine has) with their 90 % interval;
a figure without data is "assumed 0" and says so. Pure: no I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tuner.model.quantiles import norm_ppf, t_ppf

INTERVAL = 0.9  # the figures' two-sided interval
ASSUMED = "assumed"
MEASURED = "measured"
NAMES = ("prefill", "draft_prefill", "catch_up", "join")


@dataclass(frozen=True)
class TtftRound:
    """One closed round: its streams' prompt tokens (summed: one batch) and median TTFT."""

    drafting_server: bool  # a draft model was loaded (always draft, or a threshold)
    prompt_tokens: int
    ttft_ms: float


@dataclass(frozen=True)
class ProbeRecord:
    """One probe measurement: catch-up (x = tokens the slot was behind) or join (x = the
    join's prompt tokens), the running slot's step excess in ms."""

    kind: str  # "catch-up" | "join"
    drafting_server: bool
    x: float
    excess_ms: float


@dataclass(frozen=True)
class Figure:
    """One cost with its interval, where it came from and how many points it rests on."""

    value: float
    lower: float
    upper: float
    source: str  # measured | assumed
    points: int = 0
    how: str = ""

    @property
    def measured(self) -> bool:
        return self.source == MEASURED

    @property
    def sd(self) -> float:
        """The interval's half-width as a normal standard deviation (for replicate draws)."""
        z = norm_ppf(0.5 + INTERVAL / 2)
        return max(0.0, (self.upper - self.lower) / (2 * z))

    def text(self, unit: str) -> str:
        if not self.measured:
            return f"{self.value:.3g} {unit} ({self.how or ASSUMED})"
        return (
            f"{self.value:.3g} {unit} [{self.lower:.3g}, {self.upper:.3g}] "
            f"({self.how}, {self.points} points)"
        )

    @classmethod
    def assumed(cls, how: str, value: float = 0.0) -> Figure:
        return cls(value, value, value, ASSUMED, 0, how)


@dataclass(frozen=True)
class ArrivalCosts:
    """The fitted costs of arrivals (see the module docstring), in ms."""

    prefill: Figure  # target, per prompt token
    draft_prefill: Figure  # draft model, per prompt token
    catch_up: Figure  # per token a resuming slot was behind
    join: Figure  # per join, beyond its prompt tokens

    @property
    def measured(self) -> bool:
        """Whether the prompt costs were measured: what an open-loop answer needs at least."""
        return self.prefill.measured and self.draft_prefill.measured

    def draw(self, rng: np.random.Generator) -> dict[str, float]:
        """One replicate's costs: each figure drawn from its interval (as a normal), never
        below 0; an assumed figure stays as assumed."""
        out = {}
        for name, fig in self.figures().items():
            value = fig.value + (rng.normal(0.0, fig.sd) if fig.measured else 0.0)
            out[name] = max(0.0, float(value))
        return out

    def point(self) -> dict[str, float]:
        """The costs as fitted, never below 0."""
        return {name: max(0.0, fig.value) for name, fig in self.figures().items()}

    def lines(self) -> list[str]:
        """Each figure in words, for a fit's and a recommendation's reasons."""
        return [
            "target prompt processing " + self.prefill.text("ms a prompt token"),
            "draft model prompt processing " + self.draft_prefill.text("ms a prompt token"),
            "draft catch-up on resuming " + self.catch_up.text("ms a token behind"),
            "a slot joining a running batch " + self.join.text("ms beyond its prompt tokens"),
        ]

    def to_dict(self) -> dict[str, Any]:
        return {n: asdict(f) for n, f in self.figures().items()}

    def figures(self) -> dict[str, Figure]:
        return {n: getattr(self, n) for n in NAMES}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ArrivalCosts:
        return cls(**{k: Figure(**v) for k, v in data.items()})


def _slope(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float] | None:
    """Theil-Sen slope with its INTERVAL bounds; None without two distinct x."""
    if len(set(x)) < 2:
        return None
    xs, ys = np.asarray(x, float), np.asarray(y, float)
    from scipy import stats  # here: importing scipy.stats costs every command a second

    with np.errstate(invalid="ignore"):  # a few points: scipy's variance can go below zero
        slope, _, low, high = stats.theilslopes(ys, xs, INTERVAL)
    if not (np.isfinite(low) and np.isfinite(high)):
        # too few points for Sen's interval: the range of the pairwise slopes bounds it
        pairs = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i)
                 if xs[j] != xs[i]]  # fmt: skip
        low, high = min(pairs), max(pairs)
    return float(slope), float(low), float(high)


def fit_prefill(rounds: Sequence[TtftRound]) -> tuple[Figure, Figure]:
    """The target's and the draft model's cost a prompt token from the rounds' TTFT slopes."""
    plain = [r for r in rounds if not r.drafting_server]
    drafting = [r for r in rounds if r.drafting_server]
    how = "slope of the rounds' time to first token over their prompt tokens"
    target = _slope([r.prompt_tokens for r in plain], [r.ttft_ms for r in plain])
    both = _slope([r.prompt_tokens for r in drafting], [r.ttft_ms for r in drafting])
    if target is None:
        missing = "no plain rounds at two prompt sizes (levels)"
        return Figure.assumed(f"assumed 0: {missing}"), Figure.assumed(f"assumed 0: {missing}")
    prefill = Figure(target[0], target[1], target[2], MEASURED, len(plain), how + " (plain)")
    if both is None:
        missing = "assumed 0: no drafting-server rounds at two prompt sizes"
        return prefill, Figure.assumed(missing)
    # the difference of two independent slopes: half-widths add in quadrature
    value = both[0] - target[0]
    half = math.hypot(both[2] - both[0], target[2] - target[0])
    half_low = math.hypot(both[0] - both[1], target[0] - target[1])
    draft = Figure(
        value,
        value - half_low,
        value + half,
        MEASURED,
        len(drafting),
        "drafting server's TTFT slope less plain's",
    )
    return prefill, draft


def fit_catch_up(records: Sequence[ProbeRecord]) -> Figure:
    """The catch-up cost a token behind from the catch-up probe's resume steps."""
    points = [r for r in records if r.kind == "catch-up"]
    fitted = _slope([r.x for r in points], [r.excess_ms for r in points])
    if fitted is None:
        return Figure.assumed("assumed 0: no catch-up probe at two distances behind")
    how = "resume step's excess over the tokens the slot was behind (catch-up probe)"
    return Figure(*fitted, MEASURED, len(points), how)


def fit_join(records: Sequence[ProbeRecord], prefill: Figure, draft_prefill: Figure) -> Figure:
    """What a join costs the running slots beyond its prompt tokens at the prefill rates: the
    mean over the join probe's joins with its t-interval."""
    points = [r for r in records if r.kind == "join"]
    if len(points) < 2:
        return Figure.assumed("assumed 0: no join probe")
    rest = [
        r.excess_ms - r.x * (prefill.value + (draft_prefill.value if r.drafting_server else 0.0))
        for r in points
    ]
    mean = statistics.fmean(rest)
    se = statistics.stdev(rest) / math.sqrt(len(rest))
    q = t_ppf(0.5 + INTERVAL / 2, len(rest) - 1)
    how = "running stream's step excess at a join less its prompt tokens (join probe)"
    return Figure(mean, mean - q * se, mean + q * se, MEASURED, len(points), how)


def fit_arrival_costs(
    rounds: Sequence[TtftRound], records: Sequence[ProbeRecord] = ()
) -> ArrivalCosts:
    """Every arrival cost from what a profile stored (see the module docstring)."""
    prefill, draft = fit_prefill(rounds)
    return ArrivalCosts(prefill, draft, fit_catch_up(records), fit_join(records, prefill, draft))
