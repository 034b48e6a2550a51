"""The twin server against the real bench llama-server, field by field, for what the tuner reads.

Both are started from the same LaunchConfig (the twin with its own binary and the bench world as
its model), sent the same requests, and their answers held side by side: every field the twin
sends llama-server sends too, with the same JSON type (the twin's clock, `t_server`/`t_arrival`/
`twin`, aside), every field the tuner reads is in both, the counts agree, and the errors the
tuner turns into messages (POST /props without --props, bad bodies, a bad
--spec-draft-max-slots at start-up) are the same to the letter. Speed is never compared.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tunerproc import twin_server_script

from tuner.bench import Bench
from tuner.errors import ServerDiedError
from tuner.measure.client import LlamaClient, is_final_chunk, tokens_so_far
from tuner.measure.fingerprint import probe_build
from tuner.measure.launcher import LaunchConfig, ManagedServer
from tuner.measure.metrics import PER_POSITION, drafting_summary, parse_metrics

pytestmark = pytest.mark.bench

REPO = Path(__file__).resolve().parent.parent
BENCH_WORLD = REPO / "profiles" / "twin" / "bench-smollm2-cpu.toml"
KEY = "spec_draft_max_slots"
TWIN_ONLY = {"t_server", "t_arrival", "twin"}
# What the tuner reads (tuner.measure.*, tuner.decide.watch): paths into each answer.
PROPS_READ = [
    "total_slots",
    "model_path",
    "model_alias",
    "default_generation_settings.n_ctx",
    KEY,
    "endpoint_props",
    "endpoint_slots",
    "endpoint_metrics",
    "build_info",
]
SLOT_READ = ["id", "is_processing", "n_ctx", "id_task", "n_prompt_tokens", "next_token.0.n_decoded"]
TIMINGS_READ = ["timings.predicted_n", "timings.predicted_ms", "timings.prompt_n"]
DRAFT_READ = ["timings.draft_n", "timings.draft_n_accepted"]
METRICS_READ = {
    "tokens_predicted_total",
    "n_decode_total",
    "n_busy_slots_per_decode",
    "requests_processing",
    "requests_deferred",
    "spec_decode_num_drafts_total",
    "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total",
}


def _kind(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return repr(value) if value is None else "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def same_shape(real: Any, twin: Any, where: str = "") -> None:
    """Every field the twin sends, llama-server sends too, with the same JSON type."""
    if isinstance(twin, dict):
        assert isinstance(real, dict), f"{where}: llama-server sends {_kind(real)}, not an object"
        for key, value in twin.items():
            if key in TWIN_ONLY:
                continue
            assert key in real, f"{where}.{key}: the twin sends it, llama-server does not"
            same_shape(real[key], value, f"{where}.{key}")
    elif isinstance(twin, list):
        assert isinstance(real, list), f"{where}: llama-server sends {_kind(real)}, not a list"
        if twin and real:
            same_shape(real[0], twin[0], f"{where}[0]")
    elif twin is not None and real is not None:
        assert _kind(real) == _kind(twin), f"{where}: {_kind(real)} there, {_kind(twin)} here"


def field(answer: Any, path: str) -> Any:
    for part in path.split("."):
        answer = answer[int(part)] if isinstance(answer, list) else answer[part]
    return answer


def both_have(real: Any, twin: Any, paths: list[str], what: str) -> None:
    for path in paths:
        for name, answer in (("llama-server", real), ("twin", twin)):
            try:
                field(answer, path)
            except (KeyError, IndexError, TypeError):
                pytest.fail(f"{what}: {name} lacks {path}, which the tuner reads")


# --- the two servers --------------------------------------------------------------------------


def _configs(
    bench: Bench, tmp_path: Path, *extra: str, drafting: bool = True, max_slots: int | None = None
) -> tuple[LaunchConfig, LaunchConfig]:
    args = ["--kv-unified", *extra]
    if drafting:
        args += ["--model-draft", str(bench.draft), "--spec-type", "draft-simple"]
        args += ["--spec-draft-n-max", "3", "--spec-synth-len", "2.5"]
    real = LaunchConfig(
        binary=bench.server,
        model=bench.target,
        n_parallel=2,
        ctx_size=2048,
        threads=2,
        args=args,
        max_slots=max_slots,
    )
    twin = dataclasses.replace(
        real,
        binary=twin_server_script(tmp_path),
        model=BENCH_WORLD,
        args=[*args, "--speed", "20", "--noise", "off"],
    )
    return real, twin


@pytest.fixture(scope="module")
def pair(bench: Bench, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The drafting bench server and its twin, both with --props (and --metrics): their URLs."""
    tmp_path = tmp_path_factory.mktemp("pair")
    real, twin = _configs(bench, tmp_path, "--props")
    with (
        ManagedServer(real, tmp_path / "real.log", start_timeout_s=180) as a,
        ManagedServer(twin, tmp_path / "twin.log", start_timeout_s=60) as b,
    ):
        yield a.url, b.url


