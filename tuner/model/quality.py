"""How well a fit matches its data, as one typed value: per-point residuals, the forms chosen and
their held-out errors, threshold levels predicted without being fitted, calibration, uncertainty,
and what the threshold server above its N rests on (`threshold_regime`).

Stored with every fit (as_dict / from_dict) and shown by `tuner dev fit` and `tuner report` through
one renderer (tuner.report.tables.fit_quality_table).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tuner.model.acceptance import _mean_length
from tuner.model.costmodel import CostModel
from tuner.model.curves import Curve, FormChoice
from tuner.model.data import FitData, LevelObs, level_step
from tuner.policy import Policy


@dataclass(frozen=True)
class PointFit:
    """One measured level against the model: tok/s measured and predicted (with its interval),
    and for fitted levels the step time too."""

    policy: Policy
    concurrency: int
    level_id: int | None
    measured_tps: float
    predicted_tps: float
    lower: float
    upper: float
    repeats: int = 1
    measured_step_ms: float | None = None
    predicted_step_ms: float | None = None
    step_residual_pct: float | None = None
    form_step_residual_pct: float | None = None  # the form alone, before calibration
    measured_accept_len: float | None = None
    model_accept_len: float | None = None

    @property
    def residual_pct(self) -> float:
        """(predicted - measured) / measured, in %."""
        return 100 * (self.predicted_tps / self.measured_tps - 1)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["policy"] = self.policy.label
        data["max_slots"] = self.policy.max_slots
        data["residual_pct"] = self.residual_pct
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PointFit:
        if "policy" in data:
            policy = Policy.parse(data["policy"])
        else:  # fits stored before the policy type: config "plain"/"spec", or max_slots alone
            policy = Policy.of_max_slots(
                data.get("max_slots", None if data.get("config") == "plain" else 0)
            )
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**fields, "policy": policy})


@dataclass(frozen=True)
class FormReport:
    """The curve form chosen for one configuration and every candidate's leave-one-out error."""

    chosen: str
    loo_rmse_pct: dict[str, float | None]

    @property
    def chosen_loo_pct(self) -> float | None:
        return self.loo_rmse_pct.get(self.chosen)


@dataclass(frozen=True)
class Calibration:
    """How much of a curve's residual was kept (1: through the medians) and the repeats' noise."""

    weight: float
    noise_pct: float | None


