"""The twin as an HTTP server (tuner.twin.server): llama-server's endpoints, its command line, the
live switch through POST /props, a client that goes away, the twin's clock, and `tuner twin`.

Most tests talk to a server in this process (a thread of its own, noise off, fast); the speed
test launches `tuner profile` twice on the twin spec (profiles/twin/bench-twin.toml), at speed 1
and at speed 20, and holds every stored level of one against the other.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from readme import wait_healthy
from sqlalchemy import select
from tunerproc import finish, start_tuner, tuner_env, twin_server_script
from typer.testing import CliRunner

from tuner.cli import app
from tuner.errors import ConfigError
from tuner.measure import metrics
from tuner.measure.client import LlamaClient
from tuner.measure.fingerprint import probe_build, probe_model, require_gguf
from tuner.measure.launcher import free_port
from tuner.measure.load import LoadGenerator, Workload, summarize
from tuner.measure.metrics import parse_metrics
from tuner.measure.observe import Poller
from tuner.measure.spec import load_spec
from tuner.policy import Policy
from tuner.traffic import TrafficProfile
from tuner.twin import tokenizer
from tuner.twin.cmdline import ArgError, launch_world, parse_args
from tuner.twin.command import main
from tuner.twin.inprocess import TwinBackend
from tuner.twin.server import TwinServer
from tuner.twin.world import load_world

REPO = Path(__file__).resolve().parent.parent
BENCH_WORLD = REPO / "profiles" / "twin" / "bench-smollm2-cpu.toml"
TWIN_SPEC = REPO / "profiles" / "twin" / "bench-twin.toml"
KEY = "spec_draft_max_slots"
PROPS_ERROR = "This server does not support changing global properties. Start it with `--props`"
EXPECTED = 'expected exactly {"spec_draft_max_slots": N}, N an integer >= 0, 0 = no limit'
DRAFTING = ["--model-draft", "twin-draft", "--spec-type", "draft-simple", "--spec-draft-n-max", "6"]


def serve(*extra: str, world: Path = BENCH_WORLD, speed: float = 50.0) -> TwinServer:
    """A twin of the bench world in this process: 4 slots, noise off, `extra` flags."""
    argv = [
        "--model",
        str(world),
        "--port",
        "0",
        "--parallel",
        "4",
        "--ctx-size",
        "4096",
        "--kv-unified",
        "--noise",
        "off",
        "--speed",
        str(speed),
        *extra,
    ]
    args = parse_args(argv, env={})
    world_, policy = launch_world(args)
    return TwinServer(args, world_, policy, log=lambda _: None).start_in_thread()


@pytest.fixture
def twin() -> Iterator[TwinServer]:
    server = serve("--metrics", "--props", "--threads", "2", "--poll", "0", *DRAFTING)
    yield server
    server.stop_thread()


def _completion(n: int, seed: int = 7, **extra: object) -> dict[str, object]:
    return {"prompt": "Once upon a time", "n_predict": n, "seed": seed, **extra}


# --- endpoints --------------------------------------------------------------------------------


def test_every_endpoint_answers_as_llama_server(twin: TwinServer) -> None:
    with LlamaClient(twin.url) as api:
        assert api.health()
        props = api.props()
        assert props["total_slots"] == 4
        assert props["model_path"] == str(BENCH_WORLD)
        assert props["default_generation_settings"]["n_ctx"] == 4096  # --kv-unified: all of it
        assert props[KEY] == 0 and props["endpoint_props"] and props["endpoint_metrics"]
        assert props["build_info"].startswith("twin-")
        assert props["twin"]["speed"] == 50.0 and props["twin"]["world"] == "bench-smollm2-cpu"
        slots = api.slots()
        assert [s["id"] for s in slots] == [0, 1, 2, 3]
        assert all(s["n_ctx"] == 4096 and s["is_processing"] is False for s in slots)
        scraped = api.metrics()
        assert scraped["n_decode_total"] == 0 and "requests_processing" in scraped
        tokens = api.tokenize("Hello, twin!")
        assert api.detokenize(tokens) == "Hello, twin!"
        assert len(tokens) == 3  # 12 ASCII characters, 4 a token
        prompt = api.apply_template([{"role": "user", "content": "hi"}])
        assert prompt.endswith("<|im_start|>assistant\n") and "hi" in prompt
        done = api.complete(_completion(16))
        assert done.tokens == 16 and done.final["stop"] is True
        after = api.slots()
        served = [s for s in after if "id_task" in s]
        # its slot keeps the task, counts reset (llama-server's released slot)
        assert len(served) == 1 and served[0]["next_token"][0]["n_decoded"] == 0
        assert api.metrics()["tokens_predicted_total"] == 16
    response = httpx.get(f"{twin.url}/nope")
    assert response.status_code == 404


def test_switched_off_endpoints_answer_as_llama_server_does() -> None:
    server = serve("--no-slots")
    try:
        with httpx.Client(timeout=10) as client:
            slots = client.get(f"{server.url}/slots")
            scrape = client.get(f"{server.url}/metrics")
            posted = client.post(f"{server.url}/props", json={KEY: 1})
            props = client.get(f"{server.url}/props").json()
    finally:
        server.stop_thread()
    assert slots.status_code == 501 and "--slots" in slots.json()["error"]["message"]
    assert scrape.status_code == 501 and "--metrics" in scrape.json()["error"]["message"]
    assert posted.status_code == 501
    assert posted.json() == {
        "error": {"code": 501, "message": PROPS_ERROR, "type": "not_supported_error"}
    }
    assert props[KEY] == 0 and props["endpoint_props"] is False  # plain: no draft model, still 0


def test_a_streamed_completion_counts_its_tokens_steps_and_times(twin: TwinServer) -> None:
    chunks: list[dict] = []
    with LlamaClient(twin.url) as api:
        done = api.stream(_completion(48, timings_per_token=True), on_chunk=chunks.append)
        whole = api.complete(_completion(48))
    partial = [c for c in chunks if not c["stop"]]
    counts = [c["tokens_predicted"] for c in partial]
    assert counts == sorted(counts) and counts[-1] == 48
    assert sum(len(c["tokens"]) for c in partial) == 48
    assert all(c["timings"]["predicted_n"] == c["tokens_predicted"] for c in partial)
    times = [c["t_server"] for c in partial]
    assert times == sorted(times) and len(set(times)) == len(times)  # one event per step
    timings = done.timings
    assert timings["predicted_n"] == 48 == done.tokens
    assert math.isclose(timings["predicted_ms"], 1000 * (times[-1] - times[0]), rel_tol=1e-9)
    # A drafting step gives 1 + its accepted draft tokens: steps = tokens - accepted, and the
    # first token comes from the prompt's own step.
    assert timings["draft_n"] >= timings["draft_n_accepted"] > 0
    assert len(partial) == 48 - timings["draft_n_accepted"]
    assert done.final["t_arrival"] <= times[0]
    # The same request again, not streamed: the same draws and step costs (noise off).
    assert whole.timings["predicted_ms"] == pytest.approx(timings["predicted_ms"])
    assert whole.draft_accepted == done.draft_accepted
    assert tokenizer.tokenize(whole.final["content"]) == tokenizer.generated(0, 48)


def test_chat_streamed_and_not(twin: TwinServer) -> None:
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 20, "seed": 3}
    chunks: list[dict] = []
    with LlamaClient(twin.url) as api:
        done = api.stream(
            {**body, "timings_per_token": True}, "/v1/chat/completions", chunks.append
        )
        whole = api.complete(body, "/v1/chat/completions")
    assert done.tokens == 20 == whole.tokens
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert whole.final["choices"][0]["message"]["role"] == "assistant"
    assert whole.final["usage"]["completion_tokens"] == 20
    with httpx.stream(
        "POST", f"{twin.url}/v1/chat/completions", json={**body, "stream": True}
    ) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"


def test_the_load_generator_reads_the_twins_clock(twin: TwinServer) -> None:
    workload = Workload(prompt_tokens=16, max_tokens=32)
    generator = LoadGenerator(twin.url, workload)
    generator.run(3)  # the client's first round at 3 streams opens its connections slowly
    samples = generator.run(3, round_key=1)
    clock = httpx.get(f"{twin.url}/props").json()["twin"]["t_server"]
    # Times are the twin's: virtual seconds, the request's start its arrival there ...
    assert all(0 < s.start <= s.token_times[0] <= s.token_times[-1] <= clock for s in samples)
    assert max(s.start for s in samples) == min(s.start for s in samples)  # admitted together
    # ... so the level's figures are those of the same requests on the engine itself.
    world, _ = launch_world(twin.args)
    engine = TwinBackend(world, switch="relaunch").measure(Policy.always(6), (0, 3), 1, workload)
    served, simulated = summarize(samples, 3), summarize(engine.samples, 3)
    assert served.tokens_per_second == pytest.approx(simulated.tokens_per_second, rel=1e-6)
    assert served.step_ms == pytest.approx(simulated.step_ms, rel=1e-6)
    assert [s.draft_n for s in samples] == [s.draft_n for s in engine.samples]


# --- the live switch ----------------------------------------------------------------------------


async def _two_equal(url: str) -> list[int]:
    async with httpx.AsyncClient(timeout=60) as client:
        answers = await asyncio.gather(
            *(client.post(f"{url}/completion", json=_completion(40, seed=i)) for i in (1, 2))
        )
    return [a.json()["timings"].get("draft_n", 0) for a in answers]


def test_the_threshold_switches_live_and_reads_back(twin: TwinServer) -> None:
    with LlamaClient(twin.url) as api:
        api.set_max_slots(1)  # reads it back, or raises
        before = api.metrics()
        limited = asyncio.run(_two_equal(twin.url))
        middle = api.metrics()
        api.set_max_slots(0)
        unlimited = asyncio.run(_two_equal(twin.url))
        after = api.metrics()
    # Two slots generating from the same step on: with N = 1 no draft ever starts.
    assert limited == [0, 0]
    assert metrics.drafting_summary(middle.since(before))["drafts"] == 0
    assert all(d > 0 for d in unlimited)
    assert metrics.drafting_summary(after.since(middle))["drafts"] > 0


def test_bad_props_bodies_get_400_with_one_line_and_change_nothing(twin: TwinServer) -> None:
    bodies = {
        b"not json": "not valid JSON",
        b"": "not valid JSON",
        b"[]": "not a JSON object",
        b"{}": "no key",
        b'{"other": 1}': 'unknown key "other"',
        b'{"spec_draft_max_slots": 1, "other": 2}': 'unknown key "other"',
        b'{"spec_draft_max_slots": -1}': "negative: -1",
        b'{"spec_draft_max_slots": 1.5}': "not an integer: 1.5",
        b'{"spec_draft_max_slots": "2"}': "not an integer",
        b'{"spec_draft_max_slots": true}': "not an integer",
        b'{"spec_draft_max_slots": null}': "not an integer",
        b'{"spec_draft_max_slots": 4294967296}': "too large",
    }
    with httpx.Client(timeout=10) as client:
        for body, reason in bodies.items():
            response = client.post(
                f"{twin.url}/props", content=body, headers={"Content-Type": "application/json"}
            )
            assert response.status_code == 400, body
            error = response.json()["error"]
            assert error["code"] == 400 and error["type"] == "invalid_request_error"
            message = error["message"]
            assert "\n" not in message and message.startswith("invalid POST /props body (")
            assert reason in message and message.endswith(EXPECTED), (body, message)
        assert client.get(f"{twin.url}/props").json()[KEY] == 0
        good = client.post(f"{twin.url}/props", json={KEY: 5})
        assert good.json() == {"success": True, KEY: 5}
        assert client.get(f"{twin.url}/props").json()[KEY] == 5


def test_a_client_that_goes_away_cancels_its_request() -> None:
    server = serve("--metrics", *DRAFTING, speed=1.0)
    try:
        with httpx.Client(timeout=30) as client:
            body = {**_completion(100000), "stream": True}
            with client.stream("POST", f"{server.url}/completion", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        break  # one chunk, then the connection closes
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                scraped = parse_metrics(client.get(f"{server.url}/metrics").text)
                if scraped["requests_processing"] == 0:
                    break
                time.sleep(0.05)
            slots = client.get(f"{server.url}/slots").json()
    finally:
        server.stop_thread()
    assert scraped["requests_processing"] == 0
    assert not any(s["is_processing"] for s in slots)


def test_observe_records_what_the_twin_served() -> None:
    """`tuner observe`'s poller on the twin (as tests/test_observe_bench.py on the bench): rounds
    of 1, 3 and 2 streams of 48 tokens, each request recorded with exactly its output and its
    32-token prompt, from /slots (a released slot: its context, counts reset) and /metrics."""
    server = serve("--metrics", *DRAFTING, speed=2.0)
    rounds = [1, 3, 2]
    samples: list = []

    def offer() -> None:
        generator = LoadGenerator(server.url, Workload(prompt_tokens=32, max_tokens=48))
        for key, streams in enumerate(rounds):
            samples.extend(generator.run(streams, round_key=key))
            time.sleep(0.05)

    profile = TrafficProfile(4)
    try:
        with Poller(server.url, clock=time.perf_counter) as poller:
            assert poller.view.counters and poller.view.n_slots == 4
            load_thread = threading.Thread(target=offer, daemon=True)
            load_thread.start()
            while load_thread.is_alive():
                poller.step(profile)
            for _ in range(4):  # the last round's ends, settled
                poller.step(profile)
    finally:
        server.stop_thread()
    assert len(samples) == sum(rounds) and all(s.ok and s.tokens == 48 for s in samples)
    assert profile.output_tokens == [48] * sum(rounds), profile.output_tokens
    assert profile.prompt_tokens == [32] * sum(rounds), profile.prompt_tokens
    assert profile.seconds.get(3, 0.0) > 0  # the 3-stream round was seen generating


# --- the command line -------------------------------------------------------------------------


def test_the_command_line_is_llama_servers() -> None:
    # As tuner.measure.plan.launch_config writes it for the bench spec, threshold 3.
    command = ["-m", str(BENCH_WORLD), "--host", "127.0.0.1", "--port", "9", "--parallel", "8"]
    command += ["--ctx-size", "4096", "--metrics", "--threads", "2", "--poll", "0", "--no-repack"]
    command += ["--spec-draft-max-slots", "3", *DRAFTING, "--spec-synth-len", "2.5"]
    args = parse_args(command, env={})
    world, policy = launch_world(args)
    assert policy == Policy.threshold(3, 6)
    assert world.slot_context == 512  # 4096 over 8 slots without --kv-unified
    assert world.acceptance.synth_len == 2.5
    assert args.ignored == ["--threads", "2", "--poll", "0", "--no-repack"]
    plain = launch_world(parse_args(["-m", str(BENCH_WORLD), "-np", "2"], env={}))
    assert plain[1] == Policy.plain() and plain[0].n_parallel == 2
    from_env = parse_args(
        ["-m", str(BENCH_WORLD), *DRAFTING], env={"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS": "2"}
    )
    assert launch_world(from_env)[1] == Policy.threshold(2, 6)
    for bad in (["--spec-draft-max-slots", "-1"], ["--spec-draft-max-slots", "x"]):
        with pytest.raises(ArgError, match="--spec-draft-max-slots expects a non-negative integer"):
            parse_args(["-m", str(BENCH_WORLD), *bad], env={})
    with pytest.raises(ArgError, match="LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS"):
        parse_args(["-m", str(BENCH_WORLD)], env={"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS": "abc"})


def test_tuner_dev_twin_serve_drafts_unless_plain(tmp_path: Path) -> None:
    """`tuner dev twin serve WORLD` is the drafting server docs/twin.md starts by hand: its
    slots draft (the pinned build's rule: a speculative type on, not --model-draft alone) and a
    completion's draft counters move; with --plain nothing drafts."""
    for plain in (False, True):
        port = free_port()
        command = [sys.executable, "-m", "tuner", "dev", "twin", "serve", str(BENCH_WORLD)]
        command += ["--port", str(port), "--props", "--metrics", "--noise", "off", "--speed", "50"]
        log = tmp_path / f"serve-{plain}.log"
        with log.open("w") as out:
            server = subprocess.Popen(
                command + (["--plain"] if plain else []),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=tuner_env(f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "cache"),
            )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, server, log, timeout_s=60)
            with LlamaClient(url) as api:
                done = api.complete(_completion(32))
                slots = api.slots()
                drafts = api.metrics().value("spec_decode_num_drafts_total")
        finally:
            server.terminate()
            server.wait(30)
        assert {s["speculative"] for s in slots} == {not plain}
        assert (done.draft_n > 0, drafts > 0) == (not plain, not plain), (done.timings, drafts)


