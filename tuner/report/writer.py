"""Writing `tuner report`: read what the report shows from the database (the current fit, the
recommendation that stands -- made and stored here when there is none --, the points, the facts,
the validation), then write report.png, report.svg and summary.md into one folder and nowhere
else, each through a temporary file, so there is never a half-written report."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from tuner.decide import advice, openloop, validate
from tuner.decide.regret import ValidationReport
from tuner.errors import ConfigError, NothingToDoError, TunerError
from tuner.model.costmodel import Crossover
from tuner.recommendation import Recommendation
from tuner.report import tables
from tuner.report.dimensions import Dimensions
from tuner.report.figure import PNG_NAME, SVG_NAME, render_figure, save_figure
from tuner.report.series import report_data
from tuner.report.summary import Facts, RunFact, render_summary
from tuner.storage import validations
from tuner.storage.fits import (
    StoredFit,
    acceptance_by_prompt_set,
    crossovers_by_depth,
    current_fit,
)
from tuner.storage.orm import Fit, Run
from tuner.storage.queries import LevelPoint, model_points, run_points
from tuner.storage.store import Store

SUMMARY_NAME = "summary.md"
DEFAULT_OUT = Path("tuner-report")


@dataclass
class ReportInputs:
    """What load_inputs read: the fit, the recommendation, the points, facts and validation."""

    fit: StoredFit
    recommendation: Recommendation
    points: list[LevelPoint]
    validation_runs: list[int]
    facts: Facts
    validation: ValidationReport | None = None
    validation_problem: str | None = None
    crossover_by_depth: dict[int, Crossover] = field(default_factory=dict)
    acceptance_by_prompt_set: dict[str, float] = field(default_factory=dict)
    dimensions: Dimensions = field(default_factory=Dimensions)


def _facts(store: Store, fit_id: int, run_ids: Sequence[int]) -> Facts:
    with store.session() as session:
        fit = session.get(Fit, fit_id)
        assert fit is not None
        host = fit.host
        build = fit.build
        model = fit.model
        runs = list(session.scalars(select(Run).where(Run.id.in_(run_ids)).order_by(Run.id)))
        imported: dict[str, str] = {}
        for run in reversed(runs):  # the newest imported table's texts
            if run.source == "imported":
                spec = run.spec or {}
                for key in ("model", "host", "build", "source", "notes"):
                    if spec.get(key) and key not in imported:
                        imported[key] = str(spec[key])
        return Facts(
            host=(
                {
                    "name": host.name,
                    "cpu_model": host.cpu_model,
                    "cpu_cores": host.cpu_cores,
                    "memory_bytes": host.memory_bytes,
                    "devices": [str(d) for d in host.devices or []],
                }
                if host
                else None
            ),
            build=(
                {
                    "binary_sha256": build.binary_sha256,
                    "version_text": build.version_text,
                    "has_max_slots": build.has_max_slots,
                }
                if build
                else None
            ),
            model={
                "name": model.name,
                "file_size": model.file_size,
                "file_sha256": model.file_sha256,
                "architecture": model.architecture,
                "quantization": model.quantization,
            },
            runs=[
                RunFact(
                    run.id,
                    run.kind,
                    run.source,
                    run.status,
                    run.spec_name,
                    run.label,
                    run.started_at,
                    sum(1 for lv in run.levels if lv.status == "completed"),
                )
                for run in runs
            ],
            imported=imported,
        )


def _validation(
    store: Store, model: str, host: str | None
) -> tuple[int | None, ValidationReport | None, str | None]:
    """The newest validation run of the model on the fit's host, its grading, or why none."""
    run_id = validations.latest_validation(store, model, host)
    if run_id is None:
        elsewhere = validations.latest_validation(store, model) if host is not None else None
        if elsewhere is None:
            return None, None, None
        other = run_points(store, elsewhere)[0].host or "an unnamed host"
        return (
            None,
            None,
            (
                f"no validation on {host} yet (the newest, run {elsewhere}, is from {other}); "
                f"run `tuner validate --model {model}` there"
            ),
        )
    try:
        return run_id, validate.analyse(store, run_id, model), None
    except TunerError as exc:
        return run_id, None, f"validation run {run_id} could not be analysed: {exc}"


