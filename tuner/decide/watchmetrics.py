"""`tuner watch --metrics-port`: the watcher's own state in Prometheus' text format.

The watcher keeps a snapshot of what it knows (`WatchState`), updated as it polls, decides,
applies and experiments; a scrape reads a copy of that snapshot under a lock and nothing else:
never the database, never the llama-server. So a scrape while the database is locked, or while
the watcher waits on the server, answers at once with the last known values.

Served by prometheus_client on a registry of its own (`CollectorRegistry`, not the global
one), from a daemon thread, bound before anything else of the watch starts: a port in use is
one error line and nothing has run. Names follow Prometheus' conventions: the `tuner_watch_`
prefix, units in the name (`_seconds`, `_tokens`, `_per_second`), counters ending `_total`;
`METRICS` lists every family with its help (docs/service.md shows them, the dashboard in
docs/grafana/ queries them).
"""

from __future__ import annotations

import copy
import errno
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tuner.decide.experiment import Experiment
from tuner.errors import ConfigError
from tuner.measure.windows import WindowBackend, WindowFigures
from tuner.recommendation import SETTLED, UNRESOLVED, Recommendation

STATUSES = ("settled", "tie", "unresolved", "model", "none")  # the standing answer's kinds
# the decisions' kinds as counted on /metrics (every label there from the start, at 0)
DECISIONS = (
    "idle", "steady", "recommend_failed", "stands", "held_margin", "held_dwell", "changed",
    "collapse",
)  # fmt: skip
CHANGES = ("start", "recommend", "experiment", "dwell_passed", "collapse")
ERRORS = ("server", "recommend", "env_file", "apply_live", "database", "experiment", "alarm")

# Every family: (name as exposed, type, help).
METRICS: tuple[tuple[str, str, str], ...] = (
    ("tuner_watch_info", "info", "the watched server and the watch (labels)"),
    ("tuner_watch_standing_max_slots", "gauge", "the standing N (0: always draft)"),
    ("tuner_watch_standing_status", "gauge", "1 for the standing answer's kind"),
    ("tuner_watch_applied_max_slots", "gauge", "the N read back from the server (GET /props)"),
    ("tuner_watch_applied_timestamp_seconds", "gauge", "when that N was set or read back"),
    ("tuner_watch_server_slots", "gauge", "the server's slots (-np)"),
    ("tuner_watch_server_up", "gauge", "1 while the server answers the polls"),
    ("tuner_watch_generating_slots", "gauge", "slots generating at the last poll"),
    ("tuner_watch_generating_slots_mean", "gauge", "mean slots generating over the window"),
    ("tuner_watch_arrival_rate_per_second", "gauge", "requests finishing per second, window"),
    ("tuner_watch_acceptance_tokens_per_draft", "gauge", "accepted draft tokens a draft, window"),
    ("tuner_watch_acceptance_lower_tokens_per_draft", "gauge", "its 90 % interval's lower end"),
    ("tuner_watch_acceptance_upper_tokens_per_draft", "gauge", "its 90 % interval's upper end"),
    (
        "tuner_watch_acceptance_by_drafting_tokens_per_draft",
        "gauge",
        "accepted draft tokens a draft by slots drafting together, window",
    ),
    (
        "tuner_watch_acceptance_floor_tokens_per_draft",
        "gauge",
        "what drafting needs to pay at that many drafting slots (fitted costs)",
    ),
    ("tuner_watch_collapse_drafting_slots", "gauge", "drafting slots where acceptance collapses"),
    ("tuner_watch_collapse_alarms_total", "counter", "intervals that raised the collapse alarm"),
    ("tuner_watch_polls_total", "counter", "polls of the server that answered"),
    ("tuner_watch_last_poll_timestamp_seconds", "gauge", "when the server last answered"),
    ("tuner_watch_decisions_total", "counter", "decisions at interval ends, by kind"),
    ("tuner_watch_changes_total", "counter", "changes of the standing N, by reason"),
    ("tuner_watch_last_decision_timestamp_seconds", "gauge", "when the watch last decided"),
    ("tuner_watch_dwell_seconds", "gauge", "--dwell: the least time between two changes of N"),
    ("tuner_watch_margin_ratio", "gauge", "--margin: the share a new N must be ahead by"),
    ("tuner_watch_next_change_timestamp_seconds", "gauge", "when the dwell next allows a change"),
    ("tuner_watch_experiments_total", "counter", "experiments ended, by status"),
    ("tuner_watch_experiment_running", "gauge", "1 while an experiment runs"),
    ("tuner_watch_experiment_windows_total", "counter", "experiment windows, by arm"),
    ("tuner_watch_experiment_seconds_total", "counter", "experiment time, by arm"),
    ("tuner_watch_experiment_requests_total", "counter", "requests served in experiments, by arm"),
    (
        "tuner_watch_experiment_tpot_ratio",
        "gauge",
        "the last experiment's contender TPOT over the standing N's, less 1",
    ),
    ("tuner_watch_errors_total", "counter", "errors the watch went on after, by kind"),
)
HELP = {name: text for name, _, text in METRICS}


