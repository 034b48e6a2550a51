"""Fitting: step-cost curves and acceptance from measured levels, then bootstrap replicates.

What is fitted is the effective step time of each level, T = c * L_measured / tok/s (stable
where tok/s of a speculative run is not). Each curve's form is chosen by leave-one-out error;
where levels were repeated, the form is calibrated towards the measured medians by as much of
its residual as the repeats' noise does not explain. Threshold rows above their N (the threshold
server not drafting: "off") get a curve of their own, fitted as plain's is, where they were
measured at two levels or more; at one level they set an overhead against plain (paired with
plain of the same run where it exists); without any the threshold server is taken as plain.

Uncertainty: bootstrap replicates of the whole fit, over the repeats of each level when they
were repeated (whole interleaved passes at once, so plain, spec and off measured side by side
stay paired), else over the curves' residuals (leverage-inflated). The point estimate keeps the
chosen form; each replicate also

- draws its form among those the leave-one-out test scored, weighted by RMSE^-n (a pseudo-Bayes
  model average), and refits it;
- draws a form error away from the measured levels: one of the form's leave-one-out errors, with
  a random sign (a jackknife prediction error), full size half an octave from any measured level;
- draws a launch-to-launch offset, normal with sd LAUNCH_NOISE_FLOOR: a new launch of the same
  server measures differently from the one fitted, however precisely that one was measured.
  spec and off share theirs: one launch of the threshold server runs both regimes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tuner.model.acceptance import (
    Acceptance,
    _mean_length,
    _pool_rates,
    estimate_acceptance,
    geometric_rates,
)
from tuner.model.arrivals import fit_arrival_costs
from tuner.model.costmodel import DEFAULT_INTERVAL, CostModel
from tuner.model.curves import (
    FLAT_FORMS,
    GENERIC_FORMS,
    Curve,
    FormChoice,
    fit_curve,
    select_form,
    valid_on,
    verify_curve,
)
from tuner.model.data import FitData, LevelObs, Repeat, level_step
from tuner.model.quality import Calibration, FitQuality, Uncertainty, assess
from tuner.model.trend import acceptance_trend

DEFAULT_REPLICATES = 200
#: Relative noise assumed for residual bootstraps when a curve has no residual degrees of freedom.
FALLBACK_NOISE = 0.02
#: Relative sd of one launch against another of the same server, the least the intervals assume.
LAUNCH_NOISE_FLOOR = 0.02
#: Relative sd of the form's error between levels when no leave-one-out error exists (2 levels).
FORM_ERROR_FALLBACK = 0.05


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


PassDraw = dict[int | None, list[int]]  # run -> the passes a replicate drew (with repeats)


def _draw_passes(rng: np.random.Generator, levels: list[LevelObs]) -> PassDraw:
    """Whole interleaved passes, drawn with replacement per run: every level measured in a drawn
    pass contributes that pass's repeat, so plain and spec keep their pairing."""
    passes: dict[int | None, set[int]] = {}
    for lv in levels:
        for r in lv.repeats:
            if r.pass_index is not None:
                passes.setdefault(lv.run_id, set()).add(r.pass_index)
    draw: PassDraw = {}
    for run, found in passes.items():
        ordered = sorted(found)
        draw[run] = [ordered[i] for i in rng.integers(0, len(ordered), size=len(ordered))]
    return draw


def _bootstrap_inputs(
    rng: np.random.Generator, levels: list[LevelObs], passes: PassDraw | None = None
) -> list[tuple[LevelObs, tuple[Repeat, ...]]]:
    """Each level's repeats resampled: by the drawn passes where its repeats carry one (every
    repeat of a drawn pass: a live launch measures spec and off in pairs, several to a pass),
    else independently."""
    out = []
    for lv in levels:
        reps = lv.repeats
        by_pass: dict[int, list[Repeat]] = {}
        for r in reps:
            if r.pass_index is not None:
                by_pass.setdefault(r.pass_index, []).append(r)
        drawn = [r for p in (passes or {}).get(lv.run_id, []) for r in by_pass.get(p, [])]
        if drawn:
            reps = tuple(drawn)
        elif len(reps) >= 2:
            idx = rng.integers(0, len(reps), size=len(reps))
            reps = tuple(reps[i] for i in idx)
        out.append((lv, reps))
    return out


