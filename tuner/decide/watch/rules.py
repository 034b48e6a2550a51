"""What the end of an interval decides from, and by which rules: the rolling traffic of the
last window (one bucket an interval), drift of the traffic and of the acceptance, and when a new
answer replaces the standing N (`replaces`: the margin); beside them the options a watch runs
with, the events it logs and the summary it returns."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.decide.alarm import Floors
from tuner.decide.experiment import (
    ExperimentOptions,
    ExperimentReport,
)
from tuner.errors import ConfigError
from tuner.model.acceptance import ObservedAcceptance
from tuner.recommendation import Recommendation
from tuner.traffic import ServerView, TrafficProfile, total_variation

MIN_BUSY_S = 5.0  # default: below this much busy time in the window, no answer is made from it
DWELL_S = 300.0  # default: the least time between two changes of N


# --- the rolling profile ------------------------------------------------------------------------


@dataclass
class Bucket:
    """One interval's traffic, from its start to its end (epoch seconds; no end while it is
    being polled, or where a restart cut it short)."""

    start: float
    profile: TrafficProfile
    end: float | None = None


@dataclass
class RollingTraffic:
    """The buckets of the last window, oldest first; their sum is the profile decisions use."""

    n_slots: int
    source: str
    window_s: float
    buckets: deque[Bucket] = field(default_factory=deque)

    def open(self, start: float) -> Bucket:
        bucket = Bucket(start, TrafficProfile(self.n_slots, source=self.source))
        self.buckets.append(bucket)
        self.drop_before(start + 1e-9 - self.window_s)
        return bucket

    def drop_before(self, t: float) -> None:
        # Buckets that started before the window: gone (the newest always stays).
        while len(self.buckets) > 1 and self.buckets[0].start < t:
            self.buckets.popleft()

    def polled(self, now: float) -> tuple[tuple[float, float], ...]:
        """The (start, end) epoch seconds the window's buckets were polled over: the time its
        figures stand for (not the gaps between intervals, while a decision was made)."""
        ends = [b.end for b in self.buckets]
        starts = [b.start for b in self.buckets]
        nexts = [*starts[1:], now]
        return tuple(
            (a, e if e is not None else n) for a, e, n in zip(starts, ends, nexts, strict=True)
        )

    def total(self) -> TrafficProfile:
        total = TrafficProfile(self.n_slots, source=self.source)
        for bucket in self.buckets:
            total = total.plus(bucket.profile)
        return total

    def to_dict(self) -> dict[str, Any]:
        """The rolling total as `recommend --traffic` reads it, with the buckets beside it (their
        request lists left out: the total keeps the newest)."""
        data = self.total().to_dict()
        data["window_s"] = self.window_s
        data["buckets"] = [
            {"start": b.start, **{k: v for k, v in b.profile.to_dict().items() if k != "requests"}}
            for b in self.buckets
        ]
        return data

    @classmethod
    def restore(
        cls, data: Mapping[str, Any], n_slots: int, source: str, window_s: float, now: float
    ) -> RollingTraffic:
        """A watcher's saved buckets within the window of now (a restart goes on from them)."""
        rolling = cls(n_slots, source, window_s)
        total = TrafficProfile.from_dict(data)
        for raw in data.get("buckets") or []:
            if float(raw["start"]) >= now - window_s:
                profile = TrafficProfile.from_dict({**raw, "n_slots": n_slots, "requests": []})
                rolling.buckets.append(Bucket(float(raw["start"]), profile))
        if rolling.buckets:
            rolling.buckets[-1].profile.requests.extend(
                r for r in total.requests if r.arrival >= rolling.buckets[0].start
            )
        return rolling


# --- decisions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What the end of an interval decided, and why (one log line)."""

    recommend: bool
    why: str
    drift: float | None = None


def decide(
    rolling: TrafficProfile,
    decided_for: Mapping[int, float] | None,
    drift: float,
    min_busy_s: float = MIN_BUSY_S,
) -> Decision:
    """Whether the rolling profile calls for a new recommendation; pure."""
    busy = rolling.covered_s - rolling.seconds.get(0, 0.0)
    if busy < min_busy_s:
        return Decision(
            False,
            f"{busy:.1f} s of busy time in the window (below {min_busy_s:g} s): the answer stands",
        )
    shares = rolling.shares(busy_only=True)
    if decided_for is None:
        return Decision(True, "no answer made from this traffic yet")
    distance = total_variation(shares, decided_for)
    if distance >= drift:
        return Decision(
            True,
            f"traffic drifted: total-variation distance {distance:.2f} >= {drift:.2f} from the "
            "traffic the standing answer was made for",
            distance,
        )
    return Decision(
        False,
        f"traffic within {distance:.2f} (< {drift:.2f}) of what the standing answer was made "
        "for: it stands",
        distance,
    )


