"""Fitting: step-cost curves and acceptance from measured levels, then bootstrap replicates.

What is fitted is the effective step time of each level, T = c * L_measured / tok/s (stable
where tok/s of a speculative run is not). Each curve's form is chosen by leave-one-out error;
where levels were repeated, the form is calibrated towards the measured medians by as much of
its residual as the repeats' noise does not explain. Uncertainty: bootstrap replicates of the
whole fit, over the repeats of each level when they were repeated, else over the curves'
residuals (leverage-inflated).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.model.acceptance import (
    Acceptance,
    _mean_length,
    _pool_rates,
    estimate_acceptance,
    geometric_rates,
)
from tuner.model.costmodel import DEFAULT_INTERVAL, CostModel
from tuner.model.curves import GENERIC_FORMS, Curve, fit_curve, select_form, verify_curve
from tuner.model.data import FitData, LevelObs, Repeat, level_step
from tuner.model.quality import Calibration, FitQuality, Uncertainty, assess

DEFAULT_REPLICATES = 200
#: Relative noise assumed for residual bootstraps when a curve has no residual degrees of freedom.
FALLBACK_NOISE = 0.02


@dataclass
class FitResult:
    """A fitted model and its quality report (per-point residuals, form choice, checks)."""

    model: CostModel
    quality: FitQuality


def _kernel_curves(data: FitData, x_max: float) -> tuple[dict[int, Curve], dict[str, Any]]:
    """Kernel cost V(c, k) per tokens-per-sequence k, each a curve in c chosen by LOO."""
    by_k: dict[int, dict[int, list[float]]] = {}
    for row in data.kernel:
        if row.step_ms > 0:
            by_k.setdefault(row.tokens_per_seq, {}).setdefault(row.n_seq, []).append(row.step_ms)
    curves: dict[int, Curve] = {}
    report: dict[str, Any] = {}
    for k, points in sorted(by_k.items()):
        if len(points) < 2:
            continue
        xs = sorted(points)
        ys = [float(np.median(points[x])) for x in xs]
        try:
            choice = select_form(xs, ys, max(x_max, max(xs)))
        except ValueError:
            continue
        curves[k] = choice.curve
        report[str(k)] = {"form": choice.curve.form, "points": len(xs)}
    if 1 not in curves:
        return {}, report
    return curves, report


def _bootstrap_inputs(
    rng: np.random.Generator, levels: list[LevelObs]
) -> list[tuple[LevelObs, tuple[Repeat, ...]]]:
    out = []
    for lv in levels:
        reps = lv.repeats
        if len(reps) >= 2:
            idx = rng.integers(0, len(reps), size=len(reps))
            reps = tuple(reps[i] for i in idx)
        out.append((lv, reps))
    return out


def _level_noise(levels: list[LevelObs], acc: Acceptance | None) -> float | None:
    """Mean relative variance of a level's median step time, from its repeats (None: no repeats)."""
    variances = []
    for lv in levels:
        if len(lv.repeats) < 2:
            continue
        values = np.array([level_step(lv, acc, (r,)) for r in lv.repeats])
        variances.append(float(np.var(values, ddof=1) / values.mean() ** 2 / len(values)))
    return float(np.mean(variances)) if variances else None


def _calibration_weight(curve: Curve, x: np.ndarray, y: np.ndarray, noise: float | None) -> float:
    """How much of the form's residuals to keep as calibration: 1 - noise / residual power.

    Residuals the repeats explain as noise are smoothed away; lack of fit beyond the noise is kept,
    so the curve passes through precisely measured medians. Without repeats the noise is unknown
    and residuals count as noise (weight 0).
    """
    if noise is None:
        return 0.0
    resid = y / curve.trend(x) - 1.0
    power = float(np.mean(resid**2))
    if power <= 0:
        return 0.0
    return float(np.clip(1.0 - noise / power, 0.0, 1.0))


def _calibrate(curve: Curve, x: np.ndarray, y: np.ndarray, weight: float) -> Curve:
    if weight <= 0 or len(x) < 2:
        return curve
    return curve.calibrated(x, weight * (y / curve.trend(x) - 1.0))


