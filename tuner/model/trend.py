"""Acceptance that moves with the number of drafting slots: per level, and a trend where the data
show one.

Each drafting round stores its /metrics deltas: drafts and accepted tokens per position. Per
level c (every slot drafts at an always-draft level, so c is the number of drafting slots) the
pooled accepted draft tokens per draft are sum_i accepted_i / drafts. The trend is a straight
line through the rounds (x = drafting slots, y = the round's accepted tokens per draft), each
round weighted by its drafts (weighted least squares), with the slope's t-interval:

- the interval excludes 0, and the line moves tokens a step (1 + accepted) by MATERIAL or more
  between the lowest and the highest drafting level: acceptance moves with the drafting slots;
  the model uses the line (tokens per step at c scale with 1 + accepted(c));
- else (or the rounds sit at one level): acceptance is flat, the pooled value stands, and the
  fit says so.

The interval is wide (99 %) on purpose: a round's rounds are few and their scatter is not all
of the draws' (on the twin, a 95 % interval called a flat world's acceptance moving in a
quarter of the profiles); a trend that matters is steep enough to clear it.

Pure numpy/scipy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tuner.model.data import FitData
from tuner.model.quantiles import norm_ppf, t_ppf

INTERVAL = 0.99  # a trend is taken where its two-sided 99 % interval excludes 0 ...
MATERIAL = 0.02  # ... and it moves tokens a step by 2 % or more across the drafting levels


@dataclass(frozen=True)
class AcceptanceTrend:
    """Accepted draft tokens per draft by drafting slots: per level, and the line through them."""

    per_level: dict[int, float]  # pooled accepted tokens per draft at each drafting level
    reference: float  # the drafts' weighted mean drafting slots: where `accepted` is taken
    accepted: float  # the line's value at the reference (the pooled mean)
    slope: float  # per drafting slot
    lower: float
    upper: float
    rounds: int
    moving: bool  # the slope's interval excludes 0
    n_max: int = 0
    notes: list[str] = field(default_factory=list)
    # one-sided 95 % upper bound of each level's pooled value, from its rounds' spread (levels
    # of two rounds or more): what tuner.model.collapse holds against the floor
    per_level_upper: dict[int, float] = field(default_factory=dict)

    def accepted_at(self, slots: np.ndarray | float) -> np.ndarray:
        """Accepted draft tokens per draft at this many drafting slots: the line where
        acceptance moves, the pooled value where flat; within 0..n_max."""
        slots = np.asarray(slots, dtype=float)
        slope = self.slope if self.moving else 0.0
        top = float(self.n_max) if self.n_max else np.inf
        return np.clip(self.accepted + slope * (slots - self.reference), 0.0, top)

    def factor(self, slots: np.ndarray | float) -> np.ndarray:
        """Tokens per step at this many drafting slots over the pooled mean's: 1 where flat."""
        return (1.0 + self.accepted_at(slots)) / (1.0 + self.accepted)

    def with_slope(self, slope: float) -> AcceptanceTrend:
        """The same trend with another slope (a bootstrap replicate's)."""
        return AcceptanceTrend(**{**asdict(self), "slope": float(slope)})

    @property
    def sd(self) -> float:
        z = norm_ppf(0.5 + INTERVAL / 2)
        return (self.upper - self.lower) / (2 * z)

    def text(self) -> str:
        levels = ", ".join(f"{c}: {v:.2f}" for c, v in sorted(self.per_level.items()))
        line = (
            f"{self.slope:+.3f} accepted tokens a draft per drafting slot "
            f"[{self.lower:+.3f}, {self.upper:+.3f}] over {self.rounds} rounds"
        )
        if self.moving:
            return f"acceptance moves with the drafting slots: {line} (per level {levels})"
        return f"acceptance flat: {line} includes 0, the pooled {self.accepted:.2f} stands " + (
            f"(per level {levels})" if levels else ""
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["per_level"] = {str(k): v for k, v in self.per_level.items()}
        data["per_level_upper"] = {str(k): v for k, v in self.per_level_upper.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AcceptanceTrend:
        return cls(
            **{
                **data,
                "per_level": {int(k): v for k, v in data["per_level"].items()},
                "per_level_upper": {
                    int(k): v for k, v in (data.get("per_level_upper") or {}).items()
                },
            }
        )


def _rounds(data: FitData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(drafting slots, accepted per draft, drafts) of every drafting round with counts."""
    xs, ys, ws = [], [], []
    for lv in data.levels:
        if not lv.policy.drafts_at(lv.concurrency):
            continue
        for r in lv.repeats:
            if r.drafts > 0 and r.accepted_per_position:
                xs.append(float(lv.concurrency))
                ys.append(float(sum(r.accepted_per_position[: data.n_max])) / r.drafts)
                ws.append(float(r.drafts))
    return np.array(xs), np.array(ys), np.array(ws)


def _upper(y: np.ndarray, w: np.ndarray) -> float | None:
    """One-sided 95 % upper bound of rounds' drafts-weighted mean (ratio estimate, t-quantile
    for rounds - 1 degrees of freedom); None with fewer than two rounds."""
    if len(y) < 2:
        return None
    mean = float(np.sum(y * w) / np.sum(w))
    share = w / np.sum(w)
    se = float(np.sqrt(np.sum(share**2 * (y - mean) ** 2) * len(y) / (len(y) - 1)))
    return mean + t_ppf(0.95, len(y) - 1) * se


def acceptance_trend(data: FitData) -> AcceptanceTrend | None:
    """The trend of a fit's data (see the module docstring); None without per-position counts."""
    x, y, w = _rounds(data)
    if len(x) == 0:
        return None
    per_level = {
        int(c): float(np.sum(y[x == c] * w[x == c]) / np.sum(w[x == c])) for c in np.unique(x)
    }
    uppers = {int(c): _upper(y[x == c], w[x == c]) for c in np.unique(x)}
    per_level_upper = {c: v for c, v in uppers.items() if v is not None}
    ref = float(np.sum(w * x) / np.sum(w))
    mean = float(np.sum(w * y) / np.sum(w))
    sxx = float(np.sum(w * (x - ref) ** 2))
    if len(per_level) < 2 or len(x) < 3 or sxx <= 0:
        note = "acceptance flat: drafting rounds at one level only, no trend can be told"
        return AcceptanceTrend(
            per_level, ref, mean, 0.0, 0.0, 0.0, len(x), False, data.n_max, [note], per_level_upper
        )
    slope = float(np.sum(w * (x - ref) * (y - mean)) / sxx)
    resid = y - mean - slope * (x - ref)
    # residual variance per unit weight; a round's variance is that over its drafts
    sigma2 = float(np.sum(w * resid**2) / (len(x) - 2))
    se = float(np.sqrt(sigma2 / sxx))
    q = t_ppf(0.5 + INTERVAL / 2, len(x) - 2)
    lower, upper = slope - q * se, slope + q * se
    span = abs(slope) * float(x.max() - x.min()) / (1.0 + mean)
    moving = (lower > 0 or upper < 0) and span >= MATERIAL
    return AcceptanceTrend(
        per_level, ref, mean, slope, lower, upper, len(x), moving, data.n_max, [], per_level_upper
    )
