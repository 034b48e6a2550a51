"""`tuner watch`: the service. Beside a running llama-server it keeps the answer current.

It polls the server the way `tuner observe` does (tuner.measure.observe.Poller: one connection,
four polls a second, never a change to the server) into one bucket per interval (`--every`);
the seconds spent deciding at an interval's end are not polled and count nowhere, and each
decision names the seconds it rests on (`WatchEvent.polled`). The buckets of the last `--window`
make the rolling traffic profile, saved under its name
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

The package, by concern: `envfile` (what a change writes and runs), `rules` (the rolling
traffic, the drift and margin rules, the options, events and summary), `watcher` (the loop's
state and steps); `watch()` here checks the options, binds the metrics port, attaches to the
server and runs the loop.
"""

from __future__ import annotations

from pathlib import Path

from tuner.decide.alarm import Floors, fit_floors
from tuner.decide.watch.envfile import EnvFile
from tuner.decide.watch.rules import (
    DWELL_S,
    MIN_BUSY_S,
    Decision,
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
from tuner.decide.watch.watcher import Watcher
from tuner.decide.watchmetrics import MetricsServer, WatchMetrics
from tuner.errors import ConfigError, TunerError
from tuner.measure.client import LlamaClient
from tuner.measure.hold import ServerHold, recover_left_hold
from tuner.measure.observe import SAMPLE_INTERVAL_S, Poller
from tuner.measure.plan import Observer, ProgressEvent, quiet
from tuner.recommendation import Recommendation
from tuner.storage.store import Store
from tuner.storage.traffic_profiles import server_of
from tuner.traffic import ServerView

__all__ = [
    "DWELL_S",
    "MIN_BUSY_S",
    "Decision",
    "EnvFile",
    "RollingTraffic",
    "WatchEvent",
    "WatchOptions",
    "WatchSummary",
    "Watcher",
    "acceptance_drift",
    "decide",
    "replaces",
    "watch",
]


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
