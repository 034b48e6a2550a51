"""Soak: two profile workers (two hosts of a fleet) writing one database at once.

Each worker is its own process, with its own engine, started together on a fresh database (so the
migrations race too). For a bounded time each one records complete profile runs of the same model
(plain and spec, every level, several repeats, one sample per stream) through the profiler's own
storage path (`Profiler.create_run`, `Profiler.record_level`, `Profiler.guarded`: one transaction
per repeat, exactly as a live `tuner profile` commits). No llama-server is involved: the point is
the database under concurrent writers, not the measurements.

With --live each worker instead runs real `tuner profile profiles/bench-smollm2-cpu.toml`
commands against the bench (short generations, a fixed repeat count, no kernel level), one
after another until the time is up; a worker's expected samples are, per profile that exited 0,
configs x sum of levels x repeats. Slower (two llama-servers share the cores), but end to end.

At the end it counts what the database holds and prints samples written, samples expected (from
the workers' own tallies) and duplicates, which must be 0. Exit status 1 when anything is lost or
duplicated.

    .venv/bin/python benchmarks/soak_two_workers.py [--seconds 30] [--db URL] [--live] [--json]

Without --db it uses SQLite (WAL) in a temporary folder; pass a postgresql+psycopg:// URL (e.g.
from `scripts/postgres.sh start`) to soak PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common import tuner_cmd, tuner_env
from record import Table, record_arguments, save_run
from sqlalchemy import func, select

from tuner.measure.fingerprint import HostInfo
from tuner.measure.load import RequestSample
from tuner.measure.metrics import drafting_summary
from tuner.measure.profiler import Context, Profiler
from tuner.measure.spec import ProfileSpec
from tuner.policy import Policy
from tuner.storage.orm import Level, Model, Run, Sample
from tuner.storage.store import Store

# Each soak stores under its own model name, so old soak data in the same database (a
# fleet's real one, or an earlier soak) does not enter its counts.
MODEL_PREFIX = "soak-model"
REPO = Path(__file__).resolve().parent.parent
LIVE_SPEC = REPO / "profiles" / "bench-smollm2-cpu.toml"
LIVE_CONFIGS = 2  # plain and spec


@dataclass
class WorkerTally:
    """What one worker wrote, by its own count."""

    host: str
    runs: int = 0
    levels: int = 0
    samples: int = 0
    seconds: float = 0.0
    error: str | None = None


def soak_spec(model: str, levels: list[int], repeats: int) -> ProfileSpec:
    return ProfileSpec.model_validate(
        {
            "name": "soak",
            "model_name": model,
            "server": {
                "binary": "/soak/llama-server",
                "model": "/soak/model.gguf",
                "n_parallel": 8,
            },
            "speculative": {"args": [], "n_max": 3},
            "workload": {
                "concurrency": levels,
                "min_repeats": repeats,
                "max_repeats": repeats,
            },
            "kernel": {"enabled": False},
        }
    )


def fake_repeat(
    rng: random.Random, concurrency: int, drafting: bool
) -> tuple[list[RequestSample], dict[str, Any]]:
    """One repeat's samples and /metrics summary, shaped like a real one."""
    samples = []
    drafts = accepted = 0
    for stream in range(concurrency):
        tokens = 64
        accepted_here = rng.randint(20, 40) if drafting else 0
        drafts_here = (tokens - accepted_here) if drafting else 0
        samples.append(
            RequestSample(
                stream=stream,
                ok=True,
                tokens=tokens,
                prompt_tokens=32,
                generation_ms=rng.uniform(800, 1200) * (1 + concurrency / 8),
                latency_ms=rng.uniform(900, 1300),
                draft_n=drafts_here * 3,
                draft_accepted=accepted_here,
            )
        )
        drafts += drafts_here
        accepted += accepted_here
    counters = {
        "spec_decode_num_drafts_total": float(drafts),
        "spec_decode_num_draft_tokens_total": float(drafts * 3),
        "spec_decode_num_accepted_tokens_total": float(accepted),
        "n_decode_total": float(64 * concurrency),
        "tokens_predicted_total": float(64 * concurrency),
    }
    return samples, drafting_summary(counters)


def _report(tally: WorkerTally, started: float, out) -> None:
    """Send a worker's tally to the parent through its pipe."""
    tally.seconds = time.monotonic() - started
    out.send(asdict(tally))
    out.close()


