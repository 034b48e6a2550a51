"""How a policy's speed moves with context depth, from the depths that were measured.

Every decode step reads the KV cache of every generating slot, so at a given concurrency the
step time, and with it the time per generated token, grows about linearly with the depth the
streams hold. Given cost models fitted at measured depths, the time per token of a policy at
another depth is interpolated linearly between the two nearest measured depths (extrapolated
from the two nearest on one side beyond them). Pure: numpy over fitted models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tuner.model.costmodel import CostModel
from tuner.policy import Policy


def bracket(depths: Sequence[int], depth: int) -> tuple[int, int]:
    """The two measured depths a depth is interpolated (or extrapolated) from."""
    ordered = sorted(set(depths))
    if len(ordered) < 2:
        raise ValueError("a depth model needs fits at two depths at least")
    above = [d for d in ordered if d >= depth]
    if not above:
        return ordered[-2], ordered[-1]
    hi = above[0]
    if hi == ordered[0]:
        return ordered[0], ordered[1]
    return ordered[ordered.index(hi) - 1], hi


def tps_at_depth(
    models: Mapping[int, CostModel], policy: Policy, concurrency: Sequence[int], depth: int
) -> np.ndarray:
    """Predicted aggregate tok/s of policy at each concurrency, at a context depth."""
    if depth in models:
        return models[depth].policy_tps(concurrency, policy)
    lo, hi = bracket(list(models), depth)
    per_token_lo = 1.0 / models[lo].policy_tps(concurrency, policy)
    per_token_hi = 1.0 / models[hi].policy_tps(concurrency, policy)
    t = (depth - lo) / (hi - lo)
    return 1.0 / (per_token_lo + t * (per_token_hi - per_token_lo))
