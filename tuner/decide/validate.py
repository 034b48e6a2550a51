"""`tuner validate`: measure the recommendation that stands and its neighbours live, grade the
model on them, and say which recommendation stands afterwards.

The server runs with the recommended N, N-1, N+1, 0 (always draft) and plain, each across the
profile's concurrency levels plus the levels where those neighbours differ (N and N+1), under
the same repeat and noise rules as `profile`. The measurements are stored as a run of kind
"validate" that names the recommendation it checks; they feed the next fit, so the answer that
stands after validation may differ, and the report says which.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tuner.decide import advice, search
from tuner.decide.regret import ValidationReport, grade
from tuner.errors import ConfigError, NothingToDoError, TunerError
from tuner.inputs import validation_message
from tuner.measure.backend import Backend
from tuner.measure.fingerprint import probe_build, probe_host, probe_model
from tuner.measure.plan import Observer, ProgressEvent, quiet
from tuner.measure.preflight import preflight
from tuner.measure.profiler import Context, Profiler, find_resumable_run
from tuner.measure.spec import (
    ProfileSpec,
    check_spec_files,
    prompt_file,
    set_dotted,
)
from tuner.policy import Policy
from tuner.recommendation import Origin, Recommendation
from tuner.storage import validations
from tuner.storage.fits import current_fit
from tuner.storage.hashes import StoredHashes
from tuner.storage.store import Store


def candidates(recommended: int, n_parallel: int) -> list[Policy]:
    """plain, always draft (N=0), and N-1, N, N+1 within 1..np."""
    around = {n for n in (recommended - 1, recommended, recommended + 1) if 1 <= n <= n_parallel}
    return [Policy.plain(), Policy.always(), *(Policy.threshold(n) for n in sorted(around))]


def validation_levels(spec: ProfileSpec, recommended: int) -> list[int]:
    """The profile's levels plus N and N+1, where N-1 | N and N | N+1 differ."""
    extra = {c for c in (recommended, recommended + 1) if 1 <= c <= spec.server.n_parallel}
    return sorted(set(spec.levels) | extra)


def validation_spec(
    stored: dict[str, Any],
    levels: list[int],
    n_max: int | None,
    overrides: list[tuple[str, Any]] | None = None,
    kind: str = "validate",
) -> ProfileSpec:
    """The profile's spec with the live run's levels and n_max, named after the run's kind
    (validate, tune, openloop); overrides come last, so a profile made with a stock server can be
    validated with --set server.binary=PATCHED."""
    data = dict(stored)
    data["name"] = f"{data['name']}-{kind}"
    workload = data.get("workload", {})
    # Live runs measure at the shallowest profiled depth: the one recommend decides at.
    depth = min(workload.get("context_tokens") or [0])
    data["workload"] = {**workload, "concurrency": levels, "context_tokens": [depth]}
    data["speculative"] = {**data.get("speculative", {}), "threshold": None}
    if n_max:
        data["speculative"]["n_max"] = n_max
    for key, value in overrides or []:
        set_dotted(data, key, value)
    _check_prompts(stored, data)
    try:
        return ProfileSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message("validation spec (--set)", exc)) from exc


def _check_prompts(stored: dict[str, Any], data: dict[str, Any]) -> None:
    """Live runs send the profile's prompts: the file must still be there and hold what the
    profile measured (its runs would not be fitted with the profile's otherwise); a prompts file
    given with --set is read and recorded afresh."""
    workload = data.get("workload") or {}
    if not workload.get("prompts"):
        return
    path, sha = prompt_file(workload["prompts"], Path.cwd(), "workload.prompts of the profile")
    before = stored.get("workload") or {}
    if str(path) == before.get("prompts") and before.get("prompts_sha256") not in (None, sha):
        raise ConfigError(
            f"workload.prompts: {path} changed since the profile measured it (sha256 "
            f"{before['prompts_sha256'][:12]} then, {sha[:12]} now); restore it or profile again"
        )
    data["workload"] = {**workload, "prompts": str(path), "prompts_sha256": sha}


def profile_spec_of(store: Store, model: str, host: str, launching: bool = True) -> dict[str, Any]:
    """The stored spec of the model's newest managed profile: the server set-up live runs use.
    launching: the caller starts servers from it, which a running server's spec (`tune --url`:
    no binary, its URLs) cannot give; its error names the command that measures there."""
    stored_spec = validations.latest_profile_spec(store, model, host)
    if stored_spec is None:
        raise NothingToDoError(
            f"model {model!r} has no managed profile run to take the server set-up from; "
            f"run `tuner profile SPEC` first"
        )
    server = stored_spec.get("server") or {}
    if launching and server.get("url"):
        origin = Origin(model, str(server["url"]), server.get("plain_url"))
        raise ConfigError(
            f"model {model!r} was measured on a running server the tuner does not start "
            f"({server['url']}): `{origin.measure()}` measures it there"
        )
    return stored_spec


