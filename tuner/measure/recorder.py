"""The run recorder: a run's rows in the database, written as its rounds finish.

A run (profile, validate, tune, openloop, attach) records who and what it measured (host,
build, model), how it switched between policies (`Run.way`), and per (configuration, depth,
concurrency) cell a level row whose repeats carry their pass, pair and round key (the key the
prompts, output lengths and request seeds were drawn from). Every repeat is committed as it
finishes, so a crash or Ctrl-C loses at most the round in flight, and a resumed run finds what
is missing. Nothing here launches or measures anything.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import delete, select

from tuner.errors import ConfigError, InterruptedRun, StorageError, TunerError
from tuner.measure import kernel
from tuner.measure.fingerprint import (
    BuildInfo,
    HostInfo,
    ModelInfo,
    probe_build,
    probe_host,
    probe_model,
)
from tuner.measure.load import LevelFigures, RequestSample, summarize
from tuner.measure.plan import Target
from tuner.measure.schedule import Cell, Step
from tuner.measure.spec import ProfileSpec
from tuner.measure.stats import level_medians, pool_drafting
from tuner.policy import Policy
from tuner.recommendation import Origin
from tuner.storage.hashes import StoredHashes
from tuner.storage.orm import (
    COMPLETED,
    FAILED,
    INTERRUPTED,
    RUNNING,
    Build,
    Host,
    KernelRow,
    Level,
    Model,
    Run,
    Sample,
    get_or_create,
)
from tuner.storage.store import Store

# max-slots-2@n3: N=2 drafting up to 3 tokens, in a run whose spec drafts up to another n_max
N_MAX_SUFFIX = "@n"


def rounds_stored(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """A level's stored rounds: the repeats its figures count, and the stalled ones kept apart."""
    return [*metrics.get("repeats", []), *metrics.get("stalled", [])]


def _set_repeats(level: Level, repeats: list[dict[str, Any]]) -> None:
    """The level's counted rounds, and what they make of it: pooled drafting, medians."""
    level.metrics = {**level.metrics, "repeats": repeats, **pool_drafting(repeats)}
    level.repeats = len(repeats)
    for key, value in level_medians(repeats).items():
        setattr(level, key, value)


@dataclass
class Context:
    """Who and what a run measures: fingerprints gathered before the first launch."""

    model_name: str
    model: ModelInfo | None
    build: BuildInfo | None
    host: HostInfo

    def rows(self, session) -> tuple[Model, Build | None, Host]:
        model = get_or_create(
            session, Model, {"name": self.model_name}, asdict(self.model) if self.model else None
        )
        build = None
        if self.build is not None:
            build = get_or_create(
                session,
                Build,
                {"binary_sha256": self.build.binary_sha256},
                {
                    "version_text": self.build.version_text,
                    "has_max_slots": self.build.has_max_slots,
                },
            )
        host_values = asdict(self.host)
        host_name = host_values.pop("name")
        host = get_or_create(session, Host, {"name": host_name}, host_values)
        return model, build, host


def gather_context(spec: ProfileSpec, host_name: str | None, store: Store | None = None) -> Context:
    """Host, build and model facts; with a store, the model's full hash is computed once."""
    host = probe_host(spec.server.binary, host_name)
    hashes = StoredHashes(store, host.name) if store is not None else None
    return Context(
        model_name=spec.model_name,
        model=probe_model(spec.server.model, hashes),
        build=probe_build(spec.server.binary),
        host=host,
    )


def find_resumable_run(
    store: Store, spec: ProfileSpec, kind: str = "profile", host_name: str | None = None
) -> int | None:
    """The newest unfinished run of this exact spec (running, failed or interrupted).

    With host_name, only that host's runs: in a fleet sharing one database, a box resumes its
    own measurements, never another box's.
    """
    with store.session() as session:
        query = (
            select(Run.id)
            .where(Run.spec_hash == spec.spec_hash(), Run.kind == kind, Run.status != COMPLETED)
            .order_by(Run.id.desc())
        )
        if host_name is not None:
            query = query.join(Host, Run.host_id == Host.id).where(Host.name == host_name)
        return session.scalars(query).first()


