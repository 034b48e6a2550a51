"""Helpers for the fleet, fault and PostgreSQL tests: live profile arguments, /proc scans,
database peeks, a PostgreSQL database per test.

Nothing here mocks the bench: faults are real signals to real processes, real locks held by
another process, a real full filesystem. Running tuner itself is tunerproc's job.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, make_url, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import ProgrammingError
from tunerproc import TWIN_SPEC, tuner_env, twin_spec_args

# Re-exported for the test files that still import them from here; new code imports tunerproc.
from tunerproc import Finished as Finished
from tunerproc import finish as finish
from tunerproc import run_tuner as run_tuner
from tunerproc import start_tuner as start_tuner
from tunerproc import tuner_cmd as tuner_cmd
from tunerproc import tuner_json as tuner_json

from tuner.measure.schedule import off_arm

env_for = tuner_env  # its old name here

REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "profiles"
BENCH_SPEC = PROFILES / "bench-smollm2-cpu.toml"

# Short live settings: the figures do not matter in these tests, only what is stored.
QUICK = [
    "--set",
    "workload.min_repeats=1",
    "--set",
    "workload.max_repeats=1",
    "--set",
    "workload.warmup=0",
    "--set",
    "kernel.enabled=false",
    "--set",
    "probes.enabled=false",  # the arrival probes have tests of their own
]


def profile_args(
    levels: str = "1,2",
    max_tokens: int = 32,
    *extra: str,
    preflight: bool = False,
    twin: Path | None = None,
    speed: float = 20.0,
) -> list[str]:
    """A brief profile of the bench spec; without the preflight unless asked (the tests of the
    preflight ask: test_faults' start-up case, test_server_death). With twin (a folder for its
    launcher script), the same profile of the bench's twin (tunerproc.TWIN_SPEC):
    for tests of what the tuner stores, not of what llama-server does (speed: the twin's)."""
    if twin is not None:
        spec = [str(TWIN_SPEC), *twin_spec_args(twin, speed=speed)]
    else:
        spec = [str(BENCH_SPEC)]
    return [
        "profile",
        *([] if preflight else ["--skip-preflight"]),
        *spec,
        "--levels",
        levels,
        "--set",
        f"workload.max_tokens={max_tokens}",
        *QUICK,
        "--budget",
        "0",  # the levels asked for only: no adaptive levels
        *extra,
    ]


def wait_for(
    predicate: Callable[[], Any], timeout_s: float = 120.0, interval_s: float = 0.05
) -> Any:
    """Poll until predicate returns something truthy; fail with a timeout otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {predicate}")


# --- processes ---------------------------------------------------------------------------------


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def llama_servers(marker: str) -> list[int]:
    """Live llama-server processes (twin servers too) whose environment or command line
    mentions marker.

    Every server a tuner starts inherits its environment, so the test's own TUNER_CACHE_DIR
    finds exactly that test's servers, even after the tuner that started them is gone.
    """
    pids = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        cmdline = _read(entry / "cmdline")
        if b"llama-server" not in cmdline.split(b"\0")[0] and b"tuner.twin.command" not in cmdline:
            continue
        if needle not in _read(entry / "environ") and needle not in cmdline:
            continue
        if is_dead(int(entry.name)):  # a zombie waiting for its parent: already dead
            continue
        pids.append(int(entry.name))
    return pids


def children_named(pid: int, name: str) -> list[int]:
    """Direct children of pid whose command is name."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _read(entry / "stat").decode(errors="replace")
        if not stat:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and int(fields[1]) == pid and name in stat.split(")", 1)[0]:
            found.append(int(entry.name))
    return found


def is_dead(pid: int) -> bool:
    """Gone, or a zombie: exited and only waiting for its parent (or init) to reap it."""
    stat = _read(Path(f"/proc/{pid}/stat")).decode(errors="replace")
    return not stat or stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def assert_no_servers(marker: str, within_s: float = 15.0) -> None:
    """No llama-server of this test may outlive its tuner (give the kernel a moment)."""
    deadline = time.monotonic() + within_s
    while llama_servers(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = llama_servers(marker)
    for pid in left:  # clean up for the next test, then fail
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"orphaned llama-server processes: {left}"


# --- database peeks (read-only; a WAL reader never waits for the writer) ----------------------


@dataclass(frozen=True)
class LevelRow:
    id: int
    run_id: int
    config: str
    concurrency: int
    status: str
    repeats: int
    created_at: str
    error: str | None


def sqlite_path(db_url: str) -> Path:
    return Path(make_url(db_url).database or "")


def peek(db_url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of one query (SQLite: a short-lived connection; PostgreSQL: one cached engine)."""
    if db_url.startswith("sqlite"):
        path = sqlite_path(db_url)
        if not path.exists():
            return []
        try:
            # Read-write mode, though it only reads: a read-only connection cannot open a WAL
            # database whose -shm file is gone (after the last writer closed it).
            with contextlib.closing(sqlite3.connect(path, timeout=10)) as con:
                return con.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []  # not created yet
            raise
    engine = _ENGINES.get(db_url)
    if engine is None:  # one per database: polling must not cost a new backend every time
        engine = _ENGINES[db_url] = create_engine(db_url, pool_size=1, max_overflow=0)
    named = {f"p{i}": value for i, value in enumerate(params)}
    for i in range(len(params)):
        sql = sql.replace("?", f":p{i}", 1)
    try:
        with engine.connect() as con:
            return [tuple(row) for row in con.execute(text(sql), named)]
    except ProgrammingError:
        return []  # the tables are not created yet


_ENGINES: dict[str, Engine] = {}


def forget_engine(db_url: str) -> None:
    engine = _ENGINES.pop(db_url, None)
    if engine is not None:
        engine.dispose()


def levels(db_url: str, run_id: int | None = None) -> dict[tuple[str, int], LevelRow]:
    query = (
        "SELECT id, run_id, config, concurrency, status, repeats, created_at, error "
        "FROM tuner_levels"
    )
    params: tuple[Any, ...] = ()
    if run_id is not None:
        query += " WHERE run_id = ?"
        params = (run_id,)
    rows = peek(db_url, query + " ORDER BY id", params)
    return {(row[2], row[3]): LevelRow(*row) for row in rows}


def samples_by_level(db_url: str) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for level_id, sample_id in peek(db_url, "SELECT level_id, id FROM tuner_samples"):
        out.setdefault(level_id, set()).add(sample_id)
    return out


def runs(db_url: str) -> list[tuple[int, str, str | None]]:
    return [
        (row[0], row[1], row[2])
        for row in peek(db_url, "SELECT id, status, error FROM tuner_runs ORDER BY id")
    ]


def completed(db_url: str) -> list[LevelRow]:
    return [lv for lv in levels(db_url).values() if lv.status == "completed"]


def running_level(db_url: str, config: str, concurrency: int) -> LevelRow | None:
    row = levels(db_url).get((config, concurrency))
    return row if row is not None and row.status == "running" else None


@dataclass(frozen=True)
class Snapshot:
    """What was stored before a fault: levels with finished repeats, and their samples.

    Profiles interleave their configurations, so a level stays open until every configuration
    has measured it; its finished repeats are what must survive a fault."""

    done: dict[tuple[str, int], LevelRow]
    samples: dict[int, set[int]]


def snapshot(db_url: str) -> Snapshot:
    done = {key: lv for key, lv in levels(db_url).items() if lv.repeats}
    all_samples = samples_by_level(db_url)
    return Snapshot(done, {lv.id: all_samples.get(lv.id, set()) for lv in done.values()})


def assert_kept(db_url: str, before: Snapshot) -> None:
    """Measured repeats were not measured again: same rows, same created_at, same samples."""
    now = levels(db_url)
    all_samples = samples_by_level(db_url)
    for key, level in before.done.items():
        assert now[key].id == level.id, f"{key} was re-created"
        assert now[key].created_at == level.created_at, f"{key} was re-measured"
        assert now[key].repeats == level.repeats, f"{key}: repeats changed"
        kept = all_samples.get(level.id, set())
        assert kept == before.samples[level.id], f"{key}: samples changed"


def profile_cells(concurrencies: Iterable[int], way: str) -> set[tuple[str, int]]:
    """The levels a profile of the bench spec (no threshold of its own) stores: plain and
    always-draft at every concurrency and, measured the live way, always-draft's off arm (the
    threshold c-1, which does not draft at c) above one stream. (profile_args leaves the
    arrival probes out.)"""
    cells = {(config, c) for config in ("plain", "spec") for c in concurrencies}
    if way == "live":
        cells |= {(arm.config_name, c) for c in concurrencies if (arm := off_arm(c))}
    return cells


def _json(value: Any) -> dict[str, Any]:
    """A JSON column as read back: text from SQLite, already a dict from PostgreSQL."""
    return value if isinstance(value, dict) else json.loads(value or "{}")


def assert_run_complete(db_url: str, run_id: int, concurrencies: Iterable[int]) -> None:
    rows = levels(db_url, run_id)
    way = peek(db_url, "SELECT way FROM tuner_runs WHERE id = ?", (run_id,))[0][0]
    assert set(rows) == profile_cells(concurrencies, way), (way, sorted(rows))
    assert all(lv.status == "completed" for lv in rows.values()), rows
    assert dict((r[0], r[1]) for r in runs(db_url))[run_id] == "completed"
    # A round a busy machine disturbed is measured again and kept apart (its samples stored
    # too, under the level's "stalled"): the counted repeats' samples are what must add up, how
    # busy the machine was being no part of the mechanism under test.
    counted = {
        level_id: {r["repeat"] for r in _json(metrics).get("repeats", [])}
        for level_id, metrics in peek(db_url, "SELECT id, metrics FROM tuner_levels")
    }
    counts: dict[int, int] = {}
    for level_id, repeat in peek(db_url, "SELECT level_id, repeat FROM tuner_samples"):
        if repeat in counted.get(level_id, set()):
            counts[level_id] = counts.get(level_id, 0) + 1
    for (config, concurrency), level in rows.items():
        if config.startswith("probe:"):
            continue  # a probe keeps its records, not samples
        # one sample per stream of every counted repeat
        assert counts.get(level.id) == concurrency * level.repeats, (level, counts)
    duplicates = peek(
        db_url,
        "SELECT level_id, repeat, stream, COUNT(*) FROM tuner_samples "
        "GROUP BY level_id, repeat, stream HAVING COUNT(*) > 1",
    )
    assert duplicates == []


# --- PostgreSQL: one database per test --------------------------------------------------------


@contextlib.contextmanager
def fresh_pg_database(server_url: str) -> Iterator[str]:
    """A new, empty database on the test server; dropped (with its connections) afterwards."""
    name = f"tuner_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as con:
            con.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
        yield url
    finally:
        forget_engine(url)
        with admin.connect() as con:
            con.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