def test_the_build_and_the_world_pass_the_tuners_fingerprints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--help"]) == 0
    assert "--spec-draft-max-slots" in capsys.readouterr().out
    build = probe_build(twin_server_script(tmp_path))
    assert build.has_max_slots
    assert build.version_text.splitlines()[0].startswith("version: ")
    require_gguf(BENCH_WORLD)
    model = probe_model(BENCH_WORLD)
    assert model.architecture == "twin" and model.file_size == BENCH_WORLD.stat().st_size
    other = tmp_path / "other.toml"
    other.write_text(BENCH_WORLD.read_text().replace("quiet", "off").replace("vm", "off"))
    assert probe_model(other).file_sha256 != model.file_sha256  # each world its own identity


def test_a_spec_on_a_twin_world_stores_under_the_worlds_own_model_name(tmp_path: Path) -> None:
    """measure reads a world's model_name without the twin: a spec under another name, or a
    world that names no model, is refused before anything is measured."""
    binary = tmp_path / "server"
    binary.write_text("")

    def spec(model_name: str, world: Path) -> Path:
        path = tmp_path / "spec.toml"
        path.write_text(
            f'name = "s"\nmodel_name = "{model_name}"\n[server]\nbinary = "{binary}"\n'
            f'model = "{world}"\n[speculative]\nargs = []\n'
        )
        return path

    own = load_world(BENCH_WORLD).model_name
    assert load_spec(spec(own, BENCH_WORLD)).model_name == own
    with pytest.raises(ConfigError, match="is not the twin world's own"):
        load_spec(spec(own + "-other", BENCH_WORLD))
    nameless = tmp_path / "nameless.toml"
    nameless.write_text(BENCH_WORLD.read_text().replace(f'model_name = "{own}"', ""))
    with pytest.raises(ConfigError, match=r"server\.model: .*model_name"):
        load_spec(spec(own, nameless))
    with pytest.raises(ConfigError, match="model_name"):
        require_gguf(nameless)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_the_tokenizer_is_reversible(text: str) -> None:
    tokens = tokenizer.tokenize(text, add_special=True)
    assert tokens[0] == tokenizer.BOS and all(0 <= t < 2**30 for t in tokens)
    assert tokenizer.detokenize(tokens) == text
    ascii_only = text.encode("ascii", errors="ignore").decode()
    assert len(tokenizer.tokenize(ascii_only)) == math.ceil(len(ascii_only) / 4)


