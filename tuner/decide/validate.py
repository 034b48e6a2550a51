"""`tuner validate`: measure the recommended N and its neighbours live, and grade the model.

The server runs with the recommended N, N-1, N+1, 0 (always draft) and plain, each across the
profile's concurrency levels plus the levels where those neighbours differ (N and N+1), under
the same repeat and noise rules as `profile`. The measurements are stored as a run of kind
"validate" (threshold measurements that feed the next `fit`) and compared with the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select

from tuner.errors import ConfigError, NothingToDoError
from tuner.measure.fingerprint import probe_build, probe_host, probe_model
from tuner.measure.profiler import (
    COMPLETED,
    Context,
    Observer,
    Profiler,
    ProgressEvent,
    ServerConfig,
    _quiet,
    find_resumable_run,
    preflight,
)
from tuner.measure.spec import ProfileSpec, check_spec_files, set_dotted, validation_message
from tuner.storage.engine import Store
from tuner.storage.hashes import StoredHashes
from tuner.storage.orm import Fit, Host, Model, Recommendation, Run
from tuner.storage.queries import run_points


@dataclass(frozen=True)
class Recommended:
    """A stored recommendation: the one validation checks, or the one that stands after it."""

    id: int
    max_slots: int
    n_max: int | None
    fit_id: int
    host: str | None
    tune_n_max: bool = False
    min_single_stream: float | None = None

    @classmethod
    def of(cls, row: Recommendation, host: str | None) -> Recommended:
        details = row.details or {}
        return cls(row.id, row.max_slots, row.n_max, row.fit_id, host,
                   bool(details.get("tune_n_max")), details.get("min_single_stream"))


@dataclass
class ValidationReport:
    """Measured tok/s per candidate and level, the best candidate, regret and model error."""

    run_id: int
    model: str
    recommended: int
    levels: list[int]
    weights: dict[int, float]
    measured: dict[str, dict[int, float]]  # candidate label -> concurrency -> tok/s
    predicted: dict[str, dict[int, float]] = field(default_factory=dict)
    weighted: dict[str, float] = field(default_factory=dict)
    best: str = ""
    regret_pct: float | None = None  # None when the recommended N lacks a level
    errors_pct: dict[str, dict[int, float]] = field(default_factory=dict)  # signed % error
    mean_abs_error_pct: float | None = None
    worst_abs_error_pct: float | None = None
    standing: Recommended | None = None  # what stands once the validation's points are fitted

    @property
    def changed(self) -> bool:
        """Whether the validation's points changed the answer."""
        return self.standing is not None and self.standing.max_slots != self.recommended

    def standing_text(self) -> str:
        """One line: the recommendation that stands now, and whether validation changed it."""
        if self.standing is None:
            return ""
        line = f"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS={self.standing.max_slots}"
        if self.changed:
            return (f"{line} now stands: validation changed the recommendation from "
                    f"N={self.recommended} (the refit includes the points just measured)")
        return f"{line} stands after validation (unchanged)"

    def regret_text(self) -> str:
        """The regret as shown in tables and summaries."""
        if self.regret_pct is None:
            return "- (a level of it failed)"
        return f"{self.regret_pct:.1f}%"

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "model": self.model, "recommended": self.recommended,
            "levels": self.levels, "weights": self.weights, "measured": self.measured,
            "predicted": self.predicted, "weighted": self.weighted, "best": self.best,
            "regret_pct": self.regret_pct, "errors_pct": self.errors_pct,
            "mean_abs_error_pct": self.mean_abs_error_pct,
            "worst_abs_error_pct": self.worst_abs_error_pct,
            "standing": self.standing.max_slots if self.standing else None,
            "changed": self.changed,
        }


def label(max_slots: int | None) -> str:
    """How a candidate is named in tables: plain, N=0 (always draft), N=k."""
    return "plain" if max_slots is None else f"N={max_slots}"


def standing_recommendation(store: Store, model: str, host: str,
                            like: Recommended | None = None) -> Recommended:
    """The recommendation that stands for host now: the newest one stored for the fit of the
    current data (what `tuner report` shows), else a new one made with like's options.

    The data are host's own, or, when host has none, the newest host's (recommend says so in
    its reasons); never a recommendation merely because it is the newest in the database.
    """
    from tuner.decide import recommend

    fit = recommend.current_fit(store, model, host)
    with store.session() as session:
        row = session.scalars(
            select(Recommendation).where(Recommendation.fit_id == fit.id)
            .order_by(Recommendation.id.desc())
        ).first()
        if row is not None:
            return Recommended.of(row, fit.inputs.get("host"))
    made = recommend.recommend(
        store, model, host=host, tune_n_max=like.tune_n_max if like else False,
        min_single_stream=like.min_single_stream if like else None,
    )
    return Recommended(made.id, made.max_slots, made.n_max, made.fit_id, made.host,
                       made.tune_n_max, made.min_single_stream)


