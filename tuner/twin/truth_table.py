"""What `tuner dev twin truth` shows: a world's noise-free truth, gathered into one report.

`truth_report(world, ...)` runs tuner.twin.truth: every policy's windowed tok/s at every
concurrency (closed levels), the tps objective per N under the given weights (uniform, or a
traffic profile's busy-time shares), the best N with its margin to the runner-up and its ties
and, with an arrival rate, every policy under the same Poisson arrivals (throughput, mean and
p95 time per output token, mean generating slots) with the best N by throughput and by mean
time per output token. Pure: the caller renders it (`to_dict` for JSON).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.errors import ConfigError
from tuner.policy import Policy
from tuner.twin.truth import Choice, ClosedTruth, OpenLoopTruth, closed_truth, open_loop_truth
from tuner.twin.world import World


@dataclass(frozen=True)
class OpenLoopReport:
    """Every policy under one Poisson arrival rate, and the best N by each objective."""

    rate: float
    duration_s: float
    figures: dict[Policy, OpenLoopTruth]
    best_tps: Policy  # highest throughput (ties: the smaller N)
    best_tpot: Policy  # lowest mean time per output token (ties: the smaller N)


@dataclass(frozen=True)
class TruthReport:
    """A world's truth (see the module docstring)."""

    world: World
    closed: ClosedTruth
    weights: dict[int, float]  # normalised, over the concurrencies that count
    objective: dict[Policy, float]  # the tps objective, every policy (plain too)
    choice: Choice  # the best N (drafting policies)
    open_loop: OpenLoopReport | None = None

    def to_dict(self) -> dict[str, Any]:
        closed = self.closed
        choice = self.choice

        def finite(x: float | None) -> float | None:
            return x if x is not None and math.isfinite(x) else None

        out: dict[str, Any] = {
            "world": self.world.name,
            "model_name": self.world.model_name,
            "n_parallel": self.world.n_parallel,
            "n_max": self.world.n_max,
            "output_tokens": closed.output_tokens,
            "prompt_tokens": closed.prompt_tokens,
            "concurrency": closed.concurrency,
            "closed": {
                p.label: [closed.tps(p, c) for c in closed.concurrency] for p in closed.policies
            },
            "weights": {str(c): w for c, w in self.weights.items()},
            "objective": {p.label: v for p, v in self.objective.items()},
            "best": {
                "policy": choice.best.label,
                "max_slots": choice.best.max_slots,
                "value": choice.value,
                "runner_up": choice.runner_up.label if choice.runner_up else None,
                "margin": choice.margin,
                "margin_pct": choice.margin_pct,
                "margin_se": choice.margin_se,
                "ties": [p.label for p in choice.ties],
            },
        }
        if self.open_loop is not None:
            ol = self.open_loop
            out["open_loop"] = {
                "rate": ol.rate,
                "duration_s": ol.duration_s,
                "policies": {
                    p.label: {
                        "tokens_per_second": f.tokens_per_second,
                        "tpot_mean_ms": finite(f.tpot_mean_ms),
                        "tpot_p95_ms": finite(f.tpot_ms[1]),
                        "mean_generating": f.mean_generating,
                        "requests": f.requests,
                    }
                    for p, f in ol.figures.items()
                },
                "best": {"tps": ol.best_tps.label, "tpot": ol.best_tpot.label},
            }
        return out


def truth_report(
    world: World,
    *,
    weights: Mapping[int, float] | None = None,
    rate: float | None = None,
    output_tokens: int = 128,
    prompt_tokens: int = 32,
    rel_se: float = 0.002,
    duration_s: float = 3600.0,
    seed: int = 0,
) -> TruthReport:
    """The truth of a world (see the module docstring); bad weights or rate: ConfigError."""
    if rate is not None and not rate > 0:
        raise ConfigError(f"--rate must be above 0 requests per second, not {rate:g}")
    if weights is not None:  # checked before the truth, which takes a while
        outside = sorted(c for c in weights if not 1 <= c <= world.n_parallel)
        if outside or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise ConfigError(
                f"--weights: concurrencies 1..{world.n_parallel} with non-negative weights, "
                f"some above 0" + (f" (not {outside})" if outside else "")
            )
    closed = closed_truth(
        world, output_tokens=output_tokens, prompt_tokens=prompt_tokens, rel_se=rel_se
    )
    try:
        normalised = closed.weights(weights)
    except ValueError as exc:
        raise ConfigError(f"--weights: {exc}") from exc
    objective = {p: closed.objective(p, weights) for p in closed.policies}
    choice = closed.best(weights)
    open_loop = None
    if rate is not None:
        figures = open_loop_truth(
            world,
            rate,
            duration_s=duration_s,
            output_tokens=output_tokens,
            prompt_tokens=prompt_tokens,
            seed=seed,
        )
        drafting = [p for p in figures if p.drafting]
        best_tps = min(drafting, key=lambda p: (-figures[p].tokens_per_second, p.sort_key))
        best_tpot = min(
            drafting,
            key=lambda p: (
                figures[p].tpot_mean_ms if math.isfinite(figures[p].tpot_mean_ms) else math.inf,
                p.sort_key,
            ),
        )
        open_loop = OpenLoopReport(rate, duration_s, figures, best_tps, best_tpot)
    return TruthReport(world, closed, normalised, objective, choice, open_loop)