def _stream(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    with (
        httpx.Client(timeout=300) as client,
        client.stream("POST", url + path, json={**body, "stream": True}) as response,
    ):
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def _slots_while_generating(url: str) -> list[dict[str, Any]]:
    """GET /slots while a request generates (a released slot may show no task at all)."""
    body = {"prompt": "A long tale", "n_predict": 24, "seed": 3, "ignore_eos": True, "stream": True}
    slots: list[dict[str, Any]] = []
    with (
        httpx.Client(timeout=300) as client,
        client.stream("POST", url + "/completion", json=body) as response,
    ):
        for line in response.iter_lines():  # to its end, the slots read at its first chunk
            if line.startswith("data: ") and not slots:
                slots = client.get(url + "/slots").json()
    return slots


def _post(url: str, path: str, body: dict[str, Any] | bytes) -> httpx.Response:
    with httpx.Client(timeout=300) as client:
        if isinstance(body, bytes):
            headers = {"Content-Type": "application/json"}
            return client.post(url + path, content=body, headers=headers)
        return client.post(url + path, json=body)


# --- the contract -----------------------------------------------------------------------------


def test_props_slots_metrics_and_the_switch_match(pair: tuple[str, str]) -> None:
    real_url, twin_url = pair
    answers = {}
    for name, url in (("real", real_url), ("twin", twin_url)):
        with LlamaClient(url, timeout=300) as api:
            props = api.props()
            api.set_max_slots(1)  # read back, or it raises
            switched = api.props()[KEY]
            posted = _post(url, "/props", {KEY: 0}).json()
            done = api.complete(
                {"prompt": "The sea", "n_predict": 8, "seed": 5, "ignore_eos": True}
            )
            answers[name] = {
                "props": props,
                "switched": switched,
                "posted": posted,
                "slots": _slots_while_generating(url),
                "metrics": api.metrics(),
                "metrics_text": httpx.get(url + "/metrics").text,
                "done": done,
                "tokenize": _post(url, "/tokenize", {"content": "Hello world"}).json(),
                "detokenize": _post(url, "/detokenize", {"tokens": api.tokenize("Hi")}).json(),
                "template": _post(
                    url, "/apply-template", {"messages": [{"role": "user", "content": "hi"}]}
                ).json(),
                "health": httpx.get(url + "/health").json(),
                "missing": httpx.get(url + "/no-such-endpoint").status_code,
            }
    real, twin = answers["real"], answers["twin"]
    same_shape(real["props"], twin["props"], "GET /props")
    both_have(real["props"], twin["props"], PROPS_READ, "GET /props")
    for key in ("total_slots", KEY, "endpoint_props", "endpoint_slots", "endpoint_metrics"):
        assert real["props"][key] == twin["props"][key], key
    n_ctx = "default_generation_settings.n_ctx"
    assert field(real["props"], n_ctx) == field(twin["props"], n_ctx)
    assert real["switched"] == twin["switched"] == 1
    assert real["posted"] == twin["posted"] == {"success": True, KEY: 0}
    assert len(real["slots"]) == len(twin["slots"]) == 2
    busy = [[s for s in answers[n]["slots"] if s["is_processing"]] for n in ("real", "twin")]
    assert len(busy[0]) == len(busy[1]) == 1, (real["slots"], twin["slots"])
    same_shape(busy[0][0], busy[1][0], "GET /slots[]")
    both_have(busy[0][0], busy[1][0], SLOT_READ, "GET /slots[]")
    assert busy[0][0]["next_token"][0]["n_decoded"] > 0 < busy[1][0]["next_token"][0]["n_decoded"]
    # /metrics: the names the tuner reads, counters and gauges alike, per-position counts
    for text in (real["metrics_text"], twin["metrics_text"]):
        scraped = parse_metrics(text)
        names = {s.name for s in scraped.samples}
        assert names >= METRICS_READ, METRICS_READ - names
        assert scraped.by_label(PER_POSITION, "position"), text[-500:]
        assert drafting_summary(scraped)["drafts"] > 0
    gauges = {
        name: {s.name: s.gauge for s in parse_metrics(answers[name]["metrics_text"]).samples}
        for name in answers
    }
    assert {n: gauges["real"][n] for n in METRICS_READ} == {
        n: gauges["twin"][n] for n in METRICS_READ
    }
    assert real["done"].tokens == twin["done"].tokens == 8
    same_shape(real["done"].final, twin["done"].final, "POST /completion")
    both_have(real["done"].final, twin["done"].final, TIMINGS_READ + DRAFT_READ, "/completion")
    for key in ("tokenize", "detokenize", "template", "health"):
        same_shape(real[key], twin[key], key)
    assert real["missing"] == twin["missing"] == 404


def test_completions_stream_alike(pair: tuple[str, str]) -> None:
    real_url, twin_url = pair
    body = {"prompt": "Once upon a time", "n_predict": 12, "seed": 9, "ignore_eos": True}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "seed": 9}
    got = {}
    for name, url in (("real", real_url), ("twin", twin_url)):
        got[name] = {
            "plain": _stream(url, "/completion", body),
            "timed": _stream(url, "/completion", {**body, "timings_per_token": True}),
            "chat": _stream(url, "/v1/chat/completions", {**chat, "timings_per_token": True}),
            "chat_whole": _post(url, "/v1/chat/completions", chat).json(),
        }
    real, twin = got["real"], got["twin"]
    for kind in ("plain", "timed", "chat"):
        r_chunks, t_chunks = real[kind], twin[kind]
        # first partial chunk, last partial chunk, final chunk: the same fields
        for pick in (0, -2, -1):
            same_shape(r_chunks[pick], t_chunks[pick], f"{kind} chunk {pick}")
        r_final = next(c for c in r_chunks if is_final_chunk(c))
        t_final = next(c for c in t_chunks if is_final_chunk(c))
        assert r_final is r_chunks[-1] and t_final is t_chunks[-1], kind
        both_have(r_final, t_final, TIMINGS_READ, f"{kind} final chunk")
        # the tuner counts tokens by tokens_so_far: the last count is the request's length
        expected = 12 if kind != "chat" else 6
        assert max(map(tokens_so_far, r_chunks)) == max(map(tokens_so_far, t_chunks)) == expected
    both_have(real["timed"][0], twin["timed"][0], ["tokens_predicted", "timings.predicted_n"], "")
    same_shape(real["chat_whole"], twin["chat_whole"], "chat, not streamed")
    both_have(real["chat_whole"], twin["chat_whole"], TIMINGS_READ, "chat, not streamed")
    assert real["chat_whole"]["usage"]["completion_tokens"] == 6
    assert twin["chat_whole"]["usage"]["completion_tokens"] == 6


