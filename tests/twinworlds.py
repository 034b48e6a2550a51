"""Twin worlds the decision tests share, and their truths computed once per test session.

The worlds are frozen here (and in profiles/twin/): a test never adjusts one after seeing how
the tuner does on it."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.policy import Policy
from tuner.twin import World, load_world, world_from_dict
from tuner.twin.truth import ClosedTruth, closed_truth

REPO = Path(__file__).resolve().parent.parent
TWIN = REPO / "profiles" / "twin"
BENCH_WORLD = TWIN / "bench-smollm2-cpu.toml"
SEED_WORLD = TWIN / "seed-gfx1151.toml"


def zigzag_world(**over: Any) -> World:
    """np 6, n_max 3, a gain that changes sign twice: the verify batches of 1-2 streams (4-8
    rows) are cheap, those of 3-4 streams (12-16 rows) land on a steep stretch of rows_ms, and
    at 5-6 streams a per-step cost by slots (slots_ms jumps there) weighs on every step alike,
    so the stream that yields several tokens a step wins again; rows_ms plateaus from 16 to 24."""
    data: dict[str, Any] = {
        "name": "zigzag",
        "model_name": "twin-zigzag",
        "n_parallel": 6,
        "n_max": 3,
        "acceptance": {"synth_len": 2.8},
        "step": {
            "rows_ms": [
                [1, 10.0],
                [2, 12.0],
                [4, 16.0],
                [8, 24.0],
                [12, 60.0],
                [16, 70.0],
                [20, 76.0],
                [24, 80.0],
                [32, 120.0],
            ],
            "slots_ms": [[1, 0.0], [4, 0.0], [5, 60.0], [6, 70.0]],
        },
        "draft": {"call_ms": [[1, 1.0], [6, 2.0]]},
        "noise": {"preset": "vm"},  # the truth runs noise-free whatever the world says
        **over,
    }
    return world_from_dict(data)


def cpu_draft_world(**over: Any) -> World:
    """The seed's box (its target step and acceptance) with a draft model on the CPU: a draft
    call of 6-13 ms, 1.2 ms a prompt token for the draft model (0.25 for the target), and a
    drafter that does not re-evaluate every target batch but catches a resuming slot up at
    1.2 ms a token. Under random arrivals of 256-token prompts every request stalls the running
    slots for the draft model's prompt: drafting pays at low rates, plain at high ones, which
    closed levels (every prompt before the window) never show."""
    data: dict[str, Any] = {
        "name": "cpu-draft",
        "model_name": "twin-cpu-draft",
        "n_parallel": 8,
        "n_max": 3,
        "acceptance": {"synth_len": 3.64},
        "step": {"rows_ms": [[1.0, 25.84], [2.0, 37.04], [4.0, 59.26], [8.0, 102.17]]},
        "draft": {
            "call_ms": [[1, 6.0], [2, 7.0], [4, 9.0], [8, 13.0]],
            "reeval_ms": [[1, 0.0]],
            "catch_up_ms_per_token": 1.2,
        },
        "prefill": {"ms_per_token": 0.25, "draft_ms_per_token": 1.2},
        "noise": {"preset": "quiet"},
        **over,
    }
    return world_from_dict(data)


CPU_DRAFT_TRAFFIC = {"prompt_tokens": 256, "output_tokens": 128}  # the cpu-draft world's requests


def world(name: str) -> World:
    """A shared world by name: bench (vm noise), seed (quiet), zigzag (vm), zigzag-quiet and
    cpu-draft (quiet)."""
    return _world(name)


@functools.cache
def _world(name: str) -> World:
    if name == "bench":
        return load_world(BENCH_WORLD)
    if name == "seed":
        return load_world(SEED_WORLD)
    if name == "zigzag":
        return zigzag_world()
    if name == "zigzag-quiet":
        return zigzag_world(name="zigzag-quiet", noise={"preset": "quiet"})
    if name == "cpu-draft":
        return cpu_draft_world()
    raise KeyError(name)


@functools.cache
def truth(name: str) -> ClosedTruth:
    """The world's noise-free truth, once per session (tens of seconds on two busy cores)."""
    return closed_truth(_world(name))


def regret(name: str, answer: int, weights: Mapping[int, float] | None = None) -> float:
    """How far N=answer falls below the truth's best, as a share of the best's objective."""
    w = _world(name)
    t = truth(name)
    best = t.best(dict(weights) if weights else None)
    value = t.objective(Policy.of_max_slots(answer, w.n_max), dict(weights) if weights else None)
    return 1.0 - value / best.value
