"""A model's data and fits as stored: which levels a fit uses (one host, build, -np and n_max),
fitting them (tuner.model) and keeping the fit with its inputs, version and quality, so the same
data is fitted once, also across the processes of a fleet."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner.errors import ConfigError, NotFoundError, NothingToDoError
from tuner.jsonout import finite
from tuner.model import fitting
from tuner.model.arrivals import ProbeRecord, TtftRound
from tuner.model.costmodel import VERSION, CostModel, Crossover
from tuner.model.data import FitData, KernelObs, LevelObs, Repeat
from tuner.model.quality import FitQuality
from tuner.storage.orm import Build, Fit, KernelRow, Level, Model, Run
from tuner.storage.probes import probe_records, run_probe_levels, ttft_rounds
from tuner.storage.store import Store

PROFILE_HINT = (
    "run `tuner tune --url URL` on a running server, or `tuner profile SPEC.toml` (or `tuner dev "
    "import FILE.toml` for a table measured elsewhere)"
)


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
    workload: str | None = None  # what the requests were: the synthetic prompt or a prompt file
    context_tokens: int = 0  # the context depth of the levels fitted
    depths: list[int] = field(default_factory=lambda: [0])  # every depth the runs measured
    # levels whose figure rests on rounds others disturbed (busy machine, others' requests):
    # "config@c" each; the answer made from them says it is not settled
    disturbed: list[str] = field(default_factory=list)

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
            "workload": self.workload,
            "context_tokens": self.context_tokens,
            "depths": self.depths,
            "disturbed": self.disturbed,
        }


def _complete(run: Run) -> bool:
    """Whether a run has completed always-draft levels and a non-drafting regime, the two a
    fit needs: plain, or (a running server tuned without a plain server) the off arm, the
    drafting server at a threshold that does not draft at the level."""
    levels = [
        (lv.policy, lv.concurrency) for lv in run.levels if lv.status == "completed" and lv.policy
    ]
    plain_or_off = any(p.is_plain or (p.is_threshold and not p.drafts_at(c)) for p, c in levels)
    return plain_or_off and any(p.is_always for p, _ in levels)


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


def disturbed(r: dict[str, Any]) -> bool:
    """A round that others disturbed and that was kept as measured after its tries (the
    profiler marks it: `busy`, other programs competed for the machine; `foreign`, others'
    requests shared the server)."""
    return bool(r.get("busy") or r.get("foreign"))


def _repeats(level: Level) -> tuple[tuple[Repeat, ...], int]:
    """A level's counted repeats as a fit reads them, and how many of those are disturbed: a
    disturbed round is left out where the level has an undisturbed one, else the level rests
    on disturbed rounds alone (counted, and said in the answer's reasons)."""
    stored = (level.metrics or {}).get("repeats", [])
    clean = [r for r in stored if not disturbed(r)]
    return _as_repeats(level, clean or stored), 0 if clean else len(stored)


def _as_repeats(level: Level, stored: list[dict[str, Any]]) -> tuple[Repeat, ...]:
    out = []
    for r in stored:
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
                int(r["pass"]) if r.get("pass") is not None else None,
                int(r.get("pair") or 0),
            )
        )
    if not out and level.tokens_per_second:
        out.append(Repeat(float(level.tokens_per_second), level.accept_len, level.step_ms))
    return tuple(out)


def workload_of(spec: dict[str, Any]) -> str | None:
    """The requests a run sent, in words: its prompt set and its output lengths."""
    workload = spec.get("workload")
    if not workload:
        return None
    output = (workload.get("output") or {}).get("distribution", "fixed")
    length = f"{workload.get('max_tokens')} tokens out" if output == "fixed" else f"{output} output"
    return f"{prompt_set_label(workload)}, {length}"


def prompt_set_label(workload: dict[str, Any]) -> str:
    """A stored workload's prompt set in words: its file (and hash) or the synthetic prompt."""
    if workload.get("prompts"):
        name = Path(workload["prompts"]).name
        return f"prompts {name} ({str(workload.get('prompts_sha256'))[:8]})"
    return f"synthetic prompt of {workload.get('prompt_tokens')} tokens"


