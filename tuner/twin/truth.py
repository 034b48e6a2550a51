"""The twin's truth: what every N is worth in a world, noise-free, to grade the tuner against.

Closed levels (`closed_truth`): for every policy (plain, N = 0, N = 1..n_parallel) at every
concurrency c = 1..n_parallel, the tuner's estimand: aggregate tok/s inside the window where all
c streams generate (tuner.measure.load.summarize: from the latest first token to the earliest
last token), for closed levels of the spec's kind (c streams released together, each with the
same prompt and output length), noise off, averaged over repeats whose request seeds differ
(repeat r of every policy uses the same seeds: the repeats are paired). Acceptance is the only
randomness left, so:

- a run that made no draft is deterministic (no draw was taken, so no seed can change it): one
  run stands for all repeats (plain; a threshold below c with equal output lengths);
- at concurrency c every N >= c is the same server as N = 0 (never more than c generate), so
  those cells are N = 0's, exactly;
- the remaining cells repeat in batches until the standard error of each mean is below
  `rel_se` of it (default 0.2 %), at least `min_repeats`, at most `max_repeats`; the error is
  kept beside every value.

Objectives: the tps objective sum_c w_c tok/s_N(c) (weights uniform over 1..n_parallel by
default, or a dict {c: w}, normalised), its standard error from the paired repeats, and the best
N with the margin to the runner-up and the N within two standard errors of the best (`ties`):
a tuner's choice inside that set is as good as the truth can tell.

Open loop (`open_loop_truth`): per N, one long run (an hour of virtual time by default) of
Poisson arrivals at a rate (or any workload), the same arrivals and request seeds for every N,
scored by what users feel (tuner.twin.serving.score): the mean time per output token over tokens
(the tpot objective's E[c] / E[tps]), end-to-end latency per request (queueing + time to first
token + generation: mean and p95), per-request TPOT and TTFT p50/p95/p99 as
`summarize_open_loop` reports them, throughput, mean generating slots, and whether the policy
keeps up: a policy whose backlog of requests waiting for a slot grows through the run (the
offered rate at or above what it serves with every slot busy on a backlog of the workload's own
requests: tuner.twin.serving.backlog_capacity; the backlog's rise through the run is kept beside
it) is overloaded, and ranks behind every policy that keeps up whatever its decode speed (`ranked`,
`OpenLoopTruth.rank_key` and `regret`: infinite for an overloaded answer where another keeps
up). Standard errors by batch means over ten stretches of requests (they are mostly the
arrivals' own variation, shared by every N: differences between N are far more precise than
these errors). `open_loop_capacity`: capacity under a latency limit, the most a workload's
arrivals can be sped up with a policy keeping up and within the limit.

Deterministic for a given world and arguments: every seed is fixed.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tuner.policy import Policy
from tuner.twin.engine import RequestResult, Workload, policies, simulate
from tuner.twin.serving import Capacities, fastest, score
from tuner.twin.world import World


@dataclass(frozen=True)
class Cell:
    """One policy at one concurrency: the mean windowed tok/s over paired repeats."""

    policy: Policy
    streams: int
    tps: float
    se: float  # standard error of tps
    values: tuple[float, ...]  # per repeat (index r = request seeds of repeat r)
    deterministic: bool  # no draft was made: every repeat gives the same value

    @property
    def repeats(self) -> int:
        return len(self.values)

    @property
    def rel_se(self) -> float:
        return self.se / self.tps if self.tps else math.inf


@dataclass(frozen=True)
class Choice:
    """The best policy for one objective, and how clearly it is the best."""

    best: Policy
    value: float
    runner_up: Policy | None
    runner_up_value: float | None
    margin: float  # best - runner-up, objective units
    margin_se: float  # standard error of that paired difference
    ties: tuple[Policy, ...]  # within two standard errors of the best (the best included)
    values: dict[Policy, float] = field(repr=False)

    @property
    def margin_pct(self) -> float:
        return 100.0 * self.margin / self.value if self.value else 0.0

    def regret(self, policy: Policy) -> float:
        """How much a chosen policy gives up against the best, as a share of the best."""
        return (self.value - self.values[policy]) / self.value if self.value else 0.0


@dataclass(frozen=True)
class ClosedTruth:
    """Every policy's windowed tok/s at every concurrency of one world."""

    world: str
    model_name: str
    n_parallel: int
    n_max: int
    output_tokens: int | None  # None: drawn per stream and repeat (see closed_truth)
    prompt_tokens: int
    depth: int
    cells: dict[tuple[Policy, int], Cell] = field(repr=False)

    @property
    def concurrency(self) -> list[int]:
        return sorted({c for _, c in self.cells})

    @property
    def policies(self) -> list[Policy]:
        return sorted({p for p, _ in self.cells}, key=lambda p: p.sort_key)

    def cell(self, policy: Policy, streams: int) -> Cell:
        return self.cells[(self._key(policy), streams)]

    def tps(self, policy: Policy, streams: int) -> float:
        return self.cell(policy, streams).tps

    def row(self, policy: Policy) -> list[float]:
        """tok/s at c = 1..n_parallel."""
        return [self.tps(policy, c) for c in self.concurrency]

    def gain(self, streams: int) -> float:
        """Always draft over plain at one concurrency (spec/plain - 1)."""
        return self.tps(Policy.always(), streams) / self.tps(Policy.plain(), streams) - 1.0

    def weights(self, weights: Mapping[int, float] | None = None) -> dict[int, float]:
        """Normalised weights over the concurrencies (uniform by default)."""
        levels = self.concurrency
        raw = {c: 1.0 for c in levels} if weights is None else dict(weights)
        unknown = set(raw) - set(levels)
        if unknown:
            raise ValueError(f"weights name concurrencies the truth lacks: {sorted(unknown)}")
        total = sum(raw.values())
        if total <= 0:
            raise ValueError("weights must sum to more than 0")
        return {c: w / total for c, w in raw.items() if w > 0}

    def objective(self, policy: Policy, weights: Mapping[int, float] | None = None) -> float:
        """The tps objective: sum_c w_c tok/s(c)."""
        w = self.weights(weights)
        return sum(wc * self.tps(policy, c) for c, wc in w.items())

    def objective_se(self, policy: Policy, weights: Mapping[int, float] | None = None) -> float:
        w = self.weights(weights)
        return math.sqrt(sum((wc * self.cell(policy, c).se) ** 2 for c, wc in w.items()))

    def difference_se(
        self, a: Policy, b: Policy, weights: Mapping[int, float] | None = None
    ) -> float:
        """Standard error of objective(a) - objective(b), from the paired repeats."""
        total = 0.0
        for c, wc in self.weights(weights).items():
            va, vb = self.cell(a, c).values, self.cell(b, c).values
            n = max(len(va), len(vb))
            diffs = [va[i % len(va)] - vb[i % len(vb)] for i in range(n)]
            if n > 1:
                total += wc * wc * statistics.variance(diffs) / n
        return math.sqrt(total)

    def best(
        self, weights: Mapping[int, float] | None = None, include_plain: bool = False
    ) -> Choice:
        """The best N for the tps objective (plain too if asked). Equal values prefer N = 0
        (the server's default) and then the smaller N."""
        candidates = [p for p in self.policies if include_plain or p.drafting]
        values = {p: self.objective(p, weights) for p in candidates}
        ranked = sorted(candidates, key=lambda p: (-values[p], p.sort_key))
        best = ranked[0]
        # the runner-up: the best policy that is not the same server where the weights look
        runner = next((p for p in ranked[1:] if not self._same(p, best, weights)), None)
        margin = values[best] - values[runner] if runner is not None else 0.0
        margin_se = self.difference_se(best, runner, weights) if runner is not None else 0.0
        ties = tuple(
            p
            for p in ranked
            if values[best] - values[p] <= 2.0 * self.difference_se(best, p, weights)
        )
        return Choice(
            best=best,
            value=values[best],
            runner_up=runner,
            runner_up_value=values[runner] if runner is not None else None,
            margin=margin,
            margin_se=margin_se,
            ties=ties,
            values=values,
        )

    def table(self) -> str:
        """A plain-text table: tok/s per policy (rows) and concurrency (columns)."""
        levels = self.concurrency
        head = "policy  " + "".join(f"{c:>9d}" for c in levels)
        lines = [head]
        for p in self.policies:
            lines.append(f"{p.label:<8}" + "".join(f"{self.tps(p, c):9.2f}" for c in levels))
        worst = max(cell.rel_se for cell in self.cells.values())
        lines.append(f"(largest standard error {100 * worst:.2f} % of its value)")
        return "\n".join(lines)

    def _key(self, policy: Policy) -> Policy:
        if policy.is_plain:
            return Policy.plain()
        return Policy.of_max_slots(policy.max_slots, self.n_max)

    def _same(self, a: Policy, b: Policy, weights: Mapping[int, float] | None = None) -> bool:
        # the same server, or one whose runs came out the same to the last bit
        return all(self.cell(a, c).values == self.cell(b, c).values for c in self.weights(weights))


