"""Fit, predict and recommend over stored data: one entry function per command, plus the choice.

- `fit_model` / `current_fit`: pick a model's data (host, build, n_parallel, n_max), fit the cost
  model (tuner.model.costmodel) and store it in `tuner_fits` with its inputs, version and quality.
- `predict`: a policy's predicted tok/s per concurrency, with intervals, from a stored fit.
- `recommend`: run the Optuna study (tuner.decide.search) on the fit, then choose N:
  * the model's optimum, kept inside what the measurements show (spec measured ahead at c means
    N >= c; measured behind at c means N < c);
  * among values within the model's uncertainty of it (one bootstrap standard error), the
    smaller N, saying so;
  * when the choice rests on levels that were not measured, which levels to measure next.
  The recommendation is stored with the fit and the study it came from.
- `render`: the output formats (env, shell, json, systemd, args).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import socket
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import select

from tuner.decide import search
from tuner.errors import ConfigError, NotFoundError, NothingToDoError
from tuner.model import costmodel
from tuner.model.costmodel import CostModel, FitData, KernelObs, LevelObs, Repeat
from tuner.storage.engine import Store
from tuner.storage.orm import Build, Fit, KernelRow, Level, Model, Recommendation, Run

ENV_MAX_SLOTS = "LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS"
ENV_N_MAX = "LLAMA_ARG_SPEC_DRAFT_N_MAX"
FORMATS = ("env", "shell", "json", "systemd", "args")
PROFILE_HINT = (
    "run `tuner profile SPEC.toml` (or `tuner import FILE.toml` for a table measured elsewhere)"
)


# --- which data a fit uses ------------------------------------------------------------------


def finite(value: Any) -> Any:
    """A JSON-able copy with NaN and infinities as None (PostgreSQL's JSON rejects them)."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    if isinstance(value, np.generic):
        return finite(value.item())
    return value


@dataclass
class Selection:
    """The runs and levels a fit is made from, and where they come from."""

    model: str
    model_id: int
    host: str | None
    host_id: int | None
    build_id: int | None
    build: str | None
    n_parallel: int
    n_max: int
    run_ids: list[int]
    level_ids: list[int]
    kernel_rows: int
    sources: list[str]
    weights: dict[str, float] | None
    measured: dict[str, list[int]]
    data_hash: str
    host_note: str | None = None

    def inputs(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "host": self.host,
            "build": self.build,
            "n_parallel": self.n_parallel,
            "n_max": self.n_max,
            "runs": self.run_ids,
            "levels": self.level_ids,
            "kernel_rows": self.kernel_rows,
            "sources": self.sources,
            "weights": self.weights,
            "measured": self.measured,
            "data_hash": self.data_hash,
        }


def this_host(settings_host: str | None = None) -> str:
    """This machine's name as results are stored under it (TUNER_HOST_NAME, else the hostname)."""
    if settings_host:
        return settings_host
    from tuner.settings import get_settings

    return get_settings().host_name or socket.gethostname()


def _complete(run: Run) -> bool:
    configs = {lv.config for lv in run.levels if lv.status == "completed"}
    return {"plain", "spec"} <= configs


def _host_label(run: Run) -> str | None:
    return run.host.name if run.host else None


def _resolve_host(
    runs: list[Run], model: str, requested: str | None, explicit: bool
) -> tuple[str | None, str | None]:
    """The host whose data to use, and a note when it is not the one asked for."""
    hosts: dict[str | None, Run] = {}
    for run in runs:  # newest first
        hosts.setdefault(_host_label(run), run)
    if requested in hosts:
        return requested, None
    names = ", ".join(h or "(no host)" for h in hosts)
    if explicit:
        raise NothingToDoError(
            f"model {model!r} has no plain and spec measurements on host {requested!r} "
            f"(hosts with data: {names}); run `tuner profile SPEC.toml` on that host, "
            f"or pass --host with one of those"
        )
    chosen_run = runs[0]
    chosen = _host_label(chosen_run)
    where = chosen or "an unnamed host"
    kind = "imported" if chosen_run.source == "imported" else "measured"
    note = (
        f"no measurements of {model} on this machine ({requested}); "
        f"using the {kind} data from {where}"
    )
    if len(hosts) > 1:
        note += f" (newest of: {names}; --host picks another)"
    return chosen, note


def _repeats(level: Level) -> tuple[Repeat, ...]:
    out = []
    for r in (level.metrics or {}).get("repeats", []):
        tps = r.get("tokens_per_second")
        if not tps:
            continue
        m = r.get("metrics") or {}
        out.append(
            Repeat(
                float(tps),
                float(r["accept_len"]) if r.get("accept_len") else None,
                float(r["step_ms"]) if r.get("step_ms") else None,
                float(m.get("drafts") or 0.0),
                tuple(float(v) for v in m.get("accepted_per_position") or ()),
            )
        )
    if not out and level.tokens_per_second:
        out.append(Repeat(float(level.tokens_per_second), level.accept_len, level.step_ms))
    return tuple(out)


def _config_kind(level: Level) -> str | None:
    if level.config == "plain" and level.max_slots is None:
        return "plain"
    if level.config == "spec" and level.max_slots == 0:
        return "spec"
    if level.config.startswith("max-slots-") and level.max_slots:
        return "threshold"
    return None  # attach labels and anything else: not a known policy


def select_data(
    store: Store, model: str, host: str | None = None, host_explicit: bool = False
) -> tuple[FitData, Selection]:
    """The fit's data: the newest complete run's host, build, -np and n_max, and runs like it."""
    with store.session() as session:
        model_row = session.scalars(select(Model).where(Model.name == model)).first()
        if model_row is None:
            known = ", ".join(session.scalars(select(Model.name).order_by(Model.name))) or "none"
            raise NothingToDoError(
                f"no data for model {model!r} (models with data: {known}); {PROFILE_HINT}"
            )
        runs = [
            run
            for run in session.scalars(
                select(Run).where(Run.model_id == model_row.id).order_by(Run.id.desc())
            )
            if _complete(run)
        ]
        if not runs:
            raise NothingToDoError(
                f"model {model!r} has no completed plain and spec levels to fit; {PROFILE_HINT}"
            )
        requested = host if host is not None or host_explicit else this_host()
        chosen_host, note = _resolve_host(runs, model, requested, host_explicit)
        runs = [run for run in runs if _host_label(run) == chosen_host]
        # The newest profile or import sets the build, -np and n_max; validations and sweeps
        # like it add their levels.
        basis = next((run for run in runs if run.kind in ("profile", "import")), runs[0])
        key = (basis.build_id, basis.n_parallel, basis.n_max)
        group = sorted(
            (run for run in runs if (run.build_id, run.n_parallel, run.n_max) == key),
            key=lambda run: run.id,
        )
        levels: list[LevelObs] = []
        level_ids: list[int] = []
        digest_rows: list[Any] = []
        measured: dict[str, set[int]] = {}
        for run in group:
            for level in run.levels:
                kind = _config_kind(level)
                if level.status != "completed" or kind is None:
                    continue
                if kind != "plain" and level.n_max not in (None, basis.n_max):
                    continue
                reps = _repeats(level)
                if not reps:
                    continue
                levels.append(LevelObs(kind, level.concurrency, reps, level.max_slots, level.id))
                level_ids.append(level.id)
                digest_rows.append([level.id, level.repeats, level.tokens_per_second])
                measured.setdefault(level.config, set()).add(level.concurrency)
        run_ids = [run.id for run in group]
        kernel = [
            KernelObs(row.n_seq, row.tokens_per_seq, row.step_ms)
            for row in session.scalars(select(KernelRow).where(KernelRow.run_id.in_(run_ids)))
        ]
        spec = basis.spec or {}
        weights = (spec.get("workload") or {}).get("weights")
        accept_rates = spec.get("accept_rates") if basis.source == "imported" else None
        accept_len = spec.get("accept_len") if basis.source == "imported" else None
        build = None
        if basis.build_id is not None:
            build_row = session.get(Build, basis.build_id)
            build = build_row.binary_sha256 if build_row else None
        elif basis.source == "imported":
            build = spec.get("build") or None
        n_parallel = int(basis.n_parallel or max(lv.concurrency for lv in levels))
        n_max = int(basis.n_max or 1)
        digest = hashlib.sha256(
            json.dumps(
                [costmodel.VERSION, digest_rows, len(kernel), n_parallel, n_max], default=str
            ).encode()
        ).hexdigest()
        selection = Selection(
            model=model,
            model_id=model_row.id,
            host=chosen_host,
            host_id=basis.host_id,
            build_id=basis.build_id,
            build=build,
            n_parallel=n_parallel,
            n_max=n_max,
            run_ids=run_ids,
            level_ids=level_ids,
            kernel_rows=len(kernel),
            sources=sorted({run.source for run in group}),
            weights={str(k): float(v) for k, v in weights.items()} if weights else None,
            measured={k: sorted(v) for k, v in sorted(measured.items())},
            data_hash=digest,
            host_note=note,
        )
    data = FitData(
        n_parallel=n_parallel,
        n_max=n_max,
        levels=tuple(levels),
        kernel=tuple(kernel),
        accept_rates=tuple(accept_rates) if accept_rates else None,
        accept_len=float(accept_len) if accept_len else None,
    )
    return data, selection


# --- fits -----------------------------------------------------------------------------------


@dataclass
class StoredFit:
    """A fit as stored: its id, model, quality report and the inputs it was made from."""

    id: int
    model: CostModel
    quality: dict[str, Any]
    inputs: dict[str, Any]
    created_at: dt.datetime
    reused: bool = False
    host_note: str | None = None

    @property
    def weights(self) -> dict[str, float] | None:
        return self.inputs.get("weights")

    @property
    def measured(self) -> dict[str, list[int]]:
        return self.inputs.get("measured", {})


def _fit_data(data: FitData, selection: Selection, seed: int, replicates: int):
    try:
        return costmodel.fit(data, seed=seed, replicates=replicates)
    except ValueError as exc:
        raise NothingToDoError(f"cannot fit {selection.model}: {exc}; {PROFILE_HINT}") from exc


def _stored(row: Fit, reused: bool, note: str | None) -> StoredFit:
    return StoredFit(
        row.id,
        CostModel.from_dict(row.params),
        dict(row.quality),
        dict(row.inputs),
        row.created_at,
        reused,
        note,
    )


def fit_model(
    store: Store,
    model: str,
    host: str | None = None,
    *,
    host_explicit: bool = False,
    seed: int = 0,
    replicates: int = costmodel.DEFAULT_REPLICATES,
) -> StoredFit:
    """`tuner fit`: fit the model's data anew and store the fit."""
    data, selection = select_data(store, model, host, host_explicit)
    return _save_fit(store, data, selection, seed, replicates)


def _equal_fit(session, selection: Selection, seed: int, replicates: int) -> Fit | None:
    """The newest stored fit of exactly this data, seed and bootstrap size, if any."""
    for row in session.scalars(
        select(Fit)
        .where(Fit.model_id == selection.model_id, Fit.version == costmodel.VERSION)
        .order_by(Fit.id.desc())
    ):
        inputs = row.inputs or {}
        if (
            inputs.get("data_hash") == selection.data_hash
            and inputs.get("seed") == seed
            and inputs.get("replicates") == replicates
        ):
            return row
    return None


def _save_fit(
    store: Store,
    data: FitData,
    selection: Selection,
    seed: int,
    replicates: int,
    reuse_equal: bool = False,
) -> StoredFit:
    """Fit and store; with reuse_equal, a fit of the same data stored meanwhile (by another
    process of a fleet) is returned instead, so the data gets one fit and one study."""
    result = _fit_data(data, selection, seed, replicates)
    inputs = selection.inputs() | {"seed": seed, "replicates": replicates}
    with store.exclusive(f"fit:{selection.model_id}:{selection.host_id}") as session:
        if reuse_equal and (existing := _equal_fit(session, selection, seed, replicates)):
            return _stored(existing, True, selection.host_note)
        row = Fit(
            model_id=selection.model_id,
            host_id=selection.host_id,
            build_id=selection.build_id,
            version=costmodel.VERSION,
            form=result.model.form,
            params=finite(result.model.to_dict()),
            inputs=finite(inputs),
            quality=finite(result.quality),
        )
        session.add(row)
        session.flush()
        return _stored(row, False, selection.host_note)


def current_fit(
    store: Store,
    model: str,
    host: str | None = None,
    *,
    host_explicit: bool = False,
    fit_id: int | None = None,
    seed: int = 0,
    replicates: int = costmodel.DEFAULT_REPLICATES,
) -> StoredFit:
    """A given fit, else the newest fit of exactly the current data, else a new fit (stored)."""
    if fit_id is not None:
        with store.session() as session:
            row = session.get(Fit, fit_id)
            if row is None:
                raise NotFoundError(
                    f"fit {fit_id} does not exist; `tuner fit --model NAME` makes one"
                )
            if row.model.name != model:
                raise ConfigError(f"fit {fit_id} is of model {row.model.name!r}, not {model!r}")
            return _stored(row, True, None)
    data, selection = select_data(store, model, host, host_explicit)
    with store.session() as session:
        if existing := _equal_fit(session, selection, seed, replicates):
            return _stored(existing, True, selection.host_note)
    return _save_fit(store, data, selection, seed, replicates, reuse_equal=True)


# --- predict --------------------------------------------------------------------------------


@dataclass
class PredictReport:
    """`tuner predict`: a policy's tok/s per concurrency, with plain and spec beside it."""

    fit: StoredFit
    max_slots: int
    n_max: int
    prediction: costmodel.Prediction
    plain: costmodel.Prediction
    spec: costmodel.Prediction
    crossover: costmodel.Crossover

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.fit.inputs.get("model"),
            "host": self.fit.inputs.get("host"),
            "fit_id": self.fit.id,
            "max_slots": self.max_slots,
            "n_max": self.n_max,
            **self.prediction.to_dict(),
            "plain": self.plain.to_dict(),
            "spec": self.spec.to_dict(),
            "crossover": self.crossover.to_dict(),
            "measured": self.fit.measured,
        }


