"""Paired differences and the one-sided rule that settles a comparison: pure statistics.

Two thresholds differ only at the levels where one drafts and the other does not, so the
difference of their workload-weighted objectives is a weighted sum of per-level gains
g(c) = on(c) - off(c): the drafting server drafting at c against the same server not drafting
there. Each level's gain is measured as paired differences (both halves of a pair on one launch,
seconds apart, same prompts and seeds), so what a comparison needs is:

- `LevelDiffs`: one level's paired differences, their mean, standard error and degrees of freedom
  (n - 1: two pairs are one degree of freedom, and "two standard errors" there is not 95 %);
- `Contrast`: a weighted sum of levels' mean differences, its standard error and Welch-
  Satterthwaite degrees of freedom, and its t-interval;
- `verdict`: which side of a tolerance a contender's advantage falls on, one-sided: ahead,
  behind, within the tolerance (the answer holds), or unresolved (neither bound cleared yet).

A verdict needs a side, not a decimal: a comparison stops as soon as one bound clears.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from tuner.model.quantiles import norm_ppf, t_ppf

AHEAD, BEHIND, WITHIN, UNRESOLVED = "ahead", "behind", "within tolerance", "unresolved"


@dataclass(frozen=True)
class Acceptance:
    """The workload's mean acceptance on a drafting server (tokens a request gets per server
    step), from the distinct request seeds measured: a request's acceptance is a function of
    its seed alone (llama-server seeds the draws from it; the bench gave identical values for
    the same seed at every level and policy), so a seed measured twice counts once."""

    mean: float
    var: float  # of the mean: the seeds' variance over their number
    seeds: int

    @property
    def df(self) -> int:
        return self.seeds - 1


@dataclass(frozen=True)
class LevelDiffs:
    """Paired differences at one level (on - off, say), in tok/s.

    Where the drafting half of each pair is scaled to the workload's mean acceptance (its tok/s
    times anchor.mean over the acceptance its own requests drew: tune.live_gains), the
    acceptance those seeds happened to draw no longer spreads the differences; what the
    anchor's own uncertainty adds is `slope` (d mean / d anchor.mean) times its variance, a
    term every level scaled by the same anchor shares (Contrast.of adds it once, not per
    level)."""

    diffs: tuple[float, ...]
    slope: float = 0.0
    anchor: Acceptance | None = None
    # the block each value comes from, in order (tune's: a run's pass, whose streams draw the
    # same seeds at every level; the live experiment's: a cycle, whose pseudo-values every
    # count shares), so that a contrast counts the covariance of levels measured in the same
    # blocks; and the degrees of freedom where fewer blocks than n carry data at this level
    blocks: tuple[Hashable, ...] | None = None
    dof: float | None = None

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.diffs) if self.diffs else math.nan

    @property
    def sd(self) -> float:
        return statistics.stdev(self.diffs) if self.n > 1 else math.inf

    @property
    def se(self) -> float:
        return self.sd / math.sqrt(self.n) if self.n > 1 else math.inf

    @property
    def df(self) -> float:
        return self.dof if self.dof is not None else max(0, self.n - 1)


def _together(levels: Mapping[int, LevelDiffs], used: Mapping[int, float], apart: float) -> float:
    """The contrast's variance with the covariances of levels measured in the same blocks:
    apart (the levels' own variances, anchors included) plus 2 sum_{c<d} a_c a_d
    Cov(mean_c, mean_d) for each two levels that carry their blocks' keys, their sample
    covariance over the blocks both have (two at least) times those blocks' number over the
    product of each level's. On levels of the very same blocks that is the per-block
    contrast's own variance over n, computed as such (no difference of near-equal sums)."""
    keyed = [(c, a) for c, a in used.items() if levels[c].blocks is not None]
    blocks = {levels[c].blocks for c, _ in keyed}
    if len(keyed) == len(used) > 1 and len(blocks) == 1:
        n = levels[keyed[0][0]].n
        joint = [sum(a * levels[c].diffs[k] for c, a in keyed) for k in range(n)]
        own = sum((a * levels[c].se) ** 2 for c, a in keyed)
        return apart - own + statistics.variance(joint) / n
    total = apart
    for i, (c, a) in enumerate(keyed):
        x = dict(zip(levels[c].blocks or (), levels[c].diffs, strict=True))
        for d, b in keyed[i + 1 :]:
            y = dict(zip(levels[d].blocks or (), levels[d].diffs, strict=True))
            both = [k for k in x if k in y]  # in level c's order
            if len(both) < 2:
                continue
            cov = statistics.covariance([x[k] for k in both], [y[k] for k in both])
            total += 2 * a * b * cov * len(both) / (levels[c].n * levels[d].n)
    # estimated pair by pair over partly shared blocks, the covariances can sum below what
    # makes a variance: the levels taken apart then
    return total if total >= 0.0 else apart


def t_quantile(p: float, df: float) -> float:
    """The t distribution's p-quantile for df degrees of freedom (inf without any; the normal
    quantile for infinitely many)."""
    if math.isnan(df) or df <= 0:
        return math.inf
    if math.isinf(df):
        return norm_ppf(p)
    return t_ppf(p, df)


@dataclass(frozen=True)
class Contrast:
    """sum_c coef_c * mean_c over levels: estimate, standard error, degrees of freedom
    (Welch-Satterthwaite), and a known part added exactly (levels measured elsewhere or zero by
    construction contribute no variance).

    Levels measured in the same blocks are not independent: stream i of a pass draws the same
    request seed at every level, so one pass's acceptance luck moves all its levels together,
    and one cycle of the live experiment moves every count it saw. Where levels carry their
    blocks' keys, the covariance of each two over the blocks they share enters the variance;
    on levels with the same blocks that is the variance of the per-block contrast, and the
    degrees of freedom are at most the blocks less one (on the twin's bench world, always draft
    against N=1 summed over 2, 3 and 4 streams, 200 runs of six passes: 38 outside two
    one-sided 95 % bounds with the levels taken as independent, 21 with their covariance, 20
    expected: benchmarks/contrast_coverage.py)."""

    estimate: float
    se: float
    df: float

    @classmethod
    def of(
        cls, levels: Mapping[int, LevelDiffs], coef: Mapping[int, float], known: float = 0.0
    ) -> Contrast:
        used = {c: a for c, a in coef.items() if a != 0.0}
        if any(c not in levels or levels[c].n == 0 for c in used):
            return cls(math.nan, math.inf, 0.0)
        estimate = known + sum(a * levels[c].mean for c, a in used.items())
        if not used:
            return cls(known, 0.0, math.inf)
        if any(levels[c].n < 2 for c in used):
            return cls(estimate, math.inf, 0.0)
        parts = [((a * levels[c].se) ** 2, levels[c].df) for c, a in used.items()]
        # One term per acceptance anchor, its levels' slopes summed: the same anchor moves
        # them all together.
        shared: dict[Acceptance, float] = {}
        for c, a in used.items():
            anchor = levels[c].anchor
            if anchor is not None:
                shared[anchor] = shared.get(anchor, 0.0) + a * levels[c].slope
        parts += [(slope**2 * anchor.var, anchor.df) for anchor, slope in shared.items()]
        apart = sum(v for v, _ in parts)
        var = _together(levels, used, apart)
        if var == 0.0:
            return cls(estimate, 0.0, math.inf)
        if any(df <= 0 for v, df in parts if v > 0.0):
            return cls(estimate, math.sqrt(var), 0.0)
        # the parts' own degrees of freedom (a covariance adds none), at most the blocks less
        # one: on levels of the same blocks, the per-block contrast's n - 1
        df = apart**2 / sum(v**2 / df for v, df in parts if v > 0.0)
        keys = [levels[c].blocks for c in used]
        if all(k is not None for k in keys):
            df = min(df, len({b for k in keys if k is not None for b in k}) - 1)
        return cls(estimate, math.sqrt(var), df)

    def bounds(self, confidence: float = 0.95) -> tuple[float, float]:
        """One-sided bounds at this confidence each: (lower, upper). Two of them make a
        two-sided interval at 2 * confidence - 1."""
        if self.se == 0.0:
            return self.estimate, self.estimate
        half = t_quantile(confidence, self.df) * self.se
        return self.estimate - half, self.estimate + half

    def interval(self, level: float = 0.90) -> tuple[float, float]:
        """The two-sided interval at this level."""
        return self.bounds(0.5 + level / 2)

    def figures(self, unit: str = " tok/s", confidence: float = 0.95, df: bool = True) -> str:
        """The estimate and its one-sided bounds in words, the unit beside each: never nan or
        inf where a level has no pair or one (a bound needs two)."""
        if not math.isfinite(self.estimate):
            return "not measured yet"
        low, high = self.bounds(confidence)
        if not (math.isfinite(low) and math.isfinite(high)):
            return f"{self.estimate:+.2f}{unit} (no bounds yet: a level has one pair)"
        dof = f" (df {self.df:.1f})" if df and math.isfinite(self.df) else ""
        return f"{self.estimate:+.2f} [{low:+.2f}, {high:+.2f}]{unit}{dof}"

    def half_width(self, confidence: float = 0.95) -> float:
        low, high = self.bounds(confidence)
        return (high - low) / 2


def verdict(advantage: Contrast, tolerance: float, confidence: float = 0.95) -> str:
    """Where a contender stands against the answer, from its advantage (contender - answer),
    one-sided at `confidence`:

    - AHEAD: the lower bound clears zero and the upper bound exceeds the tolerance: the
      contender is better, possibly by more than the tolerance; the answer should move;
    - BEHIND: the upper bound is at or below zero;
    - WITHIN: the upper bound is within the tolerance: the contender is at most that much
      ahead (even where it is surely ahead), and the answer holds;
    - UNRESOLVED: neither bound has cleared yet.

    A contender surely ahead but by less than the tolerance does not move the answer: moving
    would gain less than the tolerance, and the tie rule would move it back (the smaller of
    equivalent values is the answer)."""
    low, high = advantage.bounds(confidence)
    if high <= 0:
        return BEHIND
    if high <= tolerance:
        return WITHIN
    if low > 0:
        return AHEAD
    return UNRESOLVED


def pairs_needed(sd: float, half_width: float, confidence: float = 0.95, start: int = 2) -> int:
    """Pairs of this spread whose one-sided bound at confidence lies within half_width of the
    mean (t-quantiles for the pairs' own degrees of freedom)."""
    if half_width <= 0 or not math.isfinite(sd):
        return math.inf  # type: ignore[return-value]
    n = start
    while t_quantile(confidence, n - 1) * sd / math.sqrt(n) > half_width:
        n += 1
        if n > 100_000:
            return n
    return n


def equivalent(advantage: Contrast, tolerance: float, confidence: float = 0.95) -> bool:
    """Both one-sided bounds within +-tolerance: the two are shown equivalent (TOST)."""
    low, high = advantage.bounds(confidence)
    return low >= -tolerance and high <= tolerance


def mean_of(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan
