"""The profile plan (configurations x levels x repeats): run it, store it, resume it.

For each configuration (plain: no drafting; spec: drafting always on; max-slots-N: the patched
server's threshold) a llama-server is launched, warmed up and driven through every concurrency
level. Each repeat's samples are committed as soon as it finishes, so a crash or Ctrl-C loses at
most the repeat in flight, and `resume` finishes only what is missing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
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
from tuner.measure.server import LaunchConfig, ManagedServer
from tuner.measure.spec import ProfileSpec, WorkloadSpec
from tuner.storage.engine import Store
from tuner.storage.hashes import StoredHashes
from tuner.storage.orm import Build, Host, KernelRow, Level, Model, Run, Sample, get_or_create

RUNNING, COMPLETED, FAILED, INTERRUPTED = "running", "completed", "failed", "interrupted"
EXIT_GRACE_S = 2.0  # how long a failing server may take to be seen exited before it counts as hung


# --- plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerConfig:
    """One way of running the server: plain, spec (always draft) or a max-slots threshold."""

    name: str
    drafting: bool
    max_slots: int | None = None  # passed as --spec-draft-max-slots when not None

    @classmethod
    def plain(cls) -> ServerConfig:
        return cls("plain", drafting=False)

    @classmethod
    def spec(cls) -> ServerConfig:
        return cls("spec", drafting=True)

    @classmethod
    def threshold(cls, n: int) -> ServerConfig:
        return cls(f"max-slots-{n}", drafting=True, max_slots=n)

    @property
    def stored_max_slots(self) -> int | None:
        """None for plain, 0 for always drafting, N for a threshold (how levels are keyed)."""
        if not self.drafting:
            return None
        return self.max_slots or 0


def profile_configs(spec: ProfileSpec) -> list[ServerConfig]:
    configs = [ServerConfig.plain(), ServerConfig.spec()]
    if spec.speculative.threshold:
        configs.append(ServerConfig.threshold(spec.speculative.threshold))
    return configs


def launch_config(spec: ProfileSpec, config: ServerConfig, port: int | None = None) -> LaunchConfig:
    args = list(spec.server.args)
    if config.drafting:
        args += [*spec.speculative.args, "--spec-draft-n-max", str(spec.speculative.n_max)]
    return LaunchConfig(
        binary=spec.server.binary,
        model=spec.server.model,
        n_parallel=spec.server.n_parallel,
        ctx_size=spec.server.ctx_size,
        threads=spec.server.threads,
        args=args,
        env=dict(spec.server.env),
        max_slots=config.max_slots,
        port=port if port is not None else spec.server.port,
    )


# --- progress --------------------------------------------------------------------------------


@dataclass
class ProgressEvent:
    """What the profiler is doing, for a progress display."""

    kind: str  # plan | server | repeat | level | kernel | message
    total: int = 0  # plan: repeats planned in all
    advance: int = 0  # repeats done by this event
    config: str = ""
    concurrency: int = 0
    repeat: int = 0
    figures: LevelFigures | None = None
    text: str = ""


Observer = Callable[[ProgressEvent], None]


def _quiet(_: ProgressEvent) -> None:
    pass


# --- statistics ------------------------------------------------------------------------------


def relative_mad(values: list[float]) -> float | None:
    """MAD / median: the spread measure that decides when a level has repeated enough."""
    if len(values) < 2:
        return None
    med = statistics.median(values)
    if med == 0:
        return None
    return statistics.median(abs(v - med) for v in values) / med


@dataclass
class LevelOutcome:
    """What run_level hands back: the level row's id and whether it finished."""

    level_id: int
    completed: bool
    error: str | None = None