def closed_truth(
    world: World,
    *,
    output_tokens: int | Callable[[int, int], Sequence[int]] = 128,
    prompt_tokens: int = 32,
    depth: int = 0,
    rel_se: float = 0.002,
    min_repeats: int = 16,
    max_repeats: int = 20000,
    batch: int = 64,
    concurrency: Sequence[int] | None = None,
) -> ClosedTruth:
    """The closed-level truth of a world (see the module docstring).

    output_tokens: every stream's output length, or a function (streams, repeat) -> one length
    per stream, for a spec that draws lengths (tuner.measure.prompts); with drawn lengths no
    cell is deterministic, every one repeats."""
    fixed = isinstance(output_tokens, int)
    n_max = world.n_max
    levels = list(concurrency or range(1, world.n_parallel + 1))
    cells: dict[tuple[Policy, int], Cell] = {}
    for c in levels:
        # At c, N >= c is N = 0's server; plain and N = 1..c-1 are their own.
        distinct = [Policy.plain(), Policy.always(n_max)] + [
            Policy.threshold(n, n_max) for n in range(1, c)
        ]
        values: dict[Policy, list[float]] = {p: [] for p in distinct}
        random_ones: list[Policy] = []
        for p in distinct:
            tps, drafted = _run(world, p, c, output_tokens, prompt_tokens, depth, 0)
            values[p].append(tps)
            if drafted or not fixed:
                random_ones.append(p)
        n = 1
        while random_ones and n < max_repeats:
            if n >= min_repeats and all(_rel_se(values[p]) <= rel_se for p in random_ones):
                break
            for r in range(n, min(n + batch, max_repeats)):
                for p in random_ones:
                    values[p].append(_run(world, p, c, output_tokens, prompt_tokens, depth, r)[0])
            n = len(values[random_ones[0]])
        for p in distinct:
            vals = values[p]
            mean = statistics.fmean(vals)
            se = statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0
            cell = Cell(p, c, mean, se, tuple(vals), p not in random_ones)
            cells[(p, c)] = cell
        for k in range(c, world.n_parallel + 1):
            p = Policy.threshold(k, n_max)
            cells[(p, c)] = cells[(Policy.always(n_max), c)]
    return ClosedTruth(
        world=world.name,
        model_name=world.model_name,
        n_parallel=world.n_parallel,
        n_max=n_max,
        output_tokens=output_tokens if isinstance(output_tokens, int) else None,
        prompt_tokens=prompt_tokens,
        depth=depth,
        cells=cells,
    )


