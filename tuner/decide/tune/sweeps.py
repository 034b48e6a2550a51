"""The plan of `tuner tune`'s next sweep: the rounds that measure a set of levels on and off
side by side, and the model objective that scales the tolerance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tuner.decide import search
from tuner.measure.schedule import Cell, off_arm
from tuner.model.costmodel import CostModel
from tuner.policy import Policy

# Pairs per level a sweep measures: one, in the order that alternates from sweep to sweep (A B,
# then B A: A B B A across two sweeps). On the twin's bench and zigzag worlds this settled the
# same answers as two pairs a sweep in 36 % less measuring: every pair is a unit of its own.
SWEEP_PAIRS = 1


# Sweeps that measure a level without two pairs alone, at most: two give it its two pairs
# where nothing is set aside; a level whose rounds keep being set aside (a stalled or busy
# machine, an off arm that drafted) then no longer holds back the others.
ALONE_SWEEPS = 2


def thin_first(
    wanted: Sequence[int], pairs: Mapping[int, int], alone: Mapping[int, int]
) -> tuple[list[int], list[int]]:
    """The levels the next sweep measures, and those it holds back: while some wanted levels
    hold fewer than two pairs (and have not been measured alone ALONE_SWEEPS times), only
    those; a comparison has no interval until each of its levels has two, and a pair more
    where there are several already (the profile's passes at its base levels) narrows nothing
    that decides."""
    thin = [c for c in wanted if pairs.get(c, 0) < 2 and alone.get(c, 0) < ALONE_SWEEPS]
    if not thin:
        return list(wanted), []
    return thin, [c for c in wanted if c not in thin]


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


def pair_seconds(
    model: CostModel, arms: Mapping[Cell, list[Policy]], tokens: int
) -> dict[int, float]:
    """The cost model's seconds for one pair at each level of a sweep: each arm's c streams of
    `tokens` tokens at its tok/s there."""
    return {
        c: sum(c * tokens / max(float(np.ravel(model.policy_tps(c, p))[0]), 1e-9) for p in policies)
        for (_, c), policies in arms.items()
    }


def within(wanted: Sequence[int], seconds: Mapping[int, float], left_s: float) -> list[int]:
    """The levels of a sweep, in the order the standing wants them measured, whose pairs fit
    the seconds left: at least the first, then each next one while the sum still fits."""
    taken: list[int] = []
    total = 0.0
    for c in wanted:
        if taken and total + seconds[c] > left_s:
            break
        taken.append(c)
        total += seconds[c]
    return taken


def model_objective(model: CostModel, n: int, n_max: int, weights: np.ndarray) -> float:
    """The answer's workload-weighted tok/s on the cost model: the scale of the tolerance."""
    return search.policy_objective(model, Policy.of_max_slots(n, n_max), weights)