@dataclass(frozen=True)
class Uncertainty:
    """How the intervals were made: bootstrap over repeats or residuals, the launch-to-launch
    floor, and the weights of the forms the replicates average over."""

    method: str
    replicates: int
    interval: float
    seed: int
    launch_noise_pct: float | None = None  # None: stored before the floor existed
    form_weights: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class FitQuality:
    """Everything `tuner dev fit` shows about a fit, stored with it."""

    points: list[PointFit]  # the fitted levels: plain, always draft and (with its curve) off
    held_out: list[PointFit]  # threshold levels not in the curves (drafting; off without a curve)
    forms: dict[str, FormReport]  # "plain", "spec" and, where off rows were fitted, "off"
    calibration: dict[str, Calibration]
    uncertainty: Uncertainty
    acceptance: dict[str, Any]
    kernel: dict[str, Any] = field(default_factory=dict)
    # the threshold server above N: "source" "curve" (its own, fitted from off rows at
    # "levels"), "ratio" (plain times 1 + overhead, off rows at one level) or "assumed" (plain);
    # "overhead" its tok/s ratio to plain - 1 (with a curve: the median over "levels"); "rows"
    # how many off rows set it; "unfitted_levels" where off rows at two or more levels fitted
    # no form (they set the ratio instead). Fits before costmodel-4 store overhead and rows only.
    threshold_regime: dict[str, Any] = field(default_factory=dict)

    @property
    def worst_point(self) -> PointFit:
        return max(self.points, key=lambda p: abs(p.residual_pct))

    @property
    def rms_residual_pct(self) -> float:
        return math.sqrt(sum(p.residual_pct**2 for p in self.points) / len(self.points))

    @property
    def worst_held_out(self) -> PointFit | None:
        return max(self.held_out, key=lambda p: abs(p.residual_pct), default=None)

    def measured_gains(self, against: str = "plain") -> dict[int, float]:
        """spec / reference - 1 at the levels where both were measured.

        against="plain": spec against plain. "off": spec against the threshold server not
        drafting (the median of the off rows measured at the level) where it was measured,
        else against plain (the model's prior there; at one stream every threshold drafts):
        what decides N."""
        plain = {p.concurrency: p.measured_tps for p in self.points if p.policy.is_plain}
        spec = {p.concurrency: p.measured_tps for p in self.points if p.policy.is_always}
        reference = dict(plain)
        if against == "off":
            off: dict[int, list[float]] = {}
            for p in self.points + self.held_out:
                if p.policy.is_threshold and not p.policy.drafts_at(p.concurrency):
                    off.setdefault(p.concurrency, []).append(p.measured_tps)
            reference |= {c: float(np.median(v)) for c, v in off.items()}
        return {c: spec[c] / reference[c] - 1.0 for c in sorted(reference.keys() & spec.keys())}

    def as_dict(self) -> dict[str, Any]:
        worst = self.worst_point
        held = self.worst_held_out
        return {
            "points": [p.as_dict() for p in self.points],
            "held_out": [p.as_dict() for p in self.held_out],
            "forms": {k: asdict(v) for k, v in self.forms.items()},
            "calibration": {k: asdict(v) for k, v in self.calibration.items()},
            "uncertainty": asdict(self.uncertainty),
            "acceptance": self.acceptance,
            "kernel": self.kernel,
            "threshold_regime": self.threshold_regime,
            # derived, stored for readers of the database
            "worst_residual_pct": worst.residual_pct,
            "worst_point": {"policy": worst.policy.label, "concurrency": worst.concurrency},
            "rms_residual_pct": self.rms_residual_pct,
            "worst_held_out_error_pct": held.residual_pct if held else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FitQuality:
        return cls(
            points=[PointFit.from_dict(p) for p in data.get("points", [])],
            held_out=[
                PointFit.from_dict(p) for p in data.get("held_out", data.get("threshold_check", []))
            ],
            forms={k: FormReport(v["chosen"], v["loo_rmse_pct"]) for k, v in data["forms"].items()},
            calibration={
                k: Calibration(v["weight"], v.get("noise_pct"))
                for k, v in data.get("calibration", {}).items()
            },
            uncertainty=Uncertainty(**data["uncertainty"]),
            acceptance=dict(data.get("acceptance", {})),
            kernel=dict(data.get("kernel", {})),
            threshold_regime=dict(data.get("threshold_regime", {})),
        )


def assess(
    model: CostModel,
    data: FitData,
    choices: dict[str, FormChoice],
    *,
    calibration: dict[str, Calibration],
    uncertainty: Uncertainty,
    kernel: dict[str, Any],
) -> FitQuality:
    """Compare the fitted model with every level it was fitted on, and predict the threshold
    levels it was not."""
    acc = model.acceptance
    points: list[PointFit] = []
    fitted: list[tuple[Curve, list[LevelObs]]] = [
        (model.plain, data.plain),
        (model.spec, data.always),
    ]
    if model.off is not None:
        fitted.append((model.off, data.off))
    for curve, levels in fitted:
        points += [_point_fit(model, curve, lv) for lv in levels]
    held_out = []
    for lv in sorted(data.thresholds, key=lambda lv: (lv.policy.max_slots, lv.concurrency)):
        if lv.concurrency > model.n_parallel:
            continue
        if model.off is not None and not lv.policy.drafts_at(lv.concurrency):
            continue  # fitted: the off curve's point
        held_out.append(PointFit(**_predicted(model, lv.policy.with_n_max(None), lv)))
    return FitQuality(
        points=points,
        held_out=held_out,
        forms={
            key: FormReport(choice.curve.form, dict(choice.loo_rmse_pct))
            for key, choice in choices.items()
        },
        calibration=calibration,
        uncertainty=uncertainty,
        acceptance=acc.to_dict()
        | {"length_by_n": {str(n): acc.length(n) for n in model.n_values()}},
        kernel=kernel,
        threshold_regime=threshold_regime(model),
    )


def _predicted(model: CostModel, policy: Policy, lv: LevelObs) -> dict[str, Any]:
    """A level's tok/s measured beside the model's, with its interval: PointFit's fields."""
    pred = model.predict(policy, concurrency=[lv.concurrency])
    return {
        "policy": policy,
        "concurrency": lv.concurrency,
        "level_id": lv.level_id,
        "measured_tps": lv.tokens_per_second,
        "predicted_tps": pred.tokens_per_second[0],
        "lower": pred.lower[0],
        "upper": pred.upper[0],
        "repeats": len(lv.repeats),
    }


def _point_fit(model: CostModel, curve: Curve, lv: LevelObs) -> PointFit:
    """A level the model was fitted on against the model: tok/s, step time and acceptance."""
    acc = model.acceptance
    c = lv.concurrency
    policy = lv.policy.with_n_max(None)
    drafts = policy.drafts_at(c)
    predicted = _predicted(model, policy, lv)
    step_measured = level_step(lv, acc if drafts else None, lv.repeats)
    step_pred = float(curve(np.array([c]))[0])
    step_trend = float(curve.trend(np.array([c]))[0])
    return PointFit(
        **predicted,
        measured_step_ms=step_measured,
        predicted_step_ms=step_pred,
        step_residual_pct=100 * (step_pred / step_measured - 1),
        form_step_residual_pct=100 * (step_trend / step_measured - 1),
        measured_accept_len=(
            1.0 if policy.is_plain else _mean_length([(c, r) for r in lv.repeats])
        ),
        model_accept_len=acc.mean_length if drafts else 1.0,
    )


def threshold_regime(model: CostModel) -> dict[str, Any]:
    """What the threshold server above its N rests on (see FitQuality.threshold_regime)."""
    measured = "ratio" if model.threshold_rows else "assumed"
    source = "curve" if model.off is not None else measured
    return {
        "source": source,
        "overhead": model.threshold_overhead,
        "rows": model.threshold_rows,
        "levels": [int(c) for c in model.off.support] if model.off is not None else [],
    }