def _check_n_max(model: CostModel, n_max: int | None) -> int:
    if n_max is None:
        return model.n_max
    if n_max not in model.n_values():
        if model.acceptance.supports_other_n:
            raise ConfigError(
                f"--n-max {n_max}: the fit covers 1..{model.n_max} (the profiled n_max)"
            )
        raise ConfigError(
            f"--n-max {n_max}: this fit has no acceptance data, so only the profiled n_max "
            f"{model.n_max} can be predicted"
        )
    return n_max


def predict(
    store: Store,
    model: str,
    max_slots: int,
    *,
    n_max: int | None = None,
    host: str | None = None,
    host_explicit: bool = False,
    fit_id: int | None = None,
) -> PredictReport:
    """Predicted tok/s under --spec-draft-max-slots N (0: always draft) at every concurrency."""
    stored = current_fit(store, model, host, host_explicit=host_explicit, fit_id=fit_id)
    cm = stored.model
    if not 0 <= max_slots <= cm.n_parallel:
        raise ConfigError(f"--max-slots {max_slots}: expected 0..{cm.n_parallel} (-np of the fit)")
    n = _check_n_max(cm, n_max)
    return PredictReport(
        stored,
        max_slots,
        n,
        cm.predict(max_slots, n),
        cm.predict(None, n),
        cm.predict(0, n),
        cm.crossover(n),
    )


