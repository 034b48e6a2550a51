"""How a policy's speed moves with context depth, from the depths that were measured.

Every decode step reads the KV cache of every generating slot, so at a given concurrency the
step time, and with it the time per generated token, grows about linearly with the depth the
streams hold. Given cost models fitted at measured depths, the time per token of a policy at
another depth is interpolated linearly between the two nearest measured depths (extrapolated
from the two nearest on one side beyond them). A mix of depths (the share of time the server
spends at each) averages the depths' throughputs. `CombinedCostModel` presents either as a cost
model, replicates included, so recommend's search and choice run on it unchanged. Pure: numpy
over fitted models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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
    return model_at(models, depth).policy_tps(np.asarray(concurrency, dtype=float), policy)


class CombinedCostModel(CostModel):
    """A cost model made of models fitted at measured depths, for a depth that was not
    measured or a mix of depths. Every throughput is combined from its parts' at the same
    concurrency: `harmonic` (time per token interpolated in depth, weights may reach beyond
    0..1 to extrapolate) or arithmetic (a mix: the share of time spent at each depth). Replicate
    i combines the parts' replicates i, so intervals and the search's spread carry over."""

    def __init__(self, parts: Sequence[CostModel], weights: Sequence[float], harmonic: bool):
        first = parts[0]
        super().__init__(
            first.n_parallel,
            first.n_max,
            first.plain,
            first.spec,
            first.acceptance,
            first.verify,
            [],
            first.interval,
            first.version,
            first.threshold_overhead,
            first.threshold_rows,
            first.off,
            # plain measured only where every part measured it; the arrival costs and the
            # acceptance trend (which its parts' throughputs already apply) of the first part
            plain_measured=all(p.plain_measured for p in parts),
            arrivals=first.arrivals,
            trend=first.trend,
        )
        self.parts, self.weights, self.harmonic = list(parts), list(weights), harmonic

    def _combine(self, values: list[np.ndarray]) -> np.ndarray:
        if self.harmonic:
            per_token = sum(w / v for w, v in zip(self.weights, values, strict=True))
            return 1.0 / np.asarray(per_token)
        return np.asarray(sum(w * v for w, v in zip(self.weights, values, strict=True)))

    def n_values(self) -> list[int]:
        return sorted(set.intersection(*(set(p.n_values()) for p in self.parts)))

    def plain_tps(self, c: Any) -> np.ndarray:
        return self._combine([p.plain_tps(c) for p in self.parts])

    def spec_tps(self, c: Any, n: int | None = None) -> np.ndarray:
        return self._combine([p.spec_tps(c, n) for p in self.parts])

    def threshold_tps(self, c: Any) -> np.ndarray:
        return self._combine([p.threshold_tps(c) for p in self.parts])

    @property
    def replicate_models(self) -> list[CostModel]:
        reps = [p.replicate_models for p in self.parts]
        if not all(reps) or len({len(r) for r in reps}) != 1:
            return []
        return [
            CombinedCostModel(list(group), self.weights, self.harmonic)
            for group in zip(*reps, strict=True)
        ]


def model_at(models: Mapping[int, CostModel], depth: int) -> CostModel:
    """The model at a depth: the fitted one where it was measured, else interpolated (time per
    token linear in depth) from the two nearest measured depths."""
    if depth in models:
        return models[depth]
    lo, hi = bracket(list(models), depth)
    t = (depth - lo) / (hi - lo)
    return CombinedCostModel([models[lo], models[hi]], [1.0 - t, t], harmonic=True)


def mixed(models: Mapping[int, CostModel], mix: Mapping[int, float]) -> CostModel:
    """The model of a mix of depths (depth: share of time), each at its own model_at."""
    total = sum(mix.values())
    if len(mix) == 1:
        return model_at(models, next(iter(mix)))
    depths = sorted(mix)
    return CombinedCostModel(
        [model_at(models, d) for d in depths], [mix[d] / total for d in depths], harmonic=False
    )


def attention_per_1k(
    shallow: CostModel, deep: CostModel, shallow_context: int, deep_context: int
) -> tuple[float, float]:
    """What attention costs per 1000 tokens of context (ms), from fits at two depths: per
    decode row (every row attends on its own, as on a CPU) and per generating slot (a
    memory-bound decode reads a slot's cache once for all its draft rows). A plain step at c
    grows by c (row + slot) per 1000 tokens, a drafting one at the fit's n_max by
    c ((n + 1) row + slot): the medians over the levels of each step's growth per stream split
    the two; neither below 0."""
    if deep_context <= shallow_context:
        raise ValueError("the deep fit's context must exceed the shallow one's")
    c = shallow.levels.astype(float)
    scale = 1000.0 / (deep_context - shallow_context)
    plain = float(np.median((deep.plain_step(c) - shallow.plain_step(c)) / c)) * scale
    drafting = float(np.median((deep.spec_step(c) - shallow.spec_step(c)) / c)) * scale
    row = max(0.0, (drafting - plain) / shallow.n_max)
    return min(row, max(0.0, plain)), max(0.0, plain - row)
