"""The cost model: step time and acceptance, fitted separately, give tok/s at every concurrency.

Pure numpy/scipy, no I/O. The model follows DESIGN.md:

- A server step at c streams costs T(c). Plain decode: plain(c) = c / T_plain(c).
- A speculative step at draft length n costs T_spec(c, n) (verify c x (n+1) rows plus n draft
  steps plus overhead) and yields L(n) tokens per stream: spec(c, n) = c * L(n) / T_spec(c, n).
- L(n) = rho * (1 + a_1 + ... + a_n), a_i being the share of drafts whose first i draft tokens
  were all accepted (pooled `/metrics` per-position counts), rho the measured tokens per step at
  the profiled n_max over that expectation (steps without a draft: first token, last steps).
  Without per-position counts the rates are inferred (geometric) from the measured tokens per
  step; imported tables carry only tok/s, so their spec curve folds acceptance in (L = 1 unit).
- Threshold policy N: spec(c) for c <= N, plain(c) above; N = 0 drafts always.

What is fitted is the effective step time of each level, T = c * L_measured / tok/s (it equals the
server's step time up to the aggregate window, and it is stable where tok/s of a speculative run
is not: acceptance is random, step cost is a property of the machine). Each curve T(c) is one of a
few functional forms, chosen by leave-one-out error: linear, power law, knee (flat then linear,
memory-bound then compute-bound), quadratic, and -- when `llama-batched-bench` rows exist --
"kernel": the kernel-level cost at the same shape plus a linear server-side term. Where the
levels were repeated, the form is then calibrated towards the measured medians by as much of its
residual as the repeats' noise does not explain (so a precisely measured level is honoured, while
noise is smoothed); between levels the form gives the shape.

Draft lengths below the profiled n_max: T_spec(c, n) = T_plain(c) + [V(c, n+1) - V(c, 1)]
+ (n / n_max) * D(c), with V the kernel verify cost of c sequences x k tokens (interpolated in k)
and D(c) = T_spec(c, n_max) - T_plain(c) - [V(c, n_max+1) - V(c, 1)] the draft cost. Without
kernel rows the verify cost is taken as linear in k, and T_spec is linear in n between T_plain
(n = 0) and the measured T_spec.

Uncertainty: bootstrap replicates of the whole fit, over the repeats of each level when they were
repeated, else over the curves' residuals (leverage-inflated); every prediction, gain and the
crossover come with a percentile interval over the replicates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from scipy.optimize import minimize_scalar

VERSION = "costmodel-1"
DEFAULT_INTERVAL = 0.9
DEFAULT_REPLICATES = 200
#: Relative noise assumed for residual bootstraps when a curve has no residual degrees of freedom.
FALLBACK_NOISE = 0.02
#: A simpler form is kept when its leave-one-out error is within this factor of the best one.
PARSIMONY = 1.05

# --- functional forms of T(x) -----------------------------------------------------------------


def _softplus(z: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, z)


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
        return self.basis(x, theta) @ linear

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


@dataclass(frozen=True)
class Curve:
    """A fitted curve: a form and its parameters, optionally calibrated to measured points.

    The kernel form adds a linear server-side term to a kernel curve (base). A calibration
    (knots, corr) multiplies the form by 1 + corr, interpolated in log c between the measured
    levels (held constant beyond them): it is how a curve honours measured medians that are more
    precise than the form's lack of fit (see `fit`).
    """

    form: str
    params: tuple[float, ...]
    base: Curve | None = None  # "kernel" form: y = base(x) + a + b*x
    knots: tuple[float, ...] = ()
    corr: tuple[float, ...] = ()

    def trend(self, x: Any) -> np.ndarray:
        """The form alone, without the calibration."""
        x = np.asarray(x, dtype=float)
        if self.form == "kernel":
            assert self.base is not None
            return self.base(x) + self.params[0] + self.params[1] * x
        return FORMS[self.form].evaluate(self.params, x)

    def __call__(self, x: Any) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        y = self.trend(x)
        if self.knots and any(self.corr):
            y = y * (1.0 + np.interp(np.log(x), np.log(self.knots), self.corr))
        return y

    def with_params(self, params: Sequence[float], corr: Sequence[float] | None = None) -> Curve:
        corr_t = tuple(float(v) for v in corr) if corr is not None else self.corr
        return Curve(self.form, tuple(float(p) for p in params), self.base, self.knots, corr_t)

    def calibrated(self, knots: Sequence[float], corr: Sequence[float]) -> Curve:
        return Curve(
            self.form,
            self.params,
            self.base,
            tuple(float(k) for k in knots),
            tuple(float(v) for v in corr),
        )

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
        )


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
        res = minimize_scalar(
            cost_at, bounds=(left, right), method="bounded", options={"xatol": 1e-4}
        )
        if res.success and res.fun < best_cost:
            best_theta, best_cost = float(res.x), float(res.fun)
    coef, cost = _solve_linear(form.basis(x, best_theta), y, form.nonneg_slope)
    return (*(float(v) for v in coef), best_theta), cost


def fit_curve(
    form: str, x: Sequence[float], y: Sequence[float], base: Curve | None = None
) -> Curve:
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


def _valid_on(curve: Curve, x_max: float) -> bool:
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
    x: Sequence[float],
    y: Sequence[float],
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
        if not _valid_on(curve, x_max):
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


# --- input data -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Repeat:
    """One repeat of one level: aggregate tok/s and, when measured, tokens per stream per step."""

    tokens_per_second: float
    accept_len: float | None = None
    step_ms: float | None = None
    drafts: float = 0.0
    accepted_per_position: tuple[float, ...] = ()


@dataclass(frozen=True)
class LevelObs:
    """A measured (configuration, concurrency) point with its repeats.

    config: "plain" (no drafting), "spec" (drafting always) or "threshold" (max_slots N).
    """

    config: str
    concurrency: int
    repeats: tuple[Repeat, ...]
    max_slots: int | None = None
    level_id: int | None = None

    @property
    def tokens_per_second(self) -> float:
        return float(np.median([r.tokens_per_second for r in self.repeats]))


@dataclass(frozen=True)
class KernelObs:
    """A llama-batched-bench point: n_seq sequences x tokens_per_seq rows in step_ms."""

    n_seq: int
    tokens_per_seq: int
    step_ms: float


@dataclass(frozen=True)
class FitData:
    """Everything a fit consumes (built from the database by tuner.decide.recommend)."""

    n_parallel: int
    n_max: int
    levels: tuple[LevelObs, ...]
    kernel: tuple[KernelObs, ...] = ()
    accept_rates: tuple[float, ...] | None = None  # given outright (imported tables)
    accept_len: float | None = None  # given outright (imported tables)

    def of(self, config: str) -> list[LevelObs]:
        return sorted(
            (lv for lv in self.levels if lv.config == config and lv.repeats),
            key=lambda lv: lv.concurrency,
        )


# --- acceptance -----------------------------------------------------------------------------


def geometric_rates(mean_length: float, n_max: int) -> tuple[float, ...]:
    """Per-position rates a_i = alpha^i whose expected length 1 + sum a_i equals mean_length."""
    target = min(max(mean_length, 1.0), n_max + 1.0) - 1.0
    if target <= 0:
        return tuple(0.0 for _ in range(n_max))
    if target >= n_max:
        return tuple(1.0 for _ in range(n_max))
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(1, n_max + 1)) < target:
            lo = mid
        else:
            hi = mid
    alpha = (lo + hi) / 2
    return tuple(alpha**i for i in range(1, n_max + 1))


@dataclass(frozen=True)
class Acceptance:
    """Tokens per stream per speculative step as a function of the draft length n.

    source: "measured" (per-position rates from /metrics), "inferred" (geometric rates from the
    measured tokens per step) or "folded" (unknown: the spec curve is time per stream-token).
    """

    n_max: int
    mean_length: float  # realised tokens per stream per step at n_max (1.0 when folded)
    rates: tuple[float, ...] | None
    source: str

    @property
    def supports_other_n(self) -> bool:
        return self.source != "folded" and self.rates is not None

    def expected(self, n: int) -> float:
        """1 + a_1 + ... + a_n from the rates (n <= n_max)."""
        assert self.rates is not None
        return 1.0 + float(sum(self.rates[:n]))

    def length(self, n: int | None = None) -> float:
        n = self.n_max if n is None else n
        if n == self.n_max:
            return self.mean_length
        if not self.supports_other_n:
            raise ValueError(
                f"acceptance at n_max {n} is unknown: only n_max {self.n_max} was measured"
            )
        if not 1 <= n <= self.n_max:
            raise ValueError(f"n_max {n} is outside 1..{self.n_max} (the profiled n_max)")
        rho = self.mean_length / self.expected(self.n_max)
        return rho * self.expected(n)

    def with_rates(self, rates: Sequence[float], mean_length: float | None = None) -> Acceptance:
        """The same acceptance with other per-position rates (realisation ratio kept)."""
        rates = tuple(float(r) for r in rates)
        if mean_length is None:
            rho = self.mean_length / self.expected(self.n_max) if self.rates else 1.0
            mean_length = rho * (1.0 + sum(rates[: self.n_max]))
        return Acceptance(self.n_max, mean_length, rates, self.source)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_max": self.n_max,
            "mean_length": self.mean_length,
            "rates": list(self.rates) if self.rates is not None else None,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Acceptance:
        rates = data.get("rates")
        return cls(
            int(data["n_max"]),
            float(data["mean_length"]),
            tuple(float(r) for r in rates) if rates is not None else None,
            str(data["source"]),
        )


def _pool_rates(repeats: Iterable[Repeat], n_max: int) -> tuple[float, ...] | None:
    drafts = 0.0
    counts = np.zeros(n_max)
    for r in repeats:
        if r.drafts > 0 and r.accepted_per_position:
            drafts += r.drafts
            per = np.asarray(r.accepted_per_position[:n_max], dtype=float)
            counts[: len(per)] += per
    if drafts <= 0:
        return None
    rates = np.clip(counts / drafts, 0.0, 1.0)
    # a_i is a share of drafts with the first i tokens all accepted: it cannot grow with i
    return tuple(float(v) for v in np.minimum.accumulate(rates))


def _mean_length(pairs: Sequence[tuple[int, Repeat]]) -> float | None:
    """Tokens per stream per step over repeats, weighted by streams (a proxy for their tokens)."""
    if not pairs or not all(r.accept_len for _, r in pairs):
        return None
    weights = np.array([c for c, _ in pairs], dtype=float)
    values = np.array([r.accept_len for _, r in pairs], dtype=float)
    return float(weights @ values / weights.sum())


def estimate_acceptance(data: FitData, spec_levels: list[LevelObs]) -> Acceptance:
    """Acceptance from what the data has: rates and tokens per step, either, or neither."""
    pairs = [(lv.concurrency, r) for lv in spec_levels for r in lv.repeats]
    repeats = [r for _, r in pairs]
    measured_len = _mean_length(pairs)
    rates = _pool_rates(repeats, data.n_max)
    if rates is None and data.accept_rates is not None:
        rates = tuple(float(v) for v in data.accept_rates[: data.n_max])
        rates = rates + (0.0,) * (data.n_max - len(rates))
    if measured_len is None and data.accept_len is not None:
        measured_len = float(data.accept_len)
    if measured_len is None and rates is not None:
        measured_len = 1.0 + sum(rates)
    if measured_len is None:
        return Acceptance(data.n_max, 1.0, None, "folded")
    if rates is None:
        return Acceptance(
            data.n_max, measured_len, geometric_rates(measured_len, data.n_max), "inferred"
        )
    return Acceptance(data.n_max, measured_len, rates, "measured")


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
    return v0 + (v1 - v0) * (k - k0) / (k1 - k0) - verify[1](c)


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


# --- the model ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """Predicted aggregate tok/s per concurrency, with a percentile interval."""

    concurrency: list[int]
    tokens_per_second: list[float]
    lower: list[float]
    upper: list[float]
    interval: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "tokens_per_second": self.tokens_per_second,
            "lower": self.lower,
            "upper": self.upper,
            "interval": self.interval,
        }


@dataclass(frozen=True)
class Gain:
    """spec / plain - 1 per concurrency: point, interval bounds and replicate standard deviation."""

    concurrency: list[int]
    point: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    sd: np.ndarray

    def at(self, c: int) -> tuple[float, float, float, float]:
        i = self.concurrency.index(c)
        return float(self.point[i]), float(self.lower[i]), float(self.upper[i]), float(self.sd[i])


@dataclass(frozen=True)
class Crossover:
    """Where spec stops beating plain.

    streams: the continuous concurrency where spec(c) = plain(c) first turns against spec (None if
    spec loses already at 1 stream or still wins at n_parallel); spec_wins_upto: the largest integer
    c with spec ahead at every level 1..c (0: never; n_parallel: always).
    """

    streams: float | None
    lower: float
    upper: float
    spec_wins_upto: int
    spec_wins_upto_interval: tuple[int, int]
    interval: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "streams": self.streams,
            "lower": self.lower,
            "upper": self.upper,
            "spec_wins_upto": self.spec_wins_upto,
            "spec_wins_upto_interval": list(self.spec_wins_upto_interval),
            "interval": self.interval,
        }


def policy_label(max_slots: int | None) -> str:
    if max_slots is None:
        return "plain"
    if max_slots == 0:
        return "spec (always draft)"
    return f"threshold {max_slots}"


@dataclass
class CostModel:
    """A fitted model of one server: step costs, acceptance and bootstrap replicates."""

    n_parallel: int
    n_max: int
    plain: Curve
    spec: Curve
    acceptance: Acceptance
    verify: dict[int, Curve] = field(default_factory=dict)  # kernel V(c, k), k=1 is decode
    replicates: list[dict[str, Any]] = field(default_factory=list)
    interval: float = DEFAULT_INTERVAL
    version: str = VERSION

    # -- step costs and throughput --

    @property
    def levels(self) -> np.ndarray:
        return np.arange(1, self.n_parallel + 1)

    def n_values(self) -> list[int]:
        """Draft lengths the model can predict: 1..n_max when acceptance allows, else n_max."""
        if self.acceptance.supports_other_n:
            return list(range(1, self.n_max + 1))
        return [self.n_max]

    def plain_step(self, c: Any) -> np.ndarray:
        return self.plain(np.asarray(c, dtype=float))

    def spec_step(self, c: Any, n: int | None = None) -> np.ndarray:
        c = np.asarray(c, dtype=float)
        n = self.n_max if n is None else n
        measured = self.spec(c)
        if n == self.n_max:
            return measured
        if not 1 <= n < self.n_max:
            raise ValueError(f"n_max {n} is outside 1..{self.n_max} (the profiled n_max)")
        if not self.acceptance.supports_other_n:
            raise ValueError("this fit has no acceptance data: only the profiled n_max is known")
        plain = self.plain(c)
        full = verify_extra(self.verify, c, self.n_max + 1)
        if full is None:
            return plain + (n / self.n_max) * (measured - plain)
        part = verify_extra(self.verify, c, n + 1)
        assert part is not None
        draft = np.maximum(measured - plain - full, 0.0)
        return plain + part + (n / self.n_max) * draft

    def plain_tps(self, c: Any) -> np.ndarray:
        c = np.asarray(c, dtype=float)
        return 1000.0 * c / self.plain_step(c)

    def spec_tps(self, c: Any, n: int | None = None) -> np.ndarray:
        c = np.asarray(c, dtype=float)
        return 1000.0 * c * self.acceptance.length(n) / self.spec_step(c, n)

    def policy_tps(self, c: Any, max_slots: int | None, n: int | None = None) -> np.ndarray:
        """tok/s under a policy: None plain, 0 always draft, N draft while c <= N."""
        c = np.asarray(c, dtype=float)
        if max_slots is None:
            return self.plain_tps(c)
        spec = self.spec_tps(c, n)
        if max_slots == 0:
            return spec
        return np.where(c <= max_slots, spec, self.plain_tps(c))

    # -- replicates and intervals --

    def with_params(self, rep: dict[str, Any]) -> CostModel:
        """This model with one replicate's parameters (and no replicates of its own)."""
        acceptance = self.acceptance
        if rep.get("rates") is not None or rep.get("mean_length") is not None:
            acceptance = Acceptance(
                self.acceptance.n_max,
                float(rep.get("mean_length", self.acceptance.mean_length)),
                tuple(rep["rates"]) if rep.get("rates") is not None else self.acceptance.rates,
                self.acceptance.source,
            )
        return CostModel(
            self.n_parallel,
            self.n_max,
            self.plain.with_params(rep["plain"], rep.get("plain_corr")),
            self.spec.with_params(rep["spec"], rep.get("spec_corr")),
            acceptance,
            self.verify,
            [],
            self.interval,
            self.version,
        )

    @cached_property
    def replicate_models(self) -> list[CostModel]:
        return [self.with_params(rep) for rep in self.replicates]

    def bounds(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        alpha = (1.0 - self.interval) / 2
        return (
            np.quantile(samples, alpha, axis=0),
            np.quantile(samples, 1.0 - alpha, axis=0),
        )

    def samples(self, fn: Callable[[CostModel], np.ndarray]) -> np.ndarray:
        """fn over every replicate, stacked (replicates x ...); the point estimate if none."""
        models = self.replicate_models or [self]
        return np.stack([np.asarray(fn(m), dtype=float) for m in models])

    def predict(
        self, max_slots: int | None, n: int | None = None, concurrency: Sequence[int] | None = None
    ) -> Prediction:
        """Predicted tok/s of a policy at each level (default 1..n_parallel), with intervals."""
        c = np.asarray(concurrency if concurrency is not None else self.levels, dtype=float)
        point = self.policy_tps(c, max_slots, n)
        lo, hi = self.bounds(self.samples(lambda m: m.policy_tps(c, max_slots, n)))
        return Prediction(
            [int(v) for v in c],
            [float(v) for v in point],
            [float(min(a, p)) for a, p in zip(lo, point, strict=True)],
            [float(max(b, p)) for b, p in zip(hi, point, strict=True)],
            self.interval,
        )

    def gain(self, n: int | None = None) -> Gain:
        """spec/plain - 1 at each level 1..n_parallel, with interval and replicate spread."""
        c = self.levels.astype(float)

        def rel(m: CostModel) -> np.ndarray:
            return m.spec_tps(c, n) / m.plain_tps(c) - 1.0

        point = rel(self)
        samples = self.samples(rel)
        lo, hi = self.bounds(samples)
        return Gain(
            [int(v) for v in c],
            point,
            np.minimum(lo, point),
            np.maximum(hi, point),
            samples.std(axis=0, ddof=1) if len(samples) > 1 else np.zeros_like(point),
        )

    def _crossing(self, n: int | None) -> tuple[float | None, int]:
        grid = np.linspace(1.0, float(self.n_parallel), 1 + 100 * (self.n_parallel - 1))
        diff = self.spec_tps(grid, n) - self.plain_tps(grid)
        ints = self.levels.astype(float)
        ahead = self.spec_tps(ints, n) >= self.plain_tps(ints)
        upto = int(np.argmin(ahead)) if not ahead.all() else self.n_parallel
        if diff[0] < 0 or np.all(diff >= 0):
            return None, upto
        i = int(np.argmax(diff < 0))
        x0, x1, d0, d1 = grid[i - 1], grid[i], diff[i - 1], diff[i]
        return float(x0 + (x1 - x0) * d0 / (d0 - d1)), upto

    def crossover(self, n: int | None = None) -> Crossover:
        """Where spec stops beating plain, with an interval over the replicates."""
        streams, upto = self._crossing(n)
        reps = [m._crossing(n) for m in (self.replicate_models or [self])]

        def as_number(s: float | None, u: int) -> float:
            if s is not None:
                return s
            return 1.0 if u == 0 else float(self.n_parallel)

        values = np.array([as_number(s, u) for s, u in reps])
        uptos = np.array([u for _, u in reps], dtype=float)
        lo, hi = self.bounds(values[:, None])
        ulo, uhi = self.bounds(uptos[:, None])
        point = as_number(streams, upto)
        return Crossover(
            streams,
            float(min(lo[0], point)),
            float(max(hi[0], point)),
            upto,
            (int(min(round(ulo[0]), upto)), int(max(round(uhi[0]), upto))),
            self.interval,
        )

    # -- serialisation --

    @property
    def form(self) -> str:
        return f"plain={self.plain.form} spec={self.spec.form}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "n_parallel": self.n_parallel,
            "n_max": self.n_max,
            "plain": self.plain.to_dict(),
            "spec": self.spec.to_dict(),
            "acceptance": self.acceptance.to_dict(),
            "verify": {str(k): v.to_dict() for k, v in sorted(self.verify.items())},
            "replicates": self.replicates,
            "interval": self.interval,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        return cls(
            n_parallel=int(data["n_parallel"]),
            n_max=int(data["n_max"]),
            plain=Curve.from_dict(data["plain"]),
            spec=Curve.from_dict(data["spec"]),
            acceptance=Acceptance.from_dict(data["acceptance"]),
            verify={int(k): Curve.from_dict(v) for k, v in data.get("verify", {}).items()},
            replicates=list(data.get("replicates", [])),
            interval=float(data.get("interval", DEFAULT_INTERVAL)),
            version=str(data.get("version", VERSION)),
        )


# --- fitting --------------------------------------------------------------------------------


@dataclass
class FitResult:
    """A fitted model and its quality report (per-point residuals, form choice, checks)."""

    model: CostModel
    quality: dict[str, Any]


def _level_step(level: LevelObs, acceptance: Acceptance | None, repeats: Sequence[Repeat]) -> float:
    """Effective step time (ms) of a level from (a resample of) its repeats: median over repeats.

    T = c * L / tok/s with L = 1 for plain, the repeat's own tokens per step for spec when every
    repeat of the level measured it, else the model's mean length (1 when acceptance is folded).
    """
    own = level.config != "plain" and all(r.accept_len for r in level.repeats)
    values = []
    for r in repeats:
        if level.config == "plain" or acceptance is None or acceptance.source == "folded":
            length = 1.0
        elif own:
            length = float(r.accept_len or 0.0)
        else:
            length = acceptance.mean_length
        values.append(1000.0 * level.concurrency * length / r.tokens_per_second)
    return float(np.median(values))


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
        values = np.array([_level_step(lv, acc, (r,)) for r in lv.repeats])
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
    plain_levels, spec_levels = data.of("plain"), data.of("spec")
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

    quality = _quality(model, data, plain_levels, spec_levels, plain_choice, spec_choice)
    quality["calibration"] = {
        key: {
            "weight": weight[key],
            "noise_pct": 100 * math.sqrt(noise[key]) if noise[key] is not None else None,
        }
        for key in ("plain", "spec")
    }
    quality["uncertainty"] = {
        "method": "repeats" if has_repeats else "residuals",
        "replicates": replicates,
        "interval": interval,
        "seed": seed,
    }
    quality["kernel"] = kernel_report
    quality["acceptance"] = acceptance.to_dict() | {
        "length_by_n": {str(n): acceptance.length(n) for n in model.n_values()}
    }
    return FitResult(model, quality)


def _points_from(
    pairs: list[tuple[LevelObs, tuple[Repeat, ...]]], acc: Acceptance | None
) -> tuple[np.ndarray, np.ndarray]:
    by_c: dict[int, list[float]] = {}
    for lv, reps in pairs:
        by_c.setdefault(lv.concurrency, []).append(_level_step(lv, acc, reps))
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


def _quality(
    model: CostModel,
    data: FitData,
    plain_levels: list[LevelObs],
    spec_levels: list[LevelObs],
    plain_choice: FormChoice,
    spec_choice: FormChoice,
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    acc = model.acceptance
    for config, levels in (("plain", plain_levels), ("spec", spec_levels)):
        max_slots = None if config == "plain" else 0
        for lv in levels:
            c = lv.concurrency
            measured = lv.tokens_per_second
            pred = model.predict(max_slots, concurrency=[c])
            step_measured = _level_step(lv, None if config == "plain" else acc, lv.repeats)
            curve = model.plain if config == "plain" else model.spec
            step_pred = float(curve(np.array([c]))[0])
            step_trend = float(curve.trend(np.array([c]))[0])
            rows.append(
                {
                    "config": config,
                    "concurrency": c,
                    "level_id": lv.level_id,
                    "repeats": len(lv.repeats),
                    "measured_tps": measured,
                    "predicted_tps": pred.tokens_per_second[0],
                    "lower": pred.lower[0],
                    "upper": pred.upper[0],
                    "residual_pct": 100 * (pred.tokens_per_second[0] / measured - 1),
                    "measured_step_ms": step_measured,
                    "predicted_step_ms": step_pred,
                    "step_residual_pct": 100 * (step_pred / step_measured - 1),
                    "form_step_residual_pct": 100 * (step_trend / step_measured - 1),
                    "measured_accept_len": _mean_length([(c, r) for r in lv.repeats])
                    if config == "spec"
                    else 1.0,
                    "model_accept_len": acc.mean_length if config == "spec" else 1.0,
                }
            )
    worst = max(rows, key=lambda r: abs(r["residual_pct"]))
    checks = []
    for lv in sorted(data.of("threshold"), key=lambda lv: (lv.max_slots or 0, lv.concurrency)):
        if not lv.max_slots or lv.concurrency > model.n_parallel:
            continue
        pred = model.predict(lv.max_slots, concurrency=[lv.concurrency])
        checks.append(
            {
                "max_slots": lv.max_slots,
                "concurrency": lv.concurrency,
                "level_id": lv.level_id,
                "measured_tps": lv.tokens_per_second,
                "predicted_tps": pred.tokens_per_second[0],
                "lower": pred.lower[0],
                "upper": pred.upper[0],
                "error_pct": 100 * (pred.tokens_per_second[0] / lv.tokens_per_second - 1),
            }
        )
    return {
        "points": rows,
        "worst_residual_pct": worst["residual_pct"],
        "worst_point": {"config": worst["config"], "concurrency": worst["concurrency"]},
        "rms_residual_pct": math.sqrt(sum(r["residual_pct"] ** 2 for r in rows) / len(rows)),
        "forms": {
            "plain": {
                "chosen": plain_choice.curve.form,
                "loo_rmse_pct": plain_choice.loo_rmse_pct,
            },
            "spec": {"chosen": spec_choice.curve.form, "loo_rmse_pct": spec_choice.loo_rmse_pct},
        },
        "threshold_check": checks,
        "worst_threshold_error_pct": (
            max((c["error_pct"] for c in checks), key=abs) if checks else None
        ),
    }