def latest_profile_spec(store: Store, model: str, host: str | None = None) -> ProfileSpec:
    """The spec of the model's newest managed profile run (validation reuses its server set-up),
    preferring the given host's runs."""
    with store.session() as session:
        runs = session.scalars(
            select(Run).join(Model)
            .where(Model.name == model, Run.kind == "profile", Run.source == "measured",
                   Run.label.is_(None))
            .order_by(Run.id.desc())
        ).all()
        own = [run.spec for run in runs if run.host is not None and run.host.name == host]
        specs = own or [run.spec for run in runs]
    if not specs:
        raise NothingToDoError(
            f"model {model!r} has no managed profile run to take the server set-up from; "
            f"run `tuner profile SPEC` first"
        )
    return ProfileSpec.model_validate(specs[0])


def candidates(recommended: int, n_parallel: int) -> list[int | None]:
    """N, N-1, N+1 (within 1..np), 0 = always draft, and None = plain."""
    around = {n for n in (recommended - 1, recommended, recommended + 1) if 1 <= n <= n_parallel}
    return [None, 0, *sorted(around)]


def validation_levels(spec: ProfileSpec, recommended: int) -> list[int]:
    """The profile's levels plus N and N+1, where N-1 | N and N | N+1 differ."""
    extra = {c for c in (recommended, recommended + 1) if 1 <= c <= spec.server.n_parallel}
    return sorted(set(spec.levels) | extra)


def _config(max_slots: int | None) -> ServerConfig:
    if max_slots is None:
        return ServerConfig.plain()
    if max_slots == 0:
        return ServerConfig.spec()
    return ServerConfig.threshold(max_slots)


def _validation_spec(spec: ProfileSpec, levels: list[int], n_max: int | None,
                     overrides: list[tuple[str, Any]] | None = None) -> ProfileSpec:
    data = spec.model_dump(mode="json")
    data["name"] = f"{spec.name}-validate"
    data["workload"]["concurrency"] = levels
    if n_max:
        data["speculative"]["n_max"] = n_max
    data["speculative"]["threshold"] = None
    for key, value in overrides or []:
        set_dotted(data, key, value)
    try:
        return ProfileSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message("validation spec (--set)", exc)) from exc


def measure(store: Store, model: str, log_dir: Path, observer: Observer = _quiet,
            resume: bool = False, host_name: str | None = None, max_slots: int | None = None,
            overrides: list[tuple[str, Any]] | None = None, skip_preflight: bool = False,
            ) -> tuple[int, Recommended, ProfileSpec]:
    """Run the validation measurements; returns (run id, the recommendation, the spec used)."""
    from tuner.decide.recommend import this_host

    host = this_host(host_name)
    rec = standing_recommendation(store, model, host)
    if max_slots is not None:
        rec = replace(rec, max_slots=max_slots)
    profile_spec = latest_profile_spec(store, model, host)
    levels = validation_levels(profile_spec, rec.max_slots)
    # Overrides come first: a profile made with a stock server can be validated with
    # --set server.binary=/path/to/patched/llama-server.
    spec = _validation_spec(profile_spec, levels, rec.n_max, overrides)
    check_spec_files(spec, f"profile spec of {model}")
    build = probe_build(spec.server.binary)
    if not build.has_max_slots:
        raise ConfigError(
            f"{spec.server.binary} does not know --spec-draft-max-slots (not in its --help); "
            f"validation needs the patched server: scripts/setup.sh builds one, "
            f"--set server.binary=PATH selects it"
        )
    configs = [_config(n) for n in candidates(rec.max_slots, spec.server.n_parallel)]
    if not skip_preflight:
        preflight(spec, configs, log_dir, observer)
    profiler = Profiler(store, spec, log_dir, observer)
    run_id = find_resumable_run(store, spec, kind="validate", host_name=host) if resume else None
    if run_id is not None:
        profiler.reopen_run(run_id)
        observer(ProgressEvent("message", text=f"resuming validation run {run_id}"))
    else:
        context = Context(model_name=model, build=build,
                          model=probe_model(spec.server.model, StoredHashes(store, host)),
                          host=probe_host(spec.server.binary, host))
        profiler.create_run(context, kind="validate")
        with store.session() as session:
            run = session.get(Run, profiler.run_id)
            run.recommendation_id, run.validated_max_slots = rec.id, rec.max_slots
    run_id = profiler.execute(configs, kernel_level=False)
    return run_id, rec, spec


def measured_table(store: Store, run_id: int) -> dict[str, dict[int, float]]:
    _, points = run_points(store, run_id)
    table: dict[str, dict[int, float]] = {}
    for p in points:
        if p.status == COMPLETED and p.tokens_per_second is not None:
            table.setdefault(label(p.max_slots), {})[p.concurrency] = p.tokens_per_second
    return table


def latest_validation(store: Store, model: str, host: str | None = None) -> int | None:
    """The newest completed validation run of a model, on host when one is named."""
    with store.session() as session:
        query = (
            select(Run.id).join(Model)
            .where(Model.name == model, Run.kind == "validate", Run.status == COMPLETED)
            .order_by(Run.id.desc())
        )
        if host is not None:
            query = query.join(Host, Run.host_id == Host.id).where(Host.name == host)
        return session.scalars(query).first()


