"""On the real bench: a live scrape of `tuner watch --apply live`'s own /metrics under load (the
standing N, the N read back from the server, the generating slots, the acceptance the server's
counters show), and the collapse alarm on a bench server whose acceptance cannot pay at any
concurrency (`--spec-synth-rates 0.01,0.01,0.01`): `check`, `observe` and `watch --apply live`
each say it in one line, with the build, and watch sets the least drafting N live. The floor is
the fitted costs' of the bench's stored profile (tests/benchdata.py: measured on this bench)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from lab.traffic import offer_cycle
from test_watch import answer
from test_watch_metrics import scrape, value
from typer.testing import CliRunner

from tuner.bench import Bench
from tuner.cli.app import app
from tuner.decide.watch import EnvFile, WatchOptions, watch
from tuner.measure.client import LlamaClient
from tuner.measure.launcher import LaunchConfig, ManagedServer, free_port
from tuner.storage.store import Store

pytestmark = pytest.mark.bench


def drafting(bench: Bench, *synthetic: str, alias: str | None = None) -> LaunchConfig:
    args = ["--kv-unified", "--poll", "0", "--model-draft", str(bench.draft), "--props"]
    args += ["--spec-type", "draft-simple", "--spec-draft-n-max", "3", *synthetic]
    args += ["--alias", alias] if alias else []
    return LaunchConfig(
        binary=bench.server, model=bench.target, n_parallel=4, ctx_size=4096, threads=2, args=args
    )


def loaded(url: str, cycle: list[tuple[int, int]]) -> threading.Event:
    stop = threading.Event()
    threading.Thread(target=offer_cycle, args=(url, cycle, stop, []), daemon=True).start()
    return stop


def test_a_live_scrape_of_watch_apply_live_under_load(bench: Bench, tmp_path: Path) -> None:
    env = tmp_path / "server.env"
    env.write_text("LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=3\n")  # rounds of 2 and 3 streams all draft
    port = free_port()
    scrapes: list[dict] = []
    result: dict = {}
    config = drafting(bench, "--spec-synth-len", "3.5")
    with ManagedServer(config, tmp_path / "server.log", start_timeout_s=120) as server:
        stop = loaded(server.url, [(2, 96), (3, 96)])

        def run() -> None:
            options = WatchOptions(every_s=5.0, window_s=10.0, drift=1.0, apply="live",
                                   min_busy_s=0.3, metrics_port=port)  # fmt: skip
            result["summary"] = watch(
                Store(f"sqlite:///{tmp_path / 't.db'}"), "m", "h", server.url, env, options,
                name="bench-scraped", duration_s=16.0, recommender=lambda _: answer(3),
            )  # fmt: skip

        watcher = threading.Thread(target=run)
        watcher.start()
        while watcher.is_alive():
            time.sleep(1.0)
            try:
                scrapes.append(scrape(f"http://127.0.0.1:{port}/metrics"))
            except httpx.HTTPError:
                continue
        watcher.join()
        stop.set()
        with LlamaClient(server.url) as api:
            on_server = api.max_slots()
    last = scrapes[-1]
    shown = {
        name: value(last, name)
        for name in (
            "tuner_watch_standing_max_slots",
            "tuner_watch_applied_max_slots",
            "tuner_watch_generating_slots_mean",
            "tuner_watch_acceptance_tokens_per_draft",
            "tuner_watch_acceptance_lower_tokens_per_draft",
            "tuner_watch_acceptance_upper_tokens_per_draft",
            "tuner_watch_polls_total",
        )
    }
    peak = max(value(s, "tuner_watch_generating_slots") or 0.0 for s in scrapes)
    print(f"scrapes {len(scrapes)}; last: {shown}; generating slots at most {peak:.0f}")
    assert "summary" in result and len(scrapes) >= 8
    assert shown["tuner_watch_standing_max_slots"] == 3.0 and on_server == 3
    assert shown["tuner_watch_applied_max_slots"] == 3.0  # read back from GET /props
    assert 2.0 <= peak <= 4.0  # rounds of 2 and 3 streams
    accepted = shown["tuner_watch_acceptance_tokens_per_draft"]
    # synth-len 3.5 at n-max 3: 2.5 accepted a draft, less what drafts cut short at a request's
    # end leave out
    assert accepted is not None and 1.0 < accepted <= 3.0, shown


def test_the_collapse_alarm_where_acceptance_cannot_pay(
    bench: Bench, fitted_bench_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import FITTED_BENCH_HOST, FITTED_BENCH_MODEL

    monkeypatch.setenv("TUNER_DB", fitted_bench_db)  # the bench's stored profile and its fit
    env = tmp_path / "server.env"
    env.write_text("LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=0\n")
    said: list[str] = []
    config = drafting(bench, "--spec-synth-rates", "0.01,0.01,0.01", alias=FITTED_BENCH_MODEL)
    with ManagedServer(config, tmp_path / "server.log", start_timeout_s=120) as server:
        stop = loaded(server.url, [(1, 48), (2, 48)])
        time.sleep(4.0)  # drafts on the counters before check reads them
        stop.set()
        time.sleep(1.0)  # the last round ends: check's live switch check runs on a quiet server
        checked = CliRunner().invoke(app, ["check", "--url", server.url])
        # one stream at a time from here: every draft observe and watch read is at one drafting
        # slot, so each window holds that count's drafts whatever the machine's pace
        stop = loaded(server.url, [(1, 48)])
        observed = CliRunner().invoke(app, ["observe", "--url", server.url, "--duration", "8"])
        store = Store(fitted_bench_db)
        summary = watch(
            store, FITTED_BENCH_MODEL, FITTED_BENCH_HOST, server.url, env,
            WatchOptions(every_s=5.0, window_s=10.0, drift=1.0, apply="live", min_busy_s=0.3,
                         recommend={"host_explicit": True}),
            lambda e: said.append(e.text or ""), name="bench-collapse", duration_s=11.0,
            recommender=lambda _: answer(0, {m: 100.0 if m == 0 else 80.0 for m in range(7)}),
        )  # fmt: skip
        stop.set()
        store.dispose()
        with LlamaClient(server.url) as api:
            on_server = api.max_slots()
            build = str(api.props().get("build_info"))
    check_line = next((x for x in checked.stdout.splitlines() if "acceptance" in x), "")
    observe_line = next((x for x in observed.stdout.splitlines() if "collapses" in x), "")
    watch_line = summary.alarms[0] if summary.alarms else ""
    print(f"check:   {check_line}\nobserve: {observe_line}\nwatch:   {watch_line}")
    assert "collapses at 1 drafting slot" in check_line and build in check_line, checked.stdout
    assert "protect the server with plain" in check_line
    assert "collapses at 1 drafting slot" in observe_line and build in observe_line, observed.stdout
    assert "protect the server with plain" in observe_line
    assert "collapses at 1 drafting slot" in watch_line and "plain" in watch_line, said
    assert build in watch_line
    assert on_server == 1 and EnvFile(env).current_max_slots() == 1, said
