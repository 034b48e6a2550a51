"""A twin world serving offered traffic: the requests (drawn from an observed trace, or Poisson
arrivals with observed lengths) and every policy's figures serving them, noise-free.

The open-loop answer (tuner.decide.openanswer) runs every policy through a world made from the
fit (tuner.twin.fitted) with the same arrivals and request seeds (common random numbers), so
differences between policies are exact for that world. A threshold at or above the most slots
N = 0 ever had generating is N = 0's server (it never stops a draft): scored once. Pure.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tuner.policy import Policy
from tuner.recommendation import ObjectiveKind
from tuner.traffic import TrafficProfile
from tuner.twin.engine import (
    Request,
    SimResult,
    Workload,
    arrival_offsets,
    request_seed,
    simulate,
)
from tuner.twin.world import World

DRAWN_REQUESTS = 4000  # requests the offered traffic is drawn to: its occupancy tail
BLOCK_GAPS = 20  # consecutive arrival gaps a block of the bootstrap keeps together


@dataclass(frozen=True)
class Offered:
    """The traffic the policies are scored under, and where it came from (in words)."""

    workload: Workload
    rate: float  # requests per second offered
    source: str

    def head(self, count: int) -> Workload:
        """The first `count` requests (a shorter run for the replicate worlds' spread)."""
        w = self.workload
        return Workload(w.requests[:count], w.arrivals[:count])


def _requests(pairs: Sequence[tuple[int, int]], seed: int) -> tuple[Request, ...]:
    return tuple(
        Request(max(1, p), max(1, o), request_seed(seed, i)) for i, (p, o) in enumerate(pairs)
    )


def block_gaps(gaps: Sequence[float], count: int, rng: random.Random) -> list[float]:
    """`count` arrival gaps by a moving-block bootstrap of the observed ones: blocks of
    BLOCK_GAPS consecutive gaps (fewer where fewer were seen) from random places, end to end,
    so bursts and lulls stay together as they came and their order is new."""
    size = max(1, min(BLOCK_GAPS, len(gaps)))
    out: list[float] = []
    while len(out) < count:
        start = rng.randrange(len(gaps) - size + 1)
        out += gaps[start : start + size]
    return out[:count]


def offered_drawn(
    profile: TrafficProfile, name: str, seed: int = 0, count: int = DRAWN_REQUESTS
) -> Offered:
    """Traffic drawn from the observed traffic's distribution, not a replay of what observe
    kept: arrival gaps by a block bootstrap of the observed gaps (block_gaps: bursts and lulls
    as they came), each request's prompt and output drawn together from the observed requests;
    `count` of them, so the run reaches the occupancies the observation only touched (a replay
    never goes past the most slots it saw generating)."""
    kept = sorted(profile.requests, key=lambda r: r.arrival)
    if len(kept) < 2:
        raise ValueError(
            f"traffic {name!r} holds {len(kept)} finished requests: too few to draw from"
        )
    gaps = [b.arrival - a.arrival for a, b in itertools.pairwise(kept)]
    span = kept[-1].arrival - kept[0].arrival
    if span <= 0:
        raise ValueError(f"traffic {name!r}: its requests all arrived at once; no rate to draw")
    rng = random.Random(f"offered:{seed}:{name}")
    times = list(itertools.accumulate(block_gaps(gaps, count - 1, rng), initial=0.0))
    pairs = [(r.prompt, r.output) for r in (kept[rng.randrange(len(kept))] for _ in range(count))]
    rate = (len(kept) - 1) / span
    source = (
        f"traffic {name!r}: {count} requests drawn from the {len(kept)} observed ({rate:.3g} "
        f"req/s; arrival gaps in blocks of {min(BLOCK_GAPS, len(gaps))} as they came, prompt "
        f"{_mean([p for p, _ in pairs]):.0f} and output {_mean([o for _, o in pairs]):.0f} "
        "tokens on average)"
    )
    return Offered(Workload(_requests(pairs, seed), tuple(times)), rate, source)


def offered_poisson(
    rate: float,
    lengths: Sequence[tuple[int, int]],
    lengths_from: str,
    seed: int = 0,
    count: int = DRAWN_REQUESTS,
) -> Offered:
    """Poisson arrivals at a rate (count-conditioned, as every twin workload's:
    tuner.twin.engine.arrival_offsets), each request's (prompt, output) drawn from `lengths`."""
    if not rate > 0:
        raise ValueError(f"an arrival rate must be above 0, got {rate:g}")
    if not lengths:
        raise ValueError("no request lengths to draw from")
    rng = random.Random(f"openanswer:{seed}:{rate}")
    times = arrival_offsets("poisson", rate, count / rate, seed)
    pairs = [lengths[rng.randrange(len(lengths))] for _ in times]
    source = (
        f"Poisson arrivals at {rate:.3g} req/s, lengths {lengths_from} (prompt "
        f"{_mean([p for p, _ in pairs]):.0f}, output {_mean([o for _, o in pairs]):.0f} tokens "
        "on average)"
    )
    return Offered(Workload(_requests(pairs, seed), tuple(times)), rate, source)


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else 0.0


# --- scoring ----------------------------------------------------------------------------------

BACKLOG_PER_SLOT = 32  # requests a slot in the backlog that measures a policy's capacity


@dataclass(frozen=True)
class Score:
    """One policy serving the offered traffic in one world: what users feel (time per output
    token, end-to-end latency: queueing + time to first token + generation) and whether it
    keeps up (`overloaded`: the arrivals outrun its capacity, so its backlog of requests
    waiting for a slot grows through the run, without bound the longer it runs)."""

    tpot_ms: float  # mean time per output token, over tokens
    busy_tps: float  # tokens per second some slot generated
    p95_tpot_ms: float  # per request
    mean_generating: float
    max_generating: int  # an upper bound on the slots generating at a step's start
    latency_ms: float = math.nan  # end-to-end per request (arrival to last token), mean
    p95_latency_ms: float = math.nan
    tokens_per_second: float = 0.0  # over the run, first arrival to last token
    backlog_rise: float = 0.0  # requests waiting for a slot: their rise through the run
    capacity_rps: float = math.inf  # requests/s it serves with every slot busy (backlog_capacity)
    overloaded: bool = False  # the offered rate is at or above that capacity

    def value(self, kind: ObjectiveKind) -> float:
        """Higher is better: 1000 / mean TPOT (tpot), tokens per busy second (tps)."""
        if kind is ObjectiveKind.TPOT:
            return 1000.0 / self.tpot_ms if self.tpot_ms > 0 else 0.0
        return self.busy_tps

    def against(self, rate: float, capacity_rps: float) -> Score:
        """This score with its capacity, overloaded where the offered rate reaches it."""
        return dataclasses.replace(self, capacity_rps=capacity_rps, overloaded=rate >= capacity_rps)


def backlog_rise(arrivals: Sequence[float], starts: Sequence[float | None]) -> float:
    """How far the requests waiting for a slot rose through the run: the least-squares slope of
    the count waiting at each arrival over the arrivals' span, times that span; a request that
    never started waits to the end. Shown beside the overload verdict (which rests on capacity:
    a burst near the end of a run raises this too)."""
    if len(arrivals) < 3:
        return 0.0
    t = np.sort(np.asarray(arrivals, dtype=float))
    began = np.sort(np.asarray([math.inf if s is None else s for s in starts], dtype=float))
    waiting = np.arange(1, len(t) + 1) - np.searchsorted(began, t, side="right")
    span = float(t[-1] - t[0])
    if span <= 0:
        return 0.0
    slope = float(np.polyfit(t - t[0], np.maximum(waiting, 0), 1)[0])
    return slope * span


def backlog_capacity(world: World, policy: Policy, requests: Sequence[Request]) -> float:
    """Requests/s the policy serves with a backlog of these requests (all there at the start,
    every slot busy while it lasts, noise off): the requests finished by the time the backlog
    runs dry (the last -np still running) over that time. Arrivals at or above it outrun the
    server: its backlog grows without bound."""
    count = len(requests)
    done = count - world.n_parallel
    if done < 1:
        return math.inf
    result = simulate(world, policy, Workload(tuple(requests), (0.0,) * count), noise=False)
    ends = sorted(r.finished_at or 0.0 for r in result.requests)
    return done / ends[done - 1] if ends[done - 1] > 0 else math.inf


def offered_rate(workload: Workload) -> float:
    """Requests per second the workload offers over its arrivals' span."""
    times = workload.arrivals
    span = max(times) - min(times) if times else 0.0
    return (len(times) - 1) / span if span > 0 else math.inf


def backlog_requests(workload: Workload, n_parallel: int) -> tuple[Request, ...]:
    """The workload's first BACKLOG_PER_SLOT x -np requests: the backlog capacity is measured on."""
    return workload.requests[: BACKLOG_PER_SLOT * n_parallel]


def score(result: SimResult) -> Score:
    """The figures of one simulated run (see Score; capacity and overload: `Score.against`)."""
    reqs = result.requests
    done = [r for r in reqs if r.tokens >= 2]
    gen = sum(r.generation_time or 0.0 for r in done)
    steps = sum(r.tokens - 1 for r in done)
    per_request = [1000.0 * (r.generation_time or 0.0) / (r.tokens - 1) for r in done]
    events = sorted(
        [(r.token_times[0], 1) for r in reqs if r.token_times]
        + [(r.token_times[-1], -1) for r in reqs if r.token_times]
    )
    level = top = 0
    busy_s, last = 0.0, 0.0
    for t, change in events:
        if level > 0:
            busy_s += t - last
        level += change
        top = max(top, level)
        last = t
    tokens = sum(r.tokens for r in reqs)
    area = sum((r.token_times[-1] - r.token_times[0]) for r in reqs if r.token_times)
    latency = [1000.0 * r.latency for r in reqs if r.latency is not None and not r.cancelled]
    ends = [r.token_times[-1] for r in reqs if r.token_times]
    span = max(ends) - min(r.arrival for r in reqs) if ends else 0.0
    return Score(
        tpot_ms=1000.0 * gen / steps if steps else math.nan,
        busy_tps=tokens / busy_s if busy_s > 0 else 0.0,
        p95_tpot_ms=float(np.percentile(per_request, 95)) if per_request else math.nan,
        mean_generating=area / busy_s if busy_s > 0 else 0.0,
        max_generating=top,
        latency_ms=float(np.mean(latency)) if latency else math.nan,
        p95_latency_ms=float(np.percentile(latency, 95)) if latency else math.nan,
        tokens_per_second=tokens / span if span > 0 else 0.0,
        backlog_rise=backlog_rise([r.arrival for r in reqs], [r.start for r in reqs]),
    )


class Capacities:
    """Each policy's capacity on a backlog of a workload's requests (backlog_capacity), measured
    as needed: with every slot busy a threshold drafts only in steps where a slot is still
    reading its prompt, so its capacity lies between N=1's and always draft's, and a threshold
    is measured only where the offered rate does not fall below both of those."""

    def __init__(self, world: World, workload: Workload) -> None:
        self.world = world
        self.rate = offered_rate(workload)
        self.backlog = backlog_requests(workload, world.n_parallel)
        self.measured: dict[Policy, float] = {}

    def of(self, policy: Policy) -> float:
        key = policy if not policy.drafting else Policy.of_max_slots(policy.max_slots)
        if key not in self.measured:
            self.measured[key] = backlog_capacity(self.world, policy, self.backlog)
        return self.measured[key]

    def against(self, policy: Policy, served: Score) -> Score:
        """The score with its capacity and whether the offered rate reaches it (a threshold's
        capacity unmeasured, nan, where the rate is below N=1's and always draft's)."""
        if policy.is_threshold and (policy.max_slots or 0) > 1:
            n_max = policy.n_max
            low = min(self.of(Policy.threshold(1, n_max)), self.of(Policy.always(n_max)))
            if self.rate < low:
                return dataclasses.replace(served, capacity_rps=math.nan, overloaded=False)
        return served.against(self.rate, self.of(policy))


def score_policies(
    world: World, workload: Workload, candidates: Sequence[Policy]
) -> tuple[dict[Policy, Score], int]:
    """Every candidate's score on the world (N = 0 first: thresholds at or above the most slots
    it had generating are its server, scored once), each against its capacity on a backlog of
    the workload's requests (overloaded where the workload's rate reaches it: Capacities), and
    how many runs that took."""
    out: dict[Policy, Score] = {}
    runs = 0
    capacities = Capacities(world, workload)
    always = [p for p in candidates if p.is_always]
    for p in always + [p for p in candidates if not p.is_always]:
        top = out[always[0]].max_generating if always and always[0] in out else None
        if p.is_threshold and top is not None and (p.max_slots or 0) >= top:
            out[p] = out[always[0]]
            continue
        out[p] = capacities.against(p, score(simulate(world, p, workload, noise=False)))
        runs += 1
    return out, runs + len(capacities.measured)


def scaled(workload: Workload, factor: float) -> Workload:
    """The same requests arriving `factor` times as fast."""
    return Workload(workload.requests, tuple(t / factor for t in workload.arrivals))


def capacity(
    world: World,
    workload: Workload,
    policy: Policy,
    slo_tpot_ms: float,
    *,
    quantile: float = 95.0,
    steps: int = 6,
) -> tuple[float, int]:
    """The most the workload's arrivals can be sped up (a factor) with the per-request
    `quantile` percentile of time per output token within slo_tpot_ms, and the runs it took:
    doubled or halved until the limit is bracketed (at most `steps` times), then halved in
    between `steps` times; 0 where even an eighth of the pace misses it."""
    runs = 0

    def meets(factor: float) -> bool:
        nonlocal runs
        runs += 1
        result = simulate(world, policy, scaled(workload, factor), noise=False)
        per_request = [
            1000.0 * (r.generation_time or 0.0) / (r.tokens - 1)
            for r in result.requests
            if r.tokens >= 2
        ]
        return bool(per_request) and float(np.percentile(per_request, quantile)) <= slo_tpot_ms

    return fastest(meets, steps), runs


def fastest(meets: Callable[[float], bool], steps: int = 6) -> float:
    """The largest factor `meets` holds at (it holds below a limit, fails above): doubled or
    halved from 1 until the limit is bracketed (at most `steps` doublings), then halved in
    between `steps` times; 0 where even an eighth misses it."""
    if meets(1.0):
        lo, hi = 1.0, 2.0
        while hi <= 2.0**steps and meets(hi):
            lo, hi = hi, hi * 2
    else:
        lo, hi = 0.5, 1.0
        while not meets(lo):
            if lo <= 1.0 / 8:
                return 0.0
            lo, hi = lo / 2, lo
    for _ in range(steps):
        mid = (lo + hi) / 2
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo
