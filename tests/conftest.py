"""Shared fixtures: an isolated database and cache per test, and the real bench.

Tests that measure run against the real llama-server bench that `scripts/setup.sh` builds; when
it is missing they fail with the command that builds it, never skip silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import select

from tuner.bench import Bench, load_bench
from tuner.settings import Settings

# Resolved before any test changes TUNER_CACHE_DIR, so every test finds the same bench.
BENCH_MANIFEST = Settings().bench_manifest_path
REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "profiles"


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh SQLite database and cache dir for each test; the bench stays where it is."""
    monkeypatch.setenv("TUNER_DB", f"sqlite:///{tmp_path / 'tuner.db'}")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TUNER_BENCH_MANIFEST", str(BENCH_MANIFEST))
    monkeypatch.delenv("TUNER_API_KEY", raising=False)
    monkeypatch.delenv("TUNER_HOST_NAME", raising=False)
    return tmp_path


@pytest.fixture(scope="session")
def bench() -> Bench:
    """The real bench (patched llama-server, F32 target, one-block draft)."""
    return load_bench(BENCH_MANIFEST)


def tuner_cmd(*args: str) -> list[str]:
    """The tuner command line, run with this interpreter (the installed package)."""
    return [sys.executable, "-m", "tuner", *args]


def tuner_env(db_url: str, cache_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "TUNER_DB": db_url,
        "TUNER_CACHE_DIR": str(cache_dir),
        "TUNER_BENCH_MANIFEST": str(BENCH_MANIFEST),
        "COLUMNS": "200",
    }
    env.pop("TUNER_API_KEY", None)
    return {**env, **extra}


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
    result = subprocess.run(
        tuner_cmd("profile", str(PROFILES / f"{spec}.toml"), *extra),
        env=tuner_env(db_url, base / "cache"),
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    wall = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    from tuner.storage.engine import Store
    from tuner.storage.orm import Run

    store = Store(db_url)
    with store.session() as session:
        run_id = session.scalars(select(Run.id).order_by(Run.id.desc())).first()
    store.dispose()
    return ProfiledBench(
        db_url, run_id, result.stdout + result.stderr, wall, base / "cache" / "logs"
    )


@pytest.fixture(scope="session")
def bench_profile(tmp_path_factory: pytest.TempPathFactory) -> ProfiledBench:
    """The bench spec (n-max 6, synth-len 3.5) profiled once per test session, adaptive levels
    included (the default budget)."""
    return _profile_once(tmp_path_factory, "bench-smollm2-cpu")


@pytest.fixture(scope="session")
def bench_profile_nmax3(tmp_path_factory: pytest.TempPathFactory) -> ProfiledBench:
    """The second bench regime (n-max 3, synth-len 2.0) profiled once per test session."""
    return _profile_once(tmp_path_factory, "bench-smollm2-cpu-nmax3", "--budget", "0")


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


def copy_db(profiled: ProfiledBench, dest_dir: Path) -> str:
    """A private copy of a shared profile database, for tests that add to it."""
    source = Path(profiled.db_url.removeprefix("sqlite:///"))
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{source}{suffix}").exists():
            shutil.copy(f"{source}{suffix}", dest_dir / f"copy.db{suffix}")
    return f"sqlite:///{dest_dir / 'copy.db'}"
