"""A twin world made from a fitted cost model: the server the tuner's data describe, so arrivals
can be run through it (tuner.decide.openanswer).

The cost model knows the step time of c generating slots in each regime (plain, drafting, the
threshold server not drafting) where its levels were measured (`Levels`: their prompt, output
and context depth) and, from tuner.model.arrivals, what prompts and catch-up cost. A world's
step is rows_ms(R) + slots_ms(G) + depth x (KV tokens of its decode rows) + (drafting server)
reeval_ms(R) + the draft calls; here what the target does by generating slots goes to
`slots_ms` (rows_ms is 0), so, before the depth term:

- slots_ms(G) = P(G): a plain step at G slots;
- reeval_ms(R) = O(R) - P(R) for R up to n_parallel, flat beyond: the threshold server not
  drafting at G slots costs O(G) (never less than plain: a world cannot make a server with a
  draft model faster where it does not draft);
- call_ms(d) = (D(d) - P(d) - reeval_ms(d (n + 1))) / n: d slots drafting n tokens each cost
  D(d);
- `depth`: attention per 1000 tokens of context, per decode row and per generating slot, as
  given (fitted from levels at two depths, else 0): requests deeper than the profile's pay;
- acceptance: the pooled per-position rates (geometric from the mean length without them);
- prefill and catch-up: the arrival costs given (fitted, or a replicate's draw).

P, O and D are found by running the world's own closed levels (noise-free, the profile's
lengths and depth, fixed request seeds) and moving each step until the world's tok/s are the
model's, MATCH_ROUNDS times: that takes out the depth term at the profile's context and the
model's way of counting (its tok/s are windowed, its tokens a step counted over whole requests),
and keeps acceptance that moves with the drafting slots (the model's tok/s at d drafting slots
carry it; the step is stretched by as much as fewer tokens come of it). Values below 0 become
0 (a world's tables cannot be negative). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tuner.model.acceptance import geometric_rates
from tuner.model.costmodel import CostModel
from tuner.policy import Policy
from tuner.twin.engine import closed_level
from tuner.twin.world import World

DEFAULT_N_BATCH = 2048
DEFAULT_SLOT_CONTEXT = 1 << 20  # large: a fitted world never refuses a request for its length
MATCH_ROUNDS = 2  # moves of the steps towards the model's closed levels
MATCH_REPEATS = 6  # closed levels (request seeds) each drafting move averages over


@dataclass(frozen=True)
class Levels:
    """Where the model's closed levels were measured, and what depth costs."""

    prompt_tokens: int = 32
    output_tokens: int = 128
    depth: int = 0  # tokens each stream held when it started (0: its prompt alone)
    depth_ms_per_row_per_1k: float = 0.0
    depth_ms_per_slot_per_1k: float = 0.0


def _table(values: np.ndarray) -> list[list[float]]:
    """[[1, v1], [2, v2], ...] in ms, never below 0, flat beyond the last level."""
    points = [[float(i + 1), max(0.0, float(v))] for i, v in enumerate(values)]
    points.append([float(len(values) + 1), points[-1][1]])
    return points


def world_from_model(
    model: CostModel,
    costs: Mapping[str, float],
    levels: Levels = Levels(),
    **names: str | int,
) -> World:
    """The world of a cost model (see the module docstring); costs: prefill, draft_prefill and
    catch_up in ms (tuner.model.arrivals.ArrivalCosts.point or .draw)."""
    c = np.arange(1, model.n_parallel + 1, dtype=float)
    length = model.acceptance.mean_length
    target = {
        "plain": model.plain_tps(c),
        "off": model.threshold_tps(c),
        "drafting": model.spec_tps(c),
    }
    # the step each regime's tok/s stands for (L the pooled mean a step where drafting)
    tokens = {"plain": c, "off": c, "drafting": c * length}
    steps = {k: 1000.0 * tokens[k] / v for k, v in target.items()}
    world = _world(model, costs, steps, levels, **names)
    for _ in range(MATCH_ROUNDS):
        served = _closed_tps(world, model, levels)
        for key, tps in served.items():
            tps = np.where(np.isfinite(tps) & (tps > 0), tps, target[key])
            steps[key] = steps[key] + 1000.0 * tokens[key] * (1 / target[key] - 1 / tps)
        world = _world(model, costs, steps, levels, **names)
    return world


def _closed_tps(world: World, model: CostModel, levels: Levels) -> dict[str, np.ndarray]:
    """The world's windowed tok/s at 1..n_parallel streams in each regime (off from 2 streams
    on, plain's at 1: no threshold stops drafting at one stream)."""
    n = model.n_max
    work = (levels.output_tokens, levels.prompt_tokens, levels.depth)

    def tps(policy: Policy, streams: int, repeats: int) -> float:
        values = [
            closed_level(world, policy, streams, *work, seed=r, noise=False).window_tps()
            for r in range(repeats)
        ]
        got = [v for v in values if v]
        return float(np.mean(got)) if got else float("nan")

    top = model.n_parallel + 1
    plain = np.array([tps(Policy.plain(), s, 1) for s in range(1, top)])
    off = np.array([plain[0]] + [tps(Policy.threshold(s - 1, n), s, 1) for s in range(2, top)])
    drafting = np.array([tps(Policy.always(n), s, MATCH_REPEATS) for s in range(1, top)])
    # a level the world leaves no window at (nan) keeps its step as it is
    return {"plain": plain, "off": off, "drafting": drafting}


def _world(
    model: CostModel,
    costs: Mapping[str, float],
    steps: Mapping[str, np.ndarray],
    levels: Levels,
    *,
    name: str = "fitted",
    model_name: str = "twin-fitted",
    n_batch: int = DEFAULT_N_BATCH,
    slot_context: int = DEFAULT_SLOT_CONTEXT,
) -> World:
    """The world with these steps (ms at 1..n_parallel slots, before the depth term)."""
    n = model.n_max
    c = np.arange(1, model.n_parallel + 1, dtype=float)
    plain = steps["plain"]
    reeval = np.maximum(steps["off"] - plain, 0.0)
    reeval[0] = reeval[1] if len(reeval) > 1 else reeval[0]  # no threshold is off at 1 stream
    reeval_at_verify = np.interp(c * (n + 1), c, reeval, right=reeval[-1])
    calls = (steps["drafting"] - plain - reeval_at_verify) / n
    rates = list(model.acceptance.rates or geometric_rates(model.acceptance.mean_length, n))
    rates = [min(1.0, max(0.0, float(r))) for r in (rates + [0.0] * n)[:n]]
    return World.model_validate(
        {
            "name": name,
            "model_name": model_name,
            "description": "made from a fitted cost model and its arrival costs",
            "n_parallel": model.n_parallel,
            "n_max": n,
            "n_batch": n_batch,
            "slot_context": slot_context,
            "acceptance": {"rates": rates},
            "step": {"rows_ms": [[1.0, 0.0]], "slots_ms": _table(plain)},
            "draft": {
                "call_ms": _table(calls),
                "reeval_ms": _table(reeval),
                "catch_up_ms_per_token": max(0.0, float(costs.get("catch_up", 0.0))),
            },
            "prefill": {
                "ms_per_token": max(0.0, float(costs.get("prefill", 0.0))),
                "draft_ms_per_token": max(0.0, float(costs.get("draft_prefill", 0.0))),
            },
            "depth": {
                "ms_per_row_per_1k": max(0.0, levels.depth_ms_per_row_per_1k),
                "ms_per_slot_per_1k": max(0.0, levels.depth_ms_per_slot_per_1k),
            },
            "noise": {"preset": "off"},
        }
    )