def load_inputs(
    store: Store,
    model: str,
    host: str | None,
    *,
    host_explicit: bool = False,
    seed: int = 0,
) -> ReportInputs:
    """Read (and where missing, make) everything the report shows, from the database."""
    fit = current_fit(store, model, host, host_explicit=host_explicit, seed=seed)
    fit_host = fit.inputs.get("host")
    rec = advice.standing(store, model, host, host_explicit=host_explicit, seed=seed)
    val_run, validation, problem = _validation(store, model, fit_host)
    if validation is not None:
        # Its points are part of the current fit: what stands after it is what the report shows.
        validation.standing = rec
    run_ids = set(int(r) for r in fit.inputs.get("runs") or [])
    if val_run is not None:
        run_ids.add(val_run)
    depth = fit.inputs.get("context_tokens") or 0
    points = [
        p for p in model_points(store, model) if p.run_id in run_ids and p.context_tokens == depth
    ]
    with store.session() as session:
        validation_runs = sorted(
            session.scalars(select(Run.id).where(Run.id.in_(run_ids), Run.kind == "validate"))
        )
    if not points:
        raise NothingToDoError(
            f"model {model!r} has no completed levels to report; run `tuner profile SPEC.toml`"
        )
    facts = _facts(store, fit.id, sorted(run_ids))
    by_depth = crossovers_by_depth(store, model, host, host_explicit=host_explicit, seed=seed)
    by_prompts = acceptance_by_prompt_set(store, model)
    open_run = validations.latest_validation(store, model, fit_host, kind="openloop")
    dims = Dimensions(
        by_depth,
        by_prompts,
        open_run,
        openloop.stored_results(store, open_run) if open_run is not None else {},
    )
    return ReportInputs(
        fit, rec, points, validation_runs, facts, validation, problem, by_depth, by_prompts, dims
    )


# --- writing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportFiles:
    """The files write_report wrote (all inside out_dir)."""

    out_dir: Path
    png: Path
    svg: Path
    summary: Path
    recommendation: Recommendation
    host_note: str | None = None

    @property
    def paths(self) -> list[Path]:
        return [self.png, self.svg, self.summary]


def _prepare_dir(out_dir: Path) -> Path:
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir}: exists and is not a folder")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out_dir}: cannot create the folder: {exc}") from exc
    return out_dir


def _replace_into(out_dir: Path, name: str, write: Any) -> Path:
    """Write through a temporary file in out_dir, then rename: no half-written report."""
    target = out_dir / name
    tmp = out_dir / f".{name}.{os.getpid()}.tmp"
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def write_report(
    store: Store,
    model: str,
    out_dir: Path = DEFAULT_OUT,
    host: str | None = None,
    *,
    host_explicit: bool = False,
    seed: int = 0,
) -> ReportFiles:
    """`tuner report`: report.png, report.svg and summary.md in out_dir (created if needed).

    Everything is read and computed before out_dir is touched, so a model without data writes
    nothing (NothingToDoError, naming `tuner profile`).
    """
    inputs = load_inputs(store, model, host, host_explicit=host_explicit, seed=seed)
    fit = inputs.fit
    data = report_data(
        model,
        fit.inputs.get("host"),
        fit.id,
        fit.model,
        inputs.recommendation,
        inputs.points,
        inputs.validation_runs,
    )
    text = render_summary(
        data,
        inputs.facts,
        fit.quality,
        {
            **fit.inputs,
            "crossover_by_depth": {
                d: tables.crossover_text(x) for d, x in inputs.crossover_by_depth.items()
            },
            "acceptance_by_prompt_set": inputs.acceptance_by_prompt_set,
        },
        inputs.validation,
        inputs.validation_problem,
        fit.host_note,
        dims=inputs.dimensions,
    )
    fig = render_figure(data, inputs.dimensions)
    out = _prepare_dir(out_dir)
    png = _replace_into(out, PNG_NAME, lambda p: save_figure(fig, p, "png"))
    svg = _replace_into(out, SVG_NAME, lambda p: save_figure(fig, p, "svg"))
    summary = _replace_into(out, SUMMARY_NAME, lambda p: p.write_text(text, encoding="utf-8"))
    return ReportFiles(out, png, svg, summary, inputs.recommendation, fit.host_note)