# --- the choice -----------------------------------------------------------------------------


def effective(max_slots: int, n_parallel: int) -> int:
    """N = 0 drafts at every level: it behaves like N = n_parallel."""
    return n_parallel if max_slots == 0 else max_slots


@dataclass
class Choice:
    """The chosen N with the reasons, the levels worth measuring next, and the alternatives."""

    max_slots: int
    n_max: int
    objective: float
    objective_interval: tuple[float, float]
    model_optimum: int
    reasons: list[str]
    measure_next: list[int]
    alternatives: list[dict[str, Any]]


def measured_gains(
    points: list[dict[str, Any]],
) -> dict[int, float]:
    """spec / plain - 1 at levels where both were measured (from a fit's quality points)."""
    plain = {p["concurrency"]: p["measured_tps"] for p in points if p["config"] == "plain"}
    spec = {p["concurrency"]: p["measured_tps"] for p in points if p["config"] == "spec"}
    return {c: spec[c] / plain[c] - 1.0 for c in sorted(plain.keys() & spec.keys())}


def _bracket(gains: dict[int, float], n_parallel: int) -> tuple[int, int] | None:
    """(lo, hi): spec measured ahead up to lo and behind from hi; None when signs alternate."""
    levels = sorted(gains)
    ahead = [gains[c] > 0 for c in levels]
    if any(not a and b for a, b in itertools.pairwise(ahead)):
        return None
    lo = max((c for c, a in zip(levels, ahead, strict=True) if a), default=0)
    hi = min((c for c, a in zip(levels, ahead, strict=True) if not a), default=n_parallel + 1)
    return lo, hi