def prompt_set_of(run: Run) -> str | None:
    """The content hash of the prompt file a run measured with (None: the synthetic prompt)."""
    return ((run.spec or {}).get("workload") or {}).get("prompts_sha256")


def select_data(
    store: Store,
    model: str,
    host: str | None,
    host_explicit: bool = False,
    context: int | None = None,
) -> tuple[FitData, Selection]:
    """The fit's data: the newest complete run's host, build, -np and n_max, and runs like it,
    at one context depth (context; default the shallowest measured).

    host is the one asked about (the CLI passes this machine's name); without its own data the
    newest host's is used, with a note, unless host_explicit.
    """
    with store.session() as session:
        model_row, every_run, runs = _runs_of(session, model)
        chosen_host, note = _resolve_host(runs, model, host, host_explicit)
        basis, group = _group(runs, every_run, chosen_host)
        depths = sorted(
            {lv.context_tokens for run in group for lv in run.levels if lv.status == "completed"}
        ) or [0]
        depth = depths[0] if context is None else context
        if depth not in depths:
            raise NothingToDoError(
                f"model {model!r} has no levels measured at a context depth of {depth} tokens "
                f"(measured: {', '.join(map(str, depths))}); profile it there with "
                f"--set 'workload.context_tokens=[{depth}]'"
            )
        levels, level_ids, digest_rows, measured, spoilt = _levels(group, depth, basis.n_max)
        run_ids = [run.id for run in group]
        rounds, probes, probe_ids = _arrival_data(session, group, set(level_ids))
        digest_rows.append(["probes", probe_ids])
        kernel = [
            KernelObs(row.n_seq, row.tokens_per_seq, row.step_ms)
            for row in session.scalars(
                # the draft model's rows are the twin's (tuner.twin.from_run), not the target's
                select(KernelRow).where(KernelRow.run_id.in_(run_ids), KernelRow.shape != "draft")
            )
        ]
        spec = basis.spec or {}
        weights = (spec.get("workload") or {}).get("weights")
        accept_rates = spec.get("accept_rates") if basis.source == "imported" else None
        accept_len = spec.get("accept_len") if basis.source == "imported" else None
        n_parallel = int(basis.n_parallel or max(lv.concurrency for lv in levels))
        n_max = int(basis.n_max or 1)
        digest = hashlib.sha256(
            json.dumps([VERSION, digest_rows, len(kernel), n_parallel, n_max], default=str).encode()
        ).hexdigest()
        selection = Selection(
            model=model,
            model_id=model_row.id,
            host=chosen_host,
            host_id=basis.host_id,
            build_id=basis.build_id,
            build=_build_of(session, basis),
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
            workload=workload_of(spec),
            context_tokens=depth,
            depths=depths,
            disturbed=spoilt,
        )
    data = FitData(
        n_parallel=n_parallel,
        n_max=n_max,
        levels=tuple(levels),
        kernel=tuple(kernel),
        accept_rates=tuple(accept_rates) if accept_rates else None,
        accept_len=float(accept_len) if accept_len else None,
        ttft_rounds=tuple(rounds),
        probes=tuple(probes),
    )
    return data, selection


def _arrival_data(
    session: Session, group: list[Run], level_ids: set[int]
) -> tuple[list[TtftRound], list[ProbeRecord], list[int]]:
    """What arrivals cost: the fitted levels' rounds' time to first token, the group's probe
    records and the probe levels' ids (the data's hash includes them)."""
    rounds = ttft_rounds(session, [lv for run in group for lv in run.levels if lv.id in level_ids])
    probe_levels = [lv for run in group for lv in run_probe_levels(run)]
    probes = [r for lv in probe_levels for r in probe_records(lv)]
    return rounds, probes, [lv.id for lv in probe_levels]


def _runs_of(session: Session, model: str) -> tuple[Model, list[Run], list[Run]]:
    """The model's row, its runs newest first, and those complete enough to fit."""
    model_row = session.scalars(select(Model).where(Model.name == model)).first()
    if model_row is None:
        known = ", ".join(session.scalars(select(Model.name).order_by(Model.name))) or "none"
        raise NothingToDoError(
            f"no data for model {model!r} (models with data: {known}); {PROFILE_HINT}"
        )
    every_run = list(
        session.scalars(select(Run).where(Run.model_id == model_row.id).order_by(Run.id.desc()))
    )
    runs = [run for run in every_run if _complete(run)]
    if not runs:
        raise NothingToDoError(
            f"model {model!r} has no completed plain and spec levels to fit; {PROFILE_HINT}"
        )
    return model_row, every_run, runs