def _run(
    world: World,
    policy: Policy,
    streams: int,
    output_tokens: int | Callable[[int, int], Sequence[int]],
    prompt_tokens: int,
    depth: int,
    repeat: int,
) -> tuple[float, bool]:
    lengths = output_tokens if isinstance(output_tokens, int) else output_tokens(streams, repeat)
    work = Workload.closed(streams, lengths, prompt_tokens, depth, seed=repeat)
    result = simulate(world, policy, work, seed=repeat, noise=False)
    tps = result.window_tps()
    if tps is None:
        raise ValueError(
            f"{streams} streams of {lengths} tokens leave no window in which all generate"
        )
    drafted = any(r.draft_n for r in result.requests)
    return tps, drafted


def _rel_se(values: list[float]) -> float:
    if len(values) < 2:
        return math.inf
    mean = statistics.fmean(values)
    return statistics.stdev(values) / math.sqrt(len(values)) / mean if mean else math.inf


# -- open loop --

# What the open-loop truth ranks by (lower is better, ms): the mean time per output token over
# tokens, the mean and the 95th percentile of end-to-end latency per request
OPEN_OBJECTIVES = ("tpot", "latency", "latency_p95")


@dataclass(frozen=True)
class OpenLoopTruth:
    """One policy under open-loop arrivals at one rate, noise-free, over a long run."""

    policy: Policy
    rate: float  # offered requests per second
    requests: int
    span_s: float
    tokens_per_second: float  # throughput over the span
    tokens_per_second_se: float
    tpot_mean_ms: float  # over tokens: sum of generation times / sum of tokens after the first
    tpot_mean_ms_se: float
    tpot_ms: tuple[float, float, float]  # per request, p50/p95/p99
    ttft_ms: tuple[float, float, float]  # p50/p95/p99
    mean_generating: float  # time-averaged slots generating
    # mean TPOT (ms, over tokens) of each stretch of requests in arrival order: the same
    # requests under every policy of one call, so differences between policies pair up
    tpot_batches: tuple[float, ...] = field(default=(), repr=False)
    accept_len: float = math.nan  # tokens per verified draft, the target's own included
    # end to end per request (queueing + time to first token + generation), ms
    latency_mean_ms: float = math.nan
    latency_p95_ms: float = math.nan
    latency_batches: tuple[float, ...] = field(default=(), repr=False)
    backlog_rise: float = 0.0  # requests waiting for a slot: their rise through the run
    capacity_rps: float = math.inf  # requests/s it serves with a backlog of these requests
    overloaded: bool = False  # the arrivals reach that capacity: its backlog grows unbounded

    def value(self, objective: str = "tpot") -> float:
        """The objective's figure, ms, lower is better (OPEN_OBJECTIVES)."""
        if objective == "tpot":
            return self.tpot_mean_ms
        if objective == "latency":
            return self.latency_mean_ms
        if objective == "latency_p95":
            return self.latency_p95_ms
        raise ValueError(f"unknown objective {objective!r}; known: {', '.join(OPEN_OBJECTIVES)}")

    def rank_key(self, objective: str = "tpot") -> tuple[int, float]:
        """Sorts best first: every policy that keeps up before every overloaded one (whatever
        its decode speed: its queue grows without bound), the former by the objective, the
        latter by the throughput they manage."""
        if self.overloaded:
            return (1, -self.tokens_per_second)
        return (0, self.value(objective))

    def regret(self, best: OpenLoopTruth, objective: str = "tpot") -> float:
        """How much this policy gives up against the best, as a share: in the objective where
        it keeps up; infinite where it is overloaded and the best keeps up; in throughput where
        both are overloaded."""
        if self.overloaded and not best.overloaded:
            return math.inf
        if best.overloaded:
            return best.tokens_per_second / self.tokens_per_second - 1.0
        return self.value(objective) / best.value(objective) - 1.0

    def difference_se(self, other: OpenLoopTruth, objective: str = "tpot") -> float:
        """Standard error of value(objective) - other's from the paired stretches (the arrivals'
        own variation, shared by both, cancels); mean figures only (tpot, latency)."""
        if objective == "tpot":
            a, b = self.tpot_batches, other.tpot_batches
        elif objective == "latency":
            a, b = self.latency_batches, other.latency_batches
        else:
            return math.nan
        if len(a) != len(b) or len(a) < 2:
            return math.nan
        diffs = [x - y for x, y in zip(a, b, strict=True)]
        return statistics.stdev(diffs) / math.sqrt(len(diffs))