class RunRecorder:
    """Writes one run: its row, its level rows and their repeats, its kernel rows."""

    def __init__(self, store: Store, spec: ProfileSpec, run_id: int | None = None) -> None:
        self.store = store
        self.spec = spec
        self.run_id = run_id

    # -- the run --

    def create_run(
        self,
        context: Context,
        kind: str = "profile",
        label: str | None = None,
        way: str | None = None,
    ) -> int:
        with self.store.session() as session:
            model, build, host = context.rows(session)
            run = Run(
                kind=kind,
                source="measured",
                status=RUNNING,
                model=model,
                build=build,
                host=host,
                spec_name=self.spec.name,
                spec_hash=self.spec.spec_hash(),
                spec=self.spec.model_dump(mode="json"),
                label=label,
                n_parallel=self.spec.server.n_parallel,
                n_max=self.spec.speculative.n_max,
                way=way,
            )
            session.add(run)
            session.flush()
            self.run_id = run.id
        return self.run_id

    def reopen_run(self, run_id: int) -> None:
        with self.store.session() as session:
            run = session.get(Run, run_id)
            if run is None:
                raise ConfigError(f"run {run_id} does not exist")
            run.status, run.error, run.finished_at = RUNNING, None, None
        self.run_id = run_id

    def set_way(self, way: str) -> None:
        """How the run switches between policies, once the backend knows (a live switch that
        does not read back turns a run into a relaunching one)."""
        with self.store.session() as session:
            session.get(Run, self.run_id).way = way

    def finish(self, status: str, error: str | None = None) -> None:
        with self.store.session() as session:
            run = session.get(Run, self.run_id)
            run.status, run.error = status, error
            run.finished_at = dt.datetime.now(dt.UTC)

    def _finish_best_effort(self, status: str, error: str) -> None:
        # If the database itself failed, the original error is what the user must see.
        with contextlib.suppress(StorageError):
            self.finish(status, error)

    def guarded(self, body: Callable[[], None], resume_hint: str = "tuner profile SPEC") -> int:
        """Run body; record the run as completed, failed or interrupted, and re-raise failures.
        resume_hint: the command whose `--resume` continues the run; a run of a server the
        tuner did not start (`tune --url`) has none, and is measured further by running
        that tune again."""
        try:
            body()
        except KeyboardInterrupt:
            self.interrupt_levels()
            self._finish_best_effort(INTERRUPTED, "interrupted by the user")
            server = self.spec.server
            if server.url is not None:
                origin = Origin(self.spec.model_name, server.url, server.plain_url)
                again = f"Run `{origin.measure()}` again to go on: what was measured counts"
            else:
                again = f"Continue it with `{resume_hint} --resume`"
            raise InterruptedRun(
                f"run {self.run_id} interrupted; completed repeats are kept. {again}"
            ) from None
        except TunerError as exc:
            self.interrupt_levels()
            self._finish_best_effort(FAILED, str(exc))
            raise
        # A run that ends as it meant to keeps what it measured as data: levels measured in
        # pairs (tune's sweeps, validate's passes) never close one by one, and left running
        # they would count in no fit and show as unfinished in `tuner runs`.
        self.close_open_levels()
        self.finish(COMPLETED)
        assert self.run_id is not None
        return self.run_id

    # -- levels --

    def level_name(self, config: Target) -> str:
        """The name a configuration's levels and logs are stored under: its config name, and its
        draft length where that is not the spec's (live trials of several n_max in one run)."""
        name = config.config_name
        if (
            isinstance(config, Policy)
            and config.drafting
            and config.n_max not in (None, self.spec.speculative.n_max)
        ):
            name += f"{N_MAX_SUFFIX}{config.n_max}"
        return name

    def _level(self, session: Any, config: str, cell: Cell) -> Level | None:
        """The run's row of this config at this cell, if any."""
        depth, concurrency = cell
        return session.scalars(
            select(Level).filter_by(
                run_id=self.run_id, config=config, concurrency=concurrency, context_tokens=depth
            )
        ).first()

    def level_row(self, config: Target, cell: Cell) -> Level:
        """The cell's row, created if new; a half-done level keeps its finished repeats."""
        name = self.level_name(config)
        depth, concurrency = cell
        with self.store.session() as session:
            level = self._level(session, name, cell)
            if level is None:
                own_n_max = config.n_max if isinstance(config, Policy) else None
                level = Level(
                    run_id=self.run_id,
                    config=name,
                    max_slots=config.max_slots if isinstance(config, Policy) else None,
                    n_max=own_n_max or self.spec.speculative.n_max,
                    concurrency=concurrency,
                    context_tokens=depth,
                    status=RUNNING,
                    metrics={"repeats": []},
                )
                session.add(level)
            elif level.status != COMPLETED:
                kept = [r["repeat"] for r in rounds_stored(level.metrics)]
                # Samples of a repeat that never finished are not part of the level.
                session.execute(
                    delete(Sample).where(Sample.level_id == level.id, Sample.repeat.not_in(kept))
                )
                level.status, level.error = RUNNING, None
            session.flush()
            session.expunge(level)
        return level

    def pending(self, configs: list[Target], cells: list[Cell]) -> dict[str, list[Cell]]:
        """The cells of each configuration that are not completed yet."""
        with self.store.session() as session:
            done = {
                (row.config, row.context_tokens, row.concurrency)
                for row in session.scalars(
                    select(Level).filter_by(run_id=self.run_id, status=COMPLETED)
                )
            }
        return {
            self.level_name(p): [cell for cell in cells if (self.level_name(p), *cell) not in done]
            for p in configs
        }

    def store_repeat(
        self,
        level_id: int,
        repeat: int,
        samples: list[RequestSample],
        figures: LevelFigures,
        drafting: dict[str, Any],
        step: Step | None = None,
        extra: dict[str, Any] | None = None,
        stalled: bool = False,
    ) -> None:
        """One round's samples and figures, in one transaction. A round of a schedule carries
        its pass, pair and round key (the bootstrap's and the paired statistics' keys). A
        stalled round (the machine stood still or crawled: Profiler._stall) is kept apart,
        under the level's "stalled": its samples are stored, but no figure of the level counts
        it."""
        with self.store.session() as session:
            for s in samples:
                session.add(
                    Sample(
                        level_id=level_id,
                        repeat=repeat,
                        stream=s.stream,
                        ok=s.ok,
                        error=s.error,
                        tokens=s.tokens,
                        prompt_tokens=s.prompt_tokens,
                        generation_ms=s.generation_ms,
                        ttft_ms=s.ttft_ms,
                        latency_ms=s.latency_ms,
                        draft_n=s.draft_n,
                        draft_accepted=s.draft_accepted,
                        steps=s.steps,
                    )
                )
            if figures.failed:
                return
            level = session.get(Level, level_id)
            entry: dict[str, Any] = {"repeat": repeat, **asdict(figures), "metrics": drafting}
            if step is not None:
                entry.update(
                    {"pass": step.pass_index, "pair": step.pair, "round_key": step.round_key}
                )
            entry.update(extra or {})
            if stalled:
                kept = [*level.metrics.get("stalled", []), entry]
                level.metrics = {**level.metrics, "stalled": kept}
                return
            _set_repeats(level, [*level.metrics.get("repeats", []), entry])

    def set_aside(self, config: str, cell: Cell, round_key: int, why: str) -> bool:
        """Move a stored round (by config, cell and round key) from the level's repeats to its
        stalled rounds, with why; False where there is no such round."""
        with self.store.session() as session:
            level = self._level(session, config, cell)
            if level is None:
                return False
            repeats = list(level.metrics.get("repeats", []))
            moved = [r for r in repeats if r.get("round_key") == round_key]
            if not moved:
                return False
            # set_aside: measured and counted as done in a plan, unlike a round measured again
            aside = [{**r, "stall": why, "set_aside": True} for r in moved]
            stalled = [*level.metrics.get("stalled", []), *aside]
            level.metrics = {**level.metrics, "stalled": stalled}
            _set_repeats(level, [r for r in repeats if r.get("round_key") != round_key])
        return True

    def next_repeat(self, level: Level) -> int:
        """The repeat number of the level's next round: after every stored one, stalled or
        not (their samples share the level's rows)."""
        return max((r["repeat"] for r in rounds_stored(level.metrics)), default=-1) + 1

    def record_level(
        self,
        config: Target,
        concurrency: int,
        repeats: list[tuple[list[RequestSample], dict[str, Any]]],
        depth: int = 0,
    ) -> int:
        """Store a level measured elsewhere (replayed, simulated) through the same rows and
        commits as a measured one: one transaction per repeat, then the level completed."""
        level = self.level_row(config, (depth, concurrency))
        done = list(level.metrics.get("repeats", []))
        first = max((r["repeat"] for r in done), default=-1) + 1
        for offset, (samples, drafting) in enumerate(repeats):
            figures = summarize(samples, concurrency)
            self.store_repeat(level.id, first + offset, samples, figures, drafting)
        with self.store.session() as session:
            session.get(Level, level.id).status = COMPLETED
        return level.id

    def fail_level(self, level_id: int, error: str) -> None:
        with self.store.session() as session:
            level = session.get(Level, level_id)
            level.status, level.error = FAILED, error

    def complete_level(self, level_id: int) -> None:
        with self.store.session() as session:
            session.get(Level, level_id).status = COMPLETED

    def repeats_by_cell(
        self, configs: list[Target] | None = None, which: str = "repeats", cell: Cell | None = None
    ) -> dict[tuple[str, int, int], list[dict]]:
        """The stored repeats of the run's levels (of these configurations; at this cell), by
        (config, depth, concurrency); which="stalled": the stalled rounds kept apart instead."""
        names = {self.level_name(p) for p in configs} if configs is not None else None
        query = select(Level).filter_by(run_id=self.run_id)
        if cell is not None:
            query = query.filter_by(context_tokens=cell[0], concurrency=cell[1])
        with self.store.session() as session:
            return {
                (row.config, row.context_tokens, row.concurrency): list(
                    (row.metrics or {}).get(which, [])
                )
                for row in session.scalars(query)
                if names is None or row.config in names
            }

    def last_pass(self) -> int | None:
        """The newest pass stored in the run (None: none yet)."""
        passes = [
            r["pass"] for reps in self.repeats_by_cell().values() for r in reps if "pass" in r
        ]
        return max(passes, default=None)

    def next_pass(self) -> int:
        """The index of the run's next pass: after its own newest; for a run with none yet,
        after the newest pass of every other run of its model. A pass's index makes its round
        keys, and a round key fixes a round's requests and seeds (draw_request): a tune that
        started again at pass 0 would send the profile's requests again and count the same
        acceptance draws as new pairs."""
        last = self.last_pass()
        if last is not None:
            return last + 1
        with self.store.session() as session:
            run = session.get(Run, self.run_id)
            if run is None:
                return 0
            others = session.scalars(
                select(Level.metrics)
                .join(Run, Level.run_id == Run.id)
                .where(Run.model_id == run.model_id, Run.id != run.id)
            )
            passes = [r["pass"] for m in others for r in rounds_stored(m or {}) if "pass" in r]
        return max(passes, default=-1) + 1

    def close_levels(self, configs: list[Target], cell: Cell) -> None:
        """Mark the cell's levels of these configurations completed."""
        depth, concurrency = cell
        names = {self.level_name(p) for p in configs}
        with self.store.session() as session:
            for row in session.scalars(
                select(Level).filter_by(
                    run_id=self.run_id, concurrency=concurrency, context_tokens=depth
                )
            ):
                if row.config in names:
                    row.status, row.error = COMPLETED, None

    def close_open_levels(self) -> None:
        """Mark every level of the run still open (measured in passes) as completed."""
        with self.store.session() as session:
            for row in session.scalars(select(Level).filter_by(run_id=self.run_id, status=RUNNING)):
                if row.repeats:
                    row.status, row.error = COMPLETED, None

    def interrupt_levels(self) -> None:
        try:
            with self.store.session() as session:
                for level in session.scalars(
                    select(Level).filter_by(run_id=self.run_id, status=RUNNING)
                ):
                    level.status, level.error = FAILED, level.error or "interrupted"
        except StorageError:
            pass

    def depth_steps(self, config: Target) -> dict[Cell, float]:
        """The configuration's median step time per cell so far (equal time at depth)."""
        with self.store.session() as session:
            rows = session.scalars(
                select(Level).filter_by(run_id=self.run_id, config=self.level_name(config))
            ).all()
            return {(r.context_tokens, r.concurrency): r.step_ms for r in rows if r.step_ms}

    # -- kernel rows --

    def has_kernel_rows(self) -> bool:
        with self.store.session() as session:
            return (
                session.scalars(select(KernelRow).filter_by(run_id=self.run_id)).first() is not None
            )

    def record_kernel(self, points: list[kernel.KernelPoint]) -> None:
        """Store llama-batched-bench rows with the run, in one transaction."""
        with self.store.session() as session:
            for p in points:
                session.add(
                    KernelRow(
                        run_id=self.run_id,
                        shape=p.shape,
                        n_seq=p.n_seq,
                        tokens_per_seq=p.tokens_per_seq,
                        rows=p.rows,
                        step_ms=p.step_ms,
                    )
                )