def form_weights(choice: FormChoice, n_points: int) -> dict[str, float]:
    """Model-averaging weights over the forms the leave-one-out test scored: RMSE^-n, normalised
    (the chosen form alone when none was scored)."""
    scored = {
        name: max(rmse, 1e-6)
        for name, rmse in choice.loo_rmse_pct.items()
        if rmse is not None and name in choice.loo_errors_pct
    }
    if not scored:
        return {choice.curve.form: 1.0}
    best = min(scored.values())
    raw = {name: (best / rmse) ** n_points for name, rmse in scored.items()}
    total = sum(raw.values())
    return {name: w / total for name, w in raw.items()}


def _form_error(rng: np.random.Generator, choice: FormChoice, form: str) -> float:
    """One leave-one-out error of the form (relative), with a random sign."""
    errors = choice.loo_errors_pct.get(form) or choice.loo_errors_pct.get(choice.curve.form)
    if errors:
        return float(rng.choice(np.abs(errors)) / 100 * rng.choice([-1.0, 1.0]))
    return float(rng.normal(0.0, FORM_ERROR_FALLBACK))


def _replicate_curve(
    rng: np.random.Generator,
    key: str,
    choice: FormChoice,
    weights: dict[str, float],
    x: np.ndarray,
    y: np.ndarray,
    x_max: float,
    calibration: float,
    launch_noise: float,
    form_error: bool = True,
) -> dict[str, Any]:
    """One replicate's curve: a form drawn by weight and refitted, its calibration and offsets."""
    base = choice.curve.base
    names = list(weights)
    form = names[int(rng.choice(len(names), p=[weights[n] for n in names]))]
    refit = fit_curve(form, x, y, base)
    if form != choice.curve.form and not valid_on(refit, x_max):
        form, refit = choice.curve.form, fit_curve(choice.curve.form, x, y, base)
    rep: dict[str, Any] = {
        key: list(refit.params),
        f"{key}_shift": float(rng.normal(0.0, launch_noise)),
        f"{key}_gap": _form_error(rng, choice, form) if form_error else 0.0,
    }
    if form != choice.curve.form:
        rep[f"{key}_form"] = form
    if calibration > 0:
        rep[f"{key}_corr"] = [float(v) for v in calibration * (y / refit.trend(x) - 1)]
    return rep


def threshold_observations(data: FitData, plain: Callable[[float], float]) -> list[float]:
    """tok/s of each threshold row above its N over plain's - 1: against plain measured in the
    same run at the same level where there is one (side by side), else the plain curve. What
    sets the overhead where off rows exist at one level only (too few for a curve)."""
    paired = {(lv.run_id, lv.concurrency): lv.tokens_per_second for lv in data.plain}
    out = []
    for lv in data.off:
        ref = paired.get((lv.run_id, lv.concurrency)) if lv.run_id is not None else None
        out.append(lv.tokens_per_second / (ref or plain(lv.concurrency)) - 1.0)
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
    launch_noise: float = LAUNCH_NOISE_FLOOR,
    form_uncertainty: bool = True,
) -> FitResult:
    """Fit step-cost curves and acceptance to the data; bootstrap it; report its quality.

    launch_noise and form_uncertainty (form averaging and form errors between levels) widen the
    replicates beyond a bootstrap of the data; both off is the plain bootstrap of costmodel-2,
    kept for side-by-side benchmarks.

    Raises ValueError when plain or spec has fewer than two concurrency levels (plain's stand-in,
    the off arm, one: FitData.plain).
    """
    _check_levels(data)
    x_max = float(data.n_parallel)
    acceptance = estimate_acceptance(data, data.always)
    verify, kernel_report = _kernel_curves(data, x_max)
    f = _fit_curves(data, acceptance, verify, forms, x_max)
    overhead_obs, overhead, rows = _threshold_overhead(data, f)
    model = CostModel(
        data.n_parallel,
        data.n_max,
        f.curves["plain"],
        f.curves["spec"],
        acceptance,
        verify,
        [],
        interval,
        threshold_overhead=overhead,
        threshold_rows=rows,
        off=f.curves.get("off"),
        plain_measured=data.plain_measured,
    )
    averaging = {
        key: form_weights(choice, len(f.points[key][0]))
        if form_uncertainty
        else {choice.curve.form: 1.0}
        for key, choice in f.choices.items()
    }
    has_repeats, model.replicates = _bootstrap(
        data,
        f,
        acceptance,
        averaging,
        overhead_obs,
        x_max,
        seed,
        replicates,
        launch_noise,
        form_uncertainty,
    )
    _beside_curves(model, data, acceptance, seed)
    noise = {key: f.noise[key] for key in f.fitted}
    calibration = {
        key: Calibration(f.weight[key], None if v is None else 100 * math.sqrt(v))
        for key, v in noise.items()
    }
    how = "repeats" if has_repeats else "residuals"
    forms_weighed = {key: dict(w) for key, w in averaging.items()}
    spread = Uncertainty(how, replicates, interval, seed, 100 * launch_noise, forms_weighed)
    quality = assess(
        model, data, f.choices, calibration=calibration, uncertainty=spread, kernel=kernel_report
    )
    if f.unfitted_off:
        quality.threshold_regime["unfitted_levels"] = f.unfitted_off
    _say_beside(model, quality)
    return FitResult(model, quality)