def _group(runs: list[Run], every_run: list[Run], chosen_host: str) -> tuple[Run, list[Run]]:
    """The run that sets the build, -np, n_max and prompt set, and the runs like it on the
    host, oldest first."""
    runs = [run for run in runs if _host_label(run) == chosen_host]
    # The newest profile or import sets the build, -np, n_max and prompt set; validations
    # and sweeps like it add their levels, and so do finished live trials (which measure no
    # plain). Another prompt set drafts differently, so its runs are not mixed in.
    basis = next((run for run in runs if run.kind in ("profile", "import")), runs[0])
    key = (basis.build_id, basis.n_parallel, basis.n_max, prompt_set_of(basis))
    trials = [run for run in every_run if run.kind == "tune" and run.status == "completed"]
    group = sorted(
        (
            run
            for run in {*runs, *trials}
            if _host_label(run) == chosen_host
            and (run.build_id, run.n_parallel, run.n_max, prompt_set_of(run)) == key
        ),
        key=lambda run: run.id,
    )
    return basis, group


def _levels(
    group: list[Run], depth: int, n_max: int | None
) -> tuple[list[LevelObs], list[int], list[Any], dict[str, set[int]], list[str]]:
    """The completed levels of the group at the depth (drafting ones at the basis's n_max):
    as observations, their ids, the rows the data's hash is of, the levels per config, and
    those resting on disturbed rounds alone ("config@c")."""
    levels: list[LevelObs] = []
    level_ids: list[int] = []
    digest_rows: list[Any] = []
    measured: dict[str, set[int]] = {}
    disturbed_levels: list[str] = []
    for run in group:
        for level in run.levels:
            policy = level.policy
            if level.status != "completed" or policy is None or level.context_tokens != depth:
                continue
            if policy.drafting and level.n_max not in (None, n_max):
                continue
            reps, spoilt = _repeats(level)
            if not reps:
                continue
            if spoilt:
                disturbed_levels.append(f"{level.config}@{level.concurrency}")
            levels.append(LevelObs(policy, level.concurrency, reps, level.id, run.id))
            level_ids.append(level.id)
            row = [level.id, level.repeats, level.tokens_per_second]
            digest_rows.append([*row, spoilt] if spoilt else row)
            measured.setdefault(level.config, set()).add(level.concurrency)
    return levels, level_ids, digest_rows, measured, disturbed_levels


def _build_of(session: Session, basis: Run) -> str | None:
    """The build's binary hash (an import's as its spec names it)."""
    if basis.build_id is not None:
        build_row = session.get(Build, basis.build_id)
        return build_row.binary_sha256 if build_row else None
    if basis.source == "imported":
        return (basis.spec or {}).get("build") or None
    return None


# --- fits -----------------------------------------------------------------------------------


@dataclass
class StoredFit:
    """A fit as stored: its id, model, quality report and the inputs it was made from."""

    id: int
    model: CostModel
    quality: FitQuality
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

    def as_dict(self) -> dict[str, Any]:
        """What `tuner dev fit --format json` prints."""
        return {
            "fit_id": self.id,
            "reused": self.reused,
            "version": self.model.version,
            "form": self.model.form,
            "inputs": self.inputs,
            "quality": self.quality.as_dict(),
            "crossover": self.model.crossover().to_dict(),
            "n_values": self.model.n_values(),
            "host_note": self.host_note,
        }


def _fit_data(data: FitData, selection: Selection, seed: int, replicates: int):
    try:
        return fitting.fit(data, seed=seed, replicates=replicates)
    except ValueError as exc:
        raise NothingToDoError(
            f"cannot fit {selection.model}: {exc}; {_refit_hint(selection)}"
        ) from exc