def worker(
    index: int, db_url: str, model: str, seconds: float, levels: list[int], repeats: int, out
) -> None:
    """Record complete runs until the time is up; report the tally through the pipe."""
    tally = WorkerTally(host=f"soak-host-{index}")
    started = time.monotonic()
    try:
        store = Store(db_url)  # the two workers migrate a fresh database at the same moment
        spec = soak_spec(model, levels, repeats)
        rng = random.Random(index)
        context = Context(
            model_name=model,
            model=None,
            build=None,
            host=HostInfo(name=tally.host, cpu_model="soak", cpu_cores=2, memory_bytes=None),
        )
        configs = [Policy.plain(), Policy.always()]
        while time.monotonic() - started < seconds:
            profiler = Profiler(store, spec, Path(tempfile.gettempdir()))
            profiler.create_run(context)
            written = {"levels": 0, "samples": 0}

            def body(profiler: Profiler = profiler, written: dict[str, int] = written) -> None:
                for config in configs:
                    for c in spec.levels:
                        profiler.record_level(
                            config,
                            c,
                            [fake_repeat(rng, c, config.drafting) for _ in range(repeats)],
                        )
                        written["levels"] += 1
                        written["samples"] += c * repeats

            profiler.guarded(body)  # marks the run completed, as a live profile does
            tally.runs += 1
            tally.levels += written["levels"]
            tally.samples += written["samples"]
        store.dispose()
    except Exception as exc:  # reported, and counted as a failure by the parent
        tally.error = f"{exc.__class__.__name__}: {exc}"
    _report(tally, started, out)


@dataclass
class SoakResult:
    """What the database holds after the soak, against what the workers wrote."""

    db: str
    seconds: float
    workers: list[dict[str, Any]]
    runs_written: int
    runs_expected: int
    levels_written: int
    levels_expected: int
    samples_written: int
    samples_expected: int
    duplicates: int
    models: int
    hosts: int

    @property
    def ok(self) -> bool:
        return (
            self.duplicates == 0
            and self.samples_written == self.samples_expected
            and self.levels_written == self.levels_expected
            and self.runs_written == self.runs_expected
            and self.models == 1
            and self.hosts == len(self.workers)
            and not any(w["error"] for w in self.workers)
        )


def count(db_url: str, model: str, tallies: list[dict[str, Any]], seconds: float) -> SoakResult:
    store = Store(db_url)
    with store.session() as session:
        soak_runs = select(Run.id).join(Model).where(Model.name == model)
        runs = session.scalar(
            select(func.count())
            .select_from(Run)
            .where(Run.id.in_(soak_runs), Run.status == "completed")
        )
        levels = session.scalar(
            select(func.count())
            .select_from(Level)
            .where(Level.run_id.in_(soak_runs), Level.status == "completed")
        )
        samples = session.scalar(
            select(func.count()).select_from(Sample).join(Level).where(Level.run_id.in_(soak_runs))
        )
        duplicate_groups = (
            select(Sample.level_id)
            .group_by(Sample.level_id, Sample.repeat, Sample.stream)
            .having(func.count() > 1)
        ).subquery()
        duplicates = session.scalar(select(func.count()).select_from(duplicate_groups))
        models = session.scalar(select(func.count()).select_from(Model).where(Model.name == model))
        hosts = session.scalar(
            select(func.count(func.distinct(Run.host_id))).where(Run.id.in_(soak_runs))
        )
    store.dispose()
    return SoakResult(
        db=store.url if "@" not in store.url else store.url.split("@")[-1],
        seconds=seconds,
        workers=tallies,
        runs_written=runs or 0,
        runs_expected=sum(t["runs"] for t in tallies),
        levels_written=levels or 0,
        levels_expected=sum(t["levels"] for t in tallies),
        samples_written=samples or 0,
        samples_expected=sum(t["samples"] for t in tallies),
        duplicates=duplicates or 0,
        models=models or 0,
        hosts=hosts or 0,
    )