@dataclass
class WatchState:
    """What a scrape shows (see METRICS): the watcher writes it, scrapes copy it."""

    info: dict[str, str] = field(default_factory=dict)
    n_slots: int = 0
    standing: int | None = None
    status: str = "none"
    applied: int | None = None
    applied_at: float | None = None
    server_up: bool = True
    generating: int | None = None
    mean_generating: float | None = None
    arrival_rate: float | None = None
    acceptance: tuple[float, float, float] | None = None  # accepted a draft, lower, upper
    by_drafting: dict[int, float] = field(default_factory=dict)
    floors: dict[int, float] = field(default_factory=dict)
    collapse_slots: int = 0
    collapse_alarms: int = 0
    polls: int = 0
    last_poll: float | None = None
    decisions: Counter[str] = field(default_factory=Counter)
    changes: Counter[str] = field(default_factory=Counter)
    last_decision: float | None = None
    dwell_s: float = 0.0
    margin: float = 0.0
    next_change: float | None = None
    experiments: Counter[str] = field(default_factory=Counter)
    experiment_running: bool = False
    windows: Counter[str] = field(default_factory=Counter)  # by arm: standing, contender
    window_s: Counter[str] = field(default_factory=Counter)
    window_requests: Counter[str] = field(default_factory=Counter)
    tpot_ratio: float | None = None
    errors: Counter[str] = field(default_factory=Counter)


class WatchMetrics:
    """The snapshot and its lock: `update` and `count` from the watcher, `snapshot` for a
    scrape (a copy: the watcher never waits on a scrape for longer than the copy)."""

    def __init__(self, **values: Any) -> None:
        self._lock = threading.Lock()
        self._state = WatchState(**values)

    def update(self, **values: Any) -> None:
        with self._lock:
            for key, value in values.items():
                if not hasattr(self._state, key):
                    raise AttributeError(f"WatchState has no {key!r}")
                setattr(self._state, key, value)

    def count(self, counter: str, key: str, by: float = 1.0) -> None:
        """Add to a labelled counter (decisions, changes, errors, experiments, windows, ...)."""
        with self._lock:
            getattr(self._state, counter)[key] += by

    def add(self, name: str, by: float = 1.0) -> None:
        """Add to a plain counter (polls, collapse_alarms)."""
        with self._lock:
            setattr(self._state, name, getattr(self._state, name) + by)

    def start(self, info: dict[str, str], n_slots: int, dwell_s: float, margin: float) -> None:
        """What a watch shows from its start: the server it watches, its guard against thrash,
        and every counter's every label at 0 (a dashboard's rate() needs the series before the
        first event)."""
        self.update(info=info, n_slots=n_slots, dwell_s=dwell_s, margin=margin)
        arms = ("standing", "contender")
        for counter, keys in (
            ("decisions", DECISIONS), ("changes", CHANGES), ("errors", ERRORS), ("windows", arms),
            ("window_s", arms), ("window_requests", arms),
        ):  # fmt: skip
            for key in keys:
                self.count(counter, key, 0.0)

    def snapshot(self) -> WatchState:
        with self._lock:
            return copy.deepcopy(self._state)


def _gauge(name: str, value: float | None, labels: dict[str, str] | None = None) -> Metric:
    family = GaugeMetricFamily(name, HELP[name], labels=list(labels or {}))
    if value is not None:
        family.add_metric(list((labels or {}).values()), float(value))
    return family


def _labelled(kind: str, name: str, label: str, values: dict[Any, float]) -> Metric:
    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    family = cls(name, HELP[name + "_total" if kind == "counter" else name], labels=[label])
    for key, value in sorted(values.items(), key=lambda kv: str(kv[0])):
        family.add_metric([str(key)], float(value))
    return family


