"""The watch loop's state and steps (`Watcher`): poll into the rolling traffic, decide at each
interval's end (tuner.decide.watch.rules), apply a new answer (the env file, the live switch,
the on-change command) within the dwell and the margin, raise the collapse alarm, settle answers
live with --experiment, and keep the snapshot /metrics shows."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tuner.decide.alarm import draft_length, observed_collapse
from tuner.decide.experiment import (
    Experiment,
    ExperimentReport,
    model_tie,
)
from tuner.decide.watch.envfile import EnvFile, run_command
from tuner.decide.watch.rules import (
    Bucket,
    Decision,
    Experimenter,
    FloorsSource,
    Recommender,
    RollingTraffic,
    WatchEvent,
    WatchOptions,
    WatchSummary,
    acceptance_drift,
    decide,
    replaces,
)
from tuner.decide.watchmetrics import (
    ShownWindows,
    WatchMetrics,
    status_of,
)
from tuner.errors import StorageError, TunerError
from tuner.measure.client import LlamaClient
from tuner.measure.hold import ServerHold
from tuner.measure.observe import FLUSH_S, Poller
from tuner.measure.plan import Observer, ProgressEvent, quiet
from tuner.measure.windows import LiveWindows
from tuner.model.acceptance import ObservedAcceptance, observed_acceptance
from tuner.model.collapse import Collapse, seen_in_counts
from tuner.recommendation import ENV_MAX_SLOTS, PLAIN, SETTLED, Recommendation
from tuner.storage import traffic_profiles as traffic_store
from tuner.storage.store import Store
from tuner.traffic import ServerView, TrafficProfile

EXPERIMENTS_KEPT = 5  # the latest experiments stored with the watch's traffic


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
        info = {"model": view.model, "url": view.url, "name": name, "build": view.build}
        self.metrics.start(info, view.n_slots, options.dwell_s, options.margin)
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

    def end_of_interval(self) -> WatchEvent:
        """Decide on the rolling profile; on a new answer write the env file, set it live
        (--apply live) and run the command; with --experiment, settle the answer live. Before
        that: an answer the dwell held back, once it has passed, and the collapse alarm."""
        now = self.wall()
        if self.bucket is not None:
            self.bucket.end = now
        self.keep_live()
        total = self.rolling.total()
        decision, observed = self._decision(total)
        self._show_traffic(total, observed)
        event = WatchEvent(
            now, decision, total.mean_generating(), self.current, polled=self.rolling.polled(now)
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
                    # the seconds spent deciding were not polled: counted nowhere
                    self.poller.resume()
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