def open_live_run(
    store: Store,
    spec: ProfileSpec,
    model: str,
    host: str,
    rec: Recommendation,
    kind: str,
    policies: list[Policy],
    log_dir: Path,
    observer: Observer = quiet,
    *,
    resume: bool = False,
    skip_preflight: bool = False,
    backend: Backend | None = None,
    switch: str = "auto",
    side_by_side: bool = False,
) -> Profiler:
    """The patched server checked, its policies preflighted, and the run (of kind validate or
    tune, noting the recommendation it checks) reopened when resuming or else created.

    backend: measure on it (the twin's) rather than on launches of the spec's server;
    side_by_side: keep plain's launch up beside the drafting launch (ServerBackend's)."""
    if backend is not None:
        return _open_on_backend(store, spec, model, host, rec, kind, log_dir, observer, backend)
    check_spec_files(spec, f"profile spec of {model}")
    build = probe_build(spec.server.binary)
    if not build.has_max_slots:
        raise ConfigError(
            f"{spec.server.binary} does not know --spec-draft-max-slots (not in its --help); "
            f"`tuner {kind}` needs the patched server: scripts/setup.sh builds one, "
            f"--set server.binary=PATH selects it"
        )
    if not skip_preflight:
        preflight(spec, policies, log_dir, observer)
    profiler = Profiler(store, spec, log_dir, observer, switch=switch, side_by_side=side_by_side)
    run_id = find_resumable_run(store, spec, kind=kind, host_name=host) if resume else None
    if run_id is not None:
        profiler.reopen_run(run_id)
        observer(ProgressEvent("message", text=f"resuming {kind} run {run_id}"))
    else:
        context = Context(
            model_name=model,
            build=build,
            model=probe_model(spec.server.model, StoredHashes(store, host)),
            host=probe_host(spec.server.binary, host),
        )
        validations.record_checked(store, profiler.create_run(context, kind=kind), rec)
    return profiler


def _open_on_backend(
    store: Store,
    spec: ProfileSpec,
    model: str,
    host: str,
    rec: Recommendation,
    kind: str,
    log_dir: Path,
    observer: Observer,
    backend: Backend,
) -> Profiler:
    """A live run measured on a given backend (the twin's): no binary to probe or preflight."""
    profiler = Profiler(store, spec, log_dir, observer, backend=backend)
    context = Context(model_name=model, model=None, build=None, host=probe_host(None, host))
    validations.record_checked(store, profiler.create_run(context, kind=kind), rec)
    return profiler


def checked(store: Store, model: str, host: str, max_slots: int | None) -> Recommendation:
    """The recommendation a validation checks: the one that stands, or N=max_slots where given
    (at the standing draft length)."""
    rec = advice.standing(store, model, host)
    if max_slots is not None:
        rec = replace(rec, policy=Policy.of_max_slots(max_slots, rec.n_max))
    return rec


def measure(
    store: Store,
    model: str,
    host: str,
    log_dir: Path,
    observer: Observer = quiet,
    *,
    resume: bool = False,
    max_slots: int | None = None,
    overrides: list[tuple[str, Any]] | None = None,
    skip_preflight: bool = False,
) -> tuple[int, Recommendation]:
    """Run the validation measurements; returns (run id, the recommendation checked)."""
    rec = checked(store, model, host, max_slots)
    stored_spec = profile_spec_of(store, model, host)
    profiled = ProfileSpec.model_validate(stored_spec)
    spec = validation_spec(
        stored_spec, validation_levels(profiled, rec.max_slots), rec.n_max, overrides
    )
    policies = candidates(rec.max_slots, spec.server.n_parallel)
    profiler = open_live_run(
        store,
        spec,
        model,
        host,
        rec,
        "validate",
        policies,
        log_dir,
        observer,
        resume=resume,
        skip_preflight=skip_preflight,
    )
    return profiler.execute(policies, kernel_level=False), rec


def analyse(
    store: Store, run_id: int, model: str, checked: Recommendation | None = None
) -> ValidationReport:
    """Grade a validation run against the fit the recommendation it checked came from."""
    rec = checked or validations.checked_recommendation(store, run_id)
    measured = validations.measured_policies(store, run_id)
    if not measured:
        raise NothingToDoError(f"validation run {run_id} has no completed levels")
    fit = current_fit(store, model, rec.host, fit_id=rec.fit_id).model
    weights = search.objective_weights(fit.n_parallel, validations.run_weights(store, run_id))
    by_level = {c: float(weights[c - 1]) for c in range(1, fit.n_parallel + 1)}
    return grade(run_id, model, rec.policy, measured, fit, by_level)


def validate(
    store: Store,
    model: str,
    host: str,
    log_dir: Path,
    observer: Observer = quiet,
    *,
    resume: bool = False,
    max_slots: int | None = None,
    overrides: list[tuple[str, Any]] | None = None,
    skip_preflight: bool = False,
) -> ValidationReport:
    """`tuner validate`: measure the recommendation and its neighbours, grade them, and name the
    recommendation that stands once their points are part of the fit."""
    run_id, rec = measure(
        store,
        model,
        host,
        log_dir,
        observer,
        resume=resume,
        max_slots=max_slots,
        overrides=overrides,
        skip_preflight=skip_preflight,
    )
    report = analyse(store, run_id, model, rec)
    try:
        report.standing = advice.standing(store, model, host, like=rec)
    except TunerError as exc:
        # What was measured and graded stays shown and stored; a few noisy points can leave no
        # step-cost form that fits them all, and that is no reason to fail the validation.
        report.refit_error = str(exc).splitlines()[0]
    return report