class WatchCollector(Collector):
    """Builds every family from one snapshot; touches nothing else."""

    def __init__(self, metrics: WatchMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        s = self.metrics.snapshot()
        info = InfoMetricFamily("tuner_watch", HELP["tuner_watch_info"])
        info.add_metric([], s.info)
        yield info
        yield _gauge("tuner_watch_standing_max_slots", s.standing)
        status = GaugeMetricFamily(
            "tuner_watch_standing_status", HELP["tuner_watch_standing_status"], labels=["status"]
        )
        for kind in STATUSES:
            status.add_metric([kind], 1.0 if s.status == kind else 0.0)
        yield status
        yield _gauge("tuner_watch_applied_max_slots", s.applied)
        yield _gauge("tuner_watch_applied_timestamp_seconds", s.applied_at)
        yield _gauge("tuner_watch_server_slots", s.n_slots)
        yield _gauge("tuner_watch_server_up", 1.0 if s.server_up else 0.0)
        yield _gauge("tuner_watch_generating_slots", s.generating)
        yield _gauge("tuner_watch_generating_slots_mean", s.mean_generating)
        yield _gauge("tuner_watch_arrival_rate_per_second", s.arrival_rate)
        mean, lower, upper = s.acceptance or (None, None, None)
        yield _gauge("tuner_watch_acceptance_tokens_per_draft", mean)
        yield _gauge("tuner_watch_acceptance_lower_tokens_per_draft", lower)
        yield _gauge("tuner_watch_acceptance_upper_tokens_per_draft", upper)
        yield _labelled(
            "gauge",
            "tuner_watch_acceptance_by_drafting_tokens_per_draft",
            "drafting_slots",
            s.by_drafting,
        )
        yield _labelled(
            "gauge", "tuner_watch_acceptance_floor_tokens_per_draft", "drafting_slots", s.floors
        )
        yield _gauge("tuner_watch_collapse_drafting_slots", s.collapse_slots)
        yield CounterMetricFamily(
            "tuner_watch_collapse_alarms",
            HELP["tuner_watch_collapse_alarms_total"],
            value=s.collapse_alarms,
        )
        yield CounterMetricFamily(
            "tuner_watch_polls", HELP["tuner_watch_polls_total"], value=s.polls
        )
        yield _gauge("tuner_watch_last_poll_timestamp_seconds", s.last_poll)
        yield _labelled("counter", "tuner_watch_decisions", "kind", dict(s.decisions))
        yield _labelled("counter", "tuner_watch_changes", "reason", dict(s.changes))
        yield _gauge("tuner_watch_last_decision_timestamp_seconds", s.last_decision)
        yield _gauge("tuner_watch_dwell_seconds", s.dwell_s)
        yield _gauge("tuner_watch_margin_ratio", s.margin)
        yield _gauge("tuner_watch_next_change_timestamp_seconds", s.next_change)
        yield _labelled("counter", "tuner_watch_experiments", "status", dict(s.experiments))
        yield _gauge("tuner_watch_experiment_running", 1.0 if s.experiment_running else 0.0)
        yield _labelled("counter", "tuner_watch_experiment_windows", "arm", dict(s.windows))
        yield _labelled("counter", "tuner_watch_experiment_seconds", "arm", dict(s.window_s))
        yield _labelled(
            "counter", "tuner_watch_experiment_requests", "arm", dict(s.window_requests)
        )
        yield _gauge("tuner_watch_experiment_tpot_ratio", s.tpot_ratio)
        yield _labelled("counter", "tuner_watch_errors", "kind", dict(s.errors))


class MetricsServer:
    """The /metrics endpoint: bound at construction (a port in use is a ConfigError), served
    from a daemon thread until `close`."""

    def __init__(self, metrics: WatchMetrics, port: int, host: str = "127.0.0.1") -> None:
        if not 0 <= port < 65536:
            raise ConfigError(f"--metrics-port {port}: a TCP port in 1..65535 (0: any free one)")
        self.metrics = metrics
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(WatchCollector(metrics))
        try:
            self._server, self._thread = start_http_server(port, host, registry=self.registry)
        except OSError as exc:
            where = f"{host}:{port}"
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"--metrics-port {port}: {where} is already in use (another process listens "
                    "there): choose another port; the watch did not start"
                ) from None
            raise ConfigError(
                f"--metrics-port {port}: cannot listen on {where} ({exc.strerror or exc}); the "
                "watch did not start"
            ) from None
        self.host = host
        self.port = int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