def ranked(
    figures: Mapping[Policy, OpenLoopTruth], objective: str = "tpot"
) -> list[tuple[Policy, OpenLoopTruth]]:
    """The policies best first (OpenLoopTruth.rank_key; equal ones keep the order given)."""
    return sorted(figures.items(), key=lambda kv: kv[1].rank_key(objective))


def open_loop_truth(
    world: World,
    rate: float,
    *,
    duration_s: float = 3600.0,
    output_tokens: int | Sequence[int] = 128,
    prompt_tokens: int = 32,
    seed: int = 0,
    candidates: Sequence[Policy] | None = None,
    workload: Workload | None = None,
    batches: int = 10,
) -> dict[Policy, OpenLoopTruth]:
    """Every policy (default plain, N = 0..n_parallel) under the same arrivals: Poisson at the
    rate, or `workload` (any arrivals, lengths and acceptance classes; `rate` then only labels
    the figures). Common random numbers: every policy serves the same requests at the same
    times with the same request seeds. N = n_parallel is N = 0's server (never more than
    n_parallel generate): run once. `batches`: stretches of requests for the standard errors.
    What users feel is scored once, in tuner.twin.serving.score: time per output token,
    end-to-end latency, and whether the policy keeps up (its backlog does not grow)."""
    work = workload or Workload.poisson(rate, duration_s, output_tokens, prompt_tokens, seed=seed)
    capacities = Capacities(world, work)
    out: dict[Policy, OpenLoopTruth] = {}
    ran: dict[Policy, OpenLoopTruth] = {}
    for policy in candidates or policies(world):
        same = _same_server(world, policy)
        if same in ran:
            n_max = ran[same].policy.n_max
            out[policy] = dataclasses.replace(
                ran[same], policy=Policy.of_max_slots(policy.max_slots, n_max)
            )
            continue
        result = simulate(world, policy, work, seed=seed, noise=False)
        figures = result.open_loop_figures(rate)
        felt = capacities.against(policy, score(result))
        tps_se, tpot_se, parts, latency_parts = _batch_means(result.requests, batches)
        drafts = sum(r.drafts for r in result.requests)
        accepted = sum(r.draft_accepted for r in result.requests)
        ran[same] = out[policy] = OpenLoopTruth(
            policy=result.policy,
            rate=rate,
            requests=len(result.requests),
            span_s=figures.span_s,
            tokens_per_second=figures.tokens_per_second,
            tokens_per_second_se=tps_se,
            tpot_mean_ms=felt.tpot_ms,
            tpot_mean_ms_se=tpot_se,
            tpot_ms=figures.tpot_ms,
            ttft_ms=figures.ttft_ms,
            mean_generating=figures.mean_generating,
            tpot_batches=parts,
            accept_len=1.0 + accepted / drafts if drafts else math.nan,
            latency_mean_ms=felt.latency_ms,
            latency_p95_ms=felt.p95_latency_ms,
            latency_batches=latency_parts,
            backlog_rise=felt.backlog_rise,
            capacity_rps=felt.capacity_rps,
            overloaded=felt.overloaded,
        )
    return out


