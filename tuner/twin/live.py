"""The twin's engine as a live server: one thread owns an Engine and steps it in virtual time,
paced against the wall clock, as llama-server's main loop owns its slots.

Nothing else touches the engine. Callers (the HTTP handlers of tuner.twin.server) post commands
to its queue: submit a request, cancel one, change the threshold; the thread applies them
between steps, as llama-server's task queue is served between passes of update_slots. After
every step it publishes an immutable `Snapshot` (slots, /metrics counters, its virtual time) for
/slots and /metrics to read, and hands each request's tokens to `deliver` (on the HTTP side's
event loop) once the step's end has come on the wall clock.

The clock: virtual time runs `speed` times faster than the wall. A step of d virtual seconds
ends d / speed wall seconds after it started; when the thread falls behind (a step computed or
delivered late) the virtual clock waits for it (the anchor moves) rather than jump, so times
stay those of the engine and nothing is ever reported out of order. While nothing runs the
virtual clock follows the wall (the noise process moves on with it).

Requests that reach an idle twin together (a closed level's streams, released at once by the
load generator but sent over a few wall milliseconds) are admitted together, at the virtual
time the first arrived: the thread waits until no new command has come for ADMIT_QUIET_S (at
most ADMIT_MAX_S) before the first step. Without this, whether streams sent together start in
the same step would depend on the speed.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tuner.twin.engine import Engine, Metrics, Request, RequestResult, SlotView, TwinError

# Wall seconds without a new command that end an idle twin's admission, and its longest: a
# client on two busy cores (a test run's other worker) was seen sending a level's 7 streams
# more than 50 ms apart, which at speed 20 started them a second of virtual time apart.
ADMIT_QUIET_S = 0.1
ADMIT_MAX_S = 0.5
IDLE_WAIT_S = 0.5  # an idle thread wakes this often (to notice a stop)


@dataclass(frozen=True)
class Tokens:
    """Tokens one request received at the end of a step (virtual time `time`), with its draft
    counters as of that step. `result` is for the fields the engine set before (arrival, slot,
    start); its lists go on growing in the engine's thread."""

    count: int
    time: float
    result: RequestResult
    draft_n: int
    draft_accepted: int


@dataclass(frozen=True)
class Done:
    """A request finished (the engine no longer changes its result)."""

    result: RequestResult
    time: float


@dataclass(frozen=True)
class Failed:
    """A request the engine refused (one line, as llama-server's 400)."""

    message: str


Event = Tokens | Done | Failed
Deliver = Callable[[list[tuple[int, Event]]], None]  # (ticket, event) pairs, in order


@dataclass(frozen=True)
class SlotTask:
    """The request a slot serves, or served last (llama-server's task_prev)."""

    ticket: int
    prompt_tokens: int
    prompt_done: int
    cached: int
    n_decoded: int
    max_tokens: int
    context: int  # tokens the slot's context holds (a finished one: prompt + output - 1)


@dataclass(frozen=True)
class Snapshot:
    """The engine as of its last step (or its start)."""

    time: float  # virtual seconds at the last step's end
    slots: tuple[SlotView, ...]
    tasks: tuple[SlotTask | None, ...]  # per slot: its request, or its last one
    metrics: Metrics
    steps: int
    waiting: int  # requests waiting for a slot


@dataclass
class _Anchor:
    """Virtual time `virtual` was at wall time `wall`."""

    virtual: float
    wall: float


