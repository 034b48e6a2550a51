"""What polls of a running llama-server tell, pure (tuner.measure.observe polls): which slots
are generating (processing, with a token decoded), the seconds at each count from a load
generator's own token times, the requests seen finishing and their outputs split from the
server's counter (`FinishedRequests`, `split_tokens`, `TokenLedger`), the draft counters read and
stepped between readings (`counter_reading`, `counter_step`: a counter that went down is a
restart), and each request's drafting time by generating count (`DraftingExposure`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tuner.measure.metrics import PER_POSITION, Metrics
from tuner.traffic import (
    Finished,
)

DRAFTS = "spec_decode_num_drafts_total"
DRAFT_TOKENS = "spec_decode_num_draft_tokens_total"
ACCEPTED = "spec_decode_num_accepted_tokens_total"


def slot_generating(slot: Mapping[str, Any]) -> bool:
    """A slot is generating once it processes a request and has decoded a token."""
    if not slot.get("is_processing"):
        return False
    nxt = slot.get("next_token") or [{}]
    return int((nxt[0] if isinstance(nxt, list) and nxt else {}).get("n_decoded") or 0) > 0


def served_time(slots: list[Mapping[str, Any]]) -> float | None:
    """The server's own clock at this poll, where its /slots carry it (the twin's t_server);
    None from llama-server, whose polls are timed on the client's clock."""
    for slot in slots:
        if slot.get("t_server") is not None:
            return float(slot["t_server"])
    return None


def generating_slots(slots: list[Mapping[str, Any]]) -> int:
    return sum(slot_generating(s) for s in slots)


def generating_histogram(
    intervals: list[tuple[float, float]], start: float, end: float
) -> dict[int, float]:
    """Seconds at each number of overlapping (first token, last token) intervals within
    [start, end]: what a load generator offered, to set beside what observe saw."""
    events = sorted(
        [(max(a, start), 1) for a, b in intervals if b > start and a < end]
        + [(min(b, end), -1) for a, b in intervals if b > start and a < end]
    )
    seconds: dict[int, float] = {}
    count, last = 0, start
    for t, step in events:
        seconds[count] = seconds.get(count, 0.0) + (t - last)
        count, last = count + step, t
    seconds[count] = seconds.get(count, 0.0) + (end - last)
    return {k: v for k, v in seconds.items() if v > 0}


class Ended(NamedTuple):
    """A request seen ending, before its output is settled: what polling tells about it."""

    arrival: float
    prompt: int
    low: int  # tokens decoded when last seen generating (the output is at least this)
    high: int | None  # decoded + remaining then: what it was allowed (None: no limit)
    exact: int | None = None  # from its idle slot's context, when seen idle before reuse

    def finished(self, output: int | None = None) -> Finished:
        """As finished with this output (default: the exact one, else the last seen)."""
        if output is None:
            output = self.exact if self.exact is not None else self.low
        return Finished(self.arrival, self.prompt, output)


class _Followed(NamedTuple):
    task: Any
    arrival: float
    prompt: int
    decoded: int
    high: int | None


