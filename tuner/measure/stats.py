"""Per-level statistics over repeats: the spread that decides when a level has repeated enough,
the medians stored on the level, and acceptance pooled from the /metrics deltas. Pure."""

from __future__ import annotations

import statistics
from typing import Any

from tuner.measure.spec import WorkloadSpec


def relative_mad(values: list[float]) -> float | None:
    """MAD / median: the spread measure that decides when a level has repeated enough."""
    if len(values) < 2:
        return None
    med = statistics.median(values)
    if med == 0:
        return None
    return statistics.median(abs(v - med) for v in values) / med


# A round this many times slower than the level's own figures is the machine stalling, not a
# slow spell: here round-to-round spread is 5-13 % (spells of -30 %), and a launch once ran a
# round at 8 streams at 6.7 tok/s between rounds of 125-175. Against another policy's half of
# the same pair the margin is wider, for policies differ in their own right, and the profiler
# compares halves only where both draft or neither does (drafting at one stream can run at
# several times plain where acceptance is high).
STALL_RATIO = 3.0  # against the median of the same policy's other rounds at the level
STALL_PAIR_RATIO = 5.0  # against another policy's round of the same pair at the level


def slow_stall(rate: float | None, own: list[float], partners: list[float]) -> str | None:
    """Why a round's tok/s is a stall: far below the median of the same policy's other rounds
    at the level (own), or below another policy's round of its pair there (partners); None
    where it is not."""
    if not rate:
        return None
    if own and rate * STALL_RATIO < (typical := statistics.median(own)):
        return f"{rate:.1f} tok/s against {typical:.1f}, the median of its other rounds here"
    if partners and rate * STALL_PAIR_RATIO < (best := max(partners)):
        return f"{rate:.1f} tok/s against {best:.1f} for the other half of its pair"
    return None


def stable(repeats: list[dict[str, Any]], workload: WorkloadSpec) -> bool:
    """Step time within target_spread and tok/s within target_tps_spread (MAD/median).

    Step time is a property of the machine and settles fast; tok/s of a speculative level also
    carries the randomness of acceptance, so it may need a repeat more.
    """
    step = relative_mad([r["step_ms"] for r in repeats if r.get("step_ms")])
    tps = relative_mad([r["tokens_per_second"] for r in repeats if r.get("tokens_per_second")])
    return (
        step is not None
        and step <= workload.target_spread
        and tps is not None
        and tps <= workload.target_tps_spread
    )


def level_medians(repeats: list[dict[str, Any]]) -> dict[str, float | None]:
    """The level's figures: medians over its repeats, and the spreads of tok/s and step time."""

    def med(key: str) -> float | None:
        values = [r[key] for r in repeats if r.get(key) is not None]
        return statistics.median(values) if values else None

    return {
        "tokens_per_second": med("tokens_per_second"),
        "per_stream_tps": med("per_stream_tps"),
        "step_ms": med("step_ms"),
        "accept_len": med("accept_len"),
        "ttft_ms": med("ttft_ms"),
        "tokens_per_second_spread": relative_mad(
            [r["tokens_per_second"] for r in repeats if r.get("tokens_per_second")]
        ),
        "step_ms_spread": relative_mad([r["step_ms"] for r in repeats if r.get("step_ms")]),
    }


def pool_drafting(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """Acceptance pooled over repeats: per-position counts divided by the number of drafts."""
    drafts = sum(r["metrics"]["drafts"] for r in repeats if "metrics" in r)
    width = max(
        (len(r["metrics"]["accepted_per_position"]) for r in repeats if "metrics" in r), default=0
    )
    per_position = [
        sum(
            r["metrics"]["accepted_per_position"][i]
            for r in repeats
            if "metrics" in r and i < len(r["metrics"]["accepted_per_position"])
        )
        for i in range(width)
    ]
    return {
        "drafts": drafts,
        "draft_tokens": sum(r["metrics"]["draft_tokens"] for r in repeats if "metrics" in r),
        "accepted_tokens": sum(r["metrics"]["accepted_tokens"] for r in repeats if "metrics" in r),
        "accepted_per_position": per_position,
        "accept_rates": [p / drafts for p in per_position] if drafts else [],
        "n_decode": sum(r["metrics"]["n_decode"] for r in repeats if "metrics" in r),
    }


Steps = dict[tuple[int, int], float]  # (depth, concurrency) -> median step time (ms)


def _ratio_at(steps: Steps, shallow: int, depth: int, concurrency: int) -> float | None:
    """deep / shallow step time at the nearest concurrency measured at both depths (the
    largest at or below concurrency first: batching makes deep steps slower still)."""
    both = sorted(c for d, c in steps if d == depth and (shallow, c) in steps)
    if not both:
        return None
    below = [c for c in both if c <= concurrency]
    c = below[-1] if below else both[0]
    return steps[(depth, c)] / steps[(shallow, c)]


def depth_slowdown(steps: Steps, shallow: int, depth: int, concurrency: int) -> float | None:
    """How much slower a step is at depth than at the shallowest depth, from what was measured
    so far: the same cell, else the nearest concurrency at that depth, else another depth's
    slowdown scaled linearly in depth (the cost of reading the KV cache is). None before any
    deep step was measured."""
    ratio = _ratio_at(steps, shallow, depth, concurrency)
    if ratio is not None:
        return ratio
    others = {d for d, _ in steps if d not in (shallow, depth)}
    for other in sorted(others, key=lambda d: abs(d - depth)):
        seen = _ratio_at(steps, shallow, other, concurrency)
        if seen is not None:
            return 1.0 + (seen - 1.0) * (depth - shallow) / (other - shallow)
    return None