def _check_levels(data: FitData) -> None:
    """Spec at two levels or more; plain too, or its stand-in where plain was not measured (the
    off arm) at one or more, a flat step cost then (FLAT_FORMS)."""
    if len({lv.concurrency for lv in data.always}) < 2:
        raise ValueError("a fit needs spec measurements at two or more concurrency levels")
    plain_levels = len({lv.concurrency for lv in data.plain})
    if data.plain_measured and plain_levels < 2:
        raise ValueError("a fit needs plain measurements at two or more concurrency levels")
    if plain_levels < 1:
        raise ValueError(
            "a fit needs plain measurements, or the drafting server not drafting (the off arm: "
            "a threshold below the level), at one concurrency level or more"
        )


def _beside_curves(
    model: CostModel, data: FitData, acceptance: Acceptance | None, seed: int
) -> None:
    """What arrivals cost and acceptance by drafting slots, fitted beside the curves (the
    trend's slope drawn into the replicates)."""
    model.arrivals = fit_arrival_costs(data.ttft_rounds, data.probes) if data.ttft_rounds else None
    model.trend = acceptance_trend(data) if acceptance is not None else None
    _draw_trend(model, seed)


def _say_beside(model: CostModel, quality: FitQuality) -> None:
    """The trend and the arrival costs in words, with the fit's quality."""
    if model.trend is not None:
        quality.acceptance["trend"] = model.trend.text()
    if model.arrivals is not None:
        quality.acceptance["arrivals"] = model.arrivals.lines()


def _draw_trend(model: CostModel, seed: int) -> None:
    """Each replicate's acceptance slope, drawn from the trend's interval (normal) where the
    data show a trend; a flat acceptance stays flat in every replicate."""
    if model.trend is None or not model.trend.moving:
        return
    rng = np.random.default_rng([seed, 45])
    for rep in model.replicates:
        rep["trend_slope"] = float(rng.normal(model.trend.slope, model.trend.sd))


@dataclass
class _Curves:
    """Each regime's fitted curve and what made it: its levels (and acceptance), points,
    chosen form, noise, calibration weight; the off levels no form fitted."""

    fitted: dict[str, tuple[list[LevelObs], Acceptance | None]]
    points: dict[str, tuple[np.ndarray, np.ndarray]]
    choices: dict[str, FormChoice]
    noise: dict[str, float | None]
    weight: dict[str, float]
    curves: dict[str, Curve]
    off_levels: list[LevelObs]
    unfitted_off: list[int]


def _fit_curves(
    data: FitData,
    acceptance: Acceptance | None,
    verify: dict[int, Curve],
    forms: Sequence[str],
    x_max: float,
) -> _Curves:
    """Plain's, spec's and (from two off levels on) the off regime's curve: the form each
    selects, calibrated to the medians as far as their noise allows."""
    # The threshold server not drafting gets a curve of its own from two levels on; fewer off
    # levels leave it to the overhead (or to plain).
    off_levels = data.off if len({lv.concurrency for lv in data.off}) >= 2 else []
    fitted: dict[str, tuple[list[LevelObs], Acceptance | None]] = {
        "plain": (data.plain, None),
        "spec": (data.always, acceptance),
    }
    if off_levels:
        fitted["off"] = (off_levels, None)
    points = {
        key: _points_from([(lv, lv.repeats) for lv in lvs], acc)
        for key, (lvs, acc) in fitted.items()
    }
    decode_forms = list(forms) + (["kernel"] if 1 in verify else [])
    spec_base = verify_curve(verify, data.n_max + 1, x_max) if verify else None
    spec_forms = list(forms) + (["kernel"] if spec_base is not None else [])
    bases = {"plain": verify.get(1), "spec": spec_base, "off": verify.get(1)}
    choices: dict[str, FormChoice] = {}
    unfitted_off: list[int] = []
    for key in list(fitted):
        forms_here = spec_forms if key == "spec" else decode_forms
        if len(set(points[key][0].tolist())) == 1:
            forms_here = list(FLAT_FORMS)  # one level: no shape can be told (FLAT_FORMS)
        try:
            choice = select_form(*points[key], x_max, forms_here, bases[key])
        except ValueError:
            if key != "off":
                raise
            # Off rows that no form fits over 1..n_parallel (two adjacent levels whose noise
            # puts the line through them below zero at one stream, seen on the twin): they set
            # the overhead against plain, as rows at one level do, rather than fail the fit.
            unfitted_off = sorted({lv.concurrency for lv in off_levels})
            del fitted["off"], points["off"]
            off_levels = []
            continue
        choices[key] = _with_base(choice, bases[key])
    noise = {key: _level_noise(lvs, acc) for key, (lvs, acc) in fitted.items()}
    weight = {
        key: _calibration_weight(choices[key].curve, *points[key], noise[key]) for key in fitted
    }
    curves = {
        key: _calibrate(choices[key].curve, *points[key], weight[key]).supported_on(points[key][0])
        for key in fitted
    }
    return _Curves(fitted, points, choices, noise, weight, curves, off_levels, unfitted_off)