def _level_gain(gain: costmodel.Gain, gains_measured: dict[int, float], c: int) -> str:
    p, lo, hi, _ = gain.at(c)
    text = f"{_pct(p)} [{_pct(lo)}, {_pct(hi)}] at {c}"
    if c in gains_measured:
        text += f" (measured {_pct(gains_measured[c])})"
    return text


def _pct(value: float) -> str:
    return f"{100 * value:+.1f}%"


def _streams(c: int) -> str:
    return f"{c} stream" + ("" if c == 1 else "s")


def choose(
    model: CostModel,
    weights: np.ndarray,
    result: search.SearchResult,
    gains_measured: dict[int, float],
    min_single_stream: float | None = None,
) -> Choice:
    """Apply the measurement bracket and the one-standard-error rule to the study's optimum.

    The study picks (N, n_max); at that n_max every N is weighed here (cheap: the objective is a
    weighted sum over n_parallel levels), so the rules see the whole row even after a sampled
    search.
    """
    npar = model.n_parallel
    best = result.best
    n = best.n_max
    reasons: list[str] = []
    values = {
        c.max_slots: c
        for c in search.enumerate_space(model, weights, [n], min_single_stream)
        if c.feasible
    }
    samples = {N: search.objective_samples(model, N, n, weights) for N in values}
    gain = model.gain(n)
    cross = model.crossover(n)

    # 1. Keep to what the measurements show (they were taken at the profiled n_max).
    allowed = set(values)
    bracket = _bracket(gains_measured, npar) if n == model.n_max and gains_measured else None
    if n == model.n_max and gains_measured and bracket is None:
        reasons.append(
            "the measured gains change sign more than once ("
            + ", ".join(f"{c}: {_pct(g)}" for c, g in gains_measured.items())
            + "): noisy measurements? the model decides alone"
        )
    if bracket is not None:
        lo, hi = bracket
        inside = {N for N in allowed if max(lo, 1) <= effective(N, npar) <= max(hi - 1, 1)}
        if inside:
            allowed = inside
    pick = min(
        allowed,
        key=lambda N: (-values[N].value, search.preference(N, n, npar, model.n_max)),
    )
    if best.max_slots not in allowed:
        reasons.append(
            f"the model's optimum N={best.max_slots} contradicts the measurements "
            f"(spec measured ahead up to {_streams(bracket[0]) if bracket else '?'}); "
            f"keeping N={pick}, the best the measurements allow"
        )

    # 2. One-standard-error rule: the smallest N whose objective is within the model's
    #    uncertainty of the pick.
    chosen = pick
    for N in sorted(allowed, key=lambda N: effective(N, npar)):
        if effective(N, npar) >= effective(pick, npar):
            break
        diff = samples[pick] - samples[N]
        point = values[pick].value - values[N].value
        sd = float(np.std(diff, ddof=1)) if len(diff) > 1 else 0.0
        if point <= sd:
            chosen = N
            reasons.append(
                f"N={N} and N={pick} are within the model's uncertainty of each other "
                f"(objective {values[N].value:.1f} vs {values[pick].value:.1f} tok/s, "
                f"difference {point:.2f} ± {sd:.2f}): preferring the smaller N"
            )
            break

    # 3. Why, in terms of levels.
    eff = effective(chosen, npar)
    levels = list(range(1, npar + 1))
    measured_levels = set(gains_measured)
    if gain.point[0] < 0 and (not gains_measured or gains_measured.get(1, -1) < 0):
        reasons.insert(
            0,
            "plain beats spec even at 1 stream: N=1 drafts the least a threshold can; "
            "consider running without drafting",
        )
    elif eff >= npar:
        reasons.insert(
            0,
            f"spec is ahead of plain at every level up to {_streams(npar)}: "
            "N=0 (no limit, the server's default)",
        )
    else:
        where = (
            f"crossover near {cross.streams:.1f} streams [{cross.lower:.1f}, {cross.upper:.1f}]"
            if cross.streams is not None
            else "no crossover inside 1..n_parallel"
        )
        reasons.insert(
            0,
            f"N={eff}: spec up to {_streams(eff)}, plain above; spec vs plain "
            f"{_level_gain(gain, gains_measured, eff)}, "
            f"{_level_gain(gain, gains_measured, eff + 1)}; {where}",
        )

    if n != model.n_max:
        reasons.append(
            f"n_max {n} was not measured (the profile used {model.n_max}): its predictions "
            + (
                "take the verify cost from the kernel rows"
                if len(model.verify) > 1
                else "assume the step cost linear in the draft length (no kernel rows)"
            )
            + f" and acceptance {model.acceptance.source} per position; "
            f"`tuner validate` measures it"
        )

    # 4. Levels worth measuring: unmeasured levels the choice rests on, whose sign is uncertain.
    measure_next: list[int] = []
    if bracket is not None:
        lo, hi = bracket
        gap = [c for c in levels if lo < c < hi and c not in measured_levels]
    else:
        gap = [c for c in levels if c not in measured_levels and abs(c - eff - 0.5) <= 1]
    for c in gap:
        p, lo_c, hi_c, _ = gain.at(c)
        state = "undecided" if lo_c < 0 < hi_c else ("ahead" if p > 0 else "behind")
        if state == "undecided":
            measure_next.append(c)
        reasons.append(
            f"{_streams(c)} not measured: the model puts spec at {_pct(p)} "
            f"[{_pct(lo_c)}, {_pct(hi_c)}] there"
            + (" -- the data cannot decide it" if state == "undecided" else "")
        )
    if measure_next:
        levels_arg = ",".join(str(c) for c in measure_next)
        reasons.append(
            f"measure {', '.join(_streams(c) for c in measure_next)} next "
            f"(`tuner profile SPEC.toml --levels {levels_arg}`), then recommend again"
        )
    obj_lo, obj_hi = model.bounds(samples[chosen][:, None]) if len(samples[chosen]) else (0, 0)
    alternatives = [
        {
            "max_slots": N,
            "objective": values[N].value,
            "difference_from_chosen": values[chosen].value - values[N].value,
        }
        for N in sorted(values, key=lambda N: effective(N, npar))
    ]
    return Choice(
        chosen,
        n,
        values[chosen].value,
        (float(np.ravel(obj_lo)[0]), float(np.ravel(obj_hi)[0])),
        best.max_slots,
        reasons,
        measure_next,
        alternatives,
    )


