"""Open-loop load: requests arrive as a seeded Poisson process, whether or not earlier ones have
finished, as a served box sees them; and the pure summary serving benchmarks report (vLLM's
benchmark_serving): throughput, time to first token and time per output token at p50/p95/p99,
and how many slots were generating on average.

Slots coming and going at random is where `--spec-draft-max-slots` shows what it does (no new
drafts while more than N generate; a draft in flight is still used), which closed loops of
streams that start together cannot show.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tuner.measure.load import RequestSample
from tuner.measure.readings import generating_histogram
from tuner.traffic import Finished


def poisson_offsets(rate_per_s: float, duration_s: float, seed: int) -> list[float]:
    """Arrival times (seconds from the start) of a Poisson process of this rate over duration_s,
    seeded: every configuration measured at a rate gets the same arrivals.

    The process is conditioned on its count: exactly round(rate x duration) arrivals (at least
    one), placed as a Poisson process given its count places them (uniform order statistics;
    the gaps stay exponential-like, bursts and lulls included). Unconditioned, a 45 s window at
    0.3/s offers 14 requests give or take 4, so two rates a few tenths apart can offer the same
    load by chance: the realized rate is the rate asked for."""
    if rate_per_s <= 0:
        raise ValueError(f"arrival rate must be above 0, got {rate_per_s}")
    if duration_s <= 0:
        raise ValueError(f"arrival window must be above 0 s, got {duration_s}")
    rng = random.Random(f"poisson:{seed}:{rate_per_s}")
    count = max(1, round(rate_per_s * duration_s))
    return sorted(rng.uniform(0.0, duration_s) for _ in range(count))


@dataclass(frozen=True)
class Schedule:
    """When requests arrive (seconds from the start) and, for a replayed trace, how many tokens
    each generates (else the workload's lengths)."""

    rate: float  # offered requests per second: what results are keyed by
    offsets: list[float]
    max_tokens: list[int] | None = None
    source: str = "poisson"  # poisson | trace


def poisson_schedule(rate_per_s: float, duration_s: float, seed: int) -> Schedule:
    return Schedule(rate_per_s, poisson_offsets(rate_per_s, duration_s, seed))


def trace_schedule(requests: Iterable[Finished], window_s: float) -> Schedule:
    """An observed trace replayed: the requests that arrived within window_s of the first, at
    their observed offsets, each generating its observed output length."""
    ordered = sorted(requests, key=lambda r: r.arrival)
    if not ordered:
        return Schedule(0.0, [], [], "trace")
    t0 = ordered[0].arrival
    kept = [r for r in ordered if r.arrival - t0 < window_s]
    span = max(kept[-1].arrival - t0, 1e-9)
    rate = (len(kept) - 1) / span if len(kept) > 1 else 0.0
    return Schedule(rate, [r.arrival - t0 for r in kept], [max(1, r.output) for r in kept], "trace")


@dataclass(frozen=True)
class OpenLoopFigures:
    """One configuration under one arrival rate."""

    rate: float  # offered requests per second
    offered: int
    completed: int
    failed: int
    span_s: float  # from the first arrival to the last token
    tokens_per_second: float  # output tokens of completed requests / span
    ttft_ms: tuple[float, float, float]  # p50, p95, p99
    tpot_ms: tuple[float, float, float]  # time per output token after the first, p50/p95/p99
    mean_generating: float  # time-averaged slots generating over the span

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpenLoopFigures:
        return cls(
            **{
                **data,
                "ttft_ms": tuple(data["ttft_ms"]),
                "tpot_ms": tuple(data["tpot_ms"]),
            }
        )


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    if not values:
        return (float("nan"),) * 3  # type: ignore[return-value]
    p = np.percentile(np.asarray(values), [50, 95, 99])
    return (float(p[0]), float(p[1]), float(p[2]))


def summarize_open_loop(samples: list[RequestSample], rate: float) -> OpenLoopFigures:
    """Turn one open-loop run's samples into its figures; pure."""
    good = [s for s in samples if s.ok and len(s.token_times) >= 1]
    ttft = [s.ttft_ms for s in good if s.ttft_ms is not None]
    tpot = [
        1000 * (s.token_times[-1] - s.token_times[0]) / (len(s.token_times) - 1)
        for s in good
        if len(s.token_times) >= 2
    ]
    if good:
        begin = min(s.start for s in samples)
        end = max(s.token_times[-1] for s in good)
        span = max(end - begin, 1e-9)
        intervals = [(s.token_times[0], s.token_times[-1]) for s in good]
        hist = generating_histogram(intervals, begin, end)
        mean_generating = sum(k * v for k, v in hist.items()) / span
        tps = sum(s.tokens for s in good) / span
    else:
        span, tps, mean_generating = 0.0, 0.0, 0.0
    return OpenLoopFigures(
        rate=rate,
        offered=len(samples),
        completed=len(good),
        failed=len(samples) - len(good),
        span_s=span,
        tokens_per_second=tps,
        ttft_ms=_percentiles(ttft),
        tpot_ms=_percentiles(tpot),
        mean_generating=mean_generating,
    )