def test_the_errors_the_tuner_reads_are_the_same(bench: Bench, tmp_path: Path) -> None:
    bad_bodies = [
        b"not json",
        b"",
        b"[]",
        b"3",
        b"{}",
        b'{"other": 1}',
        b'{"spec_draft_max_slots": 1, "other": 2}',
        b'{"spec_draft_max_slots": -1}',
        b'{"spec_draft_max_slots": 1.5}',
        b'{"spec_draft_max_slots": 2.0}',
        b'{"spec_draft_max_slots": "2"}',
        b'{"spec_draft_max_slots": true}',
        b'{"spec_draft_max_slots": null}',
        b'{"spec_draft_max_slots": 4294967296}',
    ]
    answers: dict[str, list[tuple[int, Any]]] = {}
    for props in (True, False):
        real, twin = _configs(bench, tmp_path, *(["--props"] if props else []), drafting=False)
        for name, config in (("real", real), ("twin", twin)):
            with ManagedServer(config, tmp_path / f"{name}-{props}.log", start_timeout_s=180) as s:
                bodies = bad_bodies if props else [json.dumps({KEY: 1}).encode()]
                replies = [_post(s.url, "/props", body) for body in bodies]
                answers[f"{name}-{props}"] = [(r.status_code, r.json()) for r in replies]
    assert answers["twin-True"] == answers["real-True"]
    assert answers["twin-False"] == answers["real-False"]
    assert answers["real-False"][0][0] == 501
    # A bad threshold at start-up: both refuse to start, with the patch's message.
    for config in _configs(bench, tmp_path, drafting=False, max_slots=None):
        bad = dataclasses.replace(config, args=[*config.args, "--spec-draft-max-slots", "-1"])
        server = ManagedServer(bad, tmp_path / "bad.log", start_timeout_s=120)
        with pytest.raises(ServerDiedError) as failure:
            server.start()
        assert "--spec-draft-max-slots expects a non-negative integer" in str(failure.value)


def test_the_build_probe_sees_both_alike(bench: Bench, tmp_path: Path) -> None:
    for info in (probe_build(bench.server), probe_build(twin_server_script(tmp_path))):
        assert info.has_max_slots  # --help lists --spec-draft-max-slots
        lines = info.version_text.splitlines()
        assert [line.split(" ")[:2] for line in lines][1] == ["built", "with"], lines
        assert lines[0].startswith("version: "), lines