# --- recommend ------------------------------------------------------------------------------


@dataclass
class TableRow:
    concurrency: int
    measured: bool
    plain: float
    spec: float
    chosen: float
    gain_vs_plain: float
    gain_vs_spec: float
    plain_interval: tuple[float, float]
    spec_interval: tuple[float, float]


@dataclass
class RecommendationReport:
    """What `tuner recommend` prints and stores."""

    id: int
    model: str
    host: str | None
    host_note: str | None
    max_slots: int
    n_max: int
    tune_n_max: bool
    objective: float
    objective_interval: tuple[float, float]
    fit_id: int
    study_name: str
    sampler: str
    trials: int
    reasons: list[str]
    measure_next: list[int]
    table: list[TableRow]
    min_single_stream: float | None = None
    alternatives: list[dict[str, Any]] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        out = {ENV_MAX_SLOTS: str(self.max_slots)}
        if self.tune_n_max:
            out[ENV_N_MAX] = str(self.n_max)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_slots": self.max_slots,
            "n_max": self.n_max,
            "tune_n_max": self.tune_n_max,
            "env": self.env(),
            "model": self.model,
            "host": self.host,
            "host_note": self.host_note,
            "objective": self.objective,
            "objective_interval": list(self.objective_interval),
            "recommendation_id": self.id,
            "fit_id": self.fit_id,
            "study_name": self.study_name,
            "sampler": self.sampler,
            "trials": self.trials,
            "min_single_stream": self.min_single_stream,
            "reasons": self.reasons,
            "measure_next": self.measure_next,
            "table": [row.__dict__ for row in self.table],
            "alternatives": self.alternatives,
        }


