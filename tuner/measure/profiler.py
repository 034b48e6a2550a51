"""Where a level is measured: the profile plan (policies x levels x repeats), run and stored.

Each policy (plain: no drafting; always draft; threshold N: the patched server's
--spec-draft-max-slots) runs on its own llama-server launch. By default the policies are
interleaved: pass after pass, the policies take turns (A B, then B A, ...) and each measures
one repeat at every level still open, so a drift of the machine over the minutes of a profile
hits every policy alike and the repeats of one pass are paired neighbours. The policy that ends
a pass starts the next on the same launch (A, B B, A A, B): the order is kept, a launch saved.
Every other pass also walks its levels the other way (shallow to deep, then deep to shallow):
a level measured early in one pass is measured late in the next, for every policy alike, and a
pass that starts on a launch where the last one ended at its deepest depth finds that context
still cached.
A level closes, for all policies together, once each has min_repeats and a stable step time, or
max_repeats (`workload.interleave = false`: one launch per policy, repeating each level until it
is stable).
Each repeat's samples are committed as soon as it finishes, so a crash or Ctrl-C loses at most
the repeat in flight, and `resume` finishes only what is missing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select

from tuner.errors import (
    ConfigError,
    InterruptedRun,
    LoadError,
    ServerError,
    StorageError,
    TunerError,
)
from tuner.measure import kernel, metrics
from tuner.measure.fingerprint import (
    BuildInfo,
    HostInfo,
    ModelInfo,
    probe_build,
    probe_host,
    probe_model,
)
from tuner.measure.load import LevelFigures, LoadGenerator, RequestSample, Workload, summarize
from tuner.measure.plan import (
    Observer,
    ProgressEvent,
    Target,
    launch_config,
    profile_policies,
    quiet,
)
from tuner.measure.preflight import preflight
from tuner.measure.prompts import PromptSet, load_prompts
from tuner.measure.server import ManagedServer
from tuner.measure.spec import ProfileSpec
from tuner.measure.stats import depth_slowdown, level_medians, pool_drafting, stable
from tuner.policy import Policy
from tuner.storage.engine import Store
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

# max-slots-2@n3: N=2 drafting up to 3 tokens, in a run whose spec drafts up to another n_max
N_MAX_SUFFIX = "@n"
Cell = tuple[int, int]  # (context depth, concurrency): what one level row measures
EXIT_GRACE_S = 2.0  # how long a failing server may take to be seen exited before it counts as hung


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


def _figures_dict(figures: LevelFigures) -> dict[str, Any]:
    return asdict(figures)


# --- the run ---------------------------------------------------------------------------------


@dataclass
class Profiler:
    """Runs a plan of configurations x levels against llama-server and stores everything."""

    store: Store
    spec: ProfileSpec
    log_dir: Path
    observer: Observer = quiet
    api_key: str | None = None
    run_id: int | None = None
    _server_deaths: list[str] = field(default_factory=list)
    _prompt_set: PromptSet | None = None
    # The depth levels are measured at when a caller names concurrencies only (live runs,
    # attach): the spec's shallowest. A profile measures (depth, concurrency) cells.
    depth: int = field(init=False)

    def __post_init__(self) -> None:
        self.depth = self.spec.workload.context_tokens[0]

    @property
    def depths(self) -> list[int]:
        return list(self.spec.workload.context_tokens)

    # -- run lifecycle --

    def create_run(self, context: Context, kind: str = "profile", label: str | None = None) -> int:
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

    def _finish(self, status: str, error: str | None = None) -> None:
        with self.store.session() as session:
            run = session.get(Run, self.run_id)
            run.status, run.error = status, error
            run.finished_at = dt.datetime.now(dt.UTC)

    def _finish_best_effort(self, status: str, error: str) -> None:
        # If the database itself failed, the original error is what the user must see.
        with contextlib.suppress(StorageError):
            self._finish(status, error)

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

    def _level_row(self, config: Target, concurrency: int, depth: int | None = None) -> Level:
        """The level's row, created if new; a half-done level keeps its finished repeats."""
        name = self.level_name(config)
        depth = self.depth if depth is None else depth
        with self.store.session() as session:
            level = session.scalars(
                select(Level).filter_by(
                    run_id=self.run_id, config=name, concurrency=concurrency, context_tokens=depth
                )
            ).first()
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
                kept = [r["repeat"] for r in level.metrics.get("repeats", [])]
                # Samples of a repeat that never finished are not part of the level.
                session.execute(
                    delete(Sample).where(Sample.level_id == level.id, Sample.repeat.not_in(kept))
                )
                level.status, level.error = RUNNING, None
            session.flush()
            session.expunge(level)
        return level

    def pending(self, policies: list[Policy], levels: list[int]) -> dict[str, list[Cell]]:
        """(depth, concurrency) cells of each configuration that are not completed yet, at
        every depth of the spec."""
        with self.store.session() as session:
            done = {
                (row.config, row.context_tokens, row.concurrency)
                for row in session.scalars(
                    select(Level).filter_by(run_id=self.run_id, status=COMPLETED)
                )
            }
        cells = [(d, c) for d in self.depths for c in levels]
        return {
            self.level_name(p): [cell for cell in cells if (self.level_name(p), *cell) not in done]
            for p in policies
        }

    def _store_repeat(
        self,
        level_id: int,
        repeat: int,
        samples: list[RequestSample],
        figures: LevelFigures,
        drafting: dict[str, Any],
        pass_index: int | None = None,
    ) -> None:
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
            entry = {"repeat": repeat, **_figures_dict(figures), "metrics": drafting}
            if pass_index is not None:
                entry["pass"] = pass_index
            repeats = [*level.metrics.get("repeats", []), entry]
            level.metrics = {**level.metrics, "repeats": repeats, **pool_drafting(repeats)}
            level.repeats = len(repeats)
            for key, value in level_medians(repeats).items():
                setattr(level, key, value)

    def record_level(
        self,
        config: Target,
        concurrency: int,
        repeats: list[tuple[list[RequestSample], dict[str, Any]]],
        depth: int | None = None,
    ) -> int:
        """Store a level measured elsewhere (replayed, simulated) through the same rows and
        commits as run_level: one transaction per repeat, then the level marked completed."""
        level = self._level_row(config, concurrency, depth)
        done = list(level.metrics.get("repeats", []))
        first = max((r["repeat"] for r in done), default=-1) + 1
        for offset, (samples, drafting) in enumerate(repeats):
            figures = summarize(samples, concurrency)
            self._store_repeat(level.id, first + offset, samples, figures, drafting)
        with self.store.session() as session:
            session.get(Level, level.id).status = COMPLETED
        return level.id

    def prefill(
        self,
        server_url: str,
        config: Target,
        depth: int,
        streams: int,
        server: ManagedServer | None = None,
    ) -> None:
        """Every stream's padding at a depth brought into the server's cache outside any
        measurement (see LoadGenerator.prefill_async), so the levels there time decode only."""
        if depth <= 0:
            return
        generator = LoadGenerator(server_url, self.request_workload(depth), api_key=self.api_key)
        started = time.perf_counter()
        try:
            samples = generator.prefill(streams)
        except (ServerError, LoadError) as exc:
            raise ServerError(
                self._explain_failure(server, f"while prefilling depth {depth}", str(exc))
            ) from exc
        failed = [s for s in samples if not s.ok]
        if failed:
            detail = f"{len(failed)} of {streams} requests failed ({failed[0].error})"
            raise LoadError(
                self._explain_failure(server, f"while prefilling depth {depth}", detail)
            )
        self.observer(
            ProgressEvent(
                "message",
                text=f"{self.level_name(config)}: prefilled at depth {depth} for {streams} "
                f"streams in {time.perf_counter() - started:.1f} s (not measured; "
                f"{sum(s.prompt_tokens for s in samples)} tokens were not cached)",
            )
        )

    def _fail_level(self, level_id: int, error: str) -> None:
        with self.store.session() as session:
            level = session.get(Level, level_id)
            level.status, level.error = FAILED, error

    def run_level(
        self,
        server_url: str,
        config: Target,
        concurrency: int,
        server: ManagedServer | None = None,
        pass_index: int | None = None,
        depth: int | None = None,
    ) -> int:
        """Repeat a level until its step time is stable or the repeat limit; store every repeat.

        With pass_index (an interleaved pass): one repeat, tagged with the pass; the level stays
        open (closing it is the pass's decision, see `run_interleaved`). depth: the context
        depth (default: the profiler's)."""
        workload = self.spec.workload
        depth = self.depth if depth is None else depth
        level = self._level_row(config, concurrency, depth)
        repeats = list(level.metrics.get("repeats", []))
        next_repeat = max((r["repeat"] for r in repeats), default=-1) + 1
        scale = self.output_scale(config, depth, concurrency)
        generator = LoadGenerator(
            server_url, self.request_workload(depth, scale), api_key=self.api_key
        )
        headers = generator.headers
        done_before = len(repeats)
        where = f"during {self.level_name(config)} at concurrency {concurrency}" + (
            f", depth {depth}" if depth else ""
        )
        while True:
            try:
                before = metrics.scrape(None, server_url, headers)
                # The round's prompts: a pass's number, so every configuration of a pass gets the
                # same ones; else the repeat's.
                round_key = pass_index if pass_index is not None else next_repeat
                samples = generator.run(concurrency, round_key)
                # When requests failed the server may be gone or hung: their errors say more
                # than a failed /metrics scrape would.
                failed = any(not s.ok for s in samples)
                after = before if failed else metrics.scrape(None, server_url, headers)
            except (ServerError, LoadError) as exc:
                error = self._explain_failure(server, where, str(exc))
                self._fail_level(level.id, error)
                raise ServerError(error) from exc
            figures = summarize(samples, concurrency)
            drafting = metrics.drafting_summary(metrics.delta(before, after))
            self._store_repeat(level.id, next_repeat, samples, figures, drafting, pass_index)
            if figures.failed:
                first = next(s.error for s in samples if not s.ok)
                error = self._explain_failure(
                    server, where, f"{figures.failed} of {concurrency} requests failed ({first})"
                )
                self._fail_level(level.id, error)
                raise LoadError(error)
            repeats.append({"repeat": next_repeat, **_figures_dict(figures)})
            self.observer(
                ProgressEvent(
                    "repeat",
                    advance=1,
                    config=self.level_name(config),
                    concurrency=concurrency,
                    repeat=next_repeat,
                    figures=figures,
                    depth=depth,
                )
            )
            next_repeat += 1
            if pass_index is not None:
                return level.id
            if len(repeats) >= workload.max_repeats:
                break
            if len(repeats) >= workload.min_repeats and stable(repeats, workload):
                break
        with self.store.session() as session:
            row = session.get(Level, level.id)
            row.status = COMPLETED
        # The plan counted max_repeats for this level; account for the ones not needed.
        skipped = workload.max_repeats - (len(repeats) - done_before)
        self.observer(
            ProgressEvent(
                "level",
                advance=max(0, skipped),
                config=self.level_name(config),
                concurrency=concurrency,
            )
        )
        return level.id

    def _explain_failure(self, server: ManagedServer | None, where: str, detail: str) -> str:
        """Why a level or the warm-up failed: the server's exit named (signal, likely cause) when
        it died, a hang when it is still there. An attached server is not ours: its exit cannot
        be seen."""
        if server is None:
            return f"the server stopped answering {where}: {detail}"
        if server.exited_within(EXIT_GRACE_S):
            return str(server.died(where, detail))
        return f"{server.name} stopped answering {where}: {detail}"

    def request_workload(self, depth: int = 0, output_scale: float = 1.0) -> Workload:
        w = self.spec.workload
        if w.prompts is not None and self._prompt_set is None:
            self._prompt_set = load_prompts(w.prompts)
        return Workload(
            prompt_tokens=w.prompt_tokens,
            max_tokens=w.max_tokens,
            stream=w.stream,
            request_timeout_s=w.request_timeout_s,
            prompts=self._prompt_set,
            output=w.output.lengths(w.max_tokens),
            seed=w.seed,
            depth=depth,
            output_scale=output_scale,
            min_tokens=w.depth_min_tokens,
        )

    def output_scale(self, config: Target, depth: int, concurrency: int) -> float:
        """Equal time at depth: a deep cell's outputs shortened by how much slower its steps are
        than at the shallowest depth, as this run measured them so far (1 at the shallowest,
        with `depth_output = "full"`, or before any deep step of the configuration)."""
        shallow = self.depths[0]
        if depth == shallow or self.spec.workload.depth_output != "equal-time":
            return 1.0
        with self.store.session() as session:
            rows = session.scalars(
                select(Level).filter_by(run_id=self.run_id, config=self.level_name(config))
            ).all()
            steps = {(r.context_tokens, r.concurrency): r.step_ms for r in rows if r.step_ms}
        slowdown = depth_slowdown(steps, shallow, depth, concurrency)
        return 1.0 if slowdown is None or slowdown <= 1.0 else 1.0 / slowdown

    def warm_up(self, server_url: str, server: ManagedServer | None = None) -> None:
        if not self.spec.workload.warmup:
            return
        w = self.spec.workload
        warm = Workload(
            prompt_tokens=w.prompt_tokens,
            max_tokens=16,
            stream=False,
            request_timeout_s=w.request_timeout_s,
        )
        generator = LoadGenerator(server_url, warm, api_key=self.api_key)
        for _ in range(w.warmup):
            try:
                samples = generator.run(max(self.spec.levels))
                failure = None if any(s.ok for s in samples) else samples[0].error
            except (LoadError, ServerError) as exc:
                failure = str(exc)
            if failure is None:
                continue
            detail = f"warm-up requests failed: {failure}"
            raise ServerError(self._explain_failure(server, "during warm-up", detail))

    # -- managed mode --

    def run_config(
        self, policy: Policy, levels: Sequence[int | Cell], pass_index: int | None = None
    ) -> None:
        """Launch the policy's server and measure the levels on it (one repeat each in a pass):
        concurrencies at the profiler's depth, or (depth, concurrency) cells."""
        with self.launched(policy, pass_index) as server:
            self.measure_cells(server.url, policy, levels, pass_index, server)

    def measure_cells(
        self,
        server_url: str,
        config: Target,
        levels: Sequence[int | Cell],
        pass_index: int | None = None,
        server: ManagedServer | None = None,
    ) -> None:
        """Measure levels (one repeat each in a pass) on a running server of the config, each
        depth's padding prefilled before its first level."""
        cells = self._cells(levels)
        prefilled: set[int] = set()
        for depth, concurrency in cells:
            if depth not in prefilled:
                # The widest level's streams, again in every pass: the server may have dropped
                # a stream's context since (shorter prompts reuse and truncate it), and one
                # that is still cached costs a fraction of a second.
                widest = max(c for d, c in cells if d == depth)
                self.prefill(server_url, config, depth, widest, server)
                prefilled.add(depth)
            self.run_level(server_url, config, concurrency, server, pass_index, depth)

    @contextlib.contextmanager
    def launched(self, policy: Policy, pass_index: int | None = None) -> Iterator[ManagedServer]:
        """The policy's server, started, checked and warmed up; stopped on leaving."""
        name = self.level_name(policy)
        log = self.log_dir / f"run-{self.run_id}" / f"{name}.log"
        # A new log per launch: earlier launches of the same config (resume) stay readable.
        n = 1
        while log.exists():
            n += 1
            log = log.with_name(f"{name}.{n}.log")
        self.observer(
            ProgressEvent(
                "server",
                config=name,
                text=f"starting llama-server ({name})"
                + (f", pass {pass_index + 1}" if pass_index is not None else "")
                + f", log {log}",
            )
        )
        server = ManagedServer(
            launch_config(self.spec, policy),
            log,
            start_timeout_s=self.spec.server.start_timeout_s,
            name=f"llama-server ({name})",
        )
        with server:
            props = server.props()
            self._check_props(props)
            self.warm_up(server.url, server)
            yield server

    def _cells(self, levels: Sequence[int | Cell]) -> list[Cell]:
        return [(self.depth, c) if isinstance(c, int) else c for c in levels]

    # -- interleaved passes --

    def repeats_by_level(
        self, policies: list[Policy] | None = None
    ) -> dict[tuple[str, int], list[dict]]:
        """The stored repeats of the run's levels at the profiler's depth (of these policies),
        by (config, concurrency)."""
        return {
            (config, c): reps
            for (config, depth, c), reps in self.repeats_by_cell(policies).items()
            if depth == self.depth
        }

    def repeats_by_cell(
        self, policies: list[Policy] | None = None
    ) -> dict[tuple[str, int, int], list[dict]]:
        """The stored repeats of the run's levels (of these policies), by (config, depth,
        concurrency)."""
        names = {self.level_name(p) for p in policies} if policies is not None else None
        with self.store.session() as session:
            return {
                (row.config, row.context_tokens, row.concurrency): list(
                    (row.metrics or {}).get("repeats", [])
                )
                for row in session.scalars(select(Level).filter_by(run_id=self.run_id))
                if names is None or row.config in names
            }

    def last_pass(self) -> int | None:
        """The newest interleaved pass stored in the run (None: none yet)."""
        passes = [
            r["pass"] for reps in self.repeats_by_cell().values() for r in reps if "pass" in r
        ]
        return max(passes, default=None)

    def close_open_levels(self) -> None:
        """Mark every level of the run still open (measured in passes) as completed."""
        with self.store.session() as session:
            for row in session.scalars(select(Level).filter_by(run_id=self.run_id, status=RUNNING)):
                if row.repeats:
                    row.status, row.error = COMPLETED, None

    def _level_done(self, repeats: list[dict]) -> bool:
        w = self.spec.workload
        return len(repeats) >= w.max_repeats or (
            len(repeats) >= w.min_repeats and stable(repeats, w)
        )

    def _close_levels(self, policies: list[Policy], cell: Cell, left: int) -> None:
        depth, concurrency = cell
        names = {self.level_name(p) for p in policies}
        with self.store.session() as session:
            for row in session.scalars(
                select(Level).filter_by(
                    run_id=self.run_id, concurrency=concurrency, context_tokens=depth
                )
            ):
                if row.config in names:
                    row.status, row.error = COMPLETED, None
        for policy in policies:
            self.observer(
                ProgressEvent(
                    "level", advance=left, config=self.level_name(policy), concurrency=concurrency
                )
            )

    def run_interleaved(self, policies: list[Policy], cells: list[Cell]) -> None:
        """Passes over the policies in alternating order, one launch and one repeat per open
        (depth, concurrency) cell each; a cell closes for all policies at once (see the module
        docstring).

        A resumed run starts again at its newest pass: a policy that measured a cell in it
        already is not launched for that cell again."""
        w = self.spec.workload
        state = self.repeats_by_cell(policies)
        first = self.last_pass() or 0
        open_cells = list(cells)

        def reps_of(policy: Policy, cell: Cell) -> list[dict]:
            return state.get((self.level_name(policy), *cell), [])

        def needs(policy: Policy, cell: Cell, p: int) -> bool:
            reps = reps_of(policy, cell)
            return len(reps) < w.max_repeats and all(r.get("pass") != p for r in reps)

        # The policy that ends a pass starts the next one (A B, B A, ...): its server stays up
        # across the two, which keeps the order and saves a launch, its start-up and its
        # prefill of deep context. Every other turn is a fresh launch. Odd passes walk the
        # cells backwards, so the second pass on a launch starts at the depth the first ended
        # at (deep context a shallower request would truncate is still whole there).
        with contextlib.ExitStack() as held:
            up: tuple[Policy, ManagedServer] | None = None
            for p in range(first, first + w.max_repeats + 1):
                backward = p % 2 == 1
                order = list(reversed(policies)) if backward else policies
                walk = list(reversed(open_cells)) if backward else open_cells
                for policy in order:
                    todo = [cell for cell in walk if needs(policy, cell, p)]
                    if not todo:
                        continue
                    if up is not None and up[0] == policy:
                        self.observer(
                            ProgressEvent(
                                "server",
                                config=self.level_name(policy),
                                text=f"{up[1].name}: pass {p + 1} on the same launch",
                            )
                        )
                    else:
                        held.close()
                        up = (policy, held.enter_context(self.launched(policy, p)))
                    self.measure_cells(up[1].url, policy, todo, p, up[1])
                state = self.repeats_by_cell(policies)
                still_open = []
                for cell in open_cells:
                    runs = [reps_of(policy, cell) for policy in policies]
                    if all(self._level_done(reps) for reps in runs):
                        left = max(0, w.max_repeats - min(map(len, runs)))
                        self._close_levels(policies, cell, left)
                    else:
                        still_open.append(cell)
                open_cells = still_open
                if not open_cells:
                    return
        for cell in open_cells:  # cannot happen: max_repeats passes fill every cell
            self._close_levels(policies, cell, 0)

    def _check_props(self, props: dict[str, Any]) -> None:
        slots = props.get("total_slots")
        if slots is not None and slots < max(self.spec.levels):
            raise ConfigError(f"server has {slots} slots, fewer than level {max(self.spec.levels)}")

    def run_kernel(self) -> None:
        binary = self.spec.kernel_binary()
        if not self.spec.kernel.enabled:
            return
        if not binary.exists():
            self.observer(ProgressEvent("message", text=f"no {binary.name}: kernel level skipped"))
            return
        with self.store.session() as session:
            has_rows = session.scalars(select(KernelRow).filter_by(run_id=self.run_id)).first()
        if has_rows:
            return
        self.observer(ProgressEvent("kernel", text="kernel level: llama-batched-bench"))
        cmd = kernel.command(
            binary,
            self.spec.server.model,
            self.spec.server.n_parallel,
            self.spec.speculative.n_max,
            self.spec.server.ctx_size,
            self.spec.server.threads,
            self.spec.kernel.generation_tokens,
            self.spec.kernel.args,
        )
        points = kernel.run_batched_bench(cmd, self.log_dir / f"run-{self.run_id}" / "kernel.log")
        self.record_kernel(points)

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

    def execute(
        self, policies: list[Policy], kernel_level: bool = True, levels: list[int] | None = None
    ) -> int:
        """Run every pending level of every configuration (interleaved unless the spec says
        otherwise); record the outcome; return the run id."""
        todo = self.pending(policies, levels or self.spec.levels)
        open_cells = sorted({cell for pending in todo.values() for cell in pending})
        interleave = self.spec.workload.interleave and len(policies) > 1
        planned = len(policies) * len(open_cells) if interleave else sum(map(len, todo.values()))
        self.observer(ProgressEvent("plan", total=planned * self.spec.workload.max_repeats))

        def body() -> None:
            if interleave:
                if open_cells:
                    self.run_interleaved(policies, open_cells)
            else:
                for policy in policies:
                    if todo[self.level_name(policy)]:
                        self.run_config(policy, todo[self.level_name(policy)])
            if kernel_level:
                self.run_kernel()

        return self.guarded(body)

    def guarded(self, body: Callable[[], None]) -> int:
        """Run body; record the run as completed, failed or interrupted, and re-raise failures."""
        try:
            body()
        except KeyboardInterrupt:
            self._interrupt_levels()
            self._finish_best_effort(INTERRUPTED, "interrupted by the user")
            raise InterruptedRun(
                f"run {self.run_id} interrupted; completed repeats are kept. "
                f"Continue it with `tuner profile SPEC --resume`"
            ) from None
        except TunerError as exc:
            self._interrupt_levels()
            self._finish_best_effort(FAILED, str(exc))
            raise
        self._finish(COMPLETED)
        return self.run_id

    def _interrupt_levels(self) -> None:
        try:
            with self.store.session() as session:
                for level in session.scalars(
                    select(Level).filter_by(run_id=self.run_id, status=RUNNING)
                ):
                    level.status, level.error = FAILED, level.error or "interrupted"
        except StorageError:
            pass


# --- entry points ----------------------------------------------------------------------------


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


def profile(
    store: Store,
    spec: ProfileSpec,
    log_dir: Path,
    observer: Observer = quiet,
    resume: bool = False,
    host_name: str | None = None,
    skip_preflight: bool = False,
) -> int:
    """`tuner profile`: measure plain, spec (and a threshold) at every level; returns the run id."""
    context = gather_context(spec, host_name, store)
    if spec.speculative.threshold and not (context.build and context.build.has_max_slots):
        raise ConfigError(
            f"speculative.threshold needs a llama-server with --spec-draft-max-slots; "
            f"{spec.server.binary} does not list it in --help"
        )
    policies = profile_policies(spec)
    if not skip_preflight:
        preflight(spec, policies, log_dir, observer)
    profiler = Profiler(store, spec, log_dir, observer)
    run_id = find_resumable_run(store, spec, host_name=context.host.name) if resume else None
    if run_id is not None:
        profiler.reopen_run(run_id)
        observer(ProgressEvent("message", text=f"resuming run {run_id}"))
    else:
        if resume:
            observer(ProgressEvent("message", text="no unfinished run of this spec: starting anew"))
        profiler.create_run(context)
    return profiler.execute(policies)
