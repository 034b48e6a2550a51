"""`tuner watch --metrics-port`: the watch's own state in Prometheus' text format.

A live scrape of a watch on the twin over HTTP (`--apply live`, Poisson load) shows the standing
and applied N, the generating slots and the acceptance, and holds every metric the committed
Grafana dashboard (docs/grafana/tuner-watch.json) queries; names follow Prometheus' conventions.
Bad input: a port in use is one line and nothing of the watch starts; a scrape while the
database is locked answers at once with the last known values, and the watch goes on (the real
bench's scrape under load is tests/test_watch_metrics_bench.py)."""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_observe import one_line_error
from test_watch import Answers, answer
from test_watch_experiment import offered
from twinthread import twin_in_thread

from tuner.decide.watch import EnvFile, Watcher, WatchOptions, watch
from tuner.decide.watchmetrics import METRICS, MetricsServer, WatchMetrics
from tuner.measure.launcher import free_port
from tuner.storage.store import Store
from tuner.traffic import ServerView

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "docs" / "grafana" / "tuner-watch.json"


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of a scrape by its name (counters as `_total`), families with no sample
    under their exposed name with an empty list."""
    text = httpx.get(url, timeout=5.0).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            out.setdefault(line.split()[2], [])
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def value(scraped: dict, name: str, **labels: str) -> float | None:
    for have, v in scraped.get(name, []):
        if all(have.get(k) == w for k, w in labels.items()):
            return v
    return None


def dashboard_metrics() -> set[str]:
    """Every tuner metric the dashboard's queries name."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v.get("query", "") for v in board["templating"]["list"]]
    return {name for e in exprs for name in re.findall(r"\btuner_[a-z0-9_]+", e)}


def test_names_follow_prometheus_conventions() -> None:
    for name, kind, text in METRICS:
        assert re.fullmatch(r"tuner_watch_[a-z0-9_]+", name) and text, name
        assert name.endswith("_total") == (kind == "counter"), name
    assert dashboard_metrics() <= {name for name, _, _ in METRICS}, "the dashboard's queries"


def test_a_live_scrape_of_watch_on_the_twin_holds_the_dashboards_metrics(tmp_path: Path) -> None:
    twin = twin_in_thread(speed=40.0)
    env = tmp_path / "server.env"
    env.write_text("LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=2\n")
    port = free_port()
    stop = threading.Event()
    scrapes: list[dict] = []
    result: dict = {}

    def run() -> None:
        options = WatchOptions(
            every_s=2.0, window_s=6.0, drift=0.5, apply="live", min_busy_s=0.5, metrics_port=port
        )
        result["summary"] = watch(
            Store(f"sqlite:///{tmp_path / 'tuner.db'}"), "m", "h", twin.url, env, options,
            name="scraped", duration_s=7.0, interval_s=0.05, recommender=lambda _: answer(2),
        )  # fmt: skip

    try:
        offered(twin.url, 0.4, 600.0, stop)
        watcher = threading.Thread(target=run)
        watcher.start()
        url = f"http://127.0.0.1:{port}/metrics"
        while watcher.is_alive():
            time.sleep(0.5)
            try:
                scrapes.append(scrape(url))
            except httpx.HTTPError:
                continue  # before it listens, or after it closed
        watcher.join()
    finally:
        stop.set()
        twin.stop_thread()
    assert "summary" in result and len(scrapes) >= 5
    last = scrapes[-1]
    assert value(last, "tuner_watch_standing_max_slots") == 2.0
    assert value(last, "tuner_watch_applied_max_slots") == 2.0  # read back from the twin
    # the stand-in's answer is the model's, not settled live
    assert value(last, "tuner_watch_standing_status", status="model") == 1.0
    assert value(last, "tuner_watch_server_slots") == 4.0
    assert value(last, "tuner_watch_decisions_total", kind="stands") >= 1.0
    assert max(value(s, "tuner_watch_generating_slots") or 0.0 for s in scrapes) >= 1.0
    assert value(last, "tuner_watch_polls_total") > 50
    accepted = value(last, "tuner_watch_acceptance_tokens_per_draft")
    assert accepted is not None and 1.0 < accepted < 6.0  # the bench world's synth-len 3.5
    assert scrapes[0]["tuner_watch_info"][0][0]["url"] == twin.url
    missing = dashboard_metrics() - set(last)
    assert not missing, f"the dashboard queries metrics no scrape shows: {sorted(missing)}"


def test_a_metrics_port_in_use_is_one_line_and_nothing_starts(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    server = socket.socket()  # stands for the llama-server: nothing may reach it
    server.bind(("127.0.0.1", 0))
    server.listen()
    env = tmp_path / "server.env"
    port = taken.getsockname()[1]
    try:
        one_line_error(
            ["watch", "--model", "m", "--url", f"http://127.0.0.1:{server.getsockname()[1]}",
             "--env-file", str(env), "--metrics-port", str(port), "--apply", "live"],
            f"--metrics-port {port}", "already in use", "did not start",
        )  # fmt: skip
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # no connection came: the server was never asked anything
        assert not env.exists() and not (tmp_path / "state").exists()
    finally:
        taken.close()
        server.close()


def test_a_scrape_while_the_database_is_locked_answers_with_the_last_values(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tuner.db"
    store = Store(f"sqlite:///{path}", busy_timeout_s=2.0)
    view = ServerView("http://127.0.0.1:1", "m", 8, "slots")
    options = WatchOptions(every_s=60.0, window_s=60.0, drift=0.2, dwell_s=0.0)
    metrics = WatchMetrics()
    said: list[str] = []
    w = Watcher(
        store, SimpleNamespace(view=view, interval_s=0.25), EnvFile(tmp_path / "server.env"),
        "locked", options, Answers(), lambda e: said.append(e.text or ""), metrics=metrics,
    )  # type: ignore[arg-type]  # fmt: skip
    with MetricsServer(metrics, 0) as served:
        w.rolling.open(0.0).profile.add(2, 60.0)
        w.end_of_interval()  # N=3 stands
        before = scrape(served.url)
        assert value(before, "tuner_watch_standing_max_slots") == 3.0
        locker = sqlite3.connect(path, timeout=0.1, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        saving = threading.Thread(target=w.save)  # waits on the lock for its busy timeout
        started = time.monotonic()
        saving.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        during = scrape(served.url)
        took = time.monotonic() - t0
        assert saving.is_alive(), "the save did not wait on the lock"
        saving.join(timeout=30)
        waited = time.monotonic() - started
        locker.execute("ROLLBACK")
        locker.close()
        after = scrape(served.url)
        w.save()  # the lock is gone: saved again, and said so
        again = scrape(served.url)
    store.dispose()
    assert took < 1.0 < waited, (took, waited)
    for name in ("tuner_watch_standing_max_slots", "tuner_watch_decisions_total"):
        assert during[name] == before[name], name
    assert value(during, "tuner_watch_errors_total", kind="database") == 0.0
    assert value(after, "tuner_watch_errors_total", kind="database") == 1.0
    assert value(again, "tuner_watch_errors_total", kind="database") == 1.0
    assert any("could not be saved" in s and "locked" in s for s in said), said
    assert any("saved again" in s for s in said), said