@dataclass
class FinishedRequests:
    """Follows each slot's task from poll to poll; a task that left its slot has ended."""

    current: dict[int, _Followed] = field(default_factory=dict)

    def update(self, slots: list[Mapping[str, Any]], now: float = 0.0) -> list[Ended]:
        """The requests seen ending since the last poll; now (epoch seconds) is when a task
        first seen in this poll arrived, as near as polling tells."""
        done: list[Ended] = []
        for slot in slots:
            sid = int(slot.get("id", -1))
            task = slot.get("id_task")
            nxt = (slot.get("next_token") or [{}])[0]
            context = int(slot.get("n_prompt_tokens") or 0)
            decoded = int(nxt.get("n_decoded") or 0)
            # The prompt: what the slot read plus what it found cached (its timings' prompt_n and
            # cache_n). The context less the decoded tokens also holds a draft being verified.
            read = slot.get("n_prompt_tokens_processed")
            prompt = (
                int(read) + int(slot.get("n_prompt_tokens_cache") or 0)
                if read is not None
                else context - decoded
            )
            before = self.current.get(sid)
            if before is not None and before.task != task:
                # The slot took another request: the one followed ended after the last poll.
                done.append(Ended(before.arrival, before.prompt, before.decoded, before.high))
                del self.current[sid]
                before = None
            if slot.get("is_processing"):
                remain = int(nxt.get("n_remain", -1))
                self.current[sid] = _Followed(
                    task,
                    before.arrival if before is not None else now,
                    # One still reading its prompt shows only the part read so far.
                    prompt if decoded > 0 else max(prompt, before.prompt if before else 0),
                    decoded,
                    decoded + remain if remain >= 0 else None,
                )
            elif before is not None:
                # Same request, now ended. Its idle slot keeps the context (prompt + output - 1:
                # the last token is never fed back) while its counts are reset (seen on the
                # bench, plain and drafting, ended at the limit or by a stop).
                exact: int | None = context - before.prompt + 1 if before.decoded > 0 else None
                if exact is not None and (
                    exact < before.decoded or (before.high is not None and exact > before.high)
                ):
                    exact = None  # the slot's cache changed under us: not to be trusted
                ended = Ended(before.arrival, before.prompt, before.decoded, before.high, exact)
                done.append(ended)
                del self.current[sid]
        return done