def acceptance_drift(
    now: ObservedAcceptance | None, then: float | None, threshold: float
) -> str | None:
    """Why the acceptance observed now calls for a new answer, or None: observed enough for
    the first time (`then` None: the standing answer rests on the profile's), or moved from
    what the standing answer was made with beyond the observed interval and by at least
    `threshold` of it. Pure."""
    if now is None or now.enough() is not None:
        return None
    lo, hi = now.interval()
    seen = f"{now.mean_length:.2f} tokens a drafting step [{lo:.2f}, {hi:.2f}]"
    if then is None:
        return f"acceptance now observed enough ({seen}) to stand in for the profile's"
    moved = now.mean_length / then - 1.0
    if lo <= then <= hi or abs(moved) < threshold:
        return None
    return (
        f"acceptance drifted: {seen} against {then:.2f} the standing answer was made with "
        f"({moved:+.0%}: beyond its interval and {threshold:.0%})"
    )


def replaces(rec: Recommendation, standing: int | None, margin: float) -> tuple[bool | None, str]:
    """Whether a new answer replaces the standing N: True or False with why, None where the
    model's study did not score the standing N (then two decisions in a row decide). Pure."""
    new = rec.max_slots
    if standing is None:
        return True, "no N stood"
    values = rec.scored()
    top = values.get(new, rec.objective)
    if standing not in values or not top:
        return None, f"the model did not score the standing N={standing}"
    ahead = (top - values[standing]) / abs(top)
    if ahead > margin:
        return True, f"{ahead:.1%} ahead of N={standing} in the model (more than {margin:.0%})"
    return False, (
        f"the model puts N={new} only {ahead:.1%} ahead of the standing N={standing} (within "
        f"{margin:.0%}): N={standing} stands"
    )


@dataclass
class WatchEvent:
    """One interval's outcome, as logged (kept in the summary for tests and the soak)."""

    at: float  # epoch seconds
    decision: Decision
    mean_generating: float
    max_slots: int | None = None  # the answer after this interval
    changed: bool = False
    command_exit: int | None = None
    kind: str = ""  # what it came to, as /metrics counts it (DECISIONS)
    # the (start, end) epoch seconds of the traffic it decided on (the window's intervals, as
    # polled): mean_generating is over these
    polled: tuple[tuple[float, float], ...] = ()


@dataclass
class WatchSummary:
    """What a watch did until it stopped. changes counts every answer that differed from the env
    file's (the first one too, when the file held none); writes, the env-file writes."""

    name: str
    view: ServerView
    events: list[WatchEvent] = field(default_factory=list)
    changes: int = 0
    writes: int = 0
    experiments: list[ExperimentReport] = field(default_factory=list)
    alarms: list[str] = field(default_factory=list)  # the collapse alarms' lines, as said


@dataclass(frozen=True)
class WatchOptions:
    """--every, --window, --drift, --on-change and the recommend options."""

    every_s: float = 3600.0
    window_s: float = 3 * 3600.0
    drift: float = 0.1
    on_change: str | None = None
    on_change_timeout_s: float = 600.0
    recommend: Mapping[str, Any] = field(default_factory=dict)  # objective, slo_tpot_ms, ...
    # "env": write the env file (and run on_change); "live": also set N on the running server
    # through POST /props, read it back, and re-read GET /props every interval.
    apply: str = "env"
    min_busy_s: float = MIN_BUSY_S  # a window with less busy time than this decides nothing
    accept_drift: float = 0.1  # relative move of the observed acceptance that re-decides
    margin: float = 0.01  # a new answer must be ahead of the standing N by more than this
    experiment: ExperimentOptions | None = None  # --experiment: settle each answer live
    dwell_s: float = DWELL_S  # at most one change of N per this many seconds
    metrics_port: int | None = None  # --metrics-port: serve the watch's state (None: off)
    metrics_host: str = "127.0.0.1"

    def check(self) -> None:
        if self.apply not in ("env", "live"):
            raise ConfigError(f"--apply {self.apply!r}: expected env or live")
        if self.experiment is not None:
            if self.apply != "live":
                raise ConfigError(
                    "--experiment switches N on the running server between windows: it needs "
                    "--apply live (the patched llama-server started with --props)"
                )
            self.experiment.check()
        if not 0 < self.accept_drift < 1:
            raise ConfigError(f"--accept-drift {self.accept_drift:g}: a share in (0, 1)")
        if not 0 <= self.margin < 1:
            raise ConfigError(f"--margin {self.margin:g}: a share of the objective in [0, 1)")
        if self.dwell_s < 0:
            raise ConfigError(f"--dwell {self.dwell_s:g} s: a time of 0 or more")
        if self.every_s <= 0:
            raise ConfigError("--every must be above 0")
        if self.window_s < self.every_s:
            raise ConfigError(
                f"--window ({self.window_s:.0f} s) must be at least --every ({self.every_s:.0f} s)"
            )
        if not 0 < self.drift <= 1:
            raise ConfigError(f"--drift {self.drift:g}: a total-variation distance in (0, 1]")
        if not 0 <= self.min_busy_s <= self.window_s:
            raise ConfigError(
                f"--min-busy ({self.min_busy_s:g} s) must be between 0 and --window "
                f"({self.window_s:.0f} s)"
            )


Recommender = Callable[[str], Recommendation]  # traffic name -> the answer for it
# the fit the standing answer rests on (None: the model's newest) and the draft length the
# server runs (None: the fit's) -> its floors, or None
FloorsSource = Callable[[int | None, int | None], Floors | None]
# the standing answer, its N and the traffic -> what the experiment did
Experimenter = Callable[[Recommendation, int, TrafficProfile], ExperimentReport]
