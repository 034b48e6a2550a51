"""Traffic, as `tuner observe` and `tuner watch` see it and `recommend --traffic` weighs it: the
time a server spends at each number of generating slots, the requests seen finishing, the
server's own acceptance counters over the same time (`AcceptanceCounts`), and the server they
were seen on. A shared type: measure fills it, storage keeps it, decide reads it. Pure."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

SOURCE_SLOTS = "slots"
SOURCE_METRICS = "metrics"


LENGTHS_KEPT = 4000  # the most recent finished requests a profile keeps (memory stays flat)


@dataclass
class AcceptanceCounts:
    """The server's acceptance counters over an observation, as increments between readings.

    llama-server adds a request's drafts (`spec_decode_num_drafts_total`), draft tokens and
    accepted tokens, in all and per draft position
    (`spec_decode_num_accepted_tokens_per_pos_total{position}`), when the request ends; so
    the increase between two readings of /metrics belongs to the requests that ended between
    them, and readings are groups of whole requests. Kept are the totals and, for the interval
    (tuner.model.acceptance.observed_acceptance: a ratio estimate, its variance from the spread
    of the readings, which carries the requests' own differences), the sums of squares and
    products of each reading's increments: d (drafts) and x = (accepted, accepted at position
    1, 2, ...). Sums add, so buckets and observations combine (`plus`) and the size stays flat.

    `per_position` is False once the server reported drafts without per-position counts (a
    build without that family): accepted and drafts still give the mean, not the rates.
    `dropped` counts the readings left out because a counter went down (a restart); `tokens`
    is tokens_predicted_total's increase over the readings kept (what was generated, drafted
    or not)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    tokens: float = 0.0
    readings: int = 0  # increments added
    x: list[float] = field(default_factory=list)  # sum of x: accepted, then per position
    dd: float = 0.0  # sum of d^2
    xd: list[float] = field(default_factory=list)  # sum of x * d
    xx: list[list[float]] = field(default_factory=list)  # sum of x x^T
    per_position: bool = True
    dropped: int = 0

    @property
    def accepted(self) -> float:
        return self.x[0] if self.x else 0.0

    @property
    def positions(self) -> list[float]:
        """Accepted tokens at draft positions 1, 2, ... (empty without per-position counts)."""
        return list(self.x[1:]) if self.per_position else []

    def _grow(self, size: int) -> None:
        while len(self.x) < size:
            self.x.append(0.0)
            self.xd.append(0.0)
            for row in self.xx:
                row.append(0.0)
            self.xx.append([0.0] * len(self.x))

    def add(
        self,
        drafts: float,
        draft_tokens: float,
        accepted: float,
        positions: list[float] | None,
        tokens: float = 0.0,
    ) -> None:
        """One reading's increments (positions None: the server gave no per-position counts)."""
        if positions is None and drafts > 0:
            self.per_position = False
        vector = [accepted, *(positions or [])] if self.per_position else [accepted]
        self._grow(len(vector))
        vector += [0.0] * (len(self.x) - len(vector))
        self.drafts += drafts
        self.draft_tokens += draft_tokens
        self.tokens += tokens
        self.readings += 1
        self.dd += drafts * drafts
        for i, v in enumerate(vector):
            self.x[i] += v
            self.xd[i] += v * drafts
            row = self.xx[i]
            for k, w in enumerate(vector):
                row[k] += v * w

    def plus(self, other: AcceptanceCounts) -> AcceptanceCounts:
        out = AcceptanceCounts.from_dict(self.to_dict())
        size = max(len(self.x), len(other.x))
        out._grow(size)
        theirs = AcceptanceCounts.from_dict(other.to_dict())
        theirs._grow(size)
        out.drafts += theirs.drafts
        out.draft_tokens += theirs.draft_tokens
        out.tokens += theirs.tokens
        out.readings += theirs.readings
        out.dd += theirs.dd
        out.dropped += theirs.dropped
        for i in range(size):
            out.x[i] += theirs.x[i]
            out.xd[i] += theirs.xd[i]
            for k in range(size):
                out.xx[i][k] += theirs.xx[i][k]
        if not (self.per_position and other.per_position):
            out._drop_positions()
        return out

    def _drop_positions(self) -> None:
        self.per_position = False
        self.x, self.xd = self.x[:1], self.xd[:1]
        self.xx = [row[:1] for row in self.xx[:1]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "tokens": self.tokens,
            "readings": self.readings,
            "x": list(self.x),
            "dd": self.dd,
            "xd": list(self.xd),
            "xx": [list(row) for row in self.xx],
            "per_position": self.per_position,
            "dropped": self.dropped,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AcceptanceCounts:
        return cls(
            drafts=float(data.get("drafts") or 0.0),
            draft_tokens=float(data.get("draft_tokens") or 0.0),
            tokens=float(data.get("tokens") or 0.0),
            readings=int(data.get("readings") or 0),
            x=[float(v) for v in data.get("x") or []],
            dd=float(data.get("dd") or 0.0),
            xd=[float(v) for v in data.get("xd") or []],
            xx=[[float(v) for v in row] for row in data.get("xx") or []],
            per_position=bool(data.get("per_position", True)),
            dropped=int(data.get("dropped") or 0),
        )


class Finished(NamedTuple):
    """A request seen finishing: when it was first seen in a slot (epoch seconds), its lengths."""

    arrival: float
    prompt: int
    output: int


@dataclass
class TrafficProfile:
    """Seconds spent at each number of generating slots, and the requests seen finishing.

    Counters cover the whole observation; of the requests themselves only the most recent
    LENGTHS_KEPT are kept (their arrival times are the trace `validate --arrivals trace`
    replays), so a profile observed for days stays the same size.
    """

    n_slots: int
    seconds: dict[int, float] = field(default_factory=dict)
    requests: deque[Finished] = field(default_factory=lambda: deque(maxlen=LENGTHS_KEPT))
    samples: int = 0
    source: str = SOURCE_SLOTS
    finished: int = 0  # requests seen finishing, all of them
    output_total: int = 0  # their output tokens, all of them
    acceptance: AcceptanceCounts = field(default_factory=AcceptanceCounts)
    # readings of /metrics, and those at which requests waited for a free slot
    # (requests_deferred above 0: the server at capacity, its arrival rate the rate it served)
    readings: int = 0
    deferred: int = 0
    # The same counters by the number of slots drafting together while the requests of a
    # reading drafted (their drafting steps' mean, rounded): acceptance by drafting slots, what
    # tuner.model.collapse holds against the floor. Accepted tokens only (no positions).
    by_drafting: dict[int, AcceptanceCounts] = field(default_factory=dict)
    # the threshold (--spec-draft-max-slots; 0: always draft) the server ran while observed,
    # where known: the counts whose drafts the acceptance counters saw; None unknown or mixed
    max_slots: int | None = None

    def add_drafting(self, slots: int, drafts: float, draft_tokens: float, accepted: float) -> None:
        """One reading's draft counters, attributed to `slots` drafting together."""
        counts = self.by_drafting.setdefault(slots, AcceptanceCounts(per_position=False))
        counts.add(drafts, draft_tokens, accepted, None)

    def add(self, generating: int, dt: float) -> None:
        self.seconds[generating] = self.seconds.get(generating, 0.0) + dt
        self.samples += 1

    def add_finished(self, request: Finished) -> None:
        self.requests.append(request)
        self.finished += 1
        self.output_total += request.output

    @property
    def prompt_tokens(self) -> list[int]:
        return [r.prompt for r in self.requests]

    @property
    def output_tokens(self) -> list[int]:
        return [r.output for r in self.requests]

    @property
    def covered_s(self) -> float:
        return sum(self.seconds.values())

    @property
    def arrival_rate(self) -> float | None:
        """Requests per observed second (those seen finishing); None before any finished."""
        return self.finished / self.covered_s if self.finished and self.covered_s > 0 else None

    @property
    def mean_output_tokens(self) -> float | None:
        return self.output_total / self.finished if self.finished else None

    def shares(self, busy_only: bool = False) -> dict[int, float]:
        """Share of the time at each count (busy_only: of the time at least one generated)."""
        items = {k: v for k, v in self.seconds.items() if k > 0 or not busy_only}
        total = sum(items.values())
        return {k: v / total for k, v in sorted(items.items())} if total > 0 else {}

    def weights(self, n_parallel: int) -> dict[int, float]:
        """Workload weights for the objective: the share of busy time at each 1..n_parallel
        (the time nothing generates serves no tokens under any N)."""
        shares = self.shares(busy_only=True)
        return {c: shares.get(c, 0.0) for c in range(1, n_parallel + 1)}

    def mean_generating(self) -> float:
        total = self.covered_s
        return sum(k * v for k, v in self.seconds.items()) / total if total else 0.0

    def plus(self, other: TrafficProfile) -> TrafficProfile:
        """This profile and a later one together (the later one's slots and source)."""
        seconds = dict(self.seconds)
        for k, v in other.seconds.items():
            seconds[k] = seconds.get(k, 0.0) + v
        requests: deque[Finished] = deque(self.requests, maxlen=LENGTHS_KEPT)
        requests.extend(other.requests)
        return TrafficProfile(
            other.n_slots,
            seconds,
            requests,
            self.samples + other.samples,
            other.source,
            self.finished + other.finished,
            self.output_total + other.output_total,
            self.acceptance.plus(other.acceptance),
            self.readings + other.readings,
            self.deferred + other.deferred,
            _by_drafting_plus(self.by_drafting, other.by_drafting),
            self.max_slots if self.max_slots == other.max_slots else None,
        )

    def to_dict(self) -> dict[str, Any]:
        def summary(values: list[int]) -> dict[str, float] | None:
            if not values:
                return None
            ordered = sorted(values)
            return {
                "n": len(ordered),
                "median": float(statistics.median(ordered)),
                "mean": float(statistics.fmean(ordered)),
                "p90": float(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]),
                "max": float(ordered[-1]),
            }

        return {
            "n_slots": self.n_slots,
            "seconds": {str(k): v for k, v in sorted(self.seconds.items())},
            "samples": self.samples,
            "source": self.source,
            "covered_s": self.covered_s,
            "mean_generating": self.mean_generating(),
            "finished": self.finished,
            "output_total": self.output_total,
            "arrival_rate": self.arrival_rate,
            "prompt_tokens": summary(self.prompt_tokens),
            "output_tokens": summary(self.output_tokens),
            "requests": [[round(r.arrival, 3), r.prompt, r.output] for r in self.requests],
            "acceptance": self.acceptance.to_dict(),
            "readings": self.readings,
            "deferred": self.deferred,
            "by_drafting": {str(k): v.to_dict() for k, v in sorted(self.by_drafting.items())},
            "max_slots": self.max_slots,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrafficProfile:
        requests: deque[Finished] = deque(
            (Finished(float(a), int(p), int(o)) for a, p, o in data.get("requests") or []),
            maxlen=LENGTHS_KEPT,
        )
        return cls(
            n_slots=int(data["n_slots"]),
            seconds={int(k): float(v) for k, v in (data.get("seconds") or {}).items()},
            requests=requests,
            samples=int(data.get("samples") or 0),
            source=str(data.get("source") or SOURCE_SLOTS),
            finished=int(data.get("finished") or len(requests)),
            output_total=int(data.get("output_total") or sum(r.output for r in requests)),
            acceptance=AcceptanceCounts.from_dict(data.get("acceptance") or {}),
            readings=int(data.get("readings") or 0),
            deferred=int(data.get("deferred") or 0),
            by_drafting={
                int(k): AcceptanceCounts.from_dict(v)
                for k, v in (data.get("by_drafting") or {}).items()
            },
            max_slots=None if data.get("max_slots") is None else int(data["max_slots"]),
        )


def _by_drafting_plus(
    a: Mapping[int, AcceptanceCounts], b: Mapping[int, AcceptanceCounts]
) -> dict[int, AcceptanceCounts]:
    out = {k: AcceptanceCounts.from_dict(v.to_dict()) for k, v in a.items()}
    for k, v in b.items():
        out[k] = out[k].plus(v) if k in out else AcceptanceCounts.from_dict(v.to_dict())
    return out


def total_variation(p: Mapping[int, float], q: Mapping[int, float]) -> float:
    """Half the L1 distance between two distributions over counts (each summing to 1)."""
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


@dataclass
class ServerView:
    """What observe learnt about the server when it attached."""

    url: str
    model: str
    n_slots: int
    source: str
    counters: bool = False  # /metrics answers: outputs come from tokens_predicted_total
    build: str = ""  # GET /props' build_info: the build a collapse alarm names
    max_slots: int = 0  # the threshold the server ran at attach (0: no limit, or unpatched)
