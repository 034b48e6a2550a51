"""The depth model: time per token interpolated linearly in context depth between fits."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.model.costmodel import CostModel
from tuner.model.data import FitData, LevelObs, Repeat
from tuner.model.depth import bracket, tps_at_depth
from tuner.model.fitting import fit
from tuner.policy import Policy

LEVELS = [1, 2, 4, 8]


def _model(step_ms_per_depth: float, depth: int) -> CostModel:
    """A machine whose step time is 10 ms + 2 ms per stream, plus a KV read that grows
    linearly with depth; spec steps cost 2.5x and yield 2 tokens."""
    levels = []
    for c in LEVELS:
        plain_step = 10.0 + 2.0 * c + step_ms_per_depth * depth * c
        spec_step = 2.5 * plain_step
        levels.append(LevelObs(Policy.plain(), c, (Repeat(1000 * c / plain_step),)))
        levels.append(
            LevelObs(Policy.always(), c, (Repeat(1000 * c * 2.0 / spec_step, accept_len=2.0),))
        )
    return fit(FitData(8, 3, tuple(levels)), replicates=5, form_uncertainty=False).model


def test_bracket_picks_the_neighbours_or_the_nearest_pair() -> None:
    assert bracket([0, 1024, 4096], 2048) == (1024, 4096)
    assert bracket([0, 1024, 4096], 512) == (0, 1024)
    assert bracket([0, 1024, 4096], 8192) == (1024, 4096)
    assert bracket([1024, 4096], 0) == (1024, 4096)
    with pytest.raises(ValueError):
        bracket([0], 10)


def test_a_held_out_depth_is_predicted_from_its_neighbours() -> None:
    slope = 0.004  # ms per token of depth per stream
    models = {d: _model(slope, d) for d in (0, 4096)}
    truth = _model(slope, 2048)
    for policy in (Policy.plain(), Policy.always(), Policy.of_max_slots(2)):
        predicted = tps_at_depth(models, policy, LEVELS, 2048)
        measured = truth.policy_tps(LEVELS, policy)
        # per-token time is linear in depth here: the interpolation is close to exact
        assert np.max(np.abs(predicted / measured - 1)) < 0.03
    # deeper is slower, and the model says so beyond the measured range too
    beyond = tps_at_depth(models, Policy.plain(), LEVELS, 8192)
    assert np.all(beyond < models[4096].policy_tps(LEVELS, Policy.plain()))
    assert np.allclose(
        tps_at_depth(models, Policy.plain(), LEVELS, 0),
        models[0].policy_tps(LEVELS, Policy.plain()),
    )