def _refit_hint(selection: Selection) -> str:
    """What to do where no fit was made: where levels rest on disturbed rounds alone (a busy
    machine, others' requests), measuring the same way again on a quiet one, not another way."""
    if not selection.disturbed:
        return PROFILE_HINT
    shown = ", ".join(selection.disturbed[:4]) + (", ..." if len(selection.disturbed) > 4 else "")
    return (
        f"{len(selection.disturbed)} of its levels ({shown}) rest on rounds that other programs "
        "or others' requests disturbed: stop them, or give the server a machine of its own, and "
        "measure again"
    )


def _stored(row: Fit, reused: bool, note: str | None) -> StoredFit:
    return StoredFit(
        row.id,
        CostModel.from_dict(row.params),
        FitQuality.from_dict(row.quality),
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
    replicates: int = fitting.DEFAULT_REPLICATES,
    context: int | None = None,
) -> StoredFit:
    """`tuner dev fit`: fit the model's data (at one context depth) anew and store the fit."""
    data, selection = select_data(store, model, host, host_explicit, context)
    return _save_fit(store, data, selection, seed, replicates)


def _equal_fit(session, selection: Selection, seed: int, replicates: int) -> Fit | None:
    """The newest stored fit of exactly this data, seed and bootstrap size, if any."""
    for row in session.scalars(
        select(Fit)
        .where(Fit.model_id == selection.model_id, Fit.version == VERSION)
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
            version=VERSION,
            form=result.model.form,
            params=finite(result.model.to_dict()),
            inputs=finite(inputs),
            quality=finite(result.quality.as_dict()),
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
    replicates: int = fitting.DEFAULT_REPLICATES,
    context: int | None = None,
) -> StoredFit:
    """A given fit, else the newest fit of exactly the current data (at the context depth),
    else a new fit (stored)."""
    if fit_id is not None:
        with store.session() as session:
            row = session.get(Fit, fit_id)
            if row is None:
                raise NotFoundError(
                    f"fit {fit_id} does not exist; `tuner dev fit --model NAME` makes one"
                )
            if row.model.name != model:
                raise ConfigError(f"fit {fit_id} is of model {row.model.name!r}, not {model!r}")
            return _stored(row, True, None)
    data, selection = select_data(store, model, host, host_explicit, context)
    with store.session() as session:
        if existing := _equal_fit(session, selection, seed, replicates):
            return _stored(existing, True, selection.host_note)
    return _save_fit(store, data, selection, seed, replicates, reuse_equal=True)


def crossovers_by_depth(
    store: Store,
    model: str,
    host: str | None = None,
    *,
    host_explicit: bool = False,
    seed: int = 0,
) -> dict[int, Crossover]:
    """The crossover at every context depth the model's runs measured (each depth's own fit,
    made or reused): how the answer moves with depth. Empty when only one depth was measured."""
    _, selection = select_data(store, model, host, host_explicit)
    if len(selection.depths) < 2:
        return {}
    return {
        depth: current_fit(
            store, model, host, host_explicit=host_explicit, seed=seed, context=depth
        ).model.crossover()
        for depth in selection.depths
    }


def acceptance_by_prompt_set(store: Store, model: str) -> dict[str, float]:
    """Tokens per stream per step of always-draft levels, median per prompt set the model's
    runs measured (named as `tuner dev fit` names the workload): how acceptance follows the
    text. Empty when only one prompt set was measured."""
    by_set: dict[str, list[float]] = {}
    with store.session() as session:
        runs = session.scalars(select(Run).join(Model).where(Model.name == model)).all()
        for run in runs:
            workload = (run.spec or {}).get("workload")
            if not workload:
                continue
            name = prompt_set_label(workload)
            for level in run.levels:
                policy = level.policy
                if level.status == "completed" and policy and policy.is_always and level.accept_len:
                    by_set.setdefault(name, []).append(float(level.accept_len))
    if len(by_set) < 2:
        return {}
    return {name: float(np.median(values)) for name, values in sorted(by_set.items())}


def fit_build(store: Store, fit_id: int) -> str | None:
    """The build a fit's data were measured on, in one line: its version line and the binary's
    sha256 prefix (the version line alone does not tell two builds apart); None where the fit
    names none (an imported table)."""
    with store.session() as session:
        row = session.get(Fit, fit_id)
        build = row.build if row is not None else None
        if build is None:
            return None
        version = " ".join(build.version_text.split()) or "version unknown"
        return f"{version} (sha256 {build.binary_sha256[:12]})"
