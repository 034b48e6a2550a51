"""`tuner watch --apply live`: N set on the running server through POST /props and read back,
kept there every interval (a restarted server, or a flag that overrides the env file, is
noticed, logged and corrected), written to the env file too; refused in one line, before
anything runs, by a server without the live switch or without `--props`.

The server is the real patched bench server (what the switch does to drafting is
tests/test_live_switch.py's); a fake HTTP server stands in only for a llama-server without the
patch, which this project does not build."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from lab.traffic import offer_cycle

from tuner.bench import Bench
from tuner.decide.watch import WatchOptions, watch
from tuner.errors import ConfigError, TunerError
from tuner.measure.client import LlamaClient
from tuner.measure.launcher import LaunchConfig, ManagedServer
from tuner.measure.plan import ProgressEvent
from tuner.policy import Policy
from tuner.recommendation import Reason, ReasonCode, Recommendation
from tuner.storage.store import Store


def drafting_server(bench: Bench, props: bool) -> LaunchConfig:
    args = ["--kv-unified", "--poll", "0", "--model-draft", str(bench.draft)]
    args += ["--spec-type", "draft-simple", "--spec-synth-len", "3.5"]
    return LaunchConfig(
        binary=bench.server,
        model=bench.target,
        n_parallel=4,
        ctx_size=4096,
        threads=2,
        args=args + (["--props"] if props else []),
    )


def answer(n: int) -> Recommendation:
    return Recommendation(
        id=0,
        model="m",
        host="h",
        policy=Policy.of_max_slots(n, 6),
        fit_id=0,
        reasons=[Reason(ReasonCode.CROSSOVER, "stub")],
    )


@pytest.fixture
def server(bench: Bench, tmp_path: Path) -> Iterator[ManagedServer]:
    with ManagedServer(drafting_server(bench, True), tmp_path / "server.log") as running:
        yield running


@pytest.mark.bench
def test_apply_live_sets_n_keeps_it_and_writes_the_env_file(
    server: ManagedServer, tmp_path: Path
) -> None:
    env_path = tmp_path / "server.env"
    env_path.write_text("LLAMA_ARG_CTX_SIZE=4096\n")
    log: list[str] = []

    def observer(event: ProgressEvent) -> None:
        log.append(event.text)

    # Between the first and the second decision someone sets the server to N=6 behind the
    # watcher's back (a restart from its own flags would look the same).
    def override() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any("set N=3" in line for line in log):
            time.sleep(0.1)
        LlamaClient(server.url).set_max_slots(6)

    thread = threading.Thread(target=override, daemon=True)
    thread.start()
    # Traffic: rounds of 96 tokens keep the slots busy most of each 5 s window (about 6 s of a
    # 7 s one). The watcher is told to decide on 0.3 s of busy time (its default, 5 s, is a
    # service's guard against idle spells): over ten times below what the traffic gives, where 5 s
    # left one full run with no decision at all. Decisions at 5, 10 and 15 s: the first sets N,
    # the second finds the override and corrects it, the third finds N kept.
    stop = threading.Event()
    traffic = threading.Thread(
        target=offer_cycle, args=(server.url, [(2, 96)], stop, []), daemon=True
    )
    traffic.start()
    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    summary = watch(
        store,
        "m",
        "h",
        server.url,
        env_path,
        WatchOptions(every_s=5.0, window_s=5.0, drift=1.0, apply="live", min_busy_s=0.3),
        observer,
        name="live-watch",
        duration_s=16.0,
        interval_s=0.25,
        recommender=lambda _: answer(3),
    )
    stop.set()
    traffic.join(timeout=60)
    thread.join(timeout=30)
    store.dispose()

    assert summary.writes == 1, "\n".join(log)
    assert "LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=3" in env_path.read_text().splitlines()
    assert "LLAMA_ARG_CTX_SIZE=4096" in env_path.read_text().splitlines()
    assert LlamaClient(server.url).max_slots() == 3
    assert any("set N=3 on the running server" in line for line in log), log
    assert any("ran N=6, not the standing N=3" in line for line in log), log


@pytest.mark.bench
def test_apply_live_needs_props(bench: Bench, tmp_path: Path) -> None:
    with ManagedServer(drafting_server(bench, False), tmp_path / "server.log") as running:
        store = Store(f"sqlite:///{tmp_path / 't.db'}")
        with pytest.raises(TunerError) as caught:
            watch(
                store,
                "m",
                "h",
                running.url,
                tmp_path / "server.env",
                WatchOptions(every_s=2.0, apply="live"),
                recommender=lambda _: answer(3),
            )
        store.dispose()
    message = str(caught.value)
    assert "--props" in message and "\n" not in message


@pytest.fixture
def stock_server() -> Iterator[str]:
    """Answers GET /props as a llama-server without the tuner's patch does: no threshold."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"total_slots": 4, "model_path": "/m/x.gguf"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_apply_live_on_a_server_without_the_switch_is_one_line(
    stock_server: str, tmp_path: Path
) -> None:
    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    with pytest.raises(ConfigError) as caught:
        watch(
            store,
            "m",
            "h",
            stock_server,
            tmp_path / "server.env",
            WatchOptions(every_s=2.0, apply="live"),
            recommender=lambda _: answer(3),
        )
    store.dispose()
    message = str(caught.value)
    assert "spec_draft_max_slots" in message and "--on-change" in message
    assert "\n" not in message