def fit(
    data: FitData,
    *,
    seed: int = 0,
    replicates: int = DEFAULT_REPLICATES,
    interval: float = DEFAULT_INTERVAL,
    forms: Sequence[str] = GENERIC_FORMS,
) -> FitResult:
    """Fit step-cost curves and acceptance to the data; bootstrap it; report its quality.

    Raises ValueError when plain or spec has fewer than two concurrency levels.
    """
    plain_levels, spec_levels = data.plain, data.always
    for name, levels in (("plain", plain_levels), ("spec", spec_levels)):
        if len({lv.concurrency for lv in levels}) < 2:
            raise ValueError(f"a fit needs {name} measurements at two or more concurrency levels")
    x_max = float(data.n_parallel)
    acceptance = estimate_acceptance(data, spec_levels)
    verify, kernel_report = _kernel_curves(data, x_max)

    xp, yp = _points_from([(lv, lv.repeats) for lv in plain_levels], None)
    xs, ys = _points_from([(lv, lv.repeats) for lv in spec_levels], acceptance)
    plain_forms = list(forms) + (["kernel"] if 1 in verify else [])
    spec_base = verify_curve(verify, data.n_max + 1, x_max) if verify else None
    spec_forms = list(forms) + (["kernel"] if spec_base is not None else [])
    plain_choice = select_form(xp, yp, x_max, plain_forms, verify.get(1))
    spec_choice = select_form(xs, ys, x_max, spec_forms, spec_base)
    noise = {
        "plain": _level_noise(plain_levels, None),
        "spec": _level_noise(spec_levels, acceptance),
    }
    weight = {
        "plain": _calibration_weight(plain_choice.curve, xp, yp, noise["plain"]),
        "spec": _calibration_weight(spec_choice.curve, xs, ys, noise["spec"]),
    }
    model = CostModel(
        data.n_parallel,
        data.n_max,
        _calibrate(plain_choice.curve, xp, yp, weight["plain"]),
        _calibrate(spec_choice.curve, xs, ys, weight["spec"]),
        acceptance,
        verify,
        [],
        interval,
    )

    # -- bootstrap: over repeats where levels were repeated, else over residuals --
    rng = np.random.default_rng(seed)
    has_repeats = any(len(lv.repeats) >= 2 for lv in plain_levels + spec_levels)
    pools = {
        "plain": _residual_pool(plain_choice.curve, xp, yp),
        "spec": _residual_pool(spec_choice.curve, xs, ys),
    }
    reps: list[dict[str, Any]] = []
    for _ in range(replicates):
        if has_repeats:
            rs = _bootstrap_inputs(rng, spec_levels)
            acc_b = _resampled_acceptance(acceptance, data, rs)
            xp_b, yp_b = _points_from(_bootstrap_inputs(rng, plain_levels), None)
            xs_b, ys_b = _points_from(rs, acc_b)
        else:
            acc_b = acceptance
            xp_b, yp_b = xp, _perturb(rng, plain_choice.curve.trend(xp), pools["plain"])
            xs_b, ys_b = xs, _perturb(rng, spec_choice.curve.trend(xs), pools["spec"])
        rep: dict[str, Any] = {}
        for key, curve, x_b, y_b in (
            ("plain", plain_choice.curve, xp_b, yp_b),
            ("spec", spec_choice.curve, xs_b, ys_b),
        ):
            refit = fit_curve(curve.form, x_b, y_b, curve.base)
            rep[key] = list(refit.params)
            if weight[key] > 0:
                rep[f"{key}_corr"] = [float(v) for v in weight[key] * (y_b / refit.trend(x_b) - 1)]
        if acc_b is not acceptance:
            rep["mean_length"] = acc_b.mean_length
            rep["rates"] = list(acc_b.rates) if acc_b.rates is not None else None
        reps.append(rep)
    model.replicates = reps

    quality = assess(
        model,
        data,
        {"plain": plain_choice, "spec": spec_choice},
        calibration={
            key: Calibration(
                weight[key], 100 * math.sqrt(noise[key]) if noise[key] is not None else None
            )
            for key in ("plain", "spec")
        },
        uncertainty=Uncertainty(
            "repeats" if has_repeats else "residuals", replicates, interval, seed
        ),
        kernel=kernel_report,
    )
    return FitResult(model, quality)


def _points_from(
    pairs: list[tuple[LevelObs, tuple[Repeat, ...]]], acc: Acceptance | None
) -> tuple[np.ndarray, np.ndarray]:
    by_c: dict[int, list[float]] = {}
    for lv, reps in pairs:
        by_c.setdefault(lv.concurrency, []).append(level_step(lv, acc, reps))
    xs = sorted(by_c)
    return np.array(xs, dtype=float), np.array([np.median(by_c[x]) for x in xs])


def _resampled_acceptance(
    acceptance: Acceptance, data: FitData, pairs: list[tuple[LevelObs, tuple[Repeat, ...]]]
) -> Acceptance:
    if acceptance.source == "folded":
        return acceptance
    flat = [(lv.concurrency, r) for lv, reps in pairs for r in reps]
    repeats = [r for _, r in flat]
    mean_length = _mean_length(flat)
    if mean_length is None:
        return acceptance
    rates = _pool_rates(repeats, data.n_max)
    if rates is None:
        rates = (
            geometric_rates(mean_length, data.n_max)
            if acceptance.source == "inferred"
            else acceptance.rates
        )
    return Acceptance(acceptance.n_max, mean_length, rates, acceptance.source)


def _residual_pool(curve: Curve, x: np.ndarray, y: np.ndarray) -> list[float]:
    """Relative residuals, inflated by sqrt(n / (n - p)); a fallback noise with no dof left."""
    n, p = len(x), curve.n_params
    resid = (curve(x) - y) / y
    if n - p <= 0:
        return [FALLBACK_NOISE, -FALLBACK_NOISE]
    scale = math.sqrt(n / (n - p))
    centred = resid - resid.mean()
    return [float(v) for v in centred * scale]


def _perturb(rng: np.random.Generator, fitted: np.ndarray, pool: list[float]) -> np.ndarray:
    draws = rng.choice(np.asarray(pool), size=len(fitted), replace=True)
    return fitted / (1.0 + draws)