# --- storage helpers -------------------------------------------------------------------------


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
    observer: Observer = _quiet
    api_key: str | None = None
    run_id: int | None = None
    _server_deaths: list[str] = field(default_factory=list)

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

    def _level_row(self, config: ServerConfig, concurrency: int) -> Level:
        """The level's row, created if new; a half-done level keeps its finished repeats."""
        with self.store.session() as session:
            level = session.scalars(
                select(Level).filter_by(
                    run_id=self.run_id, config=config.name, concurrency=concurrency
                )
            ).first()
            if level is None:
                level = Level(
                    run_id=self.run_id,
                    config=config.name,
                    max_slots=config.stored_max_slots,
                    n_max=self.spec.speculative.n_max,
                    concurrency=concurrency,
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

    def pending(self, configs: list[ServerConfig], levels: list[int]) -> dict[str, list[int]]:
        """Levels of each configuration that are not completed yet."""
        with self.store.session() as session:
            done = {
                (row.config, row.concurrency)
                for row in session.scalars(
                    select(Level).filter_by(run_id=self.run_id, status=COMPLETED)
                )
            }
        return {cfg.name: [c for c in levels if (cfg.name, c) not in done] for cfg in configs}

    def _store_repeat(
        self,
        level_id: int,
        repeat: int,
        samples: list[RequestSample],
        figures: LevelFigures,
        drafting: dict[str, Any],
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
            repeats = [
                *level.metrics.get("repeats", []),
                {"repeat": repeat, **_figures_dict(figures), "metrics": drafting},
            ]
            level.metrics = {**level.metrics, "repeats": repeats, **_pool_drafting(repeats)}
            level.repeats = len(repeats)
            _set_medians(level, repeats)

    def record_level(
        self,
        config: ServerConfig,
        concurrency: int,
        repeats: list[tuple[list[RequestSample], dict[str, Any]]],
    ) -> int:
        """Store a level measured elsewhere (replayed, simulated) through the same rows and
        commits as run_level: one transaction per repeat, then the level marked completed."""
        level = self._level_row(config, concurrency)
        done = list(level.metrics.get("repeats", []))
        first = max((r["repeat"] for r in done), default=-1) + 1
        for offset, (samples, drafting) in enumerate(repeats):
            figures = summarize(samples, concurrency)
            self._store_repeat(level.id, first + offset, samples, figures, drafting)
        with self.store.session() as session:
            session.get(Level, level.id).status = COMPLETED
        return level.id

    def _fail_level(self, level_id: int, error: str) -> None:
        with self.store.session() as session:
            level = session.get(Level, level_id)
            level.status, level.error = FAILED, error

    def run_level(
        self,
        server_url: str,
        config: ServerConfig,
        concurrency: int,
        server: ManagedServer | None = None,
    ) -> LevelOutcome:
        """Repeat a level until its step time is stable or the repeat limit; store every repeat."""
        workload = self.spec.workload
        level = self._level_row(config, concurrency)
        repeats = list(level.metrics.get("repeats", []))
        next_repeat = max((r["repeat"] for r in repeats), default=-1) + 1
        generator = LoadGenerator(server_url, self._workload(), api_key=self.api_key)
        headers = generator.headers
        done_before = len(repeats)
        while True:
            try:
                before = metrics.scrape(None, server_url, headers)
                samples = generator.run(concurrency)
                # When requests failed the server may be gone or hung: their errors say more
                # than a failed /metrics scrape would.
                failed = any(not s.ok for s in samples)
                after = before if failed else metrics.scrape(None, server_url, headers)
            except (ServerError, LoadError) as exc:
                error = self._explain_failure(server, config, concurrency, str(exc))
                self._fail_level(level.id, error)
                raise ServerError(error) from exc
            figures = summarize(samples, concurrency)
            drafting = metrics.drafting_summary(metrics.delta(before, after))
            self._store_repeat(level.id, next_repeat, samples, figures, drafting)
            if figures.failed:
                first = next(s.error for s in samples if not s.ok)
                error = self._explain_failure(
                    server,
                    config,
                    concurrency,
                    f"{figures.failed} of {concurrency} requests failed ({first})",
                )
                self._fail_level(level.id, error)
                raise LoadError(error)
            repeats.append({"repeat": next_repeat, **_figures_dict(figures)})
            self.observer(
                ProgressEvent(
                    "repeat",
                    advance=1,
                    config=config.name,
                    concurrency=concurrency,
                    repeat=next_repeat,
                    figures=figures,
                )
            )
            next_repeat += 1
            if len(repeats) >= workload.max_repeats:
                break
            if len(repeats) >= workload.min_repeats and _stable(repeats, workload):
                break
        with self.store.session() as session:
            row = session.get(Level, level.id)
            row.status = COMPLETED
        # The plan counted max_repeats for this level; account for the ones not needed.
        skipped = workload.max_repeats - (len(repeats) - done_before)
        self.observer(
            ProgressEvent(
                "level", advance=max(0, skipped), config=config.name, concurrency=concurrency
            )
        )
        return LevelOutcome(level.id, completed=True)

    def _explain_failure(
        self, server: ManagedServer | None, config: ServerConfig, concurrency: int, detail: str
    ) -> str:
        """Why a level failed: the server's exit named (signal, likely cause) when it died, a
        hang when it is still there. An attached server is not ours: its exit cannot be seen."""
        where = f"during {config.name} at concurrency {concurrency}"
        if server is None:
            return f"the server stopped answering {where}: {detail}"
        if server.exited_within(EXIT_GRACE_S):
            return str(server.died(where, detail))
        return f"{server.name} stopped answering {where}: {detail}"

    def _workload(self) -> Workload:
        w = self.spec.workload
        return Workload(
            prompt_tokens=w.prompt_tokens,
            max_tokens=w.max_tokens,
            stream=w.stream,
            request_timeout_s=w.request_timeout_s,
        )

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
            if server is not None and server.exited_within(EXIT_GRACE_S):
                raise server.died("during warm-up", detail)
            raise ServerError(detail)

    # -- managed mode --

    def run_config(self, config: ServerConfig, levels: list[int]) -> None:
        log = self.log_dir / f"run-{self.run_id}" / f"{config.name}.log"
        # A new log per launch: earlier launches of the same config (resume) stay readable.
        n = 1
        while log.exists():
            n += 1
            log = log.with_name(f"{config.name}.{n}.log")
        self.observer(
            ProgressEvent(
                "server",
                config=config.name,
                text=f"starting llama-server ({config.name}), log {log}",
            )
        )
        server = ManagedServer(
            launch_config(self.spec, config),
            log,
            start_timeout_s=self.spec.server.start_timeout_s,
            name=f"llama-server ({config.name})",
        )
        with server:
            props = server.props()
            self._check_props(props)
            self.warm_up(server.url, server)
            for concurrency in levels:
                self.run_level(server.url, config, concurrency, server)

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

    def execute(self, configs: list[ServerConfig], kernel_level: bool = True) -> int:
        """Run every pending level of every configuration; record the outcome; return the run id."""
        todo = self.pending(configs, self.spec.levels)
        total = sum(len(v) for v in todo.values()) * self.spec.workload.max_repeats
        self.observer(ProgressEvent("plan", total=total))

        def body() -> None:
            for config in configs:
                if todo[config.name]:
                    self.run_config(config, todo[config.name])
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


def _stable(repeats: list[dict[str, Any]], workload: WorkloadSpec) -> bool:
    """Step time within target_spread and tok/s within target_tps_spread (MAD/median).

    Step time is a property of the machine and settles fast; tok/s of a speculative level also
    carries the randomness of acceptance, so it may need a repeat more.
    """
    step = relative_mad([r["step_ms"] for r in repeats if r.get("step_ms")])
    tps = relative_mad([r["tokens_per_second"] for r in repeats if r.get("tokens_per_second")])
    return (step is not None and step <= workload.target_spread
            and tps is not None and tps <= workload.target_tps_spread)


def _set_medians(level: Level, repeats: list[dict[str, Any]]) -> None:
    def med(key: str) -> float | None:
        values = [r[key] for r in repeats if r.get(key) is not None]
        return statistics.median(values) if values else None

    level.tokens_per_second = med("tokens_per_second")
    level.per_stream_tps = med("per_stream_tps")
    level.step_ms = med("step_ms")
    level.accept_len = med("accept_len")
    level.ttft_ms = med("ttft_ms")
    level.tokens_per_second_spread = relative_mad(
        [r["tokens_per_second"] for r in repeats if r.get("tokens_per_second")]
    )
    level.step_ms_spread = relative_mad([r["step_ms"] for r in repeats if r.get("step_ms")])


def _pool_drafting(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """Acceptance pooled over repeats: per-position counts divided by the number of drafts."""
    drafts = sum(r["metrics"]["drafts"] for r in repeats if "metrics" in r)
    width = max(
        (len(r["metrics"]["accepted_per_position"]) for r in repeats if "metrics" in r), default=0
    )
    per_position = [
        sum(
            r["metrics"]["accepted_per_position"][i]
            for r in repeats
            if "metrics" in r and i < len(r["metrics"]["accepted_per_position"])
        )
        for i in range(width)
    ]
    return {
        "drafts": drafts,
        "draft_tokens": sum(r["metrics"]["draft_tokens"] for r in repeats if "metrics" in r),
        "accepted_tokens": sum(r["metrics"]["accepted_tokens"] for r in repeats if "metrics" in r),
        "accepted_per_position": per_position,
        "accept_rates": [p / drafts for p in per_position] if drafts else [],
        "n_decode": sum(r["metrics"]["n_decode"] for r in repeats if "metrics" in r),
    }


# --- preflight -------------------------------------------------------------------------------


def preflight(
    spec: ProfileSpec, configs: list[ServerConfig], log_dir: Path, observer: Observer = _quiet
) -> None:
    """Launch each configuration once and have it answer one short request, drafting on where it
    drafts, before a run spends minutes on it.

    A build that crashes on this machine (an illegal instruction in the first draft step, say)
    fails here within seconds, with its signal named, and no run is created.
    """
    folder = log_dir / "preflight" / f"{dt.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"
    timeout_s = min(60.0, spec.workload.request_timeout_s)
    for config in configs:
        started = time.monotonic()
        server = ManagedServer(
            launch_config(spec, config),
            folder / f"{config.name}.log",
            start_timeout_s=spec.server.start_timeout_s,
            name=f"llama-server ({config.name})",
        )
        with server:
            timings = server.answer_one(
                "at its preflight request (one short completion, before anything is measured)",
                timeout_s=timeout_s,
            )
        drafted = int(timings.get("draft_n") or 0)
        note = f", {drafted} draft tokens" if config.drafting else ""
        observer(
            ProgressEvent(
                "message",
                text=f"preflight: {config.name} answered in {time.monotonic() - started:.1f} s"
                + note,
            )
        )
        if config.drafting and drafted == 0:
            observer(
                ProgressEvent(
                    "message",
                    text=f"note: {config.name} drafted nothing in its preflight request; "
                    "check speculative.args if drafting was expected",
                )
            )


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
    observer: Observer = _quiet,
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
    configs = profile_configs(spec)
    if not skip_preflight:
        preflight(spec, configs, log_dir, observer)
    profiler = Profiler(store, spec, log_dir, observer)
    run_id = find_resumable_run(store, spec, host_name=context.host.name) if resume else None
    if run_id is not None:
        profiler.reopen_run(run_id)
        observer(ProgressEvent("message", text=f"resuming run {run_id}"))
    else:
        if resume:
            observer(ProgressEvent("message", text="no unfinished run of this spec: starting anew"))
        profiler.create_run(context)
    return profiler.execute(configs)


def attach(
    store: Store,
    url: str,
    label: str,
    model_name: str | None,
    spec: ProfileSpec | None,
    log_dir: Path,
    observer: Observer = _quiet,
    api_key: str | None = None,
    host_name: str | None = None,
    overrides: list[tuple[str, Any]] | None = None,
) -> int:
    """Measure one already-running server as it is configured (it cannot be restarted).

    Without a spec, overrides (`--set workload.max_tokens=32`, `--levels`) shape the workload.
    The API key is only ever sent as a bearer token: it is not part of the stored spec.
    """
    from pydantic import ValidationError

    from tuner.measure.spec import _format_error, set_dotted

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{url.rstrip('/')}/props", headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        raise ServerError(f"cannot reach {url}: {exc.__class__.__name__}: {exc}") from exc
    if response.status_code == 401:
        if api_key:
            raise ServerError(f"{url} rejected the API key (HTTP 401): check --api-key")
        raise ServerError(f"{url} wants an API key: pass --api-key or set TUNER_API_KEY")
    if response.status_code != 200:
        raise ServerError(f"GET {url}/props answered HTTP {response.status_code}")
    props = response.json()
    slots = int(props.get("total_slots") or 1)
    model_path = Path(props.get("model_path") or "unknown")
    name = model_name or (spec.model_name if spec else model_path.stem)
    data: dict[str, Any] = {
        "name": f"attach-{label}",
        "model_name": name,
        "server": {"binary": "(attached)", "model": str(model_path), "n_parallel": slots},
        "speculative": {"args": []},
        "kernel": {"enabled": False},
    }
    if spec is not None:
        data["workload"] = spec.workload.model_dump()
    for key, value in overrides or []:
        set_dotted(data, key, value)
    try:
        # A level above the server's slots is an error (all streams must generate together).
        attached = ProfileSpec.model_validate(data)
    except ValidationError as exc:
        source = f"attached server {url} ({slots} slots)"
        raise ConfigError("\n".join(_format_error(source, e) for e in exc.errors())) from exc
    context = Context(
        model_name=name,
        model=probe_model(model_path) if model_path.exists() else None,
        build=None,
        host=probe_host(None, host_name),
    )
    profiler = Profiler(store, attached, log_dir, observer, api_key=api_key)
    profiler.create_run(context, kind="profile", label=label)
    config = ServerConfig(label, drafting=False)
    levels = attached.levels
    observer(ProgressEvent("plan", total=len(levels) * attached.workload.max_repeats))

    def body() -> None:
        profiler.warm_up(url)
        for concurrency in levels:
            profiler.run_level(url, config, concurrency)

    return profiler.guarded(body)