def live_worker(
    index: int, db_url: str, model: str, seconds: float, levels: list[int], repeats: int, out
) -> None:
    """Run real `tuner profile` commands on the bench until the time is up; report the tally."""
    tally = WorkerTally(host=f"soak-host-{index}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"tuner-soak-{index}-") as cache:
        # logs in a cache per worker; the bench stays where it is
        env = tuner_env(db_url, Path(cache), TUNER_HOST_NAME=tally.host)
        command = tuner_cmd(
            "profile",
            str(LIVE_SPEC),
            "--levels",
            ",".join(map(str, levels)),
            # One thread per server: two servers of two threads on 2 cores spin-wait on
            # each other for minutes.
            "--model-name",
            model,
            "--set",
            "kernel.enabled=false",
            "--set",
            "server.threads=1",
            "--set",
            "workload.max_tokens=32",
            "--set",
            "workload.warmup=0",
            "--set",
            f"workload.min_repeats={repeats}",
            "--set",
            f"workload.max_repeats={repeats}",
        )
        while time.monotonic() - started < seconds:
            result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                tally.error = (result.stderr.strip().splitlines() or ["no output"])[-1]
                break
            tally.runs += 1
            tally.levels += LIVE_CONFIGS * len(levels)
            tally.samples += LIVE_CONFIGS * sum(levels) * repeats
    _report(tally, started, out)


def soak(
    db_url: str, seconds: float, workers: int, levels: list[int], repeats: int, live: bool = False
) -> SoakResult:
    model = f"{MODEL_PREFIX}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    context = multiprocessing.get_context("spawn")
    pipes, processes = [], []
    for index in range(workers):
        receive, send = context.Pipe(duplex=False)
        process = context.Process(
            target=live_worker if live else worker,
            args=(index, db_url, model, seconds, levels, repeats, send),
            daemon=True,
        )
        pipes.append(receive)
        processes.append(process)
    started = time.monotonic()
    for process in processes:
        process.start()
    tallies = []
    for index, (receive, process) in enumerate(zip(pipes, processes, strict=True)):
        if receive.poll(seconds + (600 if live else 120)):
            tallies.append(receive.recv())
        else:
            tallies.append(asdict(WorkerTally(f"soak-host-{index}", error="no report (hung?)")))
        process.join(timeout=30)
    return count(db_url, model, tallies, time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", help="SQLAlchemy URL (default: SQLite WAL in a temporary folder)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the workers write")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--levels", help="concurrency levels per run (default 1,2,4,8)")
    parser.add_argument("--repeats", type=int, help="repeats per level (default 2)")
    parser.add_argument(
        "--live",
        action="store_true",
        help="workers run real `tuner profile` on the bench (default levels 1,2; repeats 1)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    record_arguments(parser)
    args = parser.parse_args(argv)
    levels = [int(c) for c in (args.levels or ("1,2" if args.live else "1,2,4,8")).split(",")]
    repeats = args.repeats or (1 if args.live else 2)
    with tempfile.TemporaryDirectory(prefix="tuner-soak-") as tmp:
        db_url = args.db or f"sqlite:///{Path(tmp) / 'soak.db'}"
        result = soak(db_url, args.seconds, args.workers, levels, repeats, args.live)
    if args.json:
        print(json.dumps({**asdict(result), "ok": result.ok}, indent=2))
    else:
        for w in result.workers:
            state = f"error: {w['error']}" if w["error"] else "ok"
            print(
                f"{w['host']}: {w['runs']} runs, {w['levels']} levels, {w['samples']} samples "
                f"in {w['seconds']:.1f} s ({state})"
            )
        print(f"database:          {result.db}")
        print(f"runs written:      {result.runs_written} (expected {result.runs_expected})")
        print(f"levels written:    {result.levels_written} (expected {result.levels_expected})")
        print(f"samples written:   {result.samples_written}")
        print(f"samples expected:  {result.samples_expected}")
        print(f"duplicates:        {result.duplicates}")
        print(f"models / hosts:    {result.models} / {result.hosts}")
        print("result:            " + ("OK" if result.ok else "FAILED"))
    summary, tables = figures(result, args.live)
    save_run(__file__, args, summary, tables)
    return 0 if result.ok else 1


WORKER_COLUMNS = ["worker", "runs", "levels", "samples", "seconds", "error"]


def figures(result: SoakResult, live: bool) -> tuple[dict[str, Any], list[Table]]:
    """The database's counts against the workers' own (the summary) and each worker's tally."""
    summary = {
        "result": "OK" if result.ok else "FAILED",
        "database": result.db.split(":", 1)[0],
        "workers": "live `tuner profile`" if live else "the profiler's storage path",
        "seconds": result.seconds,
        "runs written / expected": [result.runs_written, result.runs_expected],
        "levels written / expected": [result.levels_written, result.levels_expected],
        "samples written / expected": [result.samples_written, result.samples_expected],
        "duplicates": result.duplicates,
        "models / hosts": [result.models, result.hosts],
    }
    rows = [
        [w["host"], w["runs"], w["levels"], w["samples"], w["seconds"], w["error"]]
        for w in result.workers
    ]
    return summary, [Table("workers", WORKER_COLUMNS, rows)]


if __name__ == "__main__":
    sys.exit(main())