# --- tuner twin -------------------------------------------------------------------------------


SMALL_WORLD = """
name = "small"
model_name = "twin-small"
n_parallel = 2
n_max = 3
[acceptance]
synth_len = 2.5
[step]
rows_ms = [[1, 20.0], [2, 22.0], [8, 30.0]]
[draft]
call_ms = [[1, 2.0], [2, 3.0]]
[noise]
preset = "off"
"""


def test_tuner_twin_truth_and_bad_worlds(tmp_path: Path) -> None:
    world = tmp_path / "small.toml"
    world.write_text(SMALL_WORLD)
    runner = CliRunner()
    args = [
        "dev",
        "twin",
        "truth",
        str(world),
        "--weights",
        "1=1,2=1",
        "--rate",
        "2",
        "--duration",
        "60",
    ]
    result = runner.invoke(
        app, [*args, "--output-tokens", "32", "--rel-se", "0.02", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["concurrency"] == [1, 2] and set(report["closed"]) == {
        "plain",
        "N=0",
        "N=1",
        "N=2",
    }
    assert report["best"]["policy"] in ("N=0", "N=1")
    assert set(report["open_loop"]["best"]) == {"tps", "tpot"}
    missing = runner.invoke(app, ["dev", "twin", "truth", str(tmp_path / "none.toml")])
    invalid = tmp_path / "bad.toml"
    invalid.write_text("name = 3\n")
    broken = runner.invoke(app, ["dev", "twin", "truth", str(invalid)])
    for failed in (missing, broken):
        assert failed.exit_code == 2
        assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr


# --- speed: the tuner's figures are the twin's, at any speed -----------------------------------


@pytest.fixture(scope="module")
def twin_profiles(tmp_path_factory: pytest.TempPathFactory) -> dict[float, str]:
    """`tuner profile` of the twin spec, noise off, at speeds 1 and 20 (run side by side): levels
    1 and 3, 32 tokens a stream, one repeat; the database of each."""
    base = tmp_path_factory.mktemp("twin-profiles")
    script = twin_server_script(base)
    started = {}
    for speed in (1.0, 20.0):
        folder = base / f"speed-{speed:g}"
        folder.mkdir()
        overrides = [
            f"server.binary={script}",
            f"server.model={BENCH_WORLD}",
            f'server.args=["--kv-unified", "--speed", "{speed:g}", "--noise", "off"]',
            "workload.max_tokens=32",
            "workload.min_repeats=1",
            "workload.max_repeats=1",
            "probes.enabled=false",  # at speed 1 they take real time; tests of their own
        ]
        args = ["profile", str(TWIN_SPEC), "--levels", "1,3", "--budget", "0", "--skip-preflight"]
        args += [item for o in overrides for item in ("--set", o)]
        db = f"sqlite:///{folder / 'tuner.db'}"
        started[speed] = (db, start_tuner(args, tuner_env(db, folder / "cache")))
    out = {}
    for speed, (db, process) in started.items():
        result = finish(process, 300)
        assert result.returncode == 0, result.stderr[-3000:]
        out[speed] = db
    return out


def _levels(db: str) -> dict[tuple[str, int], tuple[float, float]]:
    from tuner.storage.orm import Level
    from tuner.storage.store import Store

    store = Store(db)
    try:
        with store.session() as session:
            return {
                (lv.config, lv.concurrency): (lv.tokens_per_second, lv.step_ms)
                for lv in session.scalars(select(Level))
            }
    finally:
        store.dispose()


@pytest.mark.slow  # two `tuner profile` runs side by side: about a minute
def test_a_profile_at_speed_20_stores_what_speed_1_does(
    twin_profiles: dict[float, str], tmp_path: Path
) -> None:
    """The two profiles agree; then `tuner twin calibrate --run` on one of them (one test:
    under xdist two tests could each make the profiles)."""
    slow, fast = _levels(twin_profiles[1.0]), _levels(twin_profiles[20.0])
    assert (
        set(slow)
        == set(fast)
        == {
            ("plain", 1),
            ("plain", 3),
            ("spec", 1),
            ("spec", 3),
            ("max-slots-2", 3),
        }
    )
    for key, (tps, step_ms) in slow.items():
        assert fast[key][0] == pytest.approx(tps, rel=0.01), key
        assert fast[key][1] == pytest.approx(step_ms, rel=0.01), key
    # The world's own figures (noise-free plain steps are deterministic): 1 stream at
    # 1000 / (rows_ms(1) + slots_ms(1) + attention) tok/s.
    assert slow[("plain", 1)][0] == pytest.approx(1000 / 36.3, rel=0.02)
    _tuner_twin_calibrate_from_a_stored_run(twin_profiles, tmp_path)


def _add_kernel_rows(db: str, run_id: int) -> None:
    """What llama-batched-bench would have stored for the run: the bench world's target forward
    at decode batches of 1..8 rows and verify batches of 1..3 streams x 7 rows."""
    from tuner.storage.orm import KernelRow
    from tuner.storage.store import Store
    from tuner.twin.world import Curve, load_world

    rows_ms = Curve(load_world(BENCH_WORLD).step.rows_ms)
    shapes = [("decode", n, 1) for n in range(1, 9)] + [("verify", n, 7) for n in (1, 2, 3)]
    store = Store(db)
    try:
        with store.session() as session:
            for shape, n_seq, per_seq in shapes:
                rows = n_seq * per_seq
                session.add(
                    KernelRow(
                        run_id=run_id,
                        shape=shape,
                        n_seq=n_seq,
                        tokens_per_seq=per_seq,
                        rows=rows,
                        step_ms=rows_ms(rows),
                    )
                )
            session.commit()
    finally:
        store.dispose()


def _tuner_twin_calibrate_from_a_stored_run(
    twin_profiles: dict[float, str], tmp_path: Path
) -> None:
    source = Path(twin_profiles[20.0].removeprefix("sqlite:///"))
    copy = tmp_path / "copy.db"
    copy.write_bytes(source.read_bytes())
    db = f"sqlite:///{copy}"
    _add_kernel_rows(db, 1)
    out = tmp_path / "fitted.toml"
    args = ["dev", "twin", "calibrate", "--run", "1", "--out", str(out), "--rel-se", "0.01"]
    result = finish(start_tuner(args, tuner_env(db, tmp_path / "cache")), 300)
    assert result.returncode == 0, result.stderr[-3000:]
    from tuner.twin.world import load_world

    world = load_world(out)
    assert world.model_name == "twin-twin-smollm2-135m-f32" and world.n_max == 6
    # Prompt rows priced from the levels' time to first token: the bench world's own 2.2 ms a
    # token (noise off), and the drafting server's 0.1 more.
    source_world = load_world(BENCH_WORLD)
    assert world.prefill.ms_per_token == pytest.approx(source_world.prefill.ms_per_token, rel=0.1)
    assert world.prefill.draft_ms_per_token == pytest.approx(
        source_world.prefill.draft_ms_per_token, abs=0.1
    )
    assert "from the slope of the levels' median time to first token" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if " table " in line]
    # policy, c=..., table, X, twin, Y, ±, se, error, E, %: plain and always-draft fitted, the
    # threshold held out (the run's off arm: threshold 2 at 3 streams, not drafting)
    assert [(r[0], r[1]) for r in rows] == [
        ("plain", "c=1"),
        ("plain", "c=3"),
        ("N=0", "c=1"),
        ("N=0", "c=3"),
        ("N=2", "c=3"),
    ], result.stdout
    errors = [float(r[-2]) for r in rows]
    assert max(abs(e) for e in errors[:4]) < 1.0, result.stdout
    # Held out: plain's step plus the draft model's re-evaluation (2 % of the target's forward).
    assert abs(errors[4]) < 5.0, result.stdout