def _threshold_overhead(data: FitData, f: _Curves) -> tuple[list[float], float, int]:
    """What the threshold server costs against plain when it does not draft: the observations
    (none where off has a curve of its own), their median (share of a step) and the rows."""
    curves = f.curves
    if "off" in curves:
        # For display: the fitted curves' ratio at the levels off was measured at.
        xo = f.points["off"][0]
        overhead = float(np.median(curves["plain"](xo) / curves["off"](xo)) - 1.0)
        return [], overhead, len(f.off_levels)
    overhead_obs = threshold_observations(
        data, lambda c: 1000.0 * c / float(curves["plain"](np.array([c]))[0])
    )
    overhead = float(np.median(overhead_obs)) if overhead_obs else 0.0
    return overhead_obs, overhead, len(overhead_obs)


def _bootstrap(
    data: FitData,
    f: _Curves,
    acceptance: Acceptance,
    averaging: dict[str, dict[str, float]],
    overhead_obs: list[float],
    x_max: float,
    seed: int,
    replicates: int,
    launch_noise: float,
    form_uncertainty: bool,
) -> tuple[bool, list[dict[str, Any]]]:
    """The replicates: over repeats where levels were repeated (whether they were, first),
    else over residuals."""
    plain_levels, spec_levels, off_levels = data.plain, data.always, f.off_levels
    rng = np.random.default_rng(seed)
    has_repeats = any(len(lv.repeats) >= 2 for lv in plain_levels + spec_levels + off_levels)
    pools = {key: _residual_pool(f.choices[key].curve, *f.points[key]) for key in f.fitted}
    reps: list[dict[str, Any]] = []
    for _ in range(replicates):
        drawn: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if has_repeats:
            # One draw of whole passes for every configuration: plain, spec and off of a pass
            # (spec and off seconds apart on one launch) stay together.
            passes = _draw_passes(rng, plain_levels + spec_levels + off_levels)
            rs = _bootstrap_inputs(rng, spec_levels, passes)
            acc_b = _resampled_acceptance(acceptance, data, rs)
            drawn["plain"] = _points_from(_bootstrap_inputs(rng, plain_levels, passes), None)
            drawn["spec"] = _points_from(rs, acc_b)
            if off_levels:
                drawn["off"] = _points_from(_bootstrap_inputs(rng, off_levels, passes), None)
        else:
            acc_b = acceptance
            for key in f.fitted:
                x = f.points[key][0]
                drawn[key] = (x, _perturb(rng, f.choices[key].curve.trend(x), pools[key]))
        rep: dict[str, Any] = {}
        for key, (x_b, y_b) in drawn.items():
            rep |= _replicate_curve(
                rng,
                key,
                f.choices[key],
                averaging[key],
                x_b,
                y_b,
                x_max,
                f.weight[key],
                launch_noise,
                form_uncertainty,
            )
        if "off" in rep:
            rep["off_shift"] = rep["spec_shift"]  # one launch runs both regimes
        if acc_b is not acceptance:
            rep["mean_length"] = acc_b.mean_length
            rep["rates"] = list(acc_b.rates) if acc_b.rates is not None else None
        if overhead_obs:
            picked = rng.choice(np.asarray(overhead_obs), size=len(overhead_obs))
            rep["threshold_overhead"] = float(np.median(picked))
        reps.append(rep)
    return has_repeats, reps


def _with_base(choice: FormChoice, base: Curve | None) -> FormChoice:
    """The choice with the kernel base kept on its curve, so replicates may draw that form."""
    if base is None or choice.curve.base is not None:
        return choice
    return replace(choice, curve=replace(choice.curve, base=base))


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
