"""Shared fixtures: an isolated database and cache per test, and the real bench.

Tests that measure run against the real llama-server bench that `scripts/setup.sh` builds; when
it is missing they fail with the command that builds it, never skip silently.
"""

from __future__ import annotations

from pathlib import Path

import pytest

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
