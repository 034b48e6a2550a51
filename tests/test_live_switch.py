"""The patch's live switch on the real bench: `POST /props {"spec_draft_max_slots": N}` on a
server started with `--props`, read back through `GET /props`, kept across sleep.

The switch is shown through draft counters (per-request `timings.draft_n` and /metrics'
`spec_decode_num_drafts_total`), never through speed: while more than N slots generate, a request
that runs entirely inside that window starts no draft at all.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from tuner.bench import Bench
from tuner.measure.launcher import LaunchConfig, ManagedServer
from tuner.measure.metrics import Metrics, parse_metrics

pytestmark = pytest.mark.bench

KEY = "spec_draft_max_slots"
EXPECTED = 'expected exactly {"spec_draft_max_slots": N}, N an integer >= 0, 0 = no limit'
PROPS_ERROR = "This server does not support changing global properties. Start it with `--props`"
BACKGROUND = 3  # long streams that keep generating across every switch
PROBE_TOKENS = 24
HANG_S = 300  # guards against a hung server only: a loaded 2-core machine can be very slow
N_MAX = 6


def launch(
    bench: Bench,
    tmp_path: Path,
    *extra: str,
    drafting: bool = True,
    max_slots: int | None = None,
    env: dict[str, str] | None = None,
    name: str = "server",
) -> ManagedServer:
    """A bench llama-server; drafting: the F32 target with the one-block draft (n-max 6,
    synthetic acceptance 3.5), otherwise the tiny draft model alone (enough for /props)."""
    args = ["--kv-unified", *extra]
    model = bench.draft
    if drafting:
        model = bench.target
        args += [
            "--model-draft",
            str(bench.draft),
            "--spec-type",
            "draft-simple",
            "--spec-draft-n-max",
            str(N_MAX),
            "--spec-synth-len",
            "3.5",
        ]
    config = LaunchConfig(
        binary=bench.server,
        model=model,
        n_parallel=8,
        ctx_size=8192,
        threads=2,
        args=args,
        env=env or {},
        max_slots=max_slots,
    )
    return ManagedServer(config, tmp_path / f"{name}.log", start_timeout_s=120)


def _completion(prompt: str, n_predict: int, **extra: object) -> dict[str, object]:
    return {
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": 0.0,
        "ignore_eos": True,
        "cache_prompt": False,
        **extra,
    }


def _props(client: httpx.Client, url: str) -> dict:
    response = client.get(f"{url}/props")
    assert response.status_code == 200, response.text
    return response.json()


def _set(client: httpx.Client, url: str, n: int) -> None:
    response = client.post(f"{url}/props", json={KEY: n})
    assert response.status_code == 200, response.text
    assert response.json() == {"success": True, KEY: n}
    assert _props(client, url)[KEY] == n


async def _aset(client: httpx.AsyncClient, url: str, n: int) -> None:
    response = await client.post(f"{url}/props", json={KEY: n})
    assert response.status_code == 200, response.text
    shown = (await client.get(f"{url}/props")).json()
    assert shown[KEY] == n, shown


async def _flushed(client: httpx.AsyncClient, url: str, before: Metrics) -> Metrics:
    """/metrics once the probe's stats are in: llama-server adds a request's tokens and drafts to
    /metrics as it releases the slot, just after sending the response (only the probe ends)."""
    deadline = time.monotonic() + HANG_S
    while True:
        after = parse_metrics((await client.get(f"{url}/metrics")).text)
        grown = after["tokens_predicted_total"] - before.get("tokens_predicted_total", 0.0)
        if grown >= PROBE_TOKENS or time.monotonic() > deadline:
            return after
        await asyncio.sleep(0.05)


async def _switch_under_load(url: str) -> list[dict]:
    """Three long streams generate throughout; a fourth stream sends one short probe per phase
    while N goes 0 -> 1 -> 0. Each probe runs entirely inside its phase with all four generating;
    per probe: its draft_n and /metrics' drafts_total growth (llama-server adds a request's drafts
    when it ends, and only probes end here)."""
    async with httpx.AsyncClient(timeout=HANG_S) as client:
        tokens = [0] * BACKGROUND
        started = [asyncio.Event() for _ in range(BACKGROUND)]

        async def background(i: int) -> None:
            body = _completion(f"Long story {i}: once upon a time", 2000, stream=True)
            async with client.stream("POST", f"{url}/completion", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: ") and '"content"' in line:
                        tokens[i] += 1
                        started[i].set()

        streams = [asyncio.create_task(background(i)) for i in range(BACKGROUND)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), timeout=HANG_S)
        probes: list[dict] = []
        for phase, n in enumerate((0, 1, 0)):
            await _aset(client, url, n)
            before = parse_metrics((await client.get(f"{url}/metrics")).text)
            seen = list(tokens)
            response = await client.post(
                f"{url}/completion", json=_completion(f"Probe {phase}: the sea", PROBE_TOKENS)
            )
            assert response.status_code == 200, response.text
            after = await _flushed(client, url, before)
            probes.append(
                {
                    "n": n,
                    "draft_n": response.json()["timings"].get("draft_n", 0),
                    "drafts_total": after["spec_decode_num_drafts_total"]
                    - before.get("spec_decode_num_drafts_total", 0.0),
                    "background_grew": all(t > s for t, s in zip(tokens, seen, strict=True)),
                    "background_ended": any(s.done() for s in streams),
                }
            )
        for stream in streams:
            stream.cancel()  # closing the connections cancels the long requests
        await asyncio.gather(*streams, return_exceptions=True)
    return probes


def test_the_threshold_switches_live_while_streams_generate(bench: Bench, tmp_path: Path) -> None:
    with launch(bench, tmp_path, "--props") as server:
        probes = asyncio.run(_switch_under_load(server.url))
        with httpx.Client(timeout=10) as client:
            assert _props(client, server.url)[KEY] == 0
    # The long streams kept generating across every probe, so four slots generated throughout.
    assert all(p["background_grew"] and not p["background_ended"] for p in probes), probes
    for probe in probes:
        if probe["n"] == 1:
            # More than one slot generating from the probe's first step to its last: no draft
            # started, neither the probe's nor the counter's.
            assert probe["draft_n"] == 0, probes
            assert probe["drafts_total"] == 0, probes
        else:
            # N = 0, no limit: every step but perhaps the last drafts (at most n-max + 1 tokens
            # a step, so a 24-token probe takes at least 4 steps).
            assert probe["drafts_total"] >= 3, probes
            assert probe["draft_n"] >= 3, probes


def test_get_props_reports_the_value_and_bad_bodies_get_400(bench: Bench, tmp_path: Path) -> None:
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
    with (
        launch(bench, tmp_path, "--props", drafting=False, max_slots=3) as server,
        httpx.Client(timeout=10) as client,
    ):
        assert _props(client, server.url)[KEY] == 3  # the flag's value until set live
        messages = {}
        for body in bad_bodies:
            response = client.post(
                f"{server.url}/props", content=body, headers={"Content-Type": "application/json"}
            )
            assert response.status_code == 400, (body, response.text)
            error = response.json()["error"]
            assert error["code"] == 400 and error["type"] == "invalid_request_error", error
            messages[body] = error["message"]
        assert _props(client, server.url)[KEY] == 3  # no bad body changed anything
        _set(client, server.url, 0)
        _set(client, server.url, 8)
    for body, message in messages.items():
        assert "\n" not in message, (body, message)
        assert message.startswith("invalid POST /props body ("), message
        assert message.endswith(EXPECTED), message
    assert "not valid JSON" in messages[b"not json"]
    assert 'unknown key "other"' in messages[b'{"spec_draft_max_slots": 1, "other": 2}']
    assert "no key" in messages[b"{}"]
    assert "negative: -1" in messages[b'{"spec_draft_max_slots": -1}']
    assert "not an integer: 1.5" in messages[b'{"spec_draft_max_slots": 1.5}']
    assert "too large" in messages[b'{"spec_draft_max_slots": 4294967296}']


def test_without_props_post_is_refused_and_get_still_reports(bench: Bench, tmp_path: Path) -> None:
    """The threshold set by its environment variable this time (the flag: the tests above),
    reported by GET /props: both set the one option whose effect on drafting test_patch.py
    shows."""
    with (
        launch(
            bench, tmp_path, drafting=False, env={"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS": "2"}
        ) as server,
        httpx.Client(timeout=10) as client,
    ):
        props = _props(client, server.url)
        assert props[KEY] == 2 and props["endpoint_props"] is False
        response = client.post(f"{server.url}/props", json={KEY: 1})
        assert _props(client, server.url)[KEY] == 2
    # llama-server's own answer, unchanged by the patch (the tuner names the flag from it).
    assert response.status_code == 501, response.text
    assert response.json() == {
        "error": {"code": 501, "message": PROPS_ERROR, "type": "not_supported_error"}
    }


def _wait_sleeping(client: httpx.Client, url: str, timeout_s: float = HANG_S) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        props = _props(client, url)
        if props["is_sleeping"]:
            return props
        time.sleep(0.2)
    raise AssertionError(f"the server did not fall asleep within {timeout_s:.0f} s")


async def _four_equal(url: str) -> list[int]:
    """Four greedy requests of one length started together; their draft_n."""
    async with httpx.AsyncClient(timeout=HANG_S) as client:
        responses = await asyncio.gather(
            *(
                client.post(f"{url}/completion", json=_completion(f"Tale {i}: a ship", 32))
                for i in range(4)
            )
        )
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    return [r.json()["timings"].get("draft_n", 0) for r in responses]


def test_a_live_value_survives_sleep(bench: Bench, tmp_path: Path) -> None:
    """Sleep unloads the model and reloads it at the next request: a value set before sleep, and
    one set while asleep (without waking it), is what the reloaded server schedules by."""
    with (
        launch(bench, tmp_path, "--props", "--sleep-idle-seconds", "1") as server,
        httpx.Client(timeout=HANG_S) as client,
    ):
        _set(client, server.url, 1)
        asleep = _wait_sleeping(client, server.url)
        assert asleep[KEY] == 1, asleep  # the cached props of a sleeping server
        limited = asyncio.run(_four_equal(server.url))  # wakes it: the model reloads
        assert _props(client, server.url)[KEY] == 1

        _wait_sleeping(client, server.url)
        _set(client, server.url, 0)  # while asleep: needs no reload
        still = _props(client, server.url)
        assert still["is_sleeping"] and still[KEY] == 0, still
        unlimited = asyncio.run(_four_equal(server.url))
        assert _props(client, server.url)[KEY] == 0
    log = server.log_path.read_text(errors="replace")
    # Both wakes reloaded the model (it may fall asleep once more before it is stopped).
    assert log.count("server is entering sleeping state") >= 2, log[-2000:]
    assert log.count("server is exiting sleeping state") >= 2, log[-2000:]
    # N = 1 with four generating: drafts only where requests start or end a step or two apart
    # (fewer than two generating), as in test_patch; N = 0: every step of every request drafts
    # (32 tokens: about 9 drafts of 6 tokens each at synthetic length 3.5).
    assert sum(limited) <= 4 * N_MAX * 2, (limited, unlimited)
    assert all(d >= 12 for d in unlimited), (limited, unlimited)