@dataclass
class LiveEngine:
    """An Engine stepped by a thread of its own (see the module docstring)."""

    engine: Engine
    deliver: Deliver
    speed: float = 1.0
    max_slots: int = 0  # what GET /props reports; the engine follows it from its next step
    wall: Callable[[], float] = time.monotonic
    _commands: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _tickets: dict[int, int] = field(default_factory=dict)  # engine request id -> ticket
    _last: list[SlotTask | None] = field(default_factory=list)
    _anchor: _Anchor = field(default_factory=lambda: _Anchor(0.0, 0.0))
    snapshot: Snapshot | None = None

    def __post_init__(self) -> None:
        if not self.speed > 0:
            raise ValueError(f"speed must be above 0, not {self.speed}")
        self._last = [None] * self.engine.world.n_parallel
        if self.engine.policy.drafting:
            self.max_slots = self.engine.policy.max_slots or 0

    # -- what callers do (any thread) --

    def start(self) -> None:
        self._anchor = _Anchor(self.engine.now, self.wall())
        self._publish()
        self._thread = threading.Thread(target=self._run, name="twin-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._commands.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout=10)

    def submit(self, ticket: int, request: Request) -> None:
        self._commands.put(("submit", ticket, request))

    def cancel(self, ticket: int) -> None:
        self._commands.put(("cancel", ticket))

    def set_max_slots(self, n: int) -> None:
        """The threshold from the next step on (GET /props reports it at once)."""
        self.max_slots = n
        self._commands.put(("max_slots", n))

    def now(self) -> float:
        """Virtual seconds now: the wall clock through the anchor, never behind the engine's
        last step (the engine may be ahead while it waits for a step's end)."""
        anchor = self._anchor
        snap = self.snapshot
        t = anchor.virtual + (self.wall() - anchor.wall) * self.speed
        return max(t, snap.time) if snap is not None else t

    # -- the thread --

    def _run(self) -> None:
        engine = self.engine
        try:
            while not self._stop.is_set():
                if not engine.busy and engine.next_arrival is None:
                    self._idle()
                    continue
                self._apply_all()
                step = engine.step()
                if step is None:  # the commands left nothing to run (a cancel): say so
                    self._publish()
                    continue
                self._pace(step.end)
                events: list[tuple[int, Event]] = []
                for emission in step.emitted:
                    ticket = self._tickets.get(emission.request)
                    if ticket is not None:
                        res = engine.result(emission.request)
                        tokens = Tokens(
                            emission.tokens, emission.time, res, res.draft_n, res.draft_accepted
                        )
                        events.append((ticket, tokens))
                for rid in step.finished:
                    ticket = self._tickets.pop(rid, None)
                    if ticket is not None:
                        result = engine.result(rid)
                        self._remember(ticket, result)
                        events.append((ticket, Done(result, step.end)))
                self._publish()
                if events:
                    self.deliver(events)
        except BaseException as exc:  # the server cannot go on without its engine: say why
            os.write(2, f"twin engine thread failed: {exc!r}\n".encode())
            os._exit(70)

    def _idle(self) -> None:
        """Nothing to run: wait for a command; the virtual clock follows the wall meanwhile.
        The first command after idle time gathers those that come with it (see the module
        docstring) before the next step."""
        try:
            command = self._commands.get(timeout=IDLE_WAIT_S)
        except queue.Empty:
            self._follow_wall()
            return
        self._follow_wall()
        first = self.wall()
        self._apply(command)
        while self.wall() - first < ADMIT_MAX_S:
            try:
                command = self._commands.get(timeout=ADMIT_QUIET_S)
            except queue.Empty:
                break
            self._apply(command)
        self._publish()

    def _follow_wall(self) -> None:
        """Idle: move the engine's clock to the wall's virtual time."""
        anchor = self._anchor
        t = anchor.virtual + (self.wall() - anchor.wall) * self.speed
        # (Until the wall catches up with the engine's last step, the engine waits.)
        if t > self.engine.now:
            self.engine.advance_to(t)

    def _pace(self, end: float) -> None:
        """Wait until the step's end comes on the wall clock; if that has passed, move the
        anchor so the virtual clock resumes from the step's end."""
        anchor = self._anchor
        target = anchor.wall + (end - anchor.virtual) / self.speed
        late = self.wall() - target
        if late < 0:
            self._stop.wait(-late)
        else:
            self._anchor = _Anchor(end, self.wall())

    def _apply_all(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            self._apply(command)

    def _apply(self, command: tuple) -> None:
        kind = command[0]
        engine = self.engine
        if kind == "submit":
            _, ticket, request = command
            try:
                rid = engine.submit(request)
            except TwinError as exc:
                self.deliver([(ticket, Failed(str(exc)))])
                return
            self._tickets[rid] = ticket
        elif kind == "cancel":
            ticket = command[1]
            rid = next((r for r, t in self._tickets.items() if t == ticket), None)
            if rid is not None:
                del self._tickets[rid]
                engine.cancel(rid)
        elif kind == "max_slots" and engine.policy.drafting:
            engine.set_max_slots(command[1])

    def _remember(self, ticket: int, result: RequestResult) -> None:
        """A finished request's final counts stay on its slot (llama-server's task_prev)."""
        if result.slot is None:
            return
        request = result.request
        self._last[result.slot] = SlotTask(
            ticket=ticket,
            prompt_tokens=request.prompt_tokens,
            prompt_done=request.prompt_tokens,
            cached=request.cached_tokens,
            n_decoded=result.tokens,
            max_tokens=request.max_tokens,
            # llama-server never feeds the last token back: the idle slot holds one less
            context=request.prompt_tokens + max(0, result.tokens - 1),
        )

    def _publish(self) -> None:
        engine = self.engine
        slots = tuple(engine.slots())
        for view in slots:
            ticket = self._tickets.get(view.request) if view.request is not None else None
            if ticket is None:
                continue
            request = engine.result(view.request).request
            self._last[view.id] = SlotTask(
                ticket=ticket,
                prompt_tokens=view.prompt_tokens,
                prompt_done=view.prompt_done,
                cached=request.cached_tokens,
                n_decoded=view.n_decoded,
                max_tokens=view.max_tokens,
                context=view.context,
            )
        metrics = engine.metrics()
        self.snapshot = Snapshot(
            time=engine.now,
            slots=slots,
            tasks=tuple(self._last),
            metrics=metrics,
            steps=engine.steps,
            waiting=metrics.requests_deferred,
        )