def split_tokens(total: int, bounds: list[tuple[int, int | None]]) -> list[int]:
    """Split `total` tokens over requests that ended together, each within its (low, high)
    (high None: no limit): every one gets its low, then the rest goes one equal step at a time
    to those below their high, as slots generating side by side gain about the same per step.
    Exact when there is one request or every one ran to its high. Tokens left over once all are
    at their high belong to requests never seen (they started and ended between two polls)."""
    out = [low for low, _ in bounds]
    left = total - sum(out)
    while left > 0:
        room = [i for i, (_, high) in enumerate(bounds) if high is None or out[i] < high]
        if not room:
            break
        caps = [bounds[i][1] - out[i] for i in room if bounds[i][1] is not None]
        step = min([left // len(room), *caps])
        if step == 0:
            for i in room[:left]:
                out[i] += 1
            break
        for i in room:
            out[i] += step
        left -= step * len(room)
    return out


@dataclass
class TokenLedger:
    """Outputs from tokens_predicted_total: the counter at the last settlement, and the
    requests seen ending since."""

    base: float | None = None
    waiting: list[Ended] = field(default_factory=list)

    def settle(self, counter: float) -> list[Finished]:
        """The waiting requests with their outputs, at a counter reading taken while no request
        ended; everything the counter gained since the last settlement is theirs."""
        waiting, self.waiting = self.waiting, []
        if self.base is None or counter < self.base:
            # First reading (or the server restarted): no increase to split.
            done = [e.finished() for e in waiting]
        else:
            # The counter decides; an idle slot's context (exact) only stands in without it.
            outputs = split_tokens(round(counter - self.base), [(e.low, e.high) for e in waiting])
            done = [e.finished(n) for e, n in zip(waiting, outputs, strict=True)]
        self.base = counter
        return [f for f in done if f.output > 0]

    def reset(self) -> list[Finished]:
        """The server went away: what waits is kept as seen, and the counter read anew."""
        done = [e.finished() for e in self.waiting if e.finished().output > 0]
        self.base, self.waiting = None, []
        return done


class CounterReading(NamedTuple):
    """The counters of one /metrics reading that acceptance and saturation are read from."""

    drafts: float
    draft_tokens: float
    accepted: float
    positions: tuple[float, ...] | None  # accepted per draft position; None: no such family
    tokens: float  # tokens_predicted_total
    deferred: float  # requests_deferred (a gauge): requests waiting for a free slot


def counter_reading(scrape: Metrics) -> CounterReading | None:
    """The draft counters of a scrape; None where it has none (no spec_decode_num_drafts_total:
    a server that reports no drafting)."""
    if DRAFTS not in scrape:
        return None
    by_position = {int(k): v for k, v in scrape.by_label(PER_POSITION, "position").items()}
    width = max(by_position) + 1 if by_position else 0
    positions = tuple(by_position.get(i, 0.0) for i in range(width)) if by_position else None
    return CounterReading(
        scrape.value(DRAFTS),
        scrape.value(DRAFT_TOKENS),
        scrape.value(ACCEPTED),
        positions,
        scrape.value("tokens_predicted_total"),
        scrape.value("requests_deferred"),
    )


RESTARTED = "restarted"


def counter_step(
    before: CounterReading, after: CounterReading
) -> tuple[float, float, float, list[float] | None, float] | str:
    """The increments from one reading to the next (drafts, draft tokens, accepted, accepted per
    position or None, tokens), or RESTARTED where a counter went down: the server restarted
    between them (its counters began again from 0), and the interval cannot be read."""
    firsts = (before.drafts, before.draft_tokens, before.accepted, before.tokens)
    lasts = (after.drafts, after.draft_tokens, after.accepted, after.tokens)
    if any(b < a for a, b in zip(firsts, lasts, strict=True)):
        return RESTARTED
    positions: list[float] | None = None
    if after.positions is not None:
        old = list(before.positions or ())
        old += [0.0] * (len(after.positions) - len(old))
        if len(old) > len(after.positions) or any(
            b < a for a, b in zip(old, after.positions, strict=True)
        ):
            return RESTARTED
        positions = [b - a for a, b in zip(old, after.positions, strict=True)]
    return (
        after.drafts - before.drafts,
        after.draft_tokens - before.draft_tokens,
        after.accepted - before.accepted,
        positions,
        after.tokens - before.tokens,
    )


CLEAN_SHARE = 0.8  # a reading is put at one drafting count where its requests drafted there so long


@dataclass
class DraftingExposure:
    """What each request saw while it could draft: for each (slot, task), the seconds at each
    number of drafting slots (the generating count, at polls where new drafts could start), so
    the drafts a reading counts can be put at the count their requests drafted at."""

    seen: dict[tuple[int, Any], dict[int, float]] = field(default_factory=dict)

    def poll(self, slots: list[Mapping[str, Any]], dt: float | None, max_slots: int) -> None:
        """One poll: dt seconds at the generating count seen, where drafts could start."""
        if not dt or dt <= 0:
            return
        generating = [s for s in slots if slot_generating(s)]
        count = len(generating)
        if not count or (max_slots > 0 and count > max_slots):
            return  # nothing generates, or the threshold starts no draft
        for slot in generating:
            cell = self.seen.setdefault((int(slot.get("id", -1)), slot.get("id_task")), {})
            cell[count] = cell.get(count, 0.0) + dt

    def ended(self, slots: list[Mapping[str, Any]]) -> int | None:
        """The drafting slots the requests ended since the last call drafted at, dropping them:
        the count that holds CLEAN_SHARE of their drafting time or more; None where none does
        (their drafts mix counts, and acceptance by count cannot be told from them) or none of
        them could draft."""
        live = {(int(s.get("id", -1)), s.get("id_task")) for s in slots if s.get("is_processing")}
        done = [key for key in self.seen if key not in live]
        by_count: dict[int, float] = {}
        for key in done:
            for count, seconds in self.seen.pop(key).items():
                by_count[count] = by_count.get(count, 0.0) + seconds
        total = sum(by_count.values())
        if total <= 0:
            return None
        count, seconds = max(by_count.items(), key=lambda kv: kv[1])
        return count if seconds >= CLEAN_SHARE * total else None
