"""The llama-server client (tuner.measure.client) against a fake HTTP server that stands in for
llama-server only to produce protocol cases: a wrong or missing key, a URL that is not a
llama-server, endpoints switched off, POST /props on a server without `--props`, a server that
accepts the live switch and changes nothing, a bad body, and server-sent events split anywhere.
Also the request seeds the load generator sends. The last test sets and reads the switch on the
real bench (what the switch does to drafting is tests/test_live_switch.py's)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakellama import Fake, fake_server, llama_error

from tuner.bench import Bench
from tuner.errors import ConfigError, EndpointMissingError, ServerError
from tuner.measure.client import (
    CHAT_PATH,
    AsyncLlamaClient,
    LlamaClient,
)
from tuner.measure.launcher import LaunchConfig, ManagedServer
from tuner.measure.load import LoadGenerator, Workload, request_seed
from tuner.measure.metrics import parse_metrics

PROPS = {"total_slots": 4, "model_path": "/m/x.gguf"}
PROPS_ERROR = "This server does not support changing global properties. Start it with `--props`"
SLOTS_ERROR = "This server does not support slots endpoint. Start it with `--slots`"


@pytest.fixture
def fake() -> Iterator[Fake]:
    with fake_server() as state:
        yield state


def error_of(call: Callable[[], object], kind: type[Exception] = ServerError) -> str:
    with pytest.raises(kind) as caught:
        call()
    text = str(caught.value)
    assert "\n" not in text, text
    return text


# --- who is answering -------------------------------------------------------------------------


def test_the_key_travels_as_a_bearer_token(fake: Fake) -> None:
    fake.key = "sesame"
    fake.get["/props"] = (200, json.dumps(PROPS))
    assert LlamaClient(fake.url, "sesame").props()["total_slots"] == 4
    assert error_of(lambda: LlamaClient(fake.url, "wrong").props()) == (
        f"{fake.url} rejected the API key (HTTP 401): check --api-key"
    )
    assert error_of(lambda: LlamaClient(fake.url).props()) == (
        f"{fake.url} wants an API key: pass --api-key or set TUNER_API_KEY"
    )


@pytest.mark.parametrize(
    "answer",
    [(200, json.dumps({"hello": "world"})), (200, "<html>hi</html>"), (404, "File Not Found")],
)
def test_a_url_that_is_not_a_llama_server(fake: Fake, answer: tuple[int, str]) -> None:
    fake.get["/props"] = answer
    text = error_of(lambda: LlamaClient(fake.url).props())
    assert text.startswith(
        f"{fake.url} is not a llama-server (GET /props answered HTTP {answer[0]}"
    )


def test_a_server_that_is_not_there() -> None:
    text = error_of(lambda: LlamaClient("http://127.0.0.1:9", timeout=2).props())
    assert text.startswith("cannot reach http://127.0.0.1:9: ConnectError"), text
    assert LlamaClient("http://127.0.0.1:9", timeout=2).health() is False


def test_endpoints_switched_off_name_their_flag(fake: Fake) -> None:
    fake.get["/slots"] = llama_error(501, SLOTS_ERROR, "not_supported_error")
    text = error_of(lambda: LlamaClient(fake.url).slots(), EndpointMissingError)
    assert text == (
        f"{fake.url} does not expose /slots: GET /slots answered HTTP 501 ({SLOTS_ERROR}); "
        "start llama-server with --slots"
    )
    text = error_of(lambda: LlamaClient(fake.url).metrics(), EndpointMissingError)
    assert "does not expose /metrics" in text and text.endswith("start llama-server with --metrics")
    fake.get["/health"] = (503, json.dumps({"error": {"message": "Loading model"}}))
    assert LlamaClient(fake.url).health() is False
    fake.get["/health"] = (200, json.dumps({"status": "ok"}))
    assert LlamaClient(fake.url).health() is True


# --- the live switch --------------------------------------------------------------------------


def test_post_props_without_the_props_flag(fake: Fake) -> None:
    fake.get["/props"] = (200, json.dumps(PROPS))
    fake.post["/props"] = lambda body: llama_error(501, PROPS_ERROR, "not_supported_error")
    with pytest.raises(EndpointMissingError) as caught:
        LlamaClient(fake.url).set_max_slots(2)
    assert str(caught.value) == (
        f"{fake.url} does not allow changing its settings live: POST /props answered HTTP 501 "
        f"({PROPS_ERROR}); start llama-server with --props"
    )
    assert caught.value.path == "/props" and caught.value.status == 501


def test_a_stock_server_takes_the_switch_and_changes_nothing(fake: Fake) -> None:
    fake.get["/props"] = (200, json.dumps(PROPS))
    fake.post["/props"] = lambda body: (200, json.dumps({"success": True}))
    api = LlamaClient(fake.url)
    assert api.max_slots() is None  # no such field: a server without the patch's switch
    text = error_of(lambda: api.set_max_slots(2))
    assert text == (
        f"{fake.url} does not support the live switch: it accepted spec_draft_max_slots=2 on "
        "POST /props but GET /props then reported no such field; it needs a llama-server built "
        "with the tuner's patch (`tuner bench setup`)"
    )
    # A field that does not follow the POST is refused the same way.
    fake.get["/props"] = (200, json.dumps({**PROPS, "spec_draft_max_slots": 0}))
    assert api.max_slots() == 0
    assert "GET /props then reported spec_draft_max_slots=0" in error_of(
        lambda: api.set_max_slots(3)
    )


def test_the_switch_is_read_back(fake: Fake) -> None:
    state = {"spec_draft_max_slots": 0}

    def post(body: dict[str, Any]) -> tuple[int, str]:
        value = body.get("spec_draft_max_slots")
        if not isinstance(value, int) or value < 0:
            return llama_error(400, "spec_draft_max_slots must be an integer >= 0", "invalid")
        state["spec_draft_max_slots"] = value
        fake.get["/props"] = (200, json.dumps({**PROPS, **state}))
        return 200, json.dumps({"success": True})

    fake.get["/props"] = (200, json.dumps({**PROPS, **state}))
    fake.post["/props"] = post
    api = LlamaClient(fake.url)
    api.set_max_slots(3)
    assert api.max_slots() == 3
    assert fake.bodies[-1] == ("/props", {"spec_draft_max_slots": 3})
    api.set_max_slots(0)
    assert api.max_slots() == 0
    with pytest.raises(ConfigError, match="0 \\(no limit\\) or more"):
        api.set_max_slots(-1)
    # A bad body (what the patch answers with 400) is one line with the server's reason.
    text = error_of(lambda: api.set_props({"spec_draft_max_slots": "two"}))
    assert text == (
        f'{fake.url} refused POST /props {{"spec_draft_max_slots": "two"}}: '
        "spec_draft_max_slots must be an integer >= 0"
    )


# --- /metrics ---------------------------------------------------------------------------------

METRICS = """\
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 120
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 700
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 3
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 9
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 4
"""


def test_metrics_keep_labels_as_dicts(fake: Fake) -> None:
    fake.get["/metrics"] = (200, METRICS)
    scraped = LlamaClient(fake.url).metrics()
    per_position = "spec_decode_num_accepted_tokens_per_pos_total"
    assert scraped.by_label(per_position, "position") == {"0": 9.0, "1": 4.0}
    assert scraped.value(per_position, position="1") == 4.0
    assert scraped["tokens_predicted_total"] == 120 and "requests_processing" in scraped
    later = parse_metrics(
        METRICS.replace(" 120", " 150").replace(" 3\n", " 1\n").replace("} 4", "} 6")
    )
    diff = later.since(scraped)
    assert diff["tokens_predicted_total"] == 30
    assert diff["requests_processing"] == 1  # a gauge keeps its later value
    assert diff.value("n_tokens_max_total") == 700  # a maximum is not summed
    assert diff.by_label(per_position, "position") == {"0": 0.0, "1": 2.0}


# --- completions and server-sent events -------------------------------------------------------


def sse(*chunks: dict[str, Any] | str) -> bytes:
    return b"".join(
        f"data: {c if isinstance(c, str) else json.dumps(c, ensure_ascii=False)}\n\n".encode()
        for c in chunks
    )


def byte_by_byte(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


TRICKY = "a\u2028b\x85c\x1cd\u00e9"  # line separators str.splitlines would break at, and UTF-8


def completion_events(body: dict[str, Any]) -> list[bytes]:
    n = int(body["n_predict"])
    chunks: list[dict[str, Any] | str] = [
        {"content": TRICKY, "tokens_predicted": i, "stop": False} for i in range(1, n + 1)
    ]
    chunks.append({"content": "", "stop": True, "tokens_predicted": n, "timings": timings(n)})
    return byte_by_byte(sse(*chunks))


def timings(n: int) -> dict[str, Any]:
    return {"predicted_n": n, "prompt_n": 5, "predicted_ms": 10.0 * n, "draft_n": 6}


def test_a_stream_split_anywhere_comes_whole(fake: Fake) -> None:
    fake.events["/completion"] = completion_events
    seen: list[dict[str, Any]] = []
    done = LlamaClient(fake.url).stream({"prompt": "x", "n_predict": 3}, on_chunk=seen.append)
    assert [c["content"] for c in seen[:3]] == [TRICKY] * 3
    assert [c["tokens_predicted"] for c in seen] == [1, 2, 3, 3]
    assert (done.tokens, done.prompt_tokens, done.generation_ms, done.draft_n) == (3, 5, 30.0, 6)
    assert fake.bodies[-1][1]["stream"] is True

    async def streamed() -> list[int]:
        counts: list[int] = []
        async with AsyncLlamaClient(fake.url) as api:
            await api.stream(
                {"prompt": "x", "n_predict": 4},
                on_chunk=lambda c: counts.append(c["tokens_predicted"]),
            )
        return counts

    assert asyncio.run(streamed()) == [1, 2, 3, 4, 4]


def test_a_chat_stream_ends_with_its_timings_and_done(fake: Fake) -> None:
    final = {"choices": [{"finish_reason": "length", "delta": {}}], "timings": timings(2)}
    fake.events[CHAT_PATH] = lambda body: [
        sse(
            {"choices": [{"delta": {"role": "assistant"}}]},
            {"choices": [{"delta": {"content": TRICKY}}], "timings": {"predicted_n": 1}},
            final,
            "[DONE]",
        )
    ]
    done = LlamaClient(fake.url).stream({"messages": []}, CHAT_PATH)
    assert done.tokens == 2 and done.final == final


def test_a_broken_stream_is_one_line(fake: Fake) -> None:
    fake.events["/completion"] = lambda body: [sse({"content": "a", "stop": False})]
    text = error_of(lambda: LlamaClient(fake.url).stream({"prompt": "x"}))
    assert text == f"POST /completion on {fake.url}: the stream ended without a final chunk"
    fake.events["/completion"] = lambda body: [sse({"error": {"message": "out of context"}})]
    assert "failed mid-stream" in error_of(lambda: LlamaClient(fake.url).stream({"prompt": "x"}))
    del fake.events["/completion"]
    fake.post["/completion"] = lambda body: llama_error(400, "bad n_probs", "invalid")
    text = error_of(lambda: LlamaClient(fake.url).stream({"prompt": "x"}))
    assert text.startswith(f"POST /completion on {fake.url} answered HTTP 400: ")
    assert "bad n_probs" in text
    text = error_of(lambda: LlamaClient(fake.url).complete({"prompt": "x"}))
    assert text == f"POST /completion on {fake.url} answered HTTP 400: bad n_probs"


def test_tokenize_detokenize_and_the_template(fake: Fake) -> None:
    fake.post["/tokenize"] = lambda body: (
        200,
        json.dumps({"tokens": [1, 2, len(body["content"])]}),
    )
    fake.post["/detokenize"] = lambda body: (200, json.dumps({"content": "ab"}))
    fake.post["/apply-template"] = lambda body: (200, json.dumps({"prompt": "<user>hi"}))
    api = LlamaClient(fake.url)
    assert api.tokenize("abcd") == [1, 2, 4]
    assert api.detokenize([1, 2]) == "ab"
    assert api.apply_template([{"role": "user", "content": "hi"}]) == "<user>hi"
    fake.post["/tokenize"] = lambda body: (200, json.dumps({"nothing": []}))
    assert error_of(lambda: api.tokenize("a")) == (
        f"POST /tokenize on {fake.url} answered without 'tokens'"
    )


# --- seeds ------------------------------------------------------------------------------------


def test_request_seeds_follow_seed_round_and_stream() -> None:
    seeds = {(r, i): request_seed(7, r, i) for r in range(20) for i in range(8)}
    assert len(set(seeds.values())) == len(seeds)  # every round and stream its own
    assert all(0 <= s < 2**32 - 1 for s in seeds.values())  # 0xFFFFFFFF would mean "random"
    assert request_seed(7, 3, 2) == seeds[(3, 2)]  # the same again, in another call
    assert request_seed(8, 3, 2) != seeds[(3, 2)]  # another workload seed, other draws


def _fake_llama(fake: Fake) -> None:
    fake.post["/tokenize"] = lambda body: (200, json.dumps({"tokens": list(range(11))}))

    def complete(body: dict[str, Any]) -> tuple[int, str]:
        n = int(body["n_predict"])
        return 200, json.dumps({"content": "x", "tokens_predicted": n, "timings": timings(n)})

    fake.post["/completion"] = complete
    fake.events["/completion"] = completion_events


def _sent_seeds(fake: Fake) -> list[int]:
    with fake.lock:
        sent = [body["seed"] for path, body in fake.bodies if path == "/completion"]
        fake.bodies.clear()
    return sent


@pytest.mark.parametrize("stream", [False, True])
def test_every_request_carries_its_seed(fake: Fake, stream: bool) -> None:
    _fake_llama(fake)
    generator = LoadGenerator(fake.url, Workload(max_tokens=4, seed=11, stream=stream))
    samples = generator.run(3, round_key=5)
    assert all(s.ok and s.tokens == 4 for s in samples), samples
    assert sorted(_sent_seeds(fake)) == sorted(request_seed(11, 5, i) for i in range(3))
    # The other half of a pair (a new generator, as another configuration gets) sends the same.
    LoadGenerator(fake.url, Workload(max_tokens=4, seed=11, stream=stream)).run(3, round_key=5)
    assert sorted(_sent_seeds(fake)) == sorted(request_seed(11, 5, i) for i in range(3))
    generator.run(3, round_key=6)
    assert sorted(_sent_seeds(fake)) == sorted(request_seed(11, 6, i) for i in range(3))
    # Open loop: keyed by the request's index in the schedule.
    start = time.perf_counter()
    _, arrivals = generator.run_arrivals([0.0, 0.01, 0.02, 0.03], round_key=2)
    assert all(s.ok for s in arrivals) and time.perf_counter() - start < 30
    assert sorted(_sent_seeds(fake)) == sorted(request_seed(11, 2, i) for i in range(4))


# --- the live switch on the real bench --------------------------------------------------------


@pytest.mark.bench
def test_the_live_switch_on_the_bench(bench: Bench, tmp_path: Path) -> None:
    """The patched bench server: the switch set and read back; a bad body refused in one line;
    a server started without --props names the flag. (What the switch does to drafting is
    tests/test_live_switch.py's.)"""

    def launch(*args: str, name: str) -> ManagedServer:
        # The tiny draft model alone: enough for /props, quick to start.
        config = LaunchConfig(bench.server, bench.draft, 2, 512, threads=1, args=list(args))
        return ManagedServer(config, tmp_path / f"{name}.log", start_timeout_s=120)

    with (
        launch("--props", "--spec-draft-max-slots", "2", name="props") as server,
        LlamaClient(server.url) as api,
    ):
        assert api.max_slots() == 2  # the launch's value
        api.set_max_slots(1)
        assert api.max_slots() == 1
        api.set_max_slots(0)
        assert api.max_slots() == 0
        text = error_of(lambda: api.set_props({"spec_draft_max_slots": -3}))
        assert text.startswith(f'{server.url} refused POST /props {{"spec_draft_max_slots": -3}}')
        assert "negative" in text
        assert api.max_slots() == 0  # a refused value changes nothing
    with launch(name="plain") as server, LlamaClient(server.url) as api:
        assert api.max_slots() == 0  # the patch reports the field with or without --props
        text = error_of(lambda: api.set_max_slots(1), EndpointMissingError)
        assert text.endswith("start llama-server with --props"), text
        assert api.max_slots() == 0
