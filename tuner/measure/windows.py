"""Windows of a server's own traffic, each served at one threshold: what `tuner watch
--experiment` compares (tuner.decide.experiment).

A window's figures (`WindowFigures`) are kept by the number of slots generating, as the
threshold counts them: at each count c, the seconds spent there and the tokens the generating
slots got in them. Their ratio is the window's rate at c (tok/s with c generating: c over the
time per output token there), which is what a threshold changes and nothing else does: two
thresholds differ only at the counts where one drafts and the other does not, and the
concurrency a window happened to see (how many requests arrived) weighs the counts, not the
rate at each. So windows are compared count by count, the concurrency each saw accounted for.
Within each count, the seconds in steps that also read a prompt are kept apart (a slot
processing a request it has decoded nothing of yet, beside the generating ones): such steps run
at another rate, and drafting in them lengthens the read. Beside them: requests finished and
arrived, seconds during which requests waited for a free slot and how many waited at the end (a
backlog that grows window after window: arrivals outrun the server whatever N).

Two backends serve windows (`WindowBackend`): the live server here (`LiveWindows`: watch's
poller over HTTP, the threshold switched through POST /props under a ServerHold, which gives the
threshold it found back on every way out) and the twin in-process, in virtual time
(tuner.twin.production.ServedTraffic). `SlotTokens`, the counting from /slots, is pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tuner.errors import ServerError
from tuner.measure.hold import ServerHold
from tuner.measure.observe import Poller
from tuner.measure.readings import (
    RESTARTED,
    CounterReading,
    counter_reading,
    counter_step,
    slot_generating,
)
from tuner.traffic import TrafficProfile


@dataclass
class WindowFigures:
    """One window at threshold n (0: always draft): seconds and tokens at each number of
    generating slots, on the backend's clock. `problem` says why the window could not be read
    (a restart, the server gone, the threshold changed under it); such a window counts for
    nothing."""

    n: int
    seconds: float = 0.0
    levels: dict[int, list[float]] = field(default_factory=dict)  # c -> [seconds, tokens]
    # c -> seconds of levels[c] during which a slot read its prompt beside the generating ones:
    # steps that read a prompt run at another rate than steps that only decode, and drafting
    # there makes the read longer (benchmarks/count_strata.py)
    reading: dict[int, float] = field(default_factory=dict)
    finished: int = 0
    arrivals: int = 0
    waited_s: float = 0.0  # seconds with requests waiting for a free slot
    backlog: int = 0  # requests waiting for a free slot at the window's end
    problem: str | None = None

    def add(self, count: int, seconds: float, tokens: float, reading: bool = False) -> None:
        cell = self.levels.setdefault(count, [0.0, 0.0])
        cell[0] += seconds
        cell[1] += tokens
        if reading:
            self.reading[count] = self.reading.get(count, 0.0) + seconds

    def at(self, count: int) -> tuple[float, float]:
        seconds, tokens = self.levels.get(count, (0.0, 0.0))
        return seconds, tokens

    def rate(self, count: int, min_tokens: float = 1.0) -> float | None:
        """tok/s while `count` slots generated; None with fewer than min_tokens there."""
        seconds, tokens = self.at(count)
        return tokens / seconds if tokens >= min_tokens and seconds > 0 else None

    @property
    def tokens(self) -> float:
        return sum(tokens for _, tokens in self.levels.values())

    @property
    def slot_seconds(self) -> float:
        """Generating slots x seconds: each token's share of it is its time per output token."""
        return sum(c * seconds for c, (seconds, _) in self.levels.items())

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token over the window's tokens (slot-seconds per token)."""
        return 1000.0 * self.slot_seconds / self.tokens if self.tokens else None

    @property
    def busy_s(self) -> float:
        return sum(seconds for c, (seconds, _) in self.levels.items() if c > 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "seconds": self.seconds,
            "levels": {str(c): list(v) for c, v in sorted(self.levels.items())},
            "reading": {str(c): v for c, v in sorted(self.reading.items())},
            "finished": self.finished,
            "arrivals": self.arrivals,
            "waited_s": self.waited_s,
            "backlog": self.backlog,
            "problem": self.problem,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WindowFigures:
        return cls(
            int(data["n"]),
            float(data.get("seconds") or 0.0),
            {int(c): [float(v[0]), float(v[1])] for c, v in (data.get("levels") or {}).items()},
            reading={int(c): float(v) for c, v in (data.get("reading") or {}).items()},
            finished=int(data.get("finished") or 0),
            arrivals=int(data.get("arrivals") or 0),
            waited_s=float(data.get("waited_s") or 0.0),
            backlog=int(data.get("backlog") or 0),
            problem=data.get("problem"),
        )


class WindowBackend(Protocol):
    """Serves windows of traffic at a threshold, and switches it between them."""

    @property
    def n_slots(self) -> int: ...

    @property
    def elapsed(self) -> float: ...

    def switch(self, n: int) -> None: ...

    def window(self, seconds: float) -> WindowFigures: ...


class SlotTokens:
    """Tokens decoded between two polls of /slots by the slots that generated the same request
    at both (their number: the count the interval is kept under; a slot that started or ended
    in between, and its tokens, are left out alike in every window), and the requests that
    ended (a slot's task gone or changed)."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[Any, int]] = {}  # slot id -> (task, n_decoded) generating
        self.busy: dict[int, Any] = {}  # slot id -> task, processing
        self.started = False
        # whether a slot was processing a request without having decoded a token (reading its
        # prompt) at this poll or the one before: the interval had steps that read a prompt
        self.reading = False
        self._was_reading = False

    def update(self, slots: list[Mapping[str, Any]]) -> tuple[int | None, int, int]:
        """(slots generating the same request at both polls, None at the first poll; tokens
        they decoded since; requests that ended since)."""
        steady = tokens = ended = 0
        seen: dict[int, tuple[Any, int]] = {}
        busy: dict[int, Any] = {}
        reading_now = False
        for slot in slots:
            sid, task = int(slot.get("id", -1)), slot.get("id_task")
            if not slot.get("is_processing"):
                continue
            busy[sid] = task
            if not slot_generating(slot):
                reading_now = True
                continue
            decoded = int(((slot.get("next_token") or [{}])[0]).get("n_decoded") or 0)
            before = self.seen.get(sid)
            if before is not None and before[0] == task and decoded >= before[1]:
                steady += 1
                tokens += decoded - before[1]
            seen[sid] = (task, decoded)
        ended = sum(1 for sid, task in self.busy.items() if busy.get(sid) != task)
        first = not self.started
        self.started, self.seen, self.busy = True, seen, busy
        self.reading, self._was_reading = reading_now or self._was_reading, reading_now
        return (None if first else steady), tokens, ended


class LiveWindows:
    """Windows of a running server's traffic (see the module docstring): watch's poller polls
    on (its traffic profile goes on filling through `profile`, `tick` runs after every poll),
    the threshold is switched through the hold, and /metrics is read at each window's ends for
    a restart (a counter gone down) and requests waiting for a slot."""

    def __init__(
        self,
        poller: Poller,
        hold: ServerHold,
        profile: Callable[[], TrafficProfile],
        tick: Callable[[], None] = lambda: None,
    ) -> None:
        self.poller, self.hold, self.profile, self.tick = poller, hold, profile, tick
        self.clock = 0.0
        self.current: int | None = None

    @property
    def n_slots(self) -> int:
        return self.poller.view.n_slots

    @property
    def elapsed(self) -> float:
        return self.clock

    def switch(self, n: int) -> None:
        self.hold.switch(n)
        self.current = n

    def _reading(self) -> CounterReading | None:
        try:
            return counter_reading(self.poller.client.metrics())
        except ServerError:
            return None

    def window(self, seconds: float) -> WindowFigures:
        assert self.current is not None, "switch before the first window"
        figures = WindowFigures(self.current)
        counting = SlotTokens()
        first = self._reading()
        # the seconds since the last window's last poll (its readings, the decision, the
        # switch) were not polled, and partly at the N before: they count in neither window
        self.poller.resume()

        def on_poll(dt: float | None, slots: list[Mapping[str, Any]]) -> None:
            count, tokens, ended = counting.update(slots)
            if dt is None:
                figures.problem = "the server stopped answering during the window"
                return
            figures.seconds += dt
            figures.finished += ended
            if count is not None:
                figures.add(count, dt, tokens, reading=counting.reading)

        self.poller.on_poll = on_poll
        try:
            while figures.seconds < seconds:
                if not self.poller.step(self.profile()):
                    figures.problem = "the server stopped answering during the window"
                    gone = self.poller.gone_since
                    if gone is not None and self.poller.clock() - gone > seconds:
                        break  # a window's length without an answer: it ends here
                self.tick()
        finally:
            self.poller.on_poll = None
        self.clock += figures.seconds
        last = self._reading()
        if first is not None and last is not None:
            if counter_step(first, last) == RESTARTED:
                figures.problem = "a counter went down during the window (the server restarted)"
            figures.backlog = int(last.deferred)
            if last.deferred > 0:
                figures.waited_s = figures.at(self.n_slots)[0]
        try:
            self.hold.check(self.current)
        except ServerError as exc:
            figures.problem = str(exc)
        return figures