def _table(
    model: CostModel, max_slots: int, n: int, measured: dict[str, list[int]]
) -> list[TableRow]:
    plain = model.predict(None, n)
    spec = model.predict(0, n)
    chosen = model.predict(max_slots, n)
    both = set(measured.get("plain", [])) & set(measured.get("spec", []))
    rows = []
    for i, c in enumerate(plain.concurrency):
        rows.append(
            TableRow(
                c,
                c in both,
                plain.tokens_per_second[i],
                spec.tokens_per_second[i],
                chosen.tokens_per_second[i],
                chosen.tokens_per_second[i] / plain.tokens_per_second[i] - 1,
                chosen.tokens_per_second[i] / spec.tokens_per_second[i] - 1,
                (plain.lower[i], plain.upper[i]),
                (spec.lower[i], spec.upper[i]),
            )
        )
    return rows


def recommend(
    store: Store,
    model: str,
    *,
    host: str | None = None,
    host_explicit: bool = False,
    tune_n_max: bool = False,
    min_single_stream: float | None = None,
    seed: int = 0,
    fit_id: int | None = None,
) -> RecommendationReport:
    """`tuner recommend`: fit (or reuse the fit of the same data), search, choose, store."""
    stored = current_fit(store, model, host, host_explicit=host_explicit, fit_id=fit_id, seed=seed)
    cm = stored.model
    try:
        weights = search.objective_weights(cm.n_parallel, stored.weights)
    except ValueError as exc:
        raise ConfigError(f"workload weights of {model}: {exc}") from exc
    options = {
        "tune_n_max": tune_n_max,
        "min_single_stream": min_single_stream,
        "weights": [round(float(w), 12) for w in weights],
        "seed": seed,
        "version": costmodel.VERSION,
    }
    name = search.study_name(
        model, stored.inputs.get("host"), stored.inputs.get("build"), stored.id, options
    )
    try:
        result = search.run_study(
            store.url,
            name,
            cm,
            weights,
            tune_n_max=tune_n_max,
            min_single_stream=min_single_stream,
            seed=seed,
            user_attrs={"model": model, "fit_id": stored.id, **options},
        )
    except ValueError as exc:
        best_single = max(
            float(cm.spec_tps([1], n)[0]) for n in (cm.n_values() if tune_n_max else [cm.n_max])
        )
        raise ConfigError(
            f"no setting reaches --min-single-stream {min_single_stream:g} tok/s "
            f"(the best the model predicts at 1 stream is {best_single:.1f})"
        ) from exc
    choice = choose(
        cm, weights, result, measured_gains(stored.quality.get("points", [])), min_single_stream
    )
    if stored.host_note:
        choice.reasons.append(stored.host_note)
    table = _table(cm, choice.max_slots, choice.n_max, stored.measured)
    report = RecommendationReport(
        0,
        model,
        stored.inputs.get("host"),
        stored.host_note,
        choice.max_slots,
        choice.n_max,
        tune_n_max,
        choice.objective,
        choice.objective_interval,
        stored.id,
        name,
        result.sampler,
        result.trials,
        choice.reasons,
        choice.measure_next,
        table,
        min_single_stream,
        choice.alternatives,
    )
    details = report.to_dict() | {"search": result.to_dict(), "model_optimum": choice.model_optimum}
    with store.session() as session:
        row = Recommendation(
            fit_id=stored.id,
            study_name=name,
            max_slots=choice.max_slots,
            n_max=choice.n_max,
            objective=choice.objective,
            details=finite(details),
        )
        session.add(row)
        session.flush()
        report.id = row.id
    return report


