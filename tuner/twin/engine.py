"""The twin's engine: a discrete-event model of llama-server's decode loop, in virtual time.

One `step()` is one pass of llama-server's `update_slots` (tools/server/server-context.cpp,
llama.cpp 11434 with patches/spec-draft-max-slots.patch), and the engine keeps its order:

1. Requests that arrived by the step's start take idle slots, lowest slot first, first come
   first served (the server's task queue runs between passes; a request that finds no idle
   slot waits, "deferred").
2. The threshold is counted: G = slots in state generating. With `--spec-draft-max-slots N`,
   N > 0, new drafts start only while G <= N; N = 0 is no limit; a plain server (no draft
   model) never drafts.
3. Every generating slot joins the batch, in slot order. A slot with a draft in flight (see
   `rollback` below) reuses it whatever the threshold says; otherwise, where drafts may start,
   it drafts n = min(n_max, tokens left - 1) tokens (llama-server's get_n_draft_max: a draft
   never overruns the request; n <= 0 is no draft). A slot adds 1 row (its last sampled token)
   plus its draft rows.
4. Prompt rows fill the rest of the batch, slot by slot, up to n_batch rows in all (continuous
   batching); a slot whose prompt ends in this step samples its first token at the step's end
   and generates from the next step on.
5. The step's duration: the world's cost of those rows (tuner.twin.world) times the noise
   (tuner.twin.noise).
6. At the step's end every generating slot verifies: without a draft it emits 1 token; with a
   draft of n it emits 1 + k, k the accepted prefix: position i is accepted while
   u < p_i (u uniform from the request's own generator, p_i the conditional synthetic rates),
   stopping at the first rejection (server_sample_and_accept_synth: draws = k + 1, or n when
   all are accepted). A slot that has emitted max_tokens finishes and its slot is free for the
   next step.

Acceptance is seeded per request: the generator is `random.Random(request.seed)`, drawn in
order as the request's drafts are verified, exactly as llama-server seeds its synthetic
acceptance from the request's sampling seed. The same request seed therefore gives the same
sequence of accept/reject draws under every policy (bit parity with llama-server's mt19937 is
not attempted); that is what makes paired comparisons of policies work.

Where the world's acceptance moves (tuner.twin.world.Acceptance), p_i are the request's class's
(its class fixed when it is submitted: the class its prompt marks, else one by its seed's
share), times by_drafting at the number of drafts made in the step and by_depth at the tokens
the slot's context holds when the draft is verified. The draws are the same ones from the same
generator: a policy that drafts fewer slots together changes what a draw decides, not which
draw it is. A world without those keys runs the one table it always has.

`rollback` (world): "partial" (a KV cache: rejected draft rows are simply removed) leaves no
draft alive between steps. "checkpoint" (recurrent/hybrid targets, where llama-server restores
a checkpoint): a draft with a rejection emits nothing in its step, and its accepted tokens plus
the target's correction stay in `spec_draft`: a draft in flight, replayed (all accepted, one
more sampled) in the next step whatever the threshold then says. Its verify step is counted
once, at the replay.

Counters: `StepResult` carries each step's (drafts started, draft tokens, accepted, verified);
`Engine.metrics()` mirrors llama-server's /metrics, which adds a request's tokens and draft
counters when the request finishes and counts n_decode per step.

Ways in: the incremental `Engine` (a live server: submit, set_max_slots, step, slots,
metrics, advance_to over idle time), `Engine.closed_level` (a launch measuring level after level,
its noise going on between them) and `simulate(world, policy, workload, seed)` for one closed
level or open loop on a fresh engine, all in virtual seconds.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from tuner.policy import Policy
from tuner.twin.bursts import gamma_offsets, mmpp_offsets
from tuner.twin.noise import NoiseProcess
from tuner.twin.world import Curve, World

if TYPE_CHECKING:
    from tuner.measure.arrivals import OpenLoopFigures
    from tuner.measure.load import LevelFigures, RequestSample

# -- inputs --


@dataclass(frozen=True)
class Request:
    """What one request asks for.

    prompt_tokens: the prompt's whole length (what the slot's context holds when it starts
    generating: the context depth); cached_tokens: how many of them the slot already holds
    (a cached prefix, the padding of a deep level), not evaluated again (at least one prompt
    token is always evaluated, as in llama-server); max_tokens: tokens to generate (n_predict;
    no stop strings in a twin); seed: the request's sampling seed, which seeds its synthetic
    acceptance; content: the acceptance class its prompt marks (a class name of the world's
    [[acceptance.classes]], as World.marked_class reads a prompt; "" unmarked: the class by
    its seed's share, else the world's own acceptance)."""

    prompt_tokens: int = 32
    max_tokens: int = 128
    seed: int = 0
    cached_tokens: int = 0
    content: str = ""

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be 1 or more, not {self.prompt_tokens}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be 1 or more, not {self.max_tokens}")
        if not 0 <= self.cached_tokens <= self.prompt_tokens:
            raise ValueError(
                f"cached_tokens must be within 0..prompt_tokens, not {self.cached_tokens}"
            )

    @property
    def evaluated_tokens(self) -> int:
        """Prompt tokens the server evaluates (llama-server re-evaluates at least one)."""
        return max(1, self.prompt_tokens - self.cached_tokens)


def request_seed(seed: int, index: int) -> int:
    """The sampling seed of request `index` of a workload seeded `seed` (32 bits, stable)."""
    digest = hashlib.blake2b(f"twin:{seed}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


@dataclass(frozen=True)
class Workload:
    """Requests and when they arrive (virtual seconds from the start)."""

    requests: tuple[Request, ...]
    arrivals: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.requests) != len(self.arrivals):
            raise ValueError("a workload needs one arrival time per request")
        if any(t < 0 for t in self.arrivals):
            raise ValueError("arrival times are 0 or more")

    @classmethod
    def closed(
        cls,
        streams: int,
        output_tokens: int | Sequence[int] = 128,
        prompt_tokens: int = 32,
        depth: int = 0,
        seed: int = 0,
    ) -> Workload:
        """A closed level as the tuner measures one: `streams` requests released together.

        depth > 0: each request holds exactly `depth` tokens, of which all but the prompt are
        cached (the tuner prefills each stream's padding before it measures)."""
        if streams < 1:
            raise ValueError(f"a closed level has 1 or more streams, not {streams}")
        lengths = _lengths(output_tokens, streams)
        return cls(
            tuple(
                _request(prompt_tokens, depth, lengths[i], request_seed(seed, i))
                for i in range(streams)
            ),
            (0.0,) * streams,
        )

    @classmethod
    def open_loop(
        cls,
        offsets: Sequence[float],
        output_tokens: int | Sequence[int] = 128,
        prompt_tokens: int = 32,
        depth: int = 0,
        seed: int = 0,
    ) -> Workload:
        """Requests arriving at the given offsets, each generating its length."""
        lengths = _lengths(output_tokens, len(offsets))
        return cls(
            tuple(
                _request(prompt_tokens, depth, lengths[i], request_seed(seed, i))
                for i in range(len(offsets))
            ),
            tuple(float(t) for t in offsets),
        )

    @classmethod
    def poisson(
        cls,
        rate: float,
        duration_s: float,
        output_tokens: int | Sequence[int] = 128,
        prompt_tokens: int = 32,
        depth: int = 0,
        seed: int = 0,
    ) -> Workload:
        """Poisson arrivals as `tuner validate --arrivals poisson` sends them (conditioned on
        their count: exactly round(rate x duration) of them)."""
        offsets = arrival_offsets("poisson", rate, duration_s, seed)
        return cls.open_loop(offsets, output_tokens, prompt_tokens, depth, seed)

    @classmethod
    def bursty(
        cls,
        rate: float,
        duration_s: float,
        output_tokens: int | Sequence[int] = 128,
        prompt_tokens: int = 32,
        depth: int = 0,
        seed: int = 0,
        *,
        process: str = "gamma",
        cv: float = 2.0,
        peak: float = 8.0,
        busy_share: float = 0.2,
        busy_s: float = 30.0,
    ) -> Workload:
        """Bursty arrivals (tuner.twin.bursts), conditioned on their count as `poisson` is:
        process "gamma" (gaps of coefficient of variation cv) or "mmpp" (busy spells at peak
        times the quiet rate, busy_share of the time, busy_s seconds each on average)."""
        return cls.open_loop(
            arrival_offsets(
                process,
                rate,
                duration_s,
                seed,
                cv=cv,
                peak=peak,
                busy_share=busy_share,
                busy_s=busy_s,
            ),
            output_tokens,
            prompt_tokens,
            depth,
            seed,
        )

    @classmethod
    def mixed(
        cls,
        offsets: Sequence[float],
        prompt_tokens: Sequence[int],
        output_tokens: Sequence[int],
        contents: Sequence[str] | None = None,
        seed: int = 0,
    ) -> Workload:
        """Requests of lengths (and acceptance classes, "" unmarked) of their own, arriving at
        the given offsets; request seeds from `seed` as every workload's."""
        count = len(offsets)
        marks = list(contents) if contents is not None else [""] * count
        if not len(prompt_tokens) == len(output_tokens) == len(marks) == count:
            raise ValueError("a mixed workload needs one prompt, output and class per arrival")
        return cls(
            tuple(
                Request(
                    int(prompt_tokens[i]), int(output_tokens[i]), request_seed(seed, i), 0, marks[i]
                )
                for i in range(count)
            ),
            tuple(float(t) for t in offsets),
        )


ARRIVALS = ("poisson", "gamma", "mmpp")


def arrival_offsets(
    process: str,
    rate: float,
    duration_s: float,
    seed: int,
    *,
    cv: float = 2.0,
    peak: float = 8.0,
    busy_share: float = 0.2,
    busy_s: float = 30.0,
) -> list[float]:
    """Arrival times of one of ARRIVALS, each conditioned on round(rate x duration) arrivals:
    poisson as `tuner validate --arrivals poisson` draws them, gamma and mmpp from
    tuner.twin.bursts (their parameters ignored by the processes that have none)."""
    from tuner.measure.arrivals import poisson_offsets

    if process == "poisson":
        return poisson_offsets(rate, duration_s, seed)
    if process == "gamma":
        return gamma_offsets(rate, duration_s, cv, seed)
    if process == "mmpp":
        return mmpp_offsets(rate, duration_s, seed, peak=peak, busy_share=busy_share, busy_s=busy_s)
    raise ValueError(f"unknown arrival process {process!r}; known: {', '.join(ARRIVALS)}")


def _lengths(output_tokens: int | Sequence[int], count: int) -> list[int]:
    if isinstance(output_tokens, int):
        return [output_tokens] * count
    lengths = [int(n) for n in output_tokens]
    if len(lengths) != count:
        raise ValueError(f"{len(lengths)} output lengths for {count} requests")
    return lengths


def _request(prompt_tokens: int, depth: int, max_tokens: int, seed: int) -> Request:
    if depth > 0:
        prompt = max(depth, prompt_tokens)
        return Request(prompt, max_tokens, seed, cached_tokens=prompt - prompt_tokens)
    return Request(prompt_tokens, max_tokens, seed)


# -- outputs --


class SlotState(StrEnum):
    """A slot as /slots shows it (llama-server's STARTED/PROCESSING_PROMPT/DONE_PROMPT are
    one state here: prefilling)."""

    IDLE = "idle"
    PREFILLING = "prefilling"
    GENERATING = "generating"


@dataclass(frozen=True)
class Emission:
    """Tokens one request received at the end of one step."""

    request: int
    tokens: int
    time: float


@dataclass(frozen=True)
class StepResult:
    """One pass of the decode loop."""

    index: int  # 0, 1, ... over the engine's life
    start: float  # virtual seconds
    duration: float  # with noise
    cost: float  # noise-free duration
    generating: int  # slots generating at the step's start: what the threshold counted
    drafts_allowed: bool  # whether new drafts could start in this step
    rows: int  # decode rows: one per generating slot plus its draft rows
    prompt_rows: int  # prompt tokens evaluated in this step
    drafts_started: int  # new drafts made in this step
    draft_tokens: int  # tokens those drafts hold
    verified: int  # drafts verified and used (llama-server's spec_decode_num_drafts)
    accepted: int  # draft tokens accepted by those verifications
    admitted: tuple[int, ...]  # requests that took a slot at this step's start
    emitted: tuple[Emission, ...]  # per request, the tokens it received at the step's end
    finished: tuple[int, ...]  # requests that finished at the step's end

    @property
    def end(self) -> float:
        return self.start + self.duration

    @property
    def tokens(self) -> int:
        return sum(e.tokens for e in self.emitted)


@dataclass(frozen=True)
class SlotView:
    """One slot for /slots."""

    id: int
    state: SlotState
    request: int | None  # the request it serves
    prompt_tokens: int  # its request's prompt length (0 when idle)
    prompt_done: int  # prompt tokens in its context so far
    n_decoded: int  # tokens generated so far
    max_tokens: int
    context: int  # tokens its context holds
    draft: int  # rows of its draft in flight (checkpoint worlds) or in the last step

    @property
    def is_processing(self) -> bool:
        return self.state is not SlotState.IDLE


@dataclass
class Metrics:
    """llama-server's /metrics counters (names without the `llamacpp:` prefix).

    As in llama-server, a request's tokens and draft counters are added when it finishes;
    n_decode_total and n_busy_slots_total count every step."""

    prompt_tokens_total: int = 0
    tokens_predicted_total: int = 0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0
    spec_decode_num_drafts_total: int = 0
    spec_decode_num_draft_tokens_total: int = 0
    spec_decode_num_accepted_tokens_total: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    requests_processing: int = 0
    requests_deferred: int = 0

    @property
    def n_busy_slots_per_decode(self) -> float:
        return self.n_busy_slots_total / max(self.n_decode_total, 1)

    def prometheus(self) -> str:
        """The text llama-server's /metrics answers (counters, gauges, per-position counts)."""
        counters = {
            "prompt_tokens_total": self.prompt_tokens_total,
            "tokens_predicted_total": self.tokens_predicted_total,
            "n_decode_total": self.n_decode_total,
            "spec_decode_num_draft_tokens_total": self.spec_decode_num_draft_tokens_total,
            "spec_decode_num_accepted_tokens_total": self.spec_decode_num_accepted_tokens_total,
            "spec_decode_num_drafts_total": self.spec_decode_num_drafts_total,
        }
        gauges = {
            "requests_processing": self.requests_processing,
            "requests_deferred": self.requests_deferred,
            "n_busy_slots_per_decode": self.n_busy_slots_per_decode,
        }
        lines: list[str] = []
        for kind, items in (("counter", counters), ("gauge", gauges)):
            for name, value in items.items():
                lines += [f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value}"]
        if self.accepted_per_pos:
            name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
            lines.append(f"# TYPE {name} counter")
            lines += [f'{name}{{position="{i}"}} {n}' for i, n in enumerate(self.accepted_per_pos)]
        return "\n".join(lines) + "\n"


@dataclass(slots=True, eq=False)
class RequestResult:
    """One request as a client sees it (the engine fills it in as it goes: read, do not
    write). Times are virtual seconds."""

    id: int
    request: Request
    arrival: float
    start: float | None = None  # when it took a slot (its prompt started)
    slot: int | None = None
    token_times: list[float] = field(default_factory=list)  # one per generated token
    draft_n: int = 0  # draft tokens made for it (timings.draft_n)
    draft_accepted: int = 0  # of them accepted (timings.draft_n_accepted)
    drafts: int = 0  # its drafts verified and used
    draft_log: list[tuple[int, int]] = field(default_factory=list)  # (length, accepted) each
    # (end of the step, draft_n after it) for every step that drafted for it: its draft counter
    # as of each token, as streamed chunks carry it (kept sparse: the step loop is hot)
    draft_marks: list[tuple[float, int]] = field(default_factory=list)
    finished_at: float | None = None
    cancelled: bool = False
    klass: str = ""  # its acceptance class ("" the world's own acceptance)

    @property
    def tokens(self) -> int:
        return len(self.token_times)

    @property
    def done(self) -> bool:
        return self.finished_at is not None

    @property
    def prompt_tokens(self) -> int:
        return self.request.prompt_tokens

    @property
    def prompt_evaluated(self) -> int:
        return self.request.evaluated_tokens

    @property
    def ttft(self) -> float | None:
        """Arrival to first token, seconds."""
        return self.token_times[0] - self.arrival if self.token_times else None

    @property
    def generation_time(self) -> float | None:
        """First token to last, seconds (llama-server's predicted_ms runs from the end of the
        prompt, when the first token is sampled, to the last token)."""
        return self.token_times[-1] - self.token_times[0] if self.token_times else None

    @property
    def latency(self) -> float | None:
        return self.finished_at - self.arrival if self.finished_at is not None else None

    def as_sample(self, stream: int | None = None) -> RequestSample:
        """As the load generator records a request (tuner.measure.load.RequestSample), so
        `summarize` and `summarize_open_loop` apply unchanged. Times stay virtual seconds."""
        from tuner.measure.load import RequestSample

        gen = self.generation_time
        ttft, latency = self.ttft, self.latency
        return RequestSample(
            stream=self.id if stream is None else stream,
            ok=self.done and not self.cancelled and self.tokens > 0,
            tokens=self.tokens,
            prompt_tokens=self.prompt_evaluated,
            generation_ms=gen * 1000 if gen is not None else None,
            ttft_ms=ttft * 1000 if ttft is not None else None,
            latency_ms=latency * 1000 if latency is not None else None,
            draft_n=self.draft_n,
            draft_accepted=self.draft_accepted,
            start=self.arrival,
            token_times=list(self.token_times),
            token_drafts=self.token_drafts(),
        )

    def token_drafts(self) -> list[int]:
        """The draft counter as of each token (what a streamed chunk's timings say)."""
        out: list[int] = []
        marks, i, count = self.draft_marks, 0, 0
        for t in self.token_times:
            while i < len(marks) and marks[i][0] <= t:
                count = marks[i][1]
                i += 1
            out.append(count)
        return out


# -- the engine --

_IDLE, _PREFILL, _GEN = 0, 1, 2
_STATES = {_IDLE: SlotState.IDLE, _PREFILL: SlotState.PREFILLING, _GEN: SlotState.GENERATING}


class _Slot:
    """A busy slot's state."""

    __slots__ = (
        "behind",
        "draft",
        "draft_len",
        "index",
        "kv",
        "left",
        "per_pos",
        "probs",
        "prompt_left",
        "replay",
        "res",
        "rng",
        "state",
    )

    def __init__(
        self, index: int, res: RequestResult, n_max: int, probs: list[float], lazy: bool = False
    ) -> None:
        self.index = index
        self.res = res
        req = res.request
        self.state = _PREFILL
        self.prompt_left = req.evaluated_tokens
        self.kv = req.prompt_tokens - self.prompt_left  # context held before its prompt runs
        self.left = req.max_tokens  # tokens still to generate
        self.draft = 0  # draft rows in this step
        self.replay = 0  # checkpoint worlds: rows of a draft in flight, replayed next step
        self.draft_len = 0  # checkpoint worlds: the length the draft in flight was made with
        # tokens its drafter has not seen (catch-up): a lazy drafter starts behind by the
        # prompt it evaluates; every drafter falls behind by what it generates without drafting
        self.behind = self.prompt_left if lazy else 0
        self.rng = random.Random(req.seed)
        self.per_pos = [0] * n_max
        self.probs = probs  # its class's conditional acceptance per position


class TwinError(ValueError):
    """A request or call the simulated server refuses (as llama-server would answer 400)."""


def _policy_of(policy: Policy | int | None) -> Policy:
    if isinstance(policy, Policy):
        return policy
    return Policy.of_max_slots(policy)


class Engine:
    """One simulated llama-server, stepped by its caller.

    `Engine(world, policy, seed)`: policy is a Policy, or the value of --spec-draft-max-slots
    (0 = always draft, N = threshold, None = plain: no draft model). Its n_max (else the
    world's) is --spec-draft-n-max. `seed` seeds the noise only; acceptance is seeded by each
    request's own seed. `noise=False` runs noise-free (the truth's way)."""

    def __init__(
        self,
        world: World,
        policy: Policy | int | None = 0,
        seed: int = 0,
        *,
        noise: bool = True,
    ) -> None:
        pol = _policy_of(policy)
        self.world = world
        self._spec = pol.drafting  # a draft model is loaded
        self._max_slots = pol.max_slots or 0
        self._n_max = pol.n_max or world.n_max
        self._probs = world.accept_probs(self._n_max)
        # Acceptance that moves with drafts, depth or content (World's Acceptance); else the
        # one table above serves every slot and step, as it always has.
        acc = world.acceptance
        self._moves = acc.moves
        self._class_probs = {"": self._probs} | {
            c.name: world.accept_probs(self._n_max, c.name) for c in acc.classes
        }
        self._by_drafting = (
            Curve(acc.by_drafting, world.n_parallel).at_int() if acc.by_drafting else None
        )
        self._by_depth = Curve(acc.by_depth, 0) if acc.by_depth else None
        self._n_parallel = world.n_parallel
        self._n_batch = world.n_batch
        self._slot_context = world.slot_context
        self._replay_mode = world.rollback == "checkpoint"
        self._tables = tables = world.cost_tables(self._n_max)
        self._rows, self._slots_cost = tables.rows, tables.slots
        self._call, self._reeval = tables.call, tables.reeval
        ms = 1e-3  # the world's costs are in ms, time in seconds
        self._overhead = world.draft.overhead_ms * ms
        self._catch_up = world.draft.catch_up_ms_per_token * ms
        self._lazy = world.draft.kind == "lazy"
        self._prefill = world.prefill.ms_per_token * ms
        self._prefill_draft = world.prefill.draft_ms_per_token * ms
        self._depth = world.depth.ms_per_row_per_1k * ms / 1000.0
        self._depth_slot = world.depth.ms_per_slot_per_1k * ms / 1000.0
        params = world.noise.resolve()
        self._noise = NoiseProcess(params, seed) if noise and not params.is_off else None

        self.now = 0.0
        self._slots: list[_Slot | None] = [None] * world.n_parallel
        self._waiting: deque[RequestResult] = deque()
        self._pending: list[tuple[float, int, RequestResult]] = []  # heap of future arrivals
        self._results: dict[int, RequestResult] = {}
        self._next_id = 0
        self._steps = 0
        self._metrics = Metrics(accepted_per_pos=[0] * self._n_max if self._spec else [])

    # -- policy --

    @property
    def policy(self) -> Policy:
        """The policy in force now."""
        if not self._spec:
            return Policy.plain()
        return Policy.of_max_slots(self._max_slots, self._n_max)

    @property
    def n_max(self) -> int:
        return self._n_max

    def set_max_slots(self, n: int) -> None:
        """--spec-draft-max-slots changed live; the next step counts against it."""
        if not self._spec:
            raise TwinError("a plain server has no draft model: its threshold cannot be set")
        if n < 0:
            raise TwinError(f"--spec-draft-max-slots is 0 or more, not {n}")
        self._max_slots = int(n)

    # -- requests --

    def submit(self, request: Request, at: float | None = None) -> int:
        """Queue a request arriving at virtual time `at` (default, or anything earlier: now);
        its id. It takes a slot at the start of the first step at or after its arrival."""
        if request.prompt_tokens >= self._slot_context:
            raise TwinError(
                f"request ({request.prompt_tokens} tokens) exceeds the available context size "
                f"({self._slot_context} tokens)"
            )
        try:
            klass = self.world.class_of(request.seed, request.content)
        except ValueError as exc:
            raise TwinError(str(exc)) from exc
        arrival = self.now if at is None else max(float(at), self.now)
        rid = self._next_id
        self._next_id += 1
        res = RequestResult(rid, request, arrival, klass=klass)
        self._results[rid] = res
        if arrival <= self.now:
            self._waiting.append(res)
        else:
            heapq.heappush(self._pending, (arrival, rid, res))
        return rid

    def cancel(self, rid: int) -> bool:
        """Drop a request (a client that went away): waiting ones leave the queue, a busy slot
        is freed before the next step. False if it had finished or is unknown."""
        res = self._results.get(rid)
        if res is None or res.done:
            return False
        res.cancelled = True
        res.finished_at = self.now
        if res in self._waiting:
            self._waiting.remove(res)
        self._pending = [p for p in self._pending if p[2] is not res]
        heapq.heapify(self._pending)
        for i, slot in enumerate(self._slots):
            if slot is not None and slot.res is res:
                self._slots[i] = None
        return True

    def result(self, rid: int) -> RequestResult:
        return self._results[rid]

    def results(self) -> list[RequestResult]:
        """Every request submitted, in submission order."""
        return list(self._results.values())

    # -- state --

    @property
    def busy(self) -> bool:
        """Slots processing or requests waiting (arrived) for one."""
        return bool(self._waiting) or any(s is not None for s in self._slots)

    @property
    def deferred(self) -> int:
        """Requests that arrived and found no idle slot at the last step's start (the gauge
        requests_deferred)."""
        return len(self._waiting)

    @property
    def next_arrival(self) -> float | None:
        return self._pending[0][0] if self._pending else None

    @property
    def steps(self) -> int:
        return self._steps

    def slots(self) -> list[SlotView]:
        views = []
        for i, slot in enumerate(self._slots):
            if slot is None:
                views.append(SlotView(i, SlotState.IDLE, None, 0, 0, 0, 0, 0, 0))
                continue
            req = slot.res.request
            views.append(
                SlotView(
                    id=i,
                    state=_STATES[slot.state],
                    request=slot.res.id,
                    prompt_tokens=req.prompt_tokens,
                    prompt_done=req.prompt_tokens - slot.prompt_left,
                    n_decoded=slot.res.tokens,
                    max_tokens=req.max_tokens,
                    context=slot.kv,
                    draft=slot.replay or slot.draft,
                )
            )
        return views

    def metrics(self) -> Metrics:
        m = self._metrics
        m.requests_processing = sum(s is not None for s in self._slots)
        m.requests_deferred = len(self._waiting)
        return Metrics(**{**m.__dict__, "accepted_per_pos": list(m.accepted_per_pos)})

    def advance_to(self, t: float) -> None:
        """Move the clock to t while nothing runs (a live server's idle time); it stops at a
        pending arrival before t, which the next step then serves."""
        if t <= self.now:
            return
        if any(s is not None for s in self._slots) or self._waiting:
            raise TwinError("the clock moves by steps while slots are busy")
        if self._pending and self._pending[0][0] < t:
            t = self._pending[0][0]
        if self._noise is not None:
            self._noise.advance(t - self.now)
        self.now = t

    def closed_level(
        self,
        streams: int,
        output_tokens: int | Sequence[int] = 128,
        prompt_tokens: int = 32,
        depth: int = 0,
        seed: int = 0,
    ) -> SimResult:
        """One closed level on this engine (a launch measuring level after level): `streams`
        requests released now, run until they finish; the noise goes on from where it was."""
        work = Workload.closed(streams, output_tokens, prompt_tokens, depth, seed)
        t0, steps0 = self.now, self._steps
        ids = [self.submit(r) for r in work.requests]
        while not all(self._results[i].done for i in ids):
            if self._step(False) is None:
                break
        return SimResult(
            world=self.world.name,
            policy=self.policy,
            requests=tuple(self._results[i] for i in ids),
            duration=self.now - t0,
            steps=self._steps - steps0,
            metrics=self.metrics(),
        )

    # -- stepping --

    def step(self) -> StepResult | None:
        """Run one step; None when there is nothing to do (no busy slot, nobody waiting, no
        future arrival). With only future arrivals the clock first jumps to the next one."""
        return self._step(True)

    def run(self, until: float | None = None) -> int:
        """Step until nothing is left to do (or the clock passes `until`); the steps run."""
        n = 0
        while until is None or self.now < until:
            if self._step(False) is None:
                break
            n += 1
        return n

    def _admit(self) -> list[int]:
        pending = self._pending
        while pending and pending[0][0] <= self.now:
            self._waiting.append(heapq.heappop(pending)[2])
        admitted: list[int] = []
        if not self._waiting:
            return admitted
        slots = self._slots
        for i in range(self._n_parallel):
            if not self._waiting:
                break
            if slots[i] is None:
                res = self._waiting.popleft()
                res.start = self.now
                res.slot = i
                slots[i] = _Slot(i, res, self._n_max, self._class_probs[res.klass], self._lazy)
                admitted.append(res.id)
        return admitted

    def _step(self, record: bool) -> StepResult | bool | None:
        """One llama-server scheduling step: admit, pick the drafts, fill the batch with prompt
        rows, cost it, advance the clock, then verify the drafts and emit. record: return
        the step's StepResult (else True); None when there is nothing to do."""
        took = self._take_slots()
        if took is None:
            return None
        admitted, busy = took
        # The threshold is counted at the step's start: slots in state generating.
        gen = [s for s in busy if s.state == _GEN]
        n_gen = len(gen)
        can_start = self._spec and (self._max_slots == 0 or n_gen <= self._max_slots)
        rows, kv_rows, lens, catch = self._draft(gen, can_start)
        prompt_rows, prefilled = self._fill_prompts(busy, rows)
        cost = self._cost(rows, n_gen, kv_rows, prompt_rows, catch, lens)
        if self._depth_slot:
            cost += self._depth_slot * sum(s.kv for s in gen)
        start = self.now
        duration = self._noise.duration(cost) if self._noise is not None else cost
        end = start + duration
        self.now = end
        self._steps += 1
        m = self._metrics
        m.n_decode_total += 1
        m.n_busy_slots_total += len(busy)
        m.prompt_tokens_total += prompt_rows

        emitted: list[Emission] = []
        finished: list[int] = []
        verified, accepted_step = self._verify(gen, len(lens), end, record, emitted, finished)
        if prefilled:
            self._first_tokens(prefilled, end, record, emitted, finished)
        if not record:
            return True
        return StepResult(
            index=self._steps - 1,
            start=start,
            duration=duration,
            cost=cost,
            generating=n_gen,
            drafts_allowed=can_start,
            rows=rows,
            prompt_rows=prompt_rows,
            drafts_started=len(lens),
            draft_tokens=sum(lens),
            verified=verified,
            accepted=accepted_step,
            admitted=tuple(admitted),
            emitted=tuple(emitted),
            finished=tuple(finished),
        )

    def _take_slots(self) -> tuple[list[int], list[_Slot]] | None:
        """The requests admitted at the step's start and the busy slots; with none busy the
        clock first jumps to the next arrival (None: there is none)."""
        admitted = self._admit()
        slots = self._slots
        busy = [s for s in slots if s is not None]
        if not busy:
            if not self._pending:
                return None
            self.advance_to(self._pending[0][0])
            admitted = self._admit()
            busy = [s for s in slots if s is not None]
        return admitted, busy

    def _draft(self, gen: list[_Slot], can_start: bool) -> tuple[int, int, list[int], int]:
        """Each generating slot's draft for this step: the decode rows, their context rows,
        the lengths of the drafts started and the tokens they catch up."""
        n_max = self._n_max
        rows = 0
        kv_rows = 0
        lens: list[int] = []
        catch = 0
        slot_context = self._slot_context
        if not can_start and not self._replay_mode:
            # Nothing drafts in this step (plain, or the threshold holds): one row a slot.
            for s in gen:
                s.draft = 0
                kv_rows += s.kv
            return len(gen), kv_rows, lens, catch
        for s in gen:
            if s.replay:
                d = s.replay
            elif can_start:
                d = min(n_max, s.left - 1, slot_context - s.kv - 2)
                if d > 0:
                    lens.append(d)
                    catch += s.behind
                    s.behind = 0
                    s.res.draft_n += d
                else:
                    d = 0
            else:
                d = 0
            s.draft = d
            rows += 1 + d
            kv_rows += (1 + d) * s.kv
        return rows, kv_rows, lens, catch

    def _fill_prompts(self, busy: list[_Slot], rows: int) -> tuple[int, list[_Slot]]:
        """Prompt rows fill the batch up to n_batch, slot by slot: the rows taken and the
        slots that took them."""
        prompt_rows = 0
        budget = self._n_batch - rows
        prefilled: list[_Slot] = []
        if budget > 0:
            for s in busy:
                if s.state != _PREFILL:
                    continue
                take = min(s.prompt_left, budget - prompt_rows)
                if take <= 0:
                    break
                s.prompt_left -= take
                s.kv += take
                prompt_rows += take
                prefilled.append(s)
        return prompt_rows, prefilled

    def _cost(
        self, rows: int, n_gen: int, kv_rows: int, prompt_rows: int, catch: int, lens: list[int]
    ) -> float:
        """The step's noise-free duration (seconds)."""
        rows_cost = self._rows
        # A batch of prompt rows alone still runs one forward: rows_ms(1) stands for its part.
        cost = rows_cost[rows or 1] if rows < len(rows_cost) else self._tables.rows_s(rows)
        cost += self._slots_cost[n_gen]
        cost += self._depth * kv_rows + self._prefill * prompt_rows
        if self._spec:
            reeval = self._reeval
            cost += self._overhead + self._prefill_draft * prompt_rows + catch * self._catch_up
            cost += reeval[rows] if rows < len(reeval) else self._tables.reeval_s(rows)
            if lens:
                call = self._call
                d_left = len(lens)
                ends = [0] * (self._n_max + 1)
                for d in lens:
                    ends[d] += 1
                for i in range(max(lens)):
                    cost += call[d_left]
                    d_left -= ends[i + 1]
        return cost

    def _verify(
        self,
        gen: list[_Slot],
        drafts: int,
        end: float,
        record: bool,
        emitted: list[Emission],
        finished: list[int],
    ) -> tuple[int, int]:
        """Verify each generating slot's draft at the step's end and emit what it gives (its
        request's end where its tokens, or its context, are used up): the drafts verified and
        used, and the draft tokens they accepted. drafts: the drafts made in this step (what
        by_drafting counts)."""
        probs = self._probs
        moves = self._moves
        if moves:
            table = self._by_drafting
            per_drafts = (
                1.0
                if table is None
                else table[drafts]
                if drafts < len(table)
                else self.world.drafting_factor(drafts)
            )
            by_depth = self._by_depth
        replay_mode = self._replay_mode
        slot_context = self._slot_context
        verified = accepted_step = 0
        for s in gen:
            d = s.draft
            res = s.res
            k = -1  # the draft tokens accepted where a draft is verified and used
            if d == 0:
                s.behind += 1
                n_out = 1
            elif s.replay:
                # A checkpointed draft replayed: all of it accepted, one more token sampled.
                k = s.replay - 1
                s.replay = 0
                n_out = k + 2
                d = s.draft_len
            else:
                rng = s.rng
                k = 0
                if moves:
                    # the request's class, scaled by the drafts verified together and its depth
                    scale = per_drafts * (by_depth(s.kv) if by_depth is not None else 1.0)
                    own = s.probs
                    while k < d and rng.random() < own[k] * scale:
                        k += 1
                else:
                    while k < d and rng.random() < probs[k]:
                        k += 1
                res.draft_marks.append((end, res.draft_n))
                if replay_mode and k < d:
                    s.replay = k + 1
                    s.draft_len = d
                    n_out, k = 0, -1
                else:
                    n_out = k + 1
            if k >= 0:
                res.draft_log.append((d, k))
                verified += 1
                accepted_step += k
                res.drafts += 1
                res.draft_accepted += k
                per_pos = s.per_pos
                for i in range(k):
                    per_pos[i] += 1
            if n_out:
                res.token_times.extend([end] * n_out)
                s.left -= n_out
                s.kv += n_out
                if record:
                    emitted.append(Emission(res.id, n_out, end))
                if s.left <= 0 or s.kv + 1 >= slot_context:
                    finished.append(res.id)
                    self._finish(s, end)
        return verified, accepted_step

    def _first_tokens(
        self,
        prefilled: list[_Slot],
        end: float,
        record: bool,
        emitted: list[Emission],
        finished: list[int],
    ) -> None:
        """A slot whose prompt is all in generates from here: its first token at the step's
        end (the prompt's last row made it)."""
        for s in prefilled:
            if s.prompt_left == 0:
                s.state = _GEN
                res = s.res
                res.token_times.append(end)
                s.left -= 1
                if record:
                    emitted.append(Emission(res.id, 1, end))
                if s.left <= 0:
                    finished.append(res.id)
                    self._finish(s, end)

    def _finish(self, s: _Slot, end: float) -> None:
        res = s.res
        res.finished_at = end
        self._slots[s.index] = None
        m = self._metrics
        m.tokens_predicted_total += res.tokens
        if self._spec:
            m.spec_decode_num_drafts_total += res.drafts
            m.spec_decode_num_draft_tokens_total += res.draft_n
            m.spec_decode_num_accepted_tokens_total += res.draft_accepted
            for i, n in enumerate(s.per_pos):
                m.accepted_per_pos[i] += n


# -- simulation --


@dataclass(frozen=True)
class SimResult:
    """A workload run through one engine to its end."""

    world: str
    policy: Policy
    requests: tuple[RequestResult, ...]  # in the workload's order
    duration: float  # virtual seconds from its start to its last step's end
    steps: int
    metrics: Metrics

    def window(self) -> tuple[float, float, int] | None:
        """The closed-level window (tuner.measure.load.summarize): from the latest first token
        to the earliest last token, and the tokens emitted inside (begin, end]; None when it is
        empty or a request has fewer than 2 tokens."""
        reqs = self.requests
        if not reqs or any(len(r.token_times) < 2 for r in reqs):
            return None
        begin = max(r.token_times[0] for r in reqs)
        end = min(r.token_times[-1] for r in reqs)
        if end <= begin:
            return None
        tokens = sum(
            bisect_right(r.token_times, end) - bisect_right(r.token_times, begin) for r in reqs
        )
        return begin, end, tokens

    def window_tps(self) -> float | None:
        """Aggregate tok/s inside the window: the tuner's estimand for a closed level."""
        w = self.window()
        return w[2] / (w[1] - w[0]) if w is not None else None

    def samples(self) -> list[RequestSample]:
        return [r.as_sample(i) for i, r in enumerate(self.requests)]

    def level_figures(self) -> LevelFigures:
        """tuner.measure.load.summarize over the requests, as the profiler would see them."""
        from tuner.measure.load import summarize

        return summarize(self.samples(), len(self.requests))

    def open_loop_figures(self, rate: float) -> OpenLoopFigures:
        """tuner.measure.arrivals.summarize_open_loop over the requests."""
        from tuner.measure.arrivals import summarize_open_loop

        return summarize_open_loop(self.samples(), rate)


def simulate(
    world: World,
    policy: Policy | int | None,
    workload: Workload,
    seed: int = 0,
    *,
    noise: bool = True,
) -> SimResult:
    """Run a workload (closed level or open loop) on a fresh engine, in virtual time."""
    engine = Engine(world, policy, seed, noise=noise)
    ids = [
        engine.submit(r, at=t) for r, t in zip(workload.requests, workload.arrivals, strict=True)
    ]
    steps = engine.run()
    return SimResult(
        world=world.name,
        policy=engine.policy,
        requests=tuple(engine.result(i) for i in ids),
        duration=engine.now,
        steps=steps,
        metrics=engine.metrics(),
    )


def closed_level(
    world: World,
    policy: Policy | int | None,
    streams: int,
    output_tokens: int | Sequence[int] = 128,
    prompt_tokens: int = 32,
    depth: int = 0,
    seed: int = 0,
    *,
    noise: bool = True,
) -> SimResult:
    """One closed level: `streams` requests released together (request seeds from `seed`,
    noise seeded by it too)."""
    workload = Workload.closed(streams, output_tokens, prompt_tokens, depth, seed)
    return simulate(world, policy, workload, seed, noise=noise)


def policies(world: World, include_plain: bool = True) -> list[Policy]:
    """plain (optionally), N=0 and N=1..n_parallel at the world's n_max."""
    out: Iterable[Policy] = [Policy.always(world.n_max)] + [
        Policy.threshold(n, world.n_max) for n in range(1, world.n_parallel + 1)
    ]
    return ([Policy.plain()] if include_plain else []) + list(out)
