"""What the benchmark scripts share: `tuner` run as a user runs it, into a fresh database that
still finds the bench `tuner bench setup` built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tuner.settings import Settings


def fresh_env(db: Path, cache: Path) -> dict[str, str]:
    """The environment of a tuner command on database file db with its own cache."""
    return {
        **os.environ,
        "TUNER_DB": f"sqlite:///{db}",
        "TUNER_CACHE_DIR": str(cache),
        # the bench stays where `tuner bench setup` put it
        "TUNER_BENCH_MANIFEST": str(Settings().bench_manifest_path),
    }


def tuner_run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run a tuner command; its output. A failure ends the benchmark with its stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "tuner", *args], env=env, text=True, capture_output=True, check=False
    )
    if result.returncode != 0:
        sys.exit(f"tuner {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result


def tuner(env: dict[str, str], *args: str) -> str:
    """Run a tuner command; its stdout. A failure ends the benchmark with its stderr."""
    return tuner_run(env, *args).stdout
