"""The plan of `tuner tune`'s next sweep: the rounds that measure a set of levels on and off
side by side, and the model objective that scales the tolerance."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tuner.decide import search
from tuner.measure.schedule import Cell, off_arm
from tuner.model.costmodel import CostModel
from tuner.policy import Policy

# Pairs per level a sweep measures: one, in the order that alternates from sweep to sweep (A B,
# then B A: A B B A across two sweeps). On the twin's bench and zigzag worlds this settled the
# same answers as two pairs a sweep in 36 % less measuring: every pair is a unit of its own.
SWEEP_PAIRS = 1


def sweep_arms(
    levels: Sequence[int], depth: int, n_max: int, live: bool
) -> dict[Cell, list[Policy]]:
    """The rounds of one sweep: at each level, always draft and a threshold that does not
    draft there (c-1 on a live launch; 1 when relaunching: one launch for every level)."""
    arms: dict[Cell, list[Policy]] = {}
    for c in sorted(levels):
        off = off_arm(c) if live else Policy.threshold(1)
        assert off is not None
        arms[(depth, c)] = [Policy.always(n_max), off.with_n_max(n_max)]
    return arms


def model_objective(model: CostModel, n: int, n_max: int, weights: np.ndarray) -> float:
    """The answer's workload-weighted tok/s on the cost model: the scale of the tolerance."""
    return search.policy_objective(model, Policy.of_max_slots(n, n_max), weights)
