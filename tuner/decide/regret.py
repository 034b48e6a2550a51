"""Grading a validation: measured tok/s per policy and level against the model, the best measured
policy, the recommended one's regret, and the model's error. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tuner.model.costmodel import CostModel
from tuner.policy import Policy
from tuner.recommendation import Recommendation


@dataclass
class ValidationReport:
    """Measured tok/s per policy and level, the best policy, regret and model error."""

    run_id: int
    model: str
    recommended: Policy
    levels: list[int]
    weights: dict[int, float]
    measured: dict[Policy, dict[int, float]]  # policy -> concurrency -> tok/s
    predicted: dict[Policy, dict[int, float]] = field(default_factory=dict)
    weighted: dict[Policy, float] = field(default_factory=dict)
    best: Policy | None = None
    regret_pct: float | None = None  # None when a level of the recommended policy failed
    errors_pct: dict[Policy, dict[int, float]] = field(default_factory=dict)  # signed % error
    mean_abs_error_pct: float | None = None
    worst_abs_error_pct: float | None = None
    standing: Recommendation | None = None  # what stands once the validation's points are fitted
    refit_error: str | None = None  # why no fit with the validation's points could be made

    @property
    def policies(self) -> list[Policy]:
        """The measured policies, plain first, then by N."""
        return sorted(self.measured, key=lambda p: p.sort_key)

    @property
    def changed(self) -> bool:
        """Whether the validation's points changed the answer."""
        return self.standing is not None and (
            self.standing.policy.max_slots,
            self.standing.policy.n_max,
        ) != (self.recommended.max_slots, self.recommended.n_max)

    def standing_text(self) -> str:
        """One line: the recommendation that stands now, and whether validation changed it."""
        if self.standing is None:
            if self.refit_error:
                return (
                    f"no refit with the points just measured ({self.refit_error}): "
                    f"{self.recommended.label} stands as it was"
                )
            return ""
        line = self.standing.env_line
        if self.changed:
            return (
                f"{line} now stands: validation changed the recommendation from "
                f"{self.recommended.label} (the refit includes the points just measured)"
            )
        return f"{line} stands after validation (unchanged)"

    def regret_text(self) -> str:
        """The regret as shown in tables and summaries."""
        if self.regret_pct is None:
            return "- (a level of it failed)"
        return f"{self.regret_pct:.1f}%"

    def as_dict(self) -> dict[str, Any]:
        def by_label(table: dict[Policy, Any]) -> dict[str, Any]:
            return {p.label: v for p, v in sorted(table.items(), key=lambda kv: kv[0].sort_key)}

        return {
            "run_id": self.run_id,
            "model": self.model,
            "recommended": self.recommended.max_slots,
            "levels": self.levels,
            "weights": self.weights,
            "measured": by_label(self.measured),
            "predicted": by_label(self.predicted),
            "weighted": by_label(self.weighted),
            "best": self.best.label if self.best else None,
            "regret_pct": self.regret_pct,
            "errors_pct": by_label(self.errors_pct),
            "mean_abs_error_pct": self.mean_abs_error_pct,
            "worst_abs_error_pct": self.worst_abs_error_pct,
            "standing": self.standing.max_slots if self.standing else None,
            "refit_error": self.refit_error,
            "changed": self.changed,
        }


def grade(
    run_id: int,
    model_name: str,
    recommended: Policy,
    measured: dict[Policy, dict[int, float]],
    model: CostModel,
    weights_by_level: dict[int, float],
) -> ValidationReport:
    """Compare measured policies with the model.

    Weighted figures use the workload weights restricted to the validated levels (uniform when
    none fall on them); regret is how far the recommended policy's weighted tok/s falls below the
    best measured policy's (None when a level of it failed, so it has no weighted figure); model
    error is (predicted - measured) / measured on every point.
    """
    levels = sorted({c for row in measured.values() for c in row})
    weights = {c: weights_by_level.get(c, 0.0) for c in levels}
    if sum(weights.values()) <= 0:
        weights = {c: 1.0 for c in levels}
    total = sum(weights.values())
    weights = {c: w / total for c, w in weights.items()}

    n_max = recommended.n_max if recommended.n_max in model.n_values() else None
    predicted: dict[Policy, dict[int, float]] = {}
    errors: dict[Policy, dict[int, float]] = {}
    for policy, row in measured.items():
        values = model.policy_tps(sorted(row), policy.with_n_max(n_max))
        predicted[policy] = {c: float(v) for c, v in zip(sorted(row), values, strict=True)}
        errors[policy] = {c: 100 * (predicted[policy][c] - tps) / tps for c, tps in row.items()}
    complete = {p: row for p, row in measured.items() if set(row) == set(levels)}
    weighted = {p: sum(weights[c] * row[c] for c in levels) for p, row in complete.items()}
    best = max(weighted, key=lambda p: weighted[p]) if weighted else None
    mine = next((p for p in weighted if p.max_slots == recommended.max_slots), None)
    regret = None
    if best is not None and mine is not None:
        regret = 100 * (weighted[best] - weighted[mine]) / weighted[best]
    flat = [abs(e) for row in errors.values() for e in row.values()]
    return ValidationReport(
        run_id=run_id,
        model=model_name,
        recommended=recommended,
        levels=levels,
        weights=weights,
        measured=measured,
        predicted=predicted,
        weighted=weighted,
        best=best,
        regret_pct=regret,
        errors_pct=errors,
        mean_abs_error_pct=sum(flat) / len(flat) if flat else None,
        worst_abs_error_pct=max(flat) if flat else None,
    )
