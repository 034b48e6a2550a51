"""Acceptance: how many tokens a speculative step yields per stream, E[L] = 1 + a_1 + ... + a_n.

a_i is the share of drafts whose first i draft tokens were all accepted (pooled `/metrics`
per-position counts divided by the number of drafts). Without per-position counts the rates are
inferred (geometric) from the measured tokens per step; imported tables with tok/s only fold
acceptance into the spec curve (L = 1 unit, n_max fixed). Acceptance is random, step cost is a
property of the machine: they are fitted apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.model.data import FitData, LevelObs, Repeat


def geometric_rates(mean_length: float, n_max: int) -> tuple[float, ...]:
    """Per-position rates a_i = alpha^i whose expected length 1 + sum a_i equals mean_length."""
    target = min(max(mean_length, 1.0), n_max + 1.0) - 1.0
    if target <= 0:
        return tuple(0.0 for _ in range(n_max))
    if target >= n_max:
        return tuple(1.0 for _ in range(n_max))
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(1, n_max + 1)) < target:
            lo = mid
        else:
            hi = mid
    alpha = (lo + hi) / 2
    return tuple(alpha**i for i in range(1, n_max + 1))


@dataclass(frozen=True)
class Acceptance:
    """Tokens per stream per speculative step as a function of the draft length n.

    source: "measured" (per-position rates from /metrics), "inferred" (geometric rates from the
    measured tokens per step) or "folded" (unknown: the spec curve is time per stream-token).
    """

    n_max: int
    mean_length: float  # realised tokens per stream per step at n_max (1.0 when folded)
    rates: tuple[float, ...] | None
    source: str

    @property
    def supports_other_n(self) -> bool:
        return self.source != "folded" and self.rates is not None

    def expected(self, n: int) -> float:
        """1 + a_1 + ... + a_n from the rates (n <= n_max)."""
        assert self.rates is not None
        return 1.0 + float(sum(self.rates[:n]))

    def length(self, n: int | None = None) -> float:
        n = self.n_max if n is None else n
        if n == self.n_max:
            return self.mean_length
        if not self.supports_other_n:
            raise ValueError(
                f"acceptance at n_max {n} is unknown: only n_max {self.n_max} was measured"
            )
        if not 1 <= n <= self.n_max:
            raise ValueError(f"n_max {n} is outside 1..{self.n_max} (the profiled n_max)")
        rho = self.mean_length / self.expected(self.n_max)
        return rho * self.expected(n)

    def with_rates(self, rates: Sequence[float], mean_length: float | None = None) -> Acceptance:
        """The same acceptance with other per-position rates (realisation ratio kept)."""
        rates = tuple(float(r) for r in rates)
        if mean_length is None:
            rho = self.mean_length / self.expected(self.n_max) if self.rates else 1.0
            mean_length = rho * (1.0 + sum(rates[: self.n_max]))
        return Acceptance(self.n_max, mean_length, rates, self.source)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_max": self.n_max,
            "mean_length": self.mean_length,
            "rates": list(self.rates) if self.rates is not None else None,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Acceptance:
        rates = data.get("rates")
        return cls(
            int(data["n_max"]),
            float(data["mean_length"]),
            tuple(float(r) for r in rates) if rates is not None else None,
            str(data["source"]),
        )


def _pool_rates(repeats: Iterable[Repeat], n_max: int) -> tuple[float, ...] | None:
    drafts = 0.0
    counts = np.zeros(n_max)
    for r in repeats:
        if r.drafts > 0 and r.accepted_per_position:
            drafts += r.drafts
            per = np.asarray(r.accepted_per_position[:n_max], dtype=float)
            counts[: len(per)] += per
    if drafts <= 0:
        return None
    rates = np.clip(counts / drafts, 0.0, 1.0)
    # a_i is a share of drafts with the first i tokens all accepted: it cannot grow with i
    return tuple(float(v) for v in np.minimum.accumulate(rates))


def _mean_length(pairs: Sequence[tuple[int, Repeat]]) -> float | None:
    """Tokens per stream per step over repeats, weighted by streams (a proxy for their tokens)."""
    if not pairs or not all(r.accept_len for _, r in pairs):
        return None
    weights = np.array([c for c, _ in pairs], dtype=float)
    values = np.array([r.accept_len for _, r in pairs], dtype=float)
    return float(weights @ values / weights.sum())


def estimate_acceptance(data: FitData, spec_levels: list[LevelObs]) -> Acceptance:
    """Acceptance from what the data has: rates and tokens per step, either, or neither."""
    pairs = [(lv.concurrency, r) for lv in spec_levels for r in lv.repeats]
    repeats = [r for _, r in pairs]
    measured_len = _mean_length(pairs)
    rates = _pool_rates(repeats, data.n_max)
    if rates is None and data.accept_rates is not None:
        rates = tuple(float(v) for v in data.accept_rates[: data.n_max])
        rates = rates + (0.0,) * (data.n_max - len(rates))
    if measured_len is None and data.accept_len is not None:
        measured_len = float(data.accept_len)
    if measured_len is None and rates is not None:
        measured_len = 1.0 + sum(rates)
    if measured_len is None:
        return Acceptance(data.n_max, 1.0, None, "folded")
    if rates is None:
        return Acceptance(
            data.n_max, measured_len, geometric_rates(measured_len, data.n_max), "inferred"
        )
    return Acceptance(data.n_max, measured_len, rates, "measured")
