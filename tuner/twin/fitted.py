"""A twin world made from a fitted cost model: the server the tuner's data describe, so arrivals
can be run through it (tuner.decide.openanswer).

The cost model knows the step time of c generating slots in each regime (plain, drafting, the
threshold server not drafting) and, from tuner.model.arrivals, what prompts and catch-up cost.
A world's step is rows_ms(R) + slots_ms(G) + (drafting server) reeval_ms(R) + the draft calls;
here everything the target does by generating slots goes to `slots_ms` (rows_ms is 0), so:

- slots_ms(G) = T_plain(G): a plain step at G slots;
- reeval_ms(R) = T_off(R) - T_plain(R) for R up to n_parallel, flat beyond: the threshold
  server not drafting at G slots costs T_off(G);
- call_ms(d) = (T_draft(d) - T_plain(d) - reeval_ms(d (n + 1))) / n: d slots drafting n tokens
  each cost T_draft(d), the model's effective step at d drafting slots scaled by the acceptance
  there (c L / tok/s with L the pooled mean: where acceptance moves with the drafting slots, the
  step is stretched by as much as fewer tokens come of it, so every level keeps its tok/s);
- acceptance: the pooled per-position rates (geometric from the mean length without them);
- prefill and catch-up: the arrival costs given (fitted, or a replicate's draw).

The model's tok/s are windowed (c streams all generating) while its tokens a step are counted
over whole requests (their first token, from the prompt, and their shortened last drafts
included), so a world built straight from them drafts a little faster than the model says;
`world_from_model` therefore runs the world's own closed levels (noise-free, the profile's
prompt and output lengths, fixed request seeds) and scales each drafting step by the ratio of
its tok/s to the model's, twice. Values the fit puts below 0 become 0 (a world's tables cannot
be negative). Depth costs are 0: the profile's context is its prompt, and the model's depth
terms are not carried. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tuner.model.acceptance import geometric_rates
from tuner.model.costmodel import CostModel
from tuner.policy import Policy
from tuner.twin.engine import closed_level
from tuner.twin.world import World

DEFAULT_N_BATCH = 2048
DEFAULT_SLOT_CONTEXT = 1 << 20  # large: a fitted world never refuses a request for its length


def _table(values: np.ndarray) -> list[list[float]]:
    """[[1, v1], [2, v2], ...] in ms, never below 0, flat beyond the last level."""
    points = [[float(i + 1), max(0.0, float(v))] for i, v in enumerate(values)]
    points.append([float(len(values) + 1), points[-1][1]])
    return points


MATCH_ROUNDS = 2  # scalings of the drafting step towards the model's closed levels
MATCH_REPEATS = 6  # closed levels (request seeds) each scaling averages over


def world_from_model(
    model: CostModel,
    costs: Mapping[str, float],
    *,
    output_tokens: int = 128,
    prompt_tokens: int = 32,
    **names: str | int,
) -> World:
    """The world of a cost model (see the module docstring); costs: prefill, draft_prefill and
    catch_up in ms (tuner.model.arrivals.ArrivalCosts.point or .draw); output_tokens and
    prompt_tokens: the profile's requests, what the closed levels are matched with."""
    levels = np.arange(1, model.n_parallel + 1, dtype=float)
    target = model.spec_tps(levels)
    # tok/s at d drafting slots: d L / T; the world yields L (pooled) a step, so its step is
    drafting = 1000.0 * levels * model.acceptance.mean_length / target
    world = _world(model, costs, drafting, **names)
    for _ in range(MATCH_ROUNDS):
        tps = np.array(
            [
                np.mean(
                    [
                        closed_level(
                            world,
                            Policy.always(),
                            c,
                            output_tokens,
                            prompt_tokens,
                            seed=r,
                            noise=False,
                        ).window_tps()
                        or target[c - 1]
                        for r in range(MATCH_REPEATS)
                    ]
                )
                for c in range(1, model.n_parallel + 1)
            ]
        )
        drafting = drafting * tps / target
        world = _world(model, costs, drafting, **names)
    return world


def _world(
    model: CostModel,
    costs: Mapping[str, float],
    drafting: np.ndarray,
    *,
    name: str = "fitted",
    model_name: str = "twin-fitted",
    n_batch: int = DEFAULT_N_BATCH,
    slot_context: int = DEFAULT_SLOT_CONTEXT,
) -> World:
    """The world with these drafting steps (ms at 1..n_parallel drafting slots)."""
    n = model.n_max
    levels = np.arange(1, model.n_parallel + 1, dtype=float)
    plain = model.plain_step(levels)
    off = 1000.0 * levels / model.threshold_tps(levels)
    reeval = np.maximum(off - plain, 0.0)
    reeval_at_verify = np.interp(levels * (n + 1), levels, reeval, right=reeval[-1])
    calls = (drafting - plain - reeval_at_verify) / n
    rates = model.acceptance.rates or geometric_rates(model.acceptance.mean_length, n)
    return World.model_validate(
        {
            "name": name,
            "model_name": model_name,
            "description": "made from a fitted cost model and its arrival costs",
            "n_parallel": model.n_parallel,
            "n_max": n,
            "n_batch": n_batch,
            "slot_context": slot_context,
            "acceptance": {
                "rates": [min(1.0, max(0.0, float(r))) for r in (list(rates) + [0.0] * n)[:n]]
            },
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
            "noise": {"preset": "off"},
        }
    )
