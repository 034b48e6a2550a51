"""Traffic, as `tuner observe` and `tuner watch` see it and `recommend --traffic` weighs it: the
time a server spends at each number of generating slots, the requests seen finishing, and the
server they were seen on. A shared type: measure fills it, storage keeps it, decide reads it.
Pure."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

SOURCE_SLOTS = "slots"
SOURCE_METRICS = "metrics"


LENGTHS_KEPT = 4000  # the most recent finished requests a profile keeps (memory stays flat)


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
        )


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
