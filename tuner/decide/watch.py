"""`tuner watch`: the service. Beside a running llama-server it keeps the answer current.

It polls the server the way `tuner observe` does (tuner.measure.observe.Poller: one connection,
four polls a second, never a change to the server) into one bucket per interval (`--every`).
The buckets of the last `--window` make the rolling traffic profile, saved under its name
every FLUSH_S, so a crash or kill of the watcher loses at most those seconds; a restarted
watcher reads its buckets back and goes on.

At the end of every interval it compares the rolling profile with the one its standing answer
was made for (total-variation distance of the busy-time shares), and the acceptance observed on
it (the server's own counters, tuner.decide.observed) with the acceptance the standing answer
was made with (`acceptance_drift`: moved beyond its 90 % interval and by at least
`--accept-drift` of it, or observed enough for the first time). When either moved, or when no
answer stands yet, it runs `tuner recommend --traffic NAME` (with the objective asked for).
A new answer replaces the standing N only where the model puts it ahead of the standing N by
more than `--margin` of the objective (`replaces`), or, where the model's study did not score
the standing N, where two decisions in a row gave it: so a server whose best N sits on a tie
does not flap between the tied values. When the answer changes it writes the new
`LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=N` into the env file atomically (a temporary file in the same
folder, renamed over it; other lines kept) and then runs the user's `--on-change` command once.
Decisions happen once per interval, so the command runs at most once per interval. It restarts
nothing itself unless told to. Every decision is one log line that says why.

No thrash: N changes at most once per `--dwell` (default DWELL_S) and only past `--margin`; an
answer the dwell holds back waits (`pending`) and is applied once the dwell has passed, unless
a later answer replaced it or the standing N came back in the meantime. Only the collapse alarm
acts within the dwell: protecting the server does not wait.

Collapse alarm (tuner.decide.alarm): at every interval's end the acceptance the server's
counters show by drafting slots is held against the floor of the standing answer's fit; where it
collapses (below the floor at some count of drafting slots) one line names the count, the build
and the answer that protects the server (N below the collapse, or plain), and that answer is
applied and kept as a ceiling on later answers (while this watch runs), plain as N=1 (a live
switch cannot unload the draft model: the line says to restart without it).

`--metrics-port` serves the watcher's own state for Prometheus (tuner.decide.watchmetrics): the
snapshot is updated as it polls and decides, and a scrape reads nothing else, so it answers while
the database is locked or the server is away. The port is bound before anything else starts.

With `--experiment` (and `--apply live`) each answer the model makes is then settled on the
server's own traffic (tuner.decide.experiment): in short windows the server runs the answer's
contenders instead (the switch held by tuner.measure.hold.ServerHold, so the threshold is given
back on every way out), until the verdicts settle; what it cost the users is logged, and the
experiment (verdicts with their bounds, windows, cost) is stored with the watch's traffic.

SIGTERM or Ctrl-C ends it cleanly: the current bucket is saved, nothing else changes.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.decide.alarm import Floors, draft_length, fit_floors, observed_collapse
from tuner.decide.experiment import (
    Experiment,
    ExperimentOptions,
    ExperimentReport,
    model_tie,
)
from tuner.decide.watchmetrics import MetricsServer, WatchMetrics
from tuner.errors import ConfigError, StorageError, TunerError
from tuner.measure.client import LlamaClient
from tuner.measure.hold import ServerHold, recover_left_hold
from tuner.measure.observe import FLUSH_S, SAMPLE_INTERVAL_S, Poller
from tuner.measure.plan import Observer, ProgressEvent, quiet
from tuner.measure.windows import LiveWindows, WindowBackend, WindowFigures
from tuner.model.acceptance import ObservedAcceptance, observed_acceptance
from tuner.model.collapse import Collapse, seen_in_counts
from tuner.recommendation import ENV_MAX_SLOTS, PLAIN, SETTLED, UNRESOLVED, Recommendation
from tuner.storage import traffic_profiles as traffic_store
from tuner.storage.store import Store
from tuner.storage.traffic_profiles import server_of
from tuner.traffic import ServerView, TrafficProfile, total_variation

MIN_BUSY_S = 5.0  # default: below this much busy time in the window, no answer is made from it
DWELL_S = 300.0  # default: the least time between two changes of N
# the decisions' kinds as counted on /metrics (every label there from the start, at 0)
DECISIONS = (
    "idle", "steady", "recommend_failed", "stands", "held_margin", "held_dwell", "changed",
    "collapse",
)  # fmt: skip
CHANGES = ("start", "recommend", "experiment", "dwell_passed", "collapse")
ERRORS = ("server", "recommend", "env_file", "apply_live", "database", "experiment", "alarm")
EXPERIMENTS_KEPT = 5  # the latest experiments stored with the watch's traffic


# --- the env file -------------------------------------------------------------------------------


class EnvFile:
    """A KEY=VALUE file (systemd's EnvironmentFile, docker's --env-file) the watcher owns one key
    of: written atomically, every other line kept as it was."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def check_writable(self) -> None:
        """Fail now, with the reason, if the file cannot be replaced later."""
        folder = self.path.parent
        if self.path.is_dir():
            raise ConfigError(f"--env-file {self.path}: is a directory")
        try:
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".tuner-check-"):
                pass
        except OSError as exc:
            raise ConfigError(
                f"--env-file {self.path}: cannot write in {folder} ({exc.strerror or exc})"
            ) from None

    def read(self) -> dict[str, str]:
        if not self.path.exists():
            return {}
        values = {}
        for line in self.path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not key.lstrip().startswith("#"):
                values[key.strip()] = value.strip()
        return values

    def current_max_slots(self) -> int | None:
        raw = self.read().get(ENV_MAX_SLOTS)
        try:
            return int(raw) if raw is not None else None
        except ValueError:
            return None

    def write(self, values: Mapping[str, str]) -> None:
        """Set these keys (replacing their lines, or appending), atomically."""
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        pending = dict(values)
        out = []
        for line in lines:
            key = line.partition("=")[0].strip()
            if key in pending:
                out.append(f"{key}={pending.pop(key)}")
            else:
                out.append(line)
        out += [f"{k}={v}" for k, v in pending.items()]
        mode = self.path.stat().st_mode & 0o777 if self.path.exists() else 0o644
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write("\n".join(out) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


# --- the rolling profile ------------------------------------------------------------------------


@dataclass
class Bucket:
    """One interval's traffic, from its start (epoch seconds)."""

    start: float
    profile: TrafficProfile


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
    # epoch seconds where the traffic it decided on began (the oldest bucket of the window):
    # mean_generating is over [since, at]
    since: float | None = None


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


def run_command(command: str, timeout_s: float) -> tuple[int, str]:
    """The user's on-change command in a shell: its exit status and the end of its output."""
    try:
        done = subprocess.run(
            command,
            shell=True,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout_s:.0f} s"
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    return done.returncode, " | ".join(tail)


class Watcher:
    """The watch loop's state: poller, rolling profile, env file, the standing answer, the
    guard against thrash (dwell and margin), the collapse alarm's ceiling, and the snapshot
    /metrics shows."""

    def __init__(
        self,
        store: Store,
        poller: Poller,
        env: EnvFile,
        name: str,
        options: WatchOptions,
        recommender: Recommender,
        observer: Observer = quiet,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        live: LlamaClient | None = None,
        experimenter: Experimenter | None = None,
        floors: FloorsSource | None = None,
        metrics: WatchMetrics | None = None,
    ) -> None:
        self.store, self.poller, self.env, self.name = store, poller, env, name
        self.live = live  # --apply live: the server's threshold, set and read back
        self.options, self.recommender, self.observer = options, recommender, observer
        self.experimenter = experimenter  # --experiment: settles each answer live
        self.floors = floors  # the standing answer's fit's floors: the collapse alarm
        self.clock, self.wall = clock, wall
        view = poller.view
        self.summary = WatchSummary(name, view)
        self.metrics = metrics or WatchMetrics()
        self._start_metrics(view)
        self.rolling = self._restored(view)
        self.decided_for: dict[int, float] | None = None
        # the observed mean accepted length the standing answer was made with (None: the
        # profile's acceptance, the observed one not being enough then)
        self.decided_acceptance: float | None = None
        self.proposed: int | None = None  # the last answer held back by the margin
        self.current = env.current_max_slots()
        self.fit_id: int | None = None  # the fit the standing answer rests on
        self.last_change: float | None = None  # on the clock: the dwell counts from it
        self.pending: tuple[int, str] | None = None  # an answer the dwell holds back, and why
        self.ceiling: int | None = None  # the collapse alarm's: no N above it (0 counts above)
        # the experiments stored with the traffic: a restarted watcher keeps them
        stored = traffic_store.stored_dict(store, name) or {}
        self.experiments: list[dict[str, Any]] = list(stored.get("experiments") or [])
        self.bucket: Bucket | None = None
        self.interval_start = self.last_flush = clock()
        self.save_failing = False
        self.server_up = True

    def log(self, text: str) -> None:
        self.observer(ProgressEvent("message", text=text))

    def _start_metrics(self, view: ServerView) -> None:
        m, opts = self.metrics, self.options
        m.update(
            info={"model": view.model, "url": view.url, "name": self.name, "build": view.build},
            n_slots=view.n_slots,
            dwell_s=opts.dwell_s,
            margin=opts.margin,
        )
        for counter, keys in (
            ("decisions", DECISIONS), ("changes", CHANGES), ("errors", ERRORS),
            ("windows", ("standing", "contender")), ("window_s", ("standing", "contender")),
            ("window_requests", ("standing", "contender")),
        ):  # fmt: skip
            for key in keys:
                m.count(counter, key, 0.0)

    def _restored(self, view: ServerView) -> RollingTraffic:
        data = traffic_store.stored_dict(self.store, self.name)
        if data and data.get("buckets") and int(data.get("n_slots", 0)) == view.n_slots:
            rolling = RollingTraffic.restore(
                data, view.n_slots, view.source, self.options.window_s, self.wall()
            )
            if rolling.buckets:
                kept = sum(b.profile.covered_s for b in rolling.buckets)
                self.log(f"went on from {len(rolling.buckets)} saved intervals ({kept:.0f} s)")
                return rolling
        return RollingTraffic(view.n_slots, view.source, self.options.window_s)

    def save(self, final: bool = False) -> None:
        """The rolling traffic under the watch's name. A database that does not take it (locked
        past its busy timeout, full, gone) is said once and counted; the service goes on and
        tries again at the next flush, the snapshot /metrics shows kept meanwhile."""
        status = "stopped" if final else "watching"
        data = self.rolling.to_dict()
        if self.experiments:
            data["experiments"] = self.experiments[-EXPERIMENTS_KEPT:]
        try:
            traffic_store.save(self.store, self.name, self.poller.view, data, status)
        except StorageError as exc:
            self.metrics.count("errors", "database")
            if not self.save_failing:
                self.log(f"the traffic could not be saved ({exc}); trying again every flush")
            self.save_failing = True
            return
        if self.save_failing:
            self.log("the traffic is saved again")
        self.save_failing = False

    def apply_live_start(self) -> None:
        """--apply live at start: the env file's N, where it holds one, is what should run; a
        server that runs another is given it, and said so as what it is (an application, not
        a server that drifted)."""
        self.keep_live(starting=True)

    def adopt(self, rec: Recommendation | None) -> None:
        """At start: where the env file holds no N, the answer that stands for the model
        (`tuner recommend`'s) is written into it, and set live with --apply live. An env file
        that holds one keeps it: that is what this service applied last."""
        self.metrics.update(standing=self.current)
        if rec is None:
            return
        self.fit_id = rec.fit_id
        if rec.policy.max_slots is None:
            self.log(f"the standing answer is {rec.policy.label}: no N to apply")
            return
        if rec.kind == PLAIN:
            # no env file or live switch removes the draft model: the best threshold is what
            # a server that keeps it can run
            self.log(
                f"the standing answer is {rec.headline()}: restart the server without "
                f"--model-draft to follow it; until then N={rec.max_slots} is the best "
                "threshold for a server that keeps it"
            )
        if self.current is not None:
            if self.current != rec.max_slots:
                self.log(
                    f"{self.env.path} holds N={self.current}, the stored answer N={rec.max_slots}:"
                    " the env file's stands until the traffic says otherwise"
                )
            return
        self.metrics.update(status=status_of(rec))
        self.change(rec.max_slots, f"the standing answer, {rec.headline()}", reason="start")

    def keep_live(self, starting: bool = False) -> None:
        """--apply live: the server must run the standing N. A restarted server (it starts
        from its flags or env file) or a command-line flag that overrides the env file shows
        here as another value: logged and set back. At start (`starting`) the standing N is
        applied for the first time."""
        if self.live is None or self.current is None:
            return
        try:
            seen = self.live.max_slots()
            if seen == self.current:
                if self.metrics.snapshot().applied_at is None:
                    self._applied(seen)  # found in place: applied as far as the watch knows
                return
            self.live.set_max_slots(self.current)
        except TunerError as exc:
            self.metrics.count("errors", "apply_live")
            self.log(f"--apply live: could not check or set N={self.current} ({exc})")
            return
        self._applied(self.current)
        if starting:
            self.log(
                f"applying the standing N={self.current} live (from {self.env.path}); the server "
                f"ran N={seen}"
            )
            return
        self.log(
            f"the server ran N={seen}, not the standing N={self.current} (restarted, or a "
            f"command-line flag overrides the env file): set it back live"
        )

    def _applied(self, n: int) -> None:
        self.metrics.update(applied=n, applied_at=self.wall())
        if hasattr(self.poller, "max_slots"):
            self.poller.max_slots = n  # the drafting slots its requests see

    def apply_live(self, n: int) -> None:
        if self.live is None:
            return
        try:
            self.live.set_max_slots(n)
        except TunerError as exc:
            self.metrics.count("errors", "apply_live")
            self.log(f"--apply live: N={n} not set on the server ({exc}); the env file has it")
            return
        self._applied(n)
        self.log(f"set N={n} on the running server (read back from GET /props)")

    # -- deciding --

    def dwell_left(self) -> float:
        """Seconds until the dwell allows another change of N (0: now)."""
        if self.last_change is None:
            return 0.0
        return max(0.0, self.options.dwell_s - (self.clock() - self.last_change))

    def _decision(self, total: TrafficProfile) -> tuple[Decision, ObservedAcceptance | None]:
        """The traffic's drift rule, then the acceptance's (see the module docstring)."""
        opts = self.options
        decision = decide(total, self.decided_for, opts.drift, opts.min_busy_s)
        observed = observed_acceptance(total.acceptance)
        busy = total.covered_s - total.seconds.get(0, 0.0)
        if decision.recommend or busy < opts.min_busy_s:
            return decision, observed
        moved = acceptance_drift(observed, self.decided_acceptance, opts.accept_drift)
        if moved is not None:
            return Decision(True, moved, decision.drift), observed
        return decision, observed

    def _show_traffic(self, total: TrafficProfile, observed: ObservedAcceptance | None) -> None:
        accepted = None
        if observed is not None:
            lo, hi = observed.interval()
            accepted = (observed.mean_accepted, lo - 1.0, hi - 1.0)
        seen = seen_in_counts(total.by_drafting)
        self.metrics.update(
            mean_generating=total.mean_generating(),
            arrival_rate=total.arrival_rate,
            acceptance=accepted,
            by_drafting={c: v.accepted for c, v in seen.items()},
            last_decision=self.wall(),
        )

    def window_start(self) -> float | None:
        """Epoch seconds where the rolling window's traffic begins (None before any)."""
        return self.rolling.buckets[0].start if self.rolling.buckets else None

    def end_of_interval(self) -> WatchEvent:
        """Decide on the rolling profile; on a new answer write the env file, set it live
        (--apply live) and run the command; with --experiment, settle the answer live. Before
        that: an answer the dwell held back, once it has passed, and the collapse alarm."""
        self.keep_live()
        total = self.rolling.total()
        decision, observed = self._decision(total)
        self._show_traffic(total, observed)
        event = WatchEvent(
            self.wall(), decision, total.mean_generating(), self.current, since=self.window_start()
        )
        self.summary.events.append(event)
        if self._protect(total, event) or self._after_dwell(event):
            return event
        if not decision.recommend:
            self._kind(event, "idle" if "busy time" in decision.why else "steady")
            self.log(f"{total.mean_generating():.2f} slots generating on average; " + decision.why)
            return event
        self.save()
        try:
            rec = self.recommender(self.name)
        except TunerError as exc:
            # A service keeps going: the answer in the env file stands, and the log says why.
            self.metrics.count("errors", "recommend")
            self._kind(event, "recommend_failed")
            self.log(f"{decision.why}; recommend failed ({exc}): the answer stands")
            return event
        self.fit_id = rec.fit_id
        self.decided_for = total.shares(busy_only=True)
        enough = observed is not None and observed.enough() is None
        self.decided_acceptance = observed.mean_length if enough and observed else None
        head = f"{decision.why}; {total.mean_generating():.2f} slots generating on average"
        answer = self._held(rec, head, event)
        event.max_slots = answer
        if answer == rec.max_slots:  # the answer stands on the server (or is about to)
            self.metrics.update(status=status_of(rec))
        if answer != self.current:
            self.change(answer, head, event, reason="recommend")
        if self.experimenter is not None and self.current is not None:
            self.experiment(rec, total)
        return event

    def _kind(self, event: WatchEvent, kind: str) -> None:
        event.kind = kind
        self.metrics.count("decisions", kind)

    def _capped(self, n: int, head: str) -> int:
        """An answer under the collapse alarm's ceiling (N=0 drafts at every count: above it)."""
        if self.ceiling is None or (0 < n <= self.ceiling):
            return n
        self.log(f"{head}: N={n} capped at N={self.ceiling}, below the collapse")
        return self.ceiling

    def _held(self, rec: Recommendation, head: str, event: WatchEvent) -> int | None:
        """The N that stands after a new answer: the answer where it replaces the standing N
        (see `replaces`) and the dwell allows a change, else the standing N (the answer then
        pending until the dwell has passed)."""
        new = self._capped(rec.max_slots, head)
        if new == self.current:
            self.proposed = self.pending = None
            self._kind(event, "stands")
            self.log(f"{head}: N={new} stands")
            return self.current
        verdict, why = (True, "below the collapse") if new != rec.max_slots else (None, "")
        if verdict is None:
            verdict, why = replaces(rec, self.current, self.options.margin)
        if verdict is None:
            verdict = self.proposed == new
            why += (
                "; the same answer twice in a row"
                if verdict
                else f": N={new} waits for a second decision in a row"
            )
        if not verdict:
            self.proposed = new
            self._kind(event, "held_margin")
            self.log(f"{head}: {why}")
            return self.current
        self.proposed = None
        left = self.dwell_left()
        if left > 0:
            self.pending = (new, why)
            self._kind(event, "held_dwell")
            self.log(
                f"{head}: N={new}, {why}; held back by the dwell: N last changed "
                f"{self.options.dwell_s - left:.0f} s ago (--dwell {self.options.dwell_s:.0f} s), "
                f"N={self.current} stands for {left:.0f} s more"
            )
            return self.current
        self._kind(event, "changed")
        self.log(f"{head}: N={new}, {why}")
        return new

    def _after_dwell(self, event: WatchEvent) -> bool:
        """An answer the dwell held back, applied once it has passed (True: it was)."""
        if self.pending is None or self.dwell_left() > 0:
            return False
        n, why = self.pending
        self.pending = None
        if n == self.current:
            return False
        self._kind(event, "changed")
        self.change(n, f"N={n} held back by the dwell ({why}): applied now", event, "dwell_passed")
        event.max_slots = self.current
        return True

    def _protect(self, total: TrafficProfile, event: WatchEvent) -> bool:
        """The collapse alarm: acceptance by drafting slots against the floor of the standing
        answer's fit; where it collapses, the line, and the protective N applied at once (True:
        it was changed)."""
        collapse = self._collapse(total)
        if collapse is None:
            self.metrics.update(collapse_slots=0)
            return False
        line = collapse.line()
        self.summary.alarms.append(line)
        self.metrics.update(collapse_slots=collapse.slots)
        self.metrics.add("collapse_alarms")
        self.log(line)
        if collapse.protected:
            return False
        target = collapse.protective or 1  # plain: N=1 drafts least while the draft stays
        self.ceiling = target if self.ceiling is None else min(self.ceiling, target)
        self.pending = None
        if self.current == target:
            return False
        self._kind(event, "collapse")
        how = "" if collapse.protective else " (plain needs a restart without the draft model)"
        head = f"acceptance collapsed: N={target}{how}, whatever the dwell"
        self.log(head)
        self.change(target, head, event, "collapse")
        event.max_slots = self.current
        return True

    def _collapse(self, total: TrafficProfile) -> Collapse | None:
        if self.floors is None or not total.by_drafting:
            return None
        try:
            floors = self.floors(self.fit_id, draft_length(total))
        except TunerError as exc:
            self.metrics.count("errors", "alarm")
            self.log(f"the collapse alarm has no floor now ({exc})")
            return None
        if floors is None:
            return None
        self.metrics.update(floors={c: f.lower for c, f in floors.floors.items()})
        view = self.poller.view
        return observed_collapse(floors, total, view.build, self.current)

    def change(
        self,
        answer: int | None,
        head: str,
        event: WatchEvent | None = None,
        reason: str = "recommend",
    ) -> None:
        """Write the env file, set it live and run the command for a new standing N; event:
        the interval's, where an interval's end made the change (noted on it)."""
        event = event or WatchEvent(self.wall(), Decision(False, head), 0.0)
        if answer is None:
            return
        before = self.current
        try:
            self.env.write({ENV_MAX_SLOTS: str(answer)})
        except OSError as exc:
            # The service keeps going and tries again at the next interval's end.
            self.decided_for = None
            self.metrics.count("errors", "env_file")
            self.log(
                f"{head}: N={answer}, but {self.env.path} could not be written "
                f"({exc.strerror or exc}); trying again at the next interval"
            )
            return
        self.summary.writes += 1
        self.summary.changes += 1
        self.current = answer
        self.last_change = self.clock()
        self.metrics.count("changes", reason)
        self.metrics.update(standing=answer, next_change=self.wall() + self.options.dwell_s)
        event.changed = True
        was = f"N={before}" if before is not None else "nothing"
        self.log(f"N={answer} (was {was}); wrote {self.env.path}")
        self.apply_live(answer)
        if self.options.on_change:
            code, tail = run_command(self.options.on_change, self.options.on_change_timeout_s)
            event.command_exit = code
            self.log(
                f"ran `{self.options.on_change}`: exit {code}" + (f" ({tail})" if tail else "")
            )

    def experiment(self, rec: Recommendation, total: TrafficProfile) -> None:
        """--experiment: settle the standing N on the server's own traffic; a verdict that
        moves it is applied like an answer (the dwell holding it back as it does any); the
        report is logged and stored."""
        assert self.experimenter is not None and self.current is not None
        self.metrics.update(experiment_running=True)
        try:
            report = self.experimenter(rec, self.current, total)
        except TunerError as exc:
            self.metrics.count("errors", "experiment")
            self.log(f"--experiment: {exc}; N={self.current} stands")
            return
        finally:
            self.metrics.update(experiment_running=False)
        self.summary.experiments.append(report)
        self.experiments.append(report.as_dict())
        self.metrics.count("experiments", report.status)
        self.metrics.update(tpot_ratio=report.cost.tpot_ratio)
        if report.status == SETTLED:
            self.metrics.update(status=SETTLED)
        for line in report.verdicts():
            self.log(f"experiment: {line}")
        self.log(f"experiment {report.status}: N={report.answer}; {report.cost.text()}")
        answer = self._capped(report.answer, "experiment")
        if answer != self.current:
            event = WatchEvent(self.wall(), Decision(True, "experiment"), total.mean_generating())
            self.summary.events.append(event)
            left = self.dwell_left()
            if left > 0:
                self.pending = (answer, "the server's own traffic settled it")
                self._kind(event, "held_dwell")
                self.log(f"experiment: N={answer} held back by the dwell for {left:.0f} s more")
            else:
                self._kind(event, "changed")
                self.change(answer, "the server's own traffic settled it", event, "experiment")
        self.save()

    def tick(self) -> None:
        """After every poll: the snapshot /metrics shows, and the flush (the decision itself
        is run's, between polls)."""
        now = self.clock()
        self._show_poll()
        if now - self.last_flush >= FLUSH_S:
            self.save()
            self.last_flush = now

    def _show_poll(self) -> None:
        poller = self.poller
        up = getattr(poller, "gone_since", None) is None
        if not up and self.server_up:
            self.metrics.count("errors", "server")
        self.server_up = up
        self.metrics.update(
            generating=getattr(poller, "generating", None),
            polls=getattr(poller, "polls", 0),
            server_up=up,
            **({"last_poll": self.wall()} if up else {}),
        )

    def run(self, duration_s: float | None = None) -> WatchSummary:
        """Until SIGTERM/Ctrl-C (or duration_s, for tests and the soak; an experiment under
        way finishes first)."""
        opts = self.options
        view = self.poller.view
        self.log(
            f"watching {view.url} ({view.model}, {view.n_slots} slots) from /{view.source} "
            f"every {self.poller.interval_s * 1000:.0f} ms; deciding every {opts.every_s:.0f} s "
            f"on the last {opts.window_s:.0f} s; env file {self.env.path}"
            + (f" (now N={self.current})" if self.current is not None else "")
        )
        started = self.clock()
        self.bucket = self.rolling.open(self.wall())
        self.interval_start = self.last_flush = self.clock()
        try:
            while duration_s is None or self.clock() - started < duration_s:
                self.poller.step(self.bucket.profile)
                self.tick()
                if self.clock() - self.interval_start >= opts.every_s:
                    began = self.interval_start
                    self.end_of_interval()
                    if self.interval_start == began:  # an experiment opens buckets as it goes
                        self.bucket = self.rolling.open(self.wall())
                        self.interval_start = self.clock()
        except KeyboardInterrupt:
            self.log("stopped: saving the current interval")
        finally:
            self.save(final=True)
        return self.summary

    def live_experimenter(self, hold: Callable[[], ServerHold]) -> Experimenter:
        """The experiment on this watch's server: its windows polled by the watch's poller
        (the rolling traffic goes on filling, a new bucket each interval), N switched under a
        ServerHold made by `hold` for each experiment."""
        opts = self.options.experiment
        assert opts is not None

        def profile() -> TrafficProfile:
            assert self.bucket is not None
            return self.bucket.profile

        def tick() -> None:
            self.tick()
            if self.clock() - self.interval_start >= self.options.every_s:
                self.bucket = self.rolling.open(self.wall())
                self.interval_start = self.clock()

        def run(rec: Recommendation, standing: int, total: TrafficProfile) -> ExperimentReport:
            shares = total.shares()
            experiment = Experiment(
                standing,
                self.poller.view.n_slots,
                opts,
                tie=model_tie(rec, opts.tolerance),
                shares=shares,
                rate=total.arrival_rate,
                output_tokens=total.mean_output_tokens,
                say=lambda text: self.log(f"experiment: {text}"),
            )
            self.log(
                f"experiment from N={standing}: contenders "
                + ", ".join(f"N={n}" for n in experiment.contenders())
                + f"; at most {opts.share:.0%} of the time away from N={standing}, "
                f"{opts.budget_s:.0f} s at most"
            )
            with hold() as held:
                shown = ShownWindows(
                    LiveWindows(self.poller, held, profile, tick), experiment, self.metrics
                )
                try:
                    return experiment.run(shown)
                finally:
                    shown.sync()

        return run


class ShownWindows:
    """A WindowBackend that shows an experiment's windows on /metrics as they are recorded
    (by arm: at the standing N, or at a contender), read from the experiment's report."""

    def __init__(self, backend: WindowBackend, experiment: Experiment, metrics: WatchMetrics):
        self.backend, self.experiment, self.metrics = backend, experiment, metrics
        self.seen = 0

    @property
    def n_slots(self) -> int:
        return self.backend.n_slots

    @property
    def elapsed(self) -> float:
        return self.backend.elapsed

    def sync(self) -> None:
        windows = self.experiment.report.windows
        for planned, figures in windows[self.seen :]:
            arm = "contender" if planned.contender else "standing"
            self.metrics.count("windows", arm)
            self.metrics.count("window_s", arm, figures.seconds)
            self.metrics.count("window_requests", arm, figures.finished)
        self.seen = len(windows)
        self.metrics.update(tpot_ratio=self.experiment.report.cost.tpot_ratio)

    def switch(self, n: int) -> None:
        self.sync()
        self.backend.switch(n)

    def window(self, seconds: float) -> WindowFigures:
        self.sync()
        return self.backend.window(seconds)


def status_of(rec: Recommendation) -> str:
    """The answer's kind as /metrics shows it: settled, tie, unresolved or model."""
    if rec.status == SETTLED and rec.tie:
        return "tie"
    return rec.status if rec.status in (SETTLED, UNRESOLVED, "model") else "model"


def default_name(view: ServerView) -> str:
    return f"watch:{server_of(view.url)}/{view.model}"


def watch(
    store: Store,
    model: str,
    host: str,
    url: str,
    env_path: Path,
    options: WatchOptions,
    observer: Observer = quiet,
    *,
    name: str | None = None,
    api_key: str | None = None,
    duration_s: float | None = None,
    interval_s: float = SAMPLE_INTERVAL_S,
    recommender: Recommender | None = None,
    state_dir: Path | None = None,
    floors: FloorsSource | None = None,
) -> WatchSummary:
    """Check the options, bind --metrics-port (before anything else: a port in use stops it
    here), check the env file, attach to the server and watch it; answers come from
    `recommend --traffic` on model's data for host (or recommender, in tests), the collapse
    alarm's floors from the model's fit (or floors). With state_dir, a threshold a tuner that
    died left switched is given back first."""
    from tuner.decide.advice import recommend

    options.check()
    metrics = WatchMetrics()
    server = (
        MetricsServer(metrics, options.metrics_port, options.metrics_host)
        if options.metrics_port is not None
        else None
    )
    try:
        if server is not None:
            observer(ProgressEvent("message", text=f"serving the watch's /metrics at {server.url}"))
        if state_dir is not None:
            recover_left_hold(url, api_key, state_dir, observer)
        env = EnvFile(env_path)
        env.check_writable()

        def from_model(traffic: str) -> Recommendation:
            return recommend(store, model, host, traffic=traffic, **dict(options.recommend))

        explicit = bool(options.recommend.get("host_explicit", False))
        return _run_watch(
            store, (model, host), url, env, options, observer, name, api_key, duration_s,
            interval_s, recommender or from_model, state_dir, metrics,
            floors or model_floors(store, model, host, explicit),
        )  # fmt: skip
    finally:
        if server is not None:
            server.close()


def model_floors(store: Store, model: str, host: str, host_explicit: bool) -> FloorsSource:
    """The collapse alarm's floors from the model's fit (the one the standing answer rests on,
    else the newest), each fit's computed once."""
    known: dict[tuple[int | None, int | None], Floors | None] = {}

    def floors_of(fit_id: int | None, n_max: int | None) -> Floors | None:
        if (fit_id, n_max) not in known:
            known[fit_id, n_max] = fit_floors(
                store, model, host, host_explicit=host_explicit, fit_id=fit_id, n_max=n_max
            )
        return known[fit_id, n_max]

    return floors_of


def _run_watch(
    store: Store,
    of: tuple[str, str],
    url: str,
    env: EnvFile,
    options: WatchOptions,
    observer: Observer,
    name: str | None,
    api_key: str | None,
    duration_s: float | None,
    interval_s: float,
    recommender: Recommender,
    state_dir: Path | None,
    metrics: WatchMetrics,
    floors: FloorsSource,
) -> WatchSummary:
    """watch() once its options, port and env file are checked: the live switch, the poller,
    the watcher; `of` is the model and host its answers are for."""
    model, host = of
    live = live_switch(url, api_key) if options.apply == "live" else None
    try:
        with Poller(url, observer, api_key=api_key, interval_s=interval_s) as poller:
            watcher = Watcher(
                store,
                poller,
                env,
                name or default_name(poller.view),
                options,
                recommender,
                observer,
                live=live,
                floors=floors,
                metrics=metrics,
            )
            if options.experiment is not None:
                if state_dir is None:
                    raise ConfigError("--experiment needs a state folder for the server's hold")
                folder = state_dir
                watcher.experimenter = watcher.live_experimenter(
                    lambda: ServerHold(url, api_key, folder, observer)
                )
            watcher.adopt(_standing_answer(store, model, host, observer))
            watcher.apply_live_start()
            return watcher.run(duration_s)
    finally:
        if live is not None:
            live.close()


def _standing_answer(
    store: Store, model: str, host: str, observer: Observer
) -> Recommendation | None:
    """The answer that stands for the model at start (None, said, where there is none yet)."""
    from tuner.decide.advice import standing

    try:
        return standing(store, model, host)
    except TunerError as exc:
        observer(ProgressEvent("message", text=f"no stored answer to start from ({exc})"))
        return None


def live_switch(url: str, api_key: str | None) -> LlamaClient:
    """The running server's live switch, checked before anything runs: GET /props must report
    spec_draft_max_slots (the patched server) and POST /props must be accepted (--props), by
    setting the value it already has and reading it back."""
    client = LlamaClient(url, api_key)
    try:
        now = client.max_slots()
        if now is None:
            raise ConfigError(
                f"--apply live: {url} reports no spec_draft_max_slots in GET /props (a "
                "llama-server without the live switch): use --on-change to restart it instead"
            )
        client.set_max_slots(now)
    except BaseException:
        client.close()
        raise
    return client
