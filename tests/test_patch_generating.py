"""What the threshold counts: generating slots only. A slot still reading its prompt neither
drafts nor counts, in the patch (llama-server's `SLOT_STATE_GENERATING`: a slot in
STARTED / PROCESSING_PROMPT / DONE_PROMPT, or waiting for its parent, is not counted) and in the
twin's engine alike; thresholds that count requests still reading their prompt thrash (a burst
of arrivals would stop every draft while prompts are read).

Three checks: the patch's own text counts that one state; the twin's engine keeps a stream
drafting at N=1 while another slot reads a long prompt over many steps; and the real bench
server does the same (a bench test: a small batch makes a 2000-token prompt take many steps,
sent once a drafting stream is generating, at --spec-draft-max-slots 1)."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx
import pytest
from httpx_sse import aconnect_sse

from tuner.bench import Bench
from tuner.measure.launcher import LaunchConfig, ManagedServer
from tuner.policy import Policy
from tuner.twin.engine import Engine, Request
from tuner.twin.world import load_world

REPO = Path(__file__).resolve().parent.parent
PATCH = REPO / "patches" / "spec-draft-max-slots.patch"


def test_the_patch_counts_generating_slots_only() -> None:
    """The added lines that count: one count_if over the slots whose state is generating, and
    the gate `n_generating <= draft_max_slots` before the branch that starts a new draft."""
    added = [line[1:] for line in PATCH.read_text().splitlines() if line.startswith("+")]
    text = "\n".join(added)
    counts = re.findall(r"count_if\(slots\.begin\(\), slots\.end\(\),[^}]*\}", text, re.S)
    assert len(counts) == 1, counts
    assert re.search(r"return slot\.state == SLOT_STATE_GENERATING;", counts[0]), counts[0]
    assert "is_processing" not in counts[0] and "PROMPT" not in counts[0]
    assert "can_start_drafts = n_generating <= draft_max_slots;" in text
    assert "} else if (can_start_drafts) {" in text  # only new drafts are gated


def test_the_twin_counts_a_slot_reading_its_prompt_as_not_generating() -> None:
    """N=1, a small batch: slot 0 generates while slot 1 reads a 1500-token prompt over many
    steps; every such step still lets drafts start and slot 0 drafts in it."""
    world = load_world(REPO / "profiles" / "twin" / "bench-smollm2-cpu.toml").with_updates(
        n_batch=64, noise={"preset": "off"}
    )
    engine = Engine(world, Policy.threshold(1, world.n_max), seed=0)
    engine.submit(Request(prompt_tokens=8, max_tokens=128, seed=1), at=0.0)
    engine.submit(Request(prompt_tokens=1500, max_tokens=1, seed=2), at=0.0)
    reading = []
    while (step := engine.step()) is not None:
        if step.prompt_rows and step.generating:
            reading.append(step)
    assert len(reading) >= 10  # the long prompt took many steps beside the generating slot
    assert all(s.generating == 1 and s.drafts_allowed for s in reading)
    assert sum(s.drafts_started for s in reading) >= 0.9 * len(reading)


def server_config(bench: Bench, batch: int) -> LaunchConfig:
    args = ["--kv-unified", "--poll", "0", "--model-draft", str(bench.draft)]
    args += ["--spec-type", "draft-simple", "--spec-draft-n-max", "6", "--spec-synth-len", "3.5"]
    args += ["--batch-size", str(batch), "--ubatch-size", str(batch)]
    return LaunchConfig(
        binary=bench.server, model=bench.target, n_parallel=2, ctx_size=4096, threads=2,
        args=args, max_slots=1,
    )  # fmt: skip


async def _beside(url: str, long_prompt: str | None) -> tuple[dict, float, float]:
    """A drafting stream of 64 tokens and, once its first token is out, a request that only
    reads a long prompt (one token out): the stream's timings, when it ended and when the
    prompt reader ended (0.0 without one).

    The reader starts after the stream is generating, so every draft the stream makes is made
    beside a prompt being read for as long as the reading lasts; with 25 prompt rows a step
    (a batch of 32 less the stream's 7) a 2000-token prompt takes about 80 steps, the stream
    at most 64: the overlap is counted in steps, which no spell of the machine can reorder."""
    async with httpx.AsyncClient(timeout=300) as client:

        async def reader() -> float:
            body = {"prompt": long_prompt, "n_predict": 1, "temperature": 0.0}
            response = await client.post(f"{url}/completion", json=body)
            response.raise_for_status()
            assert response.json()["timings"]["prompt_n"] >= 1500  # read over many steps
            return time.monotonic()

        body = {"prompt": "Once upon a time", "n_predict": 64, "temperature": 0.0,
                "ignore_eos": True, "seed": 7, "stream": True}  # fmt: skip
        reading: asyncio.Task[float] | None = None
        timings: dict = {}
        async with aconnect_sse(client, "POST", f"{url}/completion", json=body) as source:
            async for event in source.aiter_sse():
                chunk = event.json()
                if long_prompt is not None and reading is None:
                    reading = asyncio.create_task(reader())
                if chunk.get("stop"):
                    timings = chunk["timings"]
        ended = time.monotonic()
        return timings, ended, (await reading if reading is not None else 0.0)


@pytest.mark.bench
def test_a_slot_reading_its_prompt_does_not_stop_drafts_on_the_bench(
    bench: Bench, tmp_path: Path
) -> None:
    """--spec-draft-max-slots 1, -b 32: a 2000-token prompt is read some 25 rows a step while
    the drafting stream generates. Counting it as generating would stop the stream's drafts for
    all of it; counting generating slots only, the stream drafts as much as alone."""
    long_prompt = " hello" * 2000  # about 2000 tokens
    with ManagedServer(server_config(bench, 32), tmp_path / "server.log") as server:
        alone, _, _ = asyncio.run(_beside(server.url, None))
        beside, ended, read = asyncio.run(_beside(server.url, long_prompt))
    print(f"drafts alone {alone.get('draft_n')}, beside a prompt being read "
          f"{beside.get('draft_n')}; the prompt read until {read - ended:+.1f} s after the "
          "stream ended")  # fmt: skip
    assert read > ended, "the long prompt was read before the stream ended: nothing overlapped"
    assert alone["draft_n"] >= 30  # drafts of 6 in most steps
    assert beside["draft_n"] >= 0.7 * alone["draft_n"], (alone, beside)
