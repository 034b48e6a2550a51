"""Step-cost curves T(c): a few functional forms, fitted and chosen by leave-one-out error.

CPUs, APUs and GPUs bend differently (memory-bound flat start, compute-bound slope, expert
spread), so the form is chosen by held-out error, not by taste: linear, power law, knee (flat
then linear), quadratic and, when llama-batched-bench rows exist, "kernel" (the kernel cost at the
same shape plus a linear server-side term). A simpler form is kept when its leave-one-out error
is within PARSIMONY of the best. Kernel verify curves V(c, k) give the cost of other draft
lengths (verify_extra, verify_curve). Pure numpy/scipy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

#: Points along one axis: a list of floats, or an array of them.
Floats = Sequence[float] | np.ndarray

#: A simpler form is kept when its leave-one-out error is within this factor of the best one.
PARSIMONY = 1.05


def _softplus(z: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.logaddexp(0.0, z)
    return out


@dataclass(frozen=True)
class Form:
    """A family of step-cost curves y = f(x; params), linear in all but at most one parameter."""

    name: str
    n_params: int
    description: str
    # basis(x, theta) -> (n, k) design matrix for the linear parameters; theta is the nonlinear one
    basis: Callable[[np.ndarray, float], np.ndarray]
    theta_range: Callable[[np.ndarray], tuple[float, float]] | None = None
    nonneg_slope: bool = True  # the last linear parameter (the growth term) must be >= 0

    def evaluate(self, params: Sequence[float], x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        linear = np.asarray(params[: self.n_linear], dtype=float)
        theta = float(params[self.n_linear]) if self.theta_range else 0.0
        y: np.ndarray = self.basis(x, theta) @ linear
        return y

    @property
    def n_linear(self) -> int:
        return self.n_params - (1 if self.theta_range else 0)


FORMS: dict[str, Form] = {
    "linear": Form(
        "linear",
        2,
        "a + b*c",
        lambda x, _t: np.column_stack([np.ones_like(x), x]),
    ),
    "power": Form(
        "power",
        3,
        "a + b*c^p",
        lambda x, p: np.column_stack([np.ones_like(x), x**p]),
        theta_range=lambda x: (0.05, 4.0),
    ),
    "knee": Form(
        "knee",
        3,
        "a + b*softplus(c - k): flat (memory-bound) until k, then linear (compute-bound)",
        lambda x, k: np.column_stack([np.ones_like(x), _softplus(x - k)]),
        theta_range=lambda x: (float(x.min()) - 4.0, float(x.max())),
    ),
    "quadratic": Form(
        "quadratic",
        3,
        "a + b*c + q*c^2",
        lambda x, _t: np.column_stack([np.ones_like(x), x, x * x]),
        nonneg_slope=False,
    ),
}
GENERIC_FORMS = ("linear", "power", "knee", "quadratic")
# A regime measured at one level only (a running server of two slots tuned without plain: its
# non-drafting rows sit at 2 streams alone) gets the step cost measured there at every level:
# an assumption the fit says so, used only where nothing else can be fitted.
FORMS["flat"] = Form(
    "flat",
    1,
    "a: the step cost of the one measured level, assumed at every level",
    lambda x, _t: np.ones((len(np.atleast_1d(x)), 1)),
)
FLAT_FORMS = ("flat",)


@dataclass(frozen=True)
class Curve:
    """A fitted curve: a form and its parameters, optionally calibrated to measured points.

    The kernel form adds a linear server-side term to a kernel curve (base). A calibration
    (knots, corr) multiplies the form by 1 + corr, interpolated in log c between the measured
    levels (held constant beyond them): it is how a curve honours measured medians that are more
    precise than the form's lack of fit (see `fit`).

    A bootstrap replicate also carries what a refit cannot see: `shift`, a relative offset at
    every c (the next launch measures differently from the last one), and `gap_shift`, a relative
    offset that grows from 0 at the measured levels (`support`) to its full size half an octave
    away from them (how far the form may miss where nothing was measured).
    """

    form: str
    params: tuple[float, ...]
    # "kernel" form: y = base(x) + a + b*x; kept with other forms too, for replicates of this form
    base: Curve | None = None
    knots: tuple[float, ...] = ()
    corr: tuple[float, ...] = ()
    support: tuple[float, ...] = ()  # the measured levels the curve was fitted on
    shift: float = 0.0
    gap_shift: float = 0.0

    def trend(self, x: Any) -> np.ndarray:
        """The form alone, without the calibration."""
        x = np.asarray(x, dtype=float)
        if self.form == "kernel":
            assert self.base is not None
            y: np.ndarray = self.base(x) + self.params[0] + self.params[1] * x
            return y
        return FORMS[self.form].evaluate(self.params, x)

    def __call__(self, x: Any) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        y = self.trend(x)
        if self.knots and any(self.corr):
            y = y * (1.0 + np.interp(np.log(x), np.log(self.knots), self.corr))
        if self.shift or self.gap_shift:
            factor = 1.0 + self.shift + self.gap_shift * gap(x, self.support)
            y = y * np.maximum(factor, MIN_FACTOR)
        return y

    def with_params(
        self,
        params: Sequence[float],
        corr: Sequence[float] | None = None,
        *,
        form: str | None = None,
        shift: float = 0.0,
        gap_shift: float = 0.0,
    ) -> Curve:
        """A replicate of this curve: other parameters (of another form, when given), its own
        calibration and offsets."""
        form = form or self.form
        corr_t = tuple(float(v) for v in corr) if corr is not None else self.corr
        return replace(
            self,
            form=form,
            params=tuple(float(p) for p in params),
            corr=corr_t if len(corr_t) == len(self.knots) else (),
            knots=self.knots if len(corr_t) == len(self.knots) else (),
            shift=float(shift),
            gap_shift=float(gap_shift),
        )

    def calibrated(self, knots: Floats, corr: Floats) -> Curve:
        return replace(
            self, knots=tuple(float(k) for k in knots), corr=tuple(float(v) for v in corr)
        )

    def supported_on(self, levels: Floats) -> Curve:
        return replace(self, support=tuple(float(v) for v in levels))

    @property
    def n_params(self) -> int:
        return 2 if self.form == "kernel" else FORMS[self.form].n_params

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"form": self.form, "params": list(self.params)}
        if self.base is not None:
            out["base"] = self.base.to_dict()
        if self.knots:
            out["knots"] = list(self.knots)
            out["corr"] = list(self.corr)
        if self.support:
            out["support"] = list(self.support)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Curve:
        base = cls.from_dict(data["base"]) if data.get("base") else None
        return cls(
            data["form"],
            tuple(float(p) for p in data["params"]),
            base,
            tuple(float(k) for k in data.get("knots", ())),
            tuple(float(v) for v in data.get("corr", ())),
            tuple(float(v) for v in data.get("support", ())),
        )


#: The least a replicate's offsets may scale its form's step time to. A form's leave-one-out
#: miss, drawn as a replicate's error away from the measured levels, can pass -100 % where the
#: form extrapolated past a level (a quadratic fitted on 1, 2 and 4 streams, asked for 8): a
#: negative step time, negative tok/s, a replicate of no server. It stays a tenth of the form's.
MIN_FACTOR = 0.1

#: How far from the nearest measured level (in ln c) the form's error reaches its full size:
#: half an octave, the middle of the gap between levels 1, 2, 4, 8.
GAP_SCALE = 0.5 * math.log(2.0)


def gap(x: Any, support: Sequence[float]) -> np.ndarray:
    """0 at a measured level, rising linearly in ln c to 1 half an octave away (1 without any);
    beyond the measured range it keeps rising (an extrapolation misses more the farther it
    reaches)."""
    x = np.asarray(x, dtype=float)
    if not support:
        return np.ones_like(x)
    logs = np.log(np.asarray(support, dtype=float))
    lx = np.log(x)
    distance = np.min(np.abs(lx[..., None] - logs), axis=-1)
    inside = (lx >= logs.min()) & (lx <= logs.max())
    out: np.ndarray = np.where(inside, np.minimum(1.0, distance / GAP_SCALE), distance / GAP_SCALE)
    return out


def _solve_linear(design: np.ndarray, y: np.ndarray, nonneg_last: bool) -> tuple[np.ndarray, float]:
    """Least squares on relative residuals (f - y) / y; the last coefficient clipped to >= 0."""
    a = design / y[:, None]
    b = np.ones_like(y)
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    if nonneg_last and coef[-1] < 0:
        reduced, *_ = np.linalg.lstsq(a[:, :-1], b, rcond=None)
        coef = np.append(reduced, 0.0)
    resid = a @ coef - b
    return coef, float(resid @ resid)


def _fit_generic(form: Form, x: np.ndarray, y: np.ndarray) -> tuple[tuple[float, ...], float]:
    if form.theta_range is None:
        coef, cost = _solve_linear(form.basis(x, 0.0), y, form.nonneg_slope)
        return tuple(float(v) for v in coef), cost
    lo, hi = form.theta_range(x)

    def cost_at(theta: float) -> float:
        return _solve_linear(form.basis(x, theta), y, form.nonneg_slope)[1]

    grid = np.linspace(lo, hi, 41)
    costs = np.array([cost_at(t) for t in grid])
    i = int(np.argmin(costs))
    left, right = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    best_theta, best_cost = float(grid[i]), float(costs[i])
    if right > left:
        # imported here: scipy.optimize costs every command's start-up a fifth of a second, and
        # most commands read a stored fit
        from scipy.optimize import minimize_scalar

        res = minimize_scalar(
            cost_at, bounds=(left, right), method="bounded", options={"xatol": 1e-4}
        )
        if res.success and res.fun < best_cost:
            best_theta, best_cost = float(res.x), float(res.fun)
    coef, cost = _solve_linear(form.basis(x, best_theta), y, form.nonneg_slope)
    return (*(float(v) for v in coef), best_theta), cost


def fit_curve(form: str, x: Floats, y: Floats, base: Curve | None = None) -> Curve:
    """Fit one form to points (x, y) by least squares on relative residuals."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if form == "kernel":
        if base is None:
            raise ValueError("the kernel form needs a base curve")
        rest = ya - base(xa)
        design = np.column_stack([np.ones_like(xa), xa])
        coef, *_ = np.linalg.lstsq(design / ya[:, None], rest / ya, rcond=None)
        return Curve("kernel", (float(coef[0]), float(coef[1])), base)
    params, _ = _fit_generic(FORMS[form], xa, ya)
    return Curve(form, params)


