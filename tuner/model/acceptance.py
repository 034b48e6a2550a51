"""Acceptance: how many tokens a speculative step yields per stream, E[L] = 1 + a_1 + ... + a_n.

a_i is the share of drafts whose first i draft tokens were all accepted (pooled `/metrics`
per-position counts divided by the number of drafts). Without per-position counts the rates are
inferred (geometric) from the measured tokens per step; imported tables with tok/s only fold
acceptance into the spec curve (L = 1 unit, n_max fixed). Acceptance is random, step cost is a
property of the machine: they are fitted apart.

Acceptance can also be observed on a server's own traffic (`observed_acceptance`, from the
counters `tuner observe` and `tuner watch` read): the same rates, with an interval from the
spread of the readings, which `recommend --traffic` puts in place of the profile's
(tuner.decide.observed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.model.data import FitData, LevelObs, Repeat
from tuner.model.quantiles import t_ppf
from tuner.traffic import AcceptanceCounts


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


# --- acceptance observed on a server's own traffic ----------------------------------------------

MIN_DRAFTS = 500  # fewer drafts than this are not enough to stand in for the profile's
MIN_READINGS = 10  # nor fewer readings (groups of whole requests) than this
MAX_HALF_WIDTH = 0.10  # nor a 90 % interval of the mean accepted length wider than +-10 % of it
OBSERVED_INTERVAL = 0.90


@dataclass(frozen=True)
class ObservedAcceptance:
    """Acceptance from a server's own counters over observed traffic (traffic.AcceptanceCounts).

    A ratio estimate: a_i = (accepted at position i) / drafts, and the mean accepted tokens per
    draft m = accepted / drafts (= sum of a_i). Their covariance is the delta method's over the
    readings, each a group of whole requests (llama-server counts a request's drafts when it
    ends): sum_j (x_j - r d_j)(x_j - r d_j)^T / D^2 * n / (n - 1), so it carries the requests'
    own differences in acceptance (content), which a binomial count of drafts would not.
    `rates` is None where the server gave no per-position counts (then `mean_accepted` alone is
    known)."""

    drafts: float
    readings: int
    mean_accepted: float  # accepted tokens per draft: sum of a_i
    rates: tuple[float, ...] | None
    cov: tuple[tuple[float, ...], ...]  # of (mean_accepted, a_1, a_2, ...)
    draft_length: float  # draft tokens per draft

    @property
    def mean_length(self) -> float:
        """Tokens a stream gets per drafting step: 1 + mean accepted."""
        return 1.0 + self.mean_accepted

    @property
    def se(self) -> float:
        """Standard error of the mean accepted length."""
        return math.sqrt(max(self.cov[0][0], 0.0)) if self.cov else math.inf

    def interval(self, level: float = OBSERVED_INTERVAL) -> tuple[float, float]:
        """The mean accepted length's interval (t-quantile for readings - 1 degrees of freedom)."""
        if self.readings < 2:
            return (-math.inf, math.inf)
        half = t_ppf(0.5 + level / 2, self.readings - 1) * self.se
        return self.mean_length - half, self.mean_length + half

    def enough(self) -> str | None:
        """None where this is enough to stand in for the profile's acceptance, else why not."""
        lo, hi = self.interval()
        half = (hi - lo) / 2
        if self.drafts < MIN_DRAFTS:
            return f"{self.drafts:.0f} drafts seen (fewer than {MIN_DRAFTS})"
        if self.readings < MIN_READINGS:
            return f"{self.readings} readings of the counters (fewer than {MIN_READINGS})"
        if half > MAX_HALF_WIDTH * self.mean_length:
            return (
                f"its 90 % interval is +-{half:.3f} tokens, wider than {MAX_HALF_WIDTH:.0%} of "
                f"{self.mean_length:.2f}"
            )
        return None

    def rates_at(self, n_max: int) -> tuple[float, ...] | None:
        """a_1..a_n_max; None where the server drafts fewer positions than n_max (what lies
        beyond was never observed). Without per-position counts: geometric rates whose sum is
        the mean accepted (as an inferred profile acceptance is)."""
        if self.rates is None:
            return geometric_rates(self.mean_length, n_max)
        if len(self.rates) < n_max:
            return None
        return self.rates[:n_max]

    def draws(self, count: int, n_max: int, seed: int = 0) -> list[tuple[float, ...]]:
        """Rates a_1..a_n_max drawn from the estimate's sampling distribution (a normal with
        its covariance, each draw kept within [0, 1] and not rising with position): what the
        cost model's replicates take in place of their own."""
        rng = np.random.default_rng(seed)
        cov = np.asarray(self.cov, dtype=float)
        if self.rates is None:
            means = rng.normal(self.mean_accepted, self.se, size=count)
            return [geometric_rates(1.0 + max(m, 0.0), n_max) for m in means]
        mean = np.asarray(self.rates[:n_max], dtype=float)
        sub = cov[1 : n_max + 1, 1 : n_max + 1]
        drawn = rng.multivariate_normal(mean, sub, size=count, method="eigh")
        out = []
        for row in drawn:
            row = np.minimum.accumulate(np.clip(row, 0.0, 1.0))
            out.append(tuple(float(v) for v in row))
        return out

    def to_dict(self) -> dict[str, Any]:
        lo, hi = self.interval()
        return {
            "drafts": self.drafts,
            "readings": self.readings,
            "mean_length": self.mean_length,
            "interval": [lo, hi],
            "rates": list(self.rates) if self.rates is not None else None,
            "draft_length": self.draft_length,
        }


def observed_acceptance(counts: AcceptanceCounts) -> ObservedAcceptance | None:
    """The estimate from a server's counters (see ObservedAcceptance); None where nothing was
    drafted while observed (every step had more slots generating than N, or no draft model)."""
    if counts.drafts <= 0 or not counts.x:
        return None
    d_total, n = counts.drafts, counts.readings
    x = np.asarray(counts.x, dtype=float)
    r = x / d_total
    xd = np.asarray(counts.xd, dtype=float)
    xx = np.asarray(counts.xx, dtype=float)
    resid = xx - np.outer(r, xd) - np.outer(xd, r) + np.outer(r, r) * counts.dd
    cov = resid / d_total**2 * (n / (n - 1)) if n > 1 else np.full_like(resid, np.inf)
    rates = None
    if counts.per_position and len(r) > 1:
        # a_i is a share of drafts whose first i tokens were all accepted: it cannot rise with i
        rates = tuple(float(v) for v in np.minimum.accumulate(np.clip(r[1:], 0.0, 1.0)))
    return ObservedAcceptance(
        drafts=d_total,
        readings=n,
        mean_accepted=float(r[0]),
        rates=rates,
        cov=tuple(tuple(float(v) for v in row) for row in cov),
        draft_length=counts.draft_tokens / d_total,
    )
