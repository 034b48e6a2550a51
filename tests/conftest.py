"""Shared fixtures: an isolated database and cache per test, and the real bench.

Tests that measure run against the real llama-server bench that `scripts/setup.sh` builds; when
it is missing they fail with the command that builds it, never skip silently. A test that asks
for the bench or PostgreSQL through a fixture here is marked `bench` / `postgres` by that alone,
so `scripts/test.sh --fast` (`-m "not bench and not postgres and not slow"`) leaves it out.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from outputcheck import check_output
from sqlalchemy import select
from tunerproc import BENCH_MANIFEST, run_tuner, tuner_env
from tunerproc import tuner_cmd as tuner_cmd  # for tests that import it from here
from typer.testing import CliRunner

from tuner.bench import Bench, load_bench

REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "profiles"


# Fixtures that need the real bench or a PostgreSQL server: a test that uses one (directly or
# through another fixture) gets the matching marker, whether or not its file says so.
NEEDS = {
    "bench": "bench",
    "bench_profile": "bench",
    "pg_url": "postgres",
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            if (marker := NEEDS.get(fixture)) and item.get_closest_marker(marker) is None:
                item.add_marker(marker)


@pytest.fixture(autouse=True)
def checked_cli_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every in-process `tuner` run holds the suite's output rules (tests/outputcheck.py): no
    nan or inf a user would read, and suggested commands that parse."""
    invoke = CliRunner.invoke

    def checked(self: CliRunner, app: object, args: object = None, *a: object, **k: object):
        result = invoke(self, app, args, *a, **k)
        shown = " ".join(map(str, args)) if isinstance(args, list | tuple) else str(args)
        check_output(result.output, f"tuner {shown}")
        return result

    monkeypatch.setattr(CliRunner, "invoke", checked)


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh SQLite database, cache and state dir for each test; the bench stays where it is."""
    monkeypatch.setenv("TUNER_DB", f"sqlite:///{tmp_path / 'tuner.db'}")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TUNER_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TUNER_BENCH_MANIFEST", str(BENCH_MANIFEST))
    monkeypatch.delenv("TUNER_API_KEY", raising=False)
    monkeypatch.delenv("TUNER_HOST_NAME", raising=False)
    return tmp_path


@pytest.fixture(scope="session")
def bench() -> Bench:
    """The real bench (patched llama-server, F32 target, one-block draft)."""
    return load_bench(BENCH_MANIFEST)


@dataclass(frozen=True)
class ProfiledBench:
    """A finished `tuner profile` of a bench spec, shared by the tests that read it."""

    db_url: str
    run_id: int
    output: str
    wall_s: float
    log_dir: Path


def _profile_once(
    tmp_path_factory: pytest.TempPathFactory, spec: str, *extra: str
) -> ProfiledBench:
    base = tmp_path_factory.mktemp(spec)
    db_url = f"sqlite:///{base / 'tuner.db'}"
    started = time.monotonic()
    result = run_tuner(
        ["profile", str(PROFILES / f"{spec}.toml"), *extra], tuner_env(db_url, base / "cache"), 1200
    )
    wall = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    from tuner.storage.orm import Run
    from tuner.storage.store import Store

    store = Store(db_url)
    with store.session() as session:
        run_id = session.scalars(select(Run.id).order_by(Run.id.desc())).first()
    store.dispose()
    return ProfiledBench(
        db_url, run_id, result.stdout + result.stderr, wall, base / "cache" / "logs"
    )


# The shared profiles are as cheap as the tests that read them allow: they need the rows to
# exist and hang together (what a profile stores and prints, a fit, recommend, and validate,
# tune and watch starting from its answer), not figures that could decide N on this noisy
# machine; which N is right is tested on the twin (test_bench_twin.py, test_decisions.py).
# Levels 1 and 4 (4: the drafting launch measures threshold 3 beside always-draft there), two
# repeats (two interleaved passes), short outputs, no warm-up round, no adaptive levels, and
# kernel rows of two decode steps each, full-draft prompt batches measured once more, and one
# round of each arrival probe (every shape is still run and stored).
SHARED_PROFILE_LEVELS = (1, 4)
SHARED_PROFILE_TOKENS = 48
SHARED_WORKLOAD_ARGS = [
    "--levels",
    ",".join(map(str, SHARED_PROFILE_LEVELS)),
    "--budget",
    "0",
    "--set",
    f"workload.max_tokens={SHARED_PROFILE_TOKENS}",
    "--set",
    "workload.min_repeats=2",
    "--set",
    "workload.max_repeats=2",
    "--set",
    "workload.warmup=0",
]
SHARED_PROFILE_ARGS = [
    *SHARED_WORKLOAD_ARGS,
    "--set",
    "kernel.generation_tokens=2",
    "--set",
    "kernel.prompt_repeats=1",
    "--set",
    "probes.repeats=1",
]


@pytest.fixture(scope="session")
def bench_profile(tmp_path_factory: pytest.TempPathFactory) -> ProfiledBench:
    """The bench spec (n-max 6, synth-len 3.5) profiled once per test session, cheaply
    (SHARED_PROFILE_ARGS)."""
    return _profile_once(tmp_path_factory, "bench-smollm2-cpu", *SHARED_PROFILE_ARGS)


@pytest.fixture
def pg_url():
    """A fresh, empty PostgreSQL database for one test, dropped afterwards.

    The server is the one `scripts/test.sh` starts (`scripts/postgres.sh start`) and names in
    TUNER_TEST_PG_URL. Without it the test fails in CI (CI set) and is skipped, with the reason,
    when a developer runs pytest by hand.
    """
    from fleetkit import fresh_pg_database

    server = os.environ.get("TUNER_TEST_PG_URL")
    if not server:
        reason = (
            "TUNER_TEST_PG_URL is not set: run scripts/test.sh, or "
            "`export TUNER_TEST_PG_URL=$(scripts/postgres.sh start)`"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    with fresh_pg_database(server) as url:
        yield url


def copy_sqlite(db_url: str, dest: Path) -> str:
    """A private copy of a shared SQLite database (with its WAL) at file dest; its URL."""
    source = Path(db_url.removeprefix("sqlite:///"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{source}{suffix}").exists():
            shutil.copy(f"{source}{suffix}", f"{dest}{suffix}")
    return f"sqlite:///{dest}"


def copy_db(profiled: ProfiledBench, dest_dir: Path) -> str:
    """A private copy of a shared profile database, for tests that add to it."""
    return copy_sqlite(profiled.db_url, dest_dir / "copy.db")


# --- benchdata's profile, fitted once per session ---------------------------------------------


@pytest.fixture(scope="session")
def fitted_bench_template(tmp_path_factory: pytest.TempPathFactory) -> str:
    """benchdata's bench profile stored (store_profile() with its defaults) and fitted the way
    `tuner recommend` fits it first (seed 0, the default bootstrap), once per session: the fit
    is the slow part, and it is the same for every copy of the same data. Read it through
    fitted_bench_db, never directly."""
    from benchdata import store_profile

    from tuner.storage.fits import current_fit
    from tuner.storage.store import Store

    db_url = f"sqlite:///{tmp_path_factory.mktemp('fitted-bench') / 'tuner.db'}"
    store = Store(db_url)
    store_profile(store)
    current_fit(store, FITTED_BENCH_MODEL, FITTED_BENCH_HOST, host_explicit=True)
    store.dispose()
    return db_url


FITTED_BENCH_MODEL = "smollm2-bench"  # store_profile's defaults
FITTED_BENCH_HOST = "bench-host"


@pytest.fixture
def fitted_bench_db(fitted_bench_template: str, tmp_path: Path) -> str:
    """A private copy of fitted_bench_template (at tmp_path/fitted/tuner.db): the database a
    test would have after store_profile() and a first recommend's fit (run 1, fit 1), so a
    recommend, predict or report reuses that fit. Not for tests about making a fit."""
    return copy_sqlite(fitted_bench_template, tmp_path / "fitted" / "tuner.db")