def open_loop_capacity(
    world: World,
    workload: Workload,
    policy: Policy,
    limit_ms: float,
    *,
    objective: str = "latency_p95",
    steps: int = 6,
) -> float:
    """Capacity under a latency limit: the most the workload's arrivals can be sped up (a
    factor of its rate) with the policy keeping up and its objective figure (OPEN_OBJECTIVES,
    default the 95th percentile of end-to-end latency) within limit_ms; doubled or halved until
    bracketed, then halved in between `steps` times; 0 where an eighth of the pace misses it."""

    def meets(factor: float) -> bool:
        fast = Workload(workload.requests, tuple(t / factor for t in workload.arrivals))
        got = open_loop_truth(world, 1.0, candidates=[policy], workload=fast, batches=2)
        figure = next(iter(got.values()))
        return not figure.overloaded and figure.value(objective) <= limit_ms

    return fastest(meets, steps)


def _same_server(world: World, policy: Policy) -> Policy:
    """The policy whose server this one is: N >= n_parallel is N = 0 (at its n_max)."""
    if policy.drafting and (policy.max_slots or 0) >= world.n_parallel:
        return Policy.always(policy.n_max or world.n_max)
    return policy


def _batch_means(
    requests: Sequence[RequestResult], batches: int = 10
) -> tuple[float, float, tuple[float, ...], tuple[float, ...]]:
    """Standard errors of throughput and token-weighted TPOT from stretches of requests (in
    arrival order): the spread of stretch means over sqrt(stretches); and each stretch's TPOT
    and mean end-to-end latency."""
    done = [r for r in requests if r.tokens >= 2]
    if len(done) < 2 * batches:
        return math.nan, math.nan, (), ()
    size = len(requests) // batches
    tps, tpot, latency = [], [], []
    for b in range(batches):
        part = requests[b * size : (b + 1) * size]
        t0 = min(r.arrival for r in part)
        t1 = max(r.token_times[-1] for r in part if r.token_times)
        tps.append(sum(r.tokens for r in part) / (t1 - t0))
        gen = sum(r.generation_time or 0.0 for r in part if r.tokens >= 2)
        steps = sum(r.tokens - 1 for r in part if r.tokens >= 2)
        tpot.append(1000.0 * gen / steps if steps else math.nan)
        ends = [1000.0 * r.latency for r in part if r.latency is not None]
        latency.append(statistics.fmean(ends) if ends else math.nan)
    return (
        statistics.stdev(tps) / math.sqrt(batches),
        statistics.stdev(tpot) / math.sqrt(batches),
        tuple(tpot),
        tuple(latency),
    )
