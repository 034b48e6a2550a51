"""What "best N" means: the objectives an operator can ask the search to maximise.

- tps (the default): served tok/s, weighted over concurrency 1..n_parallel by the workload's
  weights or by an observed traffic profile's busy-time shares. First order: it takes the
  occupancy as given, the same under every N.
- tpot: mean time per output token a client sees, under Poisson arrivals at the observed rate
  (or --rate). Occupancy then follows the policy (tuner.model.queue): a faster server empties
  its slots sooner, so each N is scored at the occupancy it would cause.
- capacity: the highest arrival rate whose p95 time per output token stays under
  --slo-tpot-ms, short of the server falling behind.

Every objective is scored "higher is better" so the study and the choice treat them alike: tpot
is scored as its inverse, the per-stream tok/s 1000 / mean TPOT (ms); `describe` prints it as
milliseconds again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.model import queue
from tuner.model.costmodel import CostModel
from tuner.policy import Policy
from tuner.recommendation import ObjectiveKind

UNITS = {
    ObjectiveKind.TPS: "tok/s",
    ObjectiveKind.TPOT: "tok/s per stream",
    ObjectiveKind.CAPACITY: "req/s",
}


@dataclass(frozen=True)
class Objective:
    """One objective with what it needs: weights (tps), an arrival rate and a mean output
    length (tpot), a mean output length and a limit (capacity)."""

    kind: ObjectiveKind
    weights: tuple[float, ...] = ()  # tps: w_c for c = 1..n_parallel, summing to 1
    rate: float | None = None  # tpot: arrivals per second
    mean_output_tokens: float | None = None  # tpot, capacity
    slo_tpot_ms: float | None = None  # capacity
    quantile: float = 0.95  # capacity: which quantile of time per output token must meet it

    def __post_init__(self) -> None:
        if self.kind is ObjectiveKind.TPS and not self.weights:
            raise ValueError("the tps objective needs weights")
        if self.kind is not ObjectiveKind.TPS and not (self.mean_output_tokens or 0) > 0:
            raise ValueError(f"the {self.kind} objective needs a mean output length above 0")
        if self.kind is ObjectiveKind.TPOT and not (self.rate or 0) > 0:
            raise ValueError("the tpot objective needs an arrival rate above 0")
        if self.kind is ObjectiveKind.CAPACITY and not (self.slo_tpot_ms or 0) > 0:
            raise ValueError("the capacity objective needs --slo-tpot-ms above 0")

    @classmethod
    def throughput(cls, weights: np.ndarray | tuple[float, ...]) -> Objective:
        return cls(ObjectiveKind.TPS, tuple(float(w) for w in weights))

    @property
    def unit(self) -> str:
        return UNITS[self.kind]

    def value(self, model: CostModel, policy: Policy) -> float:
        """The policy's score on the model, higher is better."""
        if self.kind is ObjectiveKind.TPS:
            return float(np.asarray(self.weights) @ model.level_tps(policy))
        tps = model.level_tps(policy)
        assert self.mean_output_tokens is not None
        if self.kind is ObjectiveKind.TPOT:
            assert self.rate is not None
            occ = queue.occupancy(tps, self.rate, self.mean_output_tokens)
            return 1000.0 / queue.mean_tpot_ms(tps, occ)
        assert self.slo_tpot_ms is not None
        return queue.capacity(tps, self.mean_output_tokens, self.slo_tpot_ms, self.quantile)

    def describe(self, value: float) -> str:
        """A score as people read it."""
        if self.kind is ObjectiveKind.TPOT:
            return f"mean TPOT {1000.0 / value:.1f} ms" if value > 0 else "mean TPOT unbounded"
        if self.kind is ObjectiveKind.CAPACITY:
            limit = f"p{self.quantile * 100:.0f} TPOT {self.slo_tpot_ms:g} ms"
            return f"{value:.3g} req/s within {limit}"
        return f"{value:.1f} tok/s"

    def options(self) -> dict[str, Any]:
        """What identifies the objective (hashed into the study's name, stored with it)."""
        if self.kind is ObjectiveKind.TPS:
            return {"weights": [round(w, 12) for w in self.weights]}
        return {
            "objective": self.kind.value,
            "rate": self.rate,
            "mean_output_tokens": self.mean_output_tokens,
            "slo_tpot_ms": self.slo_tpot_ms,
            "quantile": self.quantile,
        }


def as_objective(objective: Objective | np.ndarray | tuple[float, ...]) -> Objective:
    """An Objective as given, or the tps objective over these weights."""
    if isinstance(objective, Objective):
        return objective
    return Objective.throughput(np.asarray(objective, dtype=float))
