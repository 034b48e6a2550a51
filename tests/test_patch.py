"""The llama-server patch (--spec-draft-max-slots) on the real bench: no mocks.

Each test launches the patched server with the bench's F32 target and one-block draft and drives
it with concurrent greedy requests. What the threshold does is read from draft counters
(per-request `timings.draft_n`, /metrics' drafts_total), never from speed; outputs are short, since
a count of drafts needs only a few steps on either side of each change.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tuner.bench import Bench
from tuner.errors import ServerDiedError
from tuner.measure.launcher import LaunchConfig, ManagedServer
from tuner.measure.metrics import parse_metrics

pytestmark = pytest.mark.bench

SYNTHETIC = ["--spec-synth-len", "3.5"]
# Guards against a hung server only: on a loaded 2-core machine a 192-token request at four
# streams has taken over 120 s (0.7 tok/s a stream).
HANG_S = 300


def launch(
    bench: Bench,
    tmp_path: Path,
    max_slots: int | None,
    synthetic: bool = True,
    env: dict[str, str] | None = None,
    name: str = "server",
) -> ManagedServer:
    args = [
        "--kv-unified",
        # Worker threads sleep between graph runs instead of spinning: the load generator (and
        # whatever else runs) shares the two cores.
        "--poll",
        "0",
        "--model-draft",
        str(bench.draft),
        "--spec-type",
        "draft-simple",
        "--spec-draft-n-max",
        "6",
    ]
    if synthetic:
        args += SYNTHETIC
    config = LaunchConfig(
        binary=bench.server,
        model=bench.target,
        n_parallel=8,
        ctx_size=4096,
        threads=2,
        args=args,
        env=env or {},
        max_slots=max_slots,
    )
    return ManagedServer(config, tmp_path / f"{name}.log", start_timeout_s=120)


# Staggered: 4 streams, then 3, 2 and finally 1 still generating, each phase 24 tokens of the
# longer streams (at most 7 tokens a step at n-max 6: at least 4 steps a phase).
LENGTHS = (24, 48, 72, 96)


async def _staggered(url: str) -> list[dict]:
    """Four greedy requests started together, of staggered lengths; when each one finishes,
    read drafts_total from /metrics (llama-server adds a request's drafts when it ends)."""
    async with httpx.AsyncClient(timeout=HANG_S) as client:
        before = parse_metrics((await client.get(f"{url}/metrics")).text)
        finished: list[dict] = []

        async def one(i: int, n: int) -> None:
            response = await client.post(
                f"{url}/completion",
                json={
                    "prompt": f"Story {i}: once upon a time",
                    "n_predict": n,
                    "temperature": 0.0,
                    "ignore_eos": True,
                    "cache_prompt": False,
                },
            )
            timings = response.json()["timings"]
            await asyncio.sleep(0.05)  # the server flushes the slot's stats as it resets it
            after = parse_metrics((await client.get(f"{url}/metrics")).text)
            finished.append(
                {
                    "length": n,
                    "draft_n": timings.get("draft_n", 0),
                    "drafts_total": after["spec_decode_num_drafts_total"]
                    - before.get("spec_decode_num_drafts_total", 0.0),
                }
            )

        await asyncio.gather(*(one(i, n) for i, n in enumerate(LENGTHS)))
    return finished


@pytest.mark.parametrize("max_slots", [0, 1, 4])
def test_drafting_at_concurrency_four(bench: Bench, tmp_path: Path, max_slots: int) -> None:
    """0 = no limit; 1 binds while more than one generates; 4 is the boundary: four generating
    are not more than 4, so they draft."""
    with launch(bench, tmp_path, max_slots) as server:
        finished = asyncio.run(_staggered(server.url))
    lengths = [f["length"] for f in finished]
    assert lengths[0] == LENGTHS[0], f"the shortest request did not finish first: {lengths}"
    first = finished[0]  # generated entirely while all four were generating
    if max_slots == 1:
        # No drafts while more than one generates: one token a step each, so they end in
        # length order. (Drafting every step, acceptance is random per slot and the longer
        # three may finish in another order: 144 before 96 was seen once with N=8.)
        assert lengths == list(LENGTHS), f"requests finished out of order: {lengths}"
        # More than 1 slot generating: no new drafts start, so /metrics' drafts_total did not
        # grow while 4 (then 3, then 2) were generating; a draft in flight at the start may
        # count.
        assert first["drafts_total"] <= 3, finished
        assert finished[2]["drafts_total"] <= 9, finished
        assert first["draft_n"] <= 3 * 6, finished
        # Once only the last stream is left (24 tokens alone: at least 4 steps), it drafts
        # again: its drafts reach /metrics when it ends.
        assert finished[3]["drafts_total"] - finished[2]["drafts_total"] >= 3, finished
        assert finished[3]["draft_n"] >= 3, finished
    else:
        # Not more than N generating: every step but perhaps the last drafts, in every phase.
        assert first["drafts_total"] >= 3, finished
        assert all(f["draft_n"] >= 3 for f in finished), finished


OUTPUT = 32  # tokens per greedy request


async def _greedy_tokens(url: str, concurrency: int) -> list[list[int]]:
    async with httpx.AsyncClient(timeout=HANG_S) as client:

        async def one(i: int) -> tuple[list[int], int]:
            response = await client.post(
                f"{url}/completion",
                json={
                    "prompt": f"Question {i}: what is the capital of France? Answer:",
                    "n_predict": OUTPUT,
                    "temperature": 0.0,
                    "ignore_eos": True,
                    "cache_prompt": False,
                    "return_tokens": True,
                },
            )
            body = response.json()
            return body["tokens"], body["timings"].get("draft_n", 0)

        results = await asyncio.gather(*(one(i) for i in range(concurrency)))
    assert all(draft_n > 0 for _, draft_n in results), "both servers must draft here"
    return [tokens for tokens, _ in results]


def test_threshold_changes_no_output(bench: Bench, tmp_path: Path) -> None:
    """Real acceptance (no synthetic rates), greedy: N=2 and N=0 give identical tokens, at one
    stream and at two (both servers draft there)."""
    outputs = {}
    for max_slots in (0, 2):
        with launch(bench, tmp_path, max_slots, synthetic=False, name=f"n{max_slots}") as server:
            outputs[max_slots] = [
                asyncio.run(_greedy_tokens(server.url, concurrency)) for concurrency in (1, 2)
            ]
    assert all(len(tokens) == OUTPUT for run in outputs[0] for tokens in run)
    assert outputs[2] == outputs[0]


@pytest.mark.parametrize(
    ("max_slots", "env"),
    [(-1, {}), (None, {"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS": "abc"})],
    ids=["negative-flag", "non-integer-env"],
)
def test_bad_values_fail_at_start_up(
    bench: Bench, tmp_path: Path, max_slots: int | None, env: dict[str, str]
) -> None:
    server = launch(bench, tmp_path, max_slots, env=env)
    with pytest.raises(ServerDiedError) as failure:
        server.start()
    assert "--spec-draft-max-slots expects a non-negative integer" in str(failure.value)
    assert not server.alive()