def valid_on(curve: Curve, x_max: float) -> bool:
    """A step-cost curve must be positive and never fall as streams are added, on [1, x_max]."""
    grid = np.linspace(1.0, max(x_max, 1.0), 64)
    values = curve(grid)
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        return False
    return bool(np.all(np.diff(values) >= -1e-9 * np.abs(values[:-1]).max()))


@dataclass(frozen=True)
class FormChoice:
    """The chosen curve and every candidate's leave-one-out RMSE (relative, in %)."""

    curve: Curve
    loo_rmse_pct: dict[str, float | None]
    loo_errors_pct: dict[str, list[float]]


def select_form(
    x: Floats,
    y: Floats,
    x_max: float,
    forms: Iterable[str] = GENERIC_FORMS,
    base: Curve | None = None,
) -> FormChoice:
    """Choose the form with the smallest leave-one-out error (a simpler one within PARSIMONY)."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(xa)
    candidates = [f for f in forms if f != "kernel" or base is not None]
    loo: dict[str, float | None] = {}
    errors: dict[str, list[float]] = {}
    fitted: dict[str, Curve] = {}
    for name in candidates:
        k = 2 if name == "kernel" else FORMS[name].n_params
        if n < k:
            continue
        curve = fit_curve(name, xa, ya, base)
        if not valid_on(curve, x_max):
            loo[name] = None
            continue
        fitted[name] = curve
        if n < k + 1:
            loo[name] = None  # no point left to hold out
            continue
        errs = []
        for i in range(n):
            keep = np.arange(n) != i
            held = fit_curve(name, xa[keep], ya[keep], base)
            errs.append(float((held(xa[i : i + 1])[0] - ya[i]) / ya[i]))
        errors[name] = [100 * e for e in errs]
        loo[name] = 100 * math.sqrt(sum(e * e for e in errs) / n)
    scored = {name: v for name, v in loo.items() if v is not None and name in fitted}
    if scored:
        best = min(scored.values())
        simplest = min(
            (name for name, v in scored.items() if v <= best * PARSIMONY + 1e-12),
            key=lambda name: (fitted[name].n_params, scored[name]),
        )
        chosen = fitted[simplest]
    elif fitted:
        # Too few points to hold one out: the simplest form that fits.
        chosen = min(fitted.values(), key=lambda c: c.n_params)
    else:
        raise ValueError("no step-cost form fits these points")
    return FormChoice(chosen, loo, errors)


# --- kernel verify curves -------------------------------------------------------------------


def verify_extra(verify: dict[int, Curve], c: Any, k: float) -> np.ndarray | None:
    """V(c, k) - V(c, 1) from kernel curves, piecewise linear in k; None without them."""
    ks = sorted(verify)
    if len(ks) < 2 or 1 not in verify:
        return None
    c = np.asarray(c, dtype=float)
    ks_arr = np.asarray(ks, dtype=float)
    j = int(np.clip(np.searchsorted(ks_arr, k) - 1, 0, len(ks) - 2))
    k0, k1 = ks_arr[j], ks_arr[j + 1]
    v0, v1 = verify[ks[j]](c), verify[ks[j + 1]](c)
    extra: np.ndarray = v0 + (v1 - v0) * (k - k0) / (k1 - k0) - verify[1](c)
    return extra


def verify_curve(verify: dict[int, Curve], k: int, x_max: float) -> Curve | None:
    """The kernel cost of c sequences x k tokens as a curve in c (interpolated in k if needed)."""
    if k in verify:
        return verify[k]
    xs = np.arange(1, max(int(x_max), 2) + 1, dtype=float)
    extra = verify_extra(verify, xs, k)
    if extra is None:
        return None
    try:
        return select_form(xs, verify[1](xs) + extra, x_max).curve
    except ValueError:
        return None
