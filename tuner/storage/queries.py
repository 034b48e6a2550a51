"""Reading results back: runs, their level tables, and the measured points of a model.

Everything a command shows or a fit consumes comes through here, as plain dataclasses, so the
callers never hold an ORM session.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuner.errors import NotFoundError
from tuner.policy import Policy
from tuner.storage.orm import Host, Level, Model, RecommendationRow, Run, Sample
from tuner.storage.store import Store


@dataclass(frozen=True)
class RunSummary:
    id: int
    kind: str
    source: str
    status: str
    model: str
    host: str | None
    spec_name: str
    label: str | None
    started_at: dt.datetime
    finished_at: dt.datetime | None
    levels_done: int
    levels_total: int
    samples: int
    error: str | None
    comparisons: tuple[int, int] | None = None  # a tune: (resolved, all) comparisons

    def progress(self) -> str:
        """What `tuner runs` shows of how far the run got."""
        if self.kind == "tune":
            if self.comparisons is None:
                return "no answer stored"
            resolved, total = self.comparisons
            return f"{resolved}/{total} comparisons resolved"
        return f"{self.levels_done}/{self.levels_total} levels"


@dataclass(frozen=True)
class LevelPoint:
    """One measured (configuration, concurrency) point."""

    run_id: int
    config: str  # Policy.config_name, or an attached server's label
    policy: Policy | None  # None: an attached server, measured as configured
    n_max: int | None
    concurrency: int
    status: str
    repeats: int
    tokens_per_second: float | None
    tokens_per_second_spread: float | None
    per_stream_tps: float | None
    step_ms: float | None
    step_ms_spread: float | None
    accept_len: float | None
    ttft_ms: float | None
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    context_tokens: int = 0


def _point(level: Level) -> LevelPoint:
    return LevelPoint(
        context_tokens=level.context_tokens,
        run_id=level.run_id,
        config=level.config,
        policy=level.policy,
        n_max=level.n_max,
        concurrency=level.concurrency,
        status=level.status,
        repeats=level.repeats,
        tokens_per_second=level.tokens_per_second,
        tokens_per_second_spread=level.tokens_per_second_spread,
        per_stream_tps=level.per_stream_tps,
        step_ms=level.step_ms,
        step_ms_spread=level.step_ms_spread,
        accept_len=level.accept_len,
        ttft_ms=level.ttft_ms,
        metrics=dict(level.metrics or {}),
        error=level.error,
    )


def _summary(session: Session, run: Run) -> RunSummary:
    samples = (
        session.scalar(select(func.count(Sample.id)).join(Level).where(Level.run_id == run.id)) or 0
    )
    return RunSummary(
        id=run.id,
        kind=run.kind,
        source=run.source,
        status=run.status,
        model=run.model.name,
        host=run.host.name if run.host else None,
        spec_name=run.spec_name,
        label=run.label,
        started_at=run.started_at,
        finished_at=run.finished_at,
        levels_done=sum(1 for level in run.levels if level.status == "completed"),
        levels_total=len(run.levels),
        samples=samples,
        error=run.error,
        comparisons=_tune_comparisons(session, run) if run.kind == "tune" else None,
    )


def _tune_comparisons(session: Session, run: Run) -> tuple[int, int] | None:
    """A tune's comparisons (resolved, all) from the answer it stored: its levels are pairs of
    rounds, never closed one by one, so a count of closed levels says nothing of it. None where
    it stored no answer (stopped before its first assessment)."""
    row = session.scalars(
        select(RecommendationRow)
        .where(RecommendationRow.study_name == f"tuner:live:run{run.id}")
        .order_by(RecommendationRow.id.desc())
    ).first()
    if row is None:
        return None
    comparisons = (row.details.get("tune") or {}).get("comparisons") or []
    # decide/paired.py's verdicts: ahead, behind, within tolerance, unresolved
    resolved = sum(1 for c in comparisons if c.get("verdict") not in (None, "unresolved"))
    return resolved, len(comparisons)


def list_runs(store: Store, model: str | None = None, limit: int = 50) -> list[RunSummary]:
    with store.session() as session:
        query = select(Run).order_by(Run.id.desc()).limit(limit)
        if model:
            query = query.join(Model).where(Model.name == model)
        return [_summary(session, run) for run in session.scalars(query)]


def run_points(store: Store, run_id: int) -> tuple[RunSummary, list[LevelPoint]]:
    with store.session() as session:
        run = session.get(Run, run_id)
        if run is None:
            raise NotFoundError(f"run {run_id} does not exist; `tuner runs` lists them")
        return _summary(session, run), [_point(level) for level in run.levels]


def model_points(
    store: Store,
    model: str,
    host: str | None = None,
    kinds: tuple[str, ...] = ("profile", "import", "validate", "sweep"),
) -> list[LevelPoint]:
    """Every completed level of a model (optionally on one host), oldest run first."""
    with store.session() as session:
        if session.scalars(select(Model).where(Model.name == model)).first() is None:
            raise NotFoundError(f"no model named {model!r}; `tuner runs` lists what is stored")
        query = (
            select(Level)
            .join(Run)
            .join(Model)
            .where(Model.name == model, Level.status == "completed", Run.kind.in_(kinds))
            .order_by(Run.id, Level.id)
        )
        if host is not None:
            query = query.join(Host, Run.host_id == Host.id).where(Host.name == host)
        return [_point(level) for level in session.scalars(query)]


@dataclass(frozen=True)
class HostSummary:
    """A machine of the fleet as the database knows it: what it is and what it measured."""

    name: str
    cpu_model: str | None
    cpu_cores: int | None
    memory_bytes: int | None
    devices: list[str]
    runs: int
    completed_runs: int
    models: list[str]
    last_run_at: dt.datetime | None


def list_hosts(store: Store, model: str | None = None) -> list[HostSummary]:
    """Every host with a run (optionally of one model), by name, with its models and run counts."""
    with store.session() as session:
        query = select(Run.host_id, Run.status, Run.started_at, Model.name).join(Model)
        if model:
            query = query.where(Model.name == model)
        per_host: dict[int | None, list[tuple[str, dt.datetime, str]]] = {}
        for host_id, status, started_at, model_name in session.execute(query):
            per_host.setdefault(host_id, []).append((status, started_at, model_name))
        hosts = {h.id: h for h in session.scalars(select(Host))}
        summaries = []
        for host in hosts.values():
            rows = per_host.get(host.id, [])
            if model and not rows:
                continue
            summaries.append(
                HostSummary(
                    name=host.name,
                    cpu_model=host.cpu_model,
                    cpu_cores=host.cpu_cores,
                    memory_bytes=host.memory_bytes,
                    devices=list(host.devices or []),
                    runs=len(rows),
                    completed_runs=sum(1 for status, _, _ in rows if status == "completed"),
                    models=sorted({name for _, _, name in rows}),
                    last_run_at=max((started for _, started, _ in rows), default=None),
                )
            )
        return sorted(summaries, key=lambda h: h.name)


def paired_rounds(
    store: Store,
    model: str,
    host: str,
    depth: int,
    n_max: int,
    workload: dict[str, Any],
    kinds: tuple[str, ...] = ("profile", "validate", "tune"),
) -> dict[tuple[int, str, int], list[dict[str, Any]]]:
    """The stored rounds of every measured run of the model on host that measured like this one
    (the same draft length, output length and prompts), at one depth: by (run id, config,
    concurrency), each round with its round key. Rounds of one run pair by their round key, never
    across runs (tuner.decide.tune.live_gains)."""
    same = ("max_tokens", "prompts", "prompts_sha256", "output", "prompt_tokens")
    out: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    with store.session() as session:
        runs = session.scalars(
            select(Run)
            .join(Model)
            .join(Host, Run.host_id == Host.id)
            .where(Model.name == model, Host.name == host, Run.kind.in_(kinds))
            .where(Run.source == "measured", Run.label.is_(None))
        ).all()
        for run in runs:
            spec = run.spec or {}
            if (run.n_max or (spec.get("speculative") or {}).get("n_max")) != n_max:
                continue
            theirs = spec.get("workload") or {}
            if any(theirs.get(k) != workload.get(k) for k in same):
                continue
            for level in run.levels:
                if level.context_tokens == depth:
                    reps = list((level.metrics or {}).get("repeats", []))
                    out[(run.id, level.config, level.concurrency)] = reps
    return out