def _validated_recommendation(store: Store, run_id: int, model: str) -> Recommended:
    """The recommendation a validation run checked, as the run recorded it; for runs from
    before that was recorded, the newest one made from its host's data before it started."""
    with store.session() as session:
        run = session.get(Run, run_id)
        host = run.host.name if run.host else None
        if run.recommendation_id is not None:
            row = session.get(Recommendation, run.recommendation_id)
            rec = Recommended.of(row, row.fit.host.name if row.fit.host else None)
            if run.validated_max_slots is not None:
                rec = replace(rec, max_slots=run.validated_max_slots)
            return rec
        row = session.execute(
            select(Recommendation, Host.name)
            .join(Fit, Recommendation.fit_id == Fit.id)
            .join(Model, Fit.model_id == Model.id)
            .outerjoin(Host, Fit.host_id == Host.id)
            .where(Model.name == model, Recommendation.created_at <= run.started_at,
                   Host.name == host)
            .order_by(Recommendation.id.desc())
        ).first()
    if row is None:
        raise NothingToDoError(
            f"validation run {run_id} has no recommendation of {model} from its host "
            f"({host}) to compare with; run `tuner validate --model {model}` again"
        )
    return Recommended.of(row[0], row[1])


def analyse(store: Store, run_id: int, model: str,
            recommended: Recommended | None = None) -> ValidationReport:
    """Compare a validation run with the fit the recommendation came from.

    Weighted figures use the workload weights restricted to the validated levels (uniform when
    the profile set none); regret is how far the recommended N's weighted tok/s falls below the
    best measured candidate's (None when a level of the recommended N failed, so it has no
    weighted figure); model error is (predicted - measured) / measured on every point.
    """
    from tuner.decide import recommend, search

    rec = recommended or _validated_recommendation(store, run_id, model)
    measured = measured_table(store, run_id)
    if not measured:
        raise NothingToDoError(f"validation run {run_id} has no completed levels")
    fit = recommend.current_fit(store, model, fit_id=rec.fit_id).model
    levels = sorted({c for row in measured.values() for c in row})
    all_weights = search.objective_weights(fit.n_parallel, _spec_weights(store, run_id))
    weights = {c: float(all_weights[c - 1]) for c in levels}
    if sum(weights.values()) <= 0:
        weights = {c: 1.0 for c in levels}
    total = sum(weights.values())
    weights = {c: w / total for c, w in weights.items()}

    predicted: dict[str, dict[int, float]] = {}
    errors: dict[str, dict[int, float]] = {}
    for name, row in measured.items():
        max_slots = None if name == "plain" else int(name.removeprefix("N="))
        n = rec.n_max if rec.n_max in fit.n_values() else None
        values = fit.policy_tps(sorted(row), max_slots, n)
        predicted[name] = {c: float(v) for c, v in zip(sorted(row), values, strict=True)}
        errors[name] = {c: 100 * (predicted[name][c] - tps) / tps for c, tps in row.items()}
    complete = {name: row for name, row in measured.items() if set(row) == set(levels)}
    weighted = {name: sum(weights[c] * row[c] for c in levels) for name, row in complete.items()}
    rec_label = label(rec.max_slots)
    best = max(weighted, key=lambda name: weighted[name]) if weighted else ""
    regret = None
    if best and rec_label in weighted:
        regret = 100 * (weighted[best] - weighted[rec_label]) / weighted[best]
    flat = [abs(e) for row in errors.values() for e in row.values()]
    return ValidationReport(
        run_id=run_id, model=model, recommended=rec.max_slots, levels=levels, weights=weights,
        measured=measured, predicted=predicted, weighted=weighted, best=best, regret_pct=regret,
        errors_pct=errors,
        mean_abs_error_pct=sum(flat) / len(flat) if flat else None,
        worst_abs_error_pct=max(flat) if flat else None,
    )


def _spec_weights(store: Store, run_id: int) -> dict[str, float] | None:
    with store.session() as session:
        spec = session.get(Run, run_id).spec or {}
    weights = (spec.get("workload") or {}).get("weights")
    return {str(k): float(v) for k, v in weights.items()} if weights else None


def validate(store: Store, model: str, log_dir: Path, observer: Observer = _quiet,
             resume: bool = False, host_name: str | None = None, max_slots: int | None = None,
             overrides: list[tuple[str, Any]] | None = None,
             skip_preflight: bool = False) -> ValidationReport:
    """`tuner validate`: measure the recommendation and its neighbours, then grade them."""
    from tuner.decide.recommend import this_host

    run_id, rec, _spec = measure(store, model, log_dir, observer, resume, host_name, max_slots,
                                 overrides, skip_preflight)
    report = analyse(store, run_id, model, rec)
    report.standing = standing_recommendation(store, model, this_host(host_name), like=rec)
    return report
