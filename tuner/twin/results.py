"""What the twin's engine reports: a step (`StepResult`, its `Emission`s), a slot (`SlotView`,
`SlotState`), llama-server's /metrics counters (`Metrics`), one request as a client sees it
(`RequestResult`) and a workload run to its end (`SimResult`), with the load generator's and
the open-loop summaries over it. Pure.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from tuner.policy import Policy
from tuner.twin.workload import Request

if TYPE_CHECKING:
    from tuner.measure.arrivals import OpenLoopFigures
    from tuner.measure.load import LevelFigures, RequestSample

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