# --- output ---------------------------------------------------------------------------------


def render(report: RecommendationReport, fmt: str) -> str:
    """The recommendation in one of FORMATS (env: one VAR=VALUE line per setting)."""
    env = report.env()
    if fmt == "env":
        return "\n".join(f"{k}={v}" for k, v in env.items())
    if fmt == "shell":
        return "export " + " ".join(f"{k}={v}" for k, v in env.items())
    if fmt == "systemd":
        return "Environment=" + " ".join(f"{k}={v}" for k, v in env.items())
    if fmt == "args":
        args = f"--spec-draft-max-slots {report.max_slots}"
        if report.tune_n_max:
            args += f" --spec-draft-n-max {report.n_max}"
        return args
    if fmt == "json":
        return json.dumps(report.to_dict(), default=str)
    raise ConfigError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")


def explain_lines(report: RecommendationReport) -> list[str]:
    """The reasons, one per line (the table is rendered by the CLI)."""
    head = f"N={report.max_slots}"
    if report.tune_n_max:
        head += f", n_max={report.n_max}"
    lines = [
        f"recommendation {report.id}: {head} for {report.model}"
        f" (fit {report.fit_id}, study {report.study_name}, {report.trials} trials)",
        f"objective: {report.objective:.1f} tok/s workload-weighted "
        f"[{report.objective_interval[0]:.1f}, {report.objective_interval[1]:.1f}]",
    ]
    lines += [f"- {reason}" for reason in report.reasons]
    return lines


def fit_summary(stored: StoredFit) -> dict[str, Any]:
    """What `tuner fit` shows: the forms, the residuals, the threshold check and the crossover."""
    cm = stored.model
    cross = cm.crossover()
    return {
        "fit_id": stored.id,
        "reused": stored.reused,
        "version": cm.version,
        "form": cm.form,
        "inputs": stored.inputs,
        "quality": stored.quality,
        "crossover": cross.to_dict(),
        "n_values": cm.n_values(),
        "host_note": stored.host_note,
    }
