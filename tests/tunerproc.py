"""Run `tuner` as a user runs it: a subprocess of this interpreter, on a database and cache of its
own, that still finds the bench `tuner bench setup` built.

The one subprocess helper of the tests and the benchmarks (benchmarks/common.py puts tests/ on
sys.path to import it). It stays out of the tuner package: nothing a user runs needs it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outputcheck import check_output

from tuner.settings import Settings

# Resolved when first imported, before any test points TUNER_CACHE_DIR at its own folder, so
# every command finds the same bench.
BENCH_MANIFEST: Path = Settings().bench_manifest_path


def tuner_cmd(*args: str) -> list[str]:
    """The tuner command line, run with this interpreter (the installed package)."""
    return [sys.executable, "-m", "tuner", *args]


def tuner_env(db: str | Path, cache_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a tuner subprocess: database db (a URL, or a SQLite file's path), its
    own cache dir (server logs), the real bench, wide tables and unbuffered output.

    No API key or host name leaks in from the caller's environment; extra sets any variable,
    those two included.
    """
    env = {
        **os.environ,
        "TUNER_DB": db if isinstance(db, str) else f"sqlite:///{db}",
        "TUNER_CACHE_DIR": str(cache_dir),
        "TUNER_BENCH_MANIFEST": str(BENCH_MANIFEST),
        "COLUMNS": "200",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("TUNER_API_KEY", None)
    env.pop("TUNER_HOST_NAME", None)
    return {**env, **extra}


@dataclass
class Finished:
    """A tuner command that ended: its exit status and what it printed."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


def _interactive_signals() -> None:
    # A test runner started in the background by a non-interactive shell ignores SIGINT, and its
    # children inherit that; a user's terminal does not: give the tuner the default disposition
    # so that SIGINT means Ctrl-C, as it does for a user.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_tuner(args: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """Start `tuner ARGS` with its output piped; finish() collects it."""
    return subprocess.Popen(
        tuner_cmd(*args),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_interactive_signals,
    )


def finish(process: subprocess.Popen[str], timeout_s: float | None = 300.0) -> Finished:
    """Wait for a started tuner (None: as long as it takes); one that outlives timeout_s is
    killed and fails the caller."""
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        raise AssertionError(
            f"tuner did not finish within {timeout_s} s:\n{stderr[-3000:]}"
        ) from None
    if "PYTEST_CURRENT_TEST" in os.environ:  # the suite's rules for every output it sees
        check_output(stdout + "\n" + stderr, f"tuner {' '.join(map(str, process.args[3:]))}")
    return Finished(process.returncode, stdout, stderr)


def run_tuner(
    args: Sequence[str], env: dict[str, str], timeout_s: float | None = 600.0
) -> Finished:
    """Run `tuner ARGS` to its end, whatever its exit status."""
    return finish(start_tuner(args, env), timeout_s)


def tuner_ok(env: dict[str, str], *args: str, timeout_s: float = 1200.0) -> Finished:
    """Run `tuner ARGS`; it must succeed (AssertionError with the end of its stderr)."""
    result = run_tuner(args, env, timeout_s)
    assert result.returncode == 0, f"tuner {' '.join(args)}:\n{result.stderr[-3000:]}"
    return result


def tuner_json(env: dict[str, str], *args: str, timeout_s: float = 1200.0) -> Any:
    """A command with --format json: it must succeed; what it printed."""
    return json.loads(tuner_ok(env, *args, "--format", "json", timeout_s=timeout_s).stdout)


def assert_env_line_is(line: str, answer: dict[str, Any]) -> None:
    """recommend's last env line states answer (its --format json): the threshold, or, where the
    answer is to serve without the draft model, that threshold as a comment. Which answer a
    measured run gives is the measurement's to say, not a test's to bet on."""
    assert line.endswith(f"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS={answer['max_slots']}"), line
    assert line.startswith("#") == (answer["answer"] == "plain"), (line, answer["answer"])


# --- the twin server as a spec's llama-server ---------------------------------------------------

REPO = Path(__file__).resolve().parent.parent
TWIN_SPEC = REPO / "profiles" / "twin" / "bench-twin.toml"  # the bench spec on the twin server
TWIN_BENCH_WORLD = REPO / "profiles" / "twin" / "bench-smollm2-cpu.toml"
TWIN_MODEL = "twin-smollm2-135m-f32"  # that world's model identity


def twin_server_script(folder: Path) -> Path:
    """An executable in folder that runs the twin server with this interpreter (what the
    package's tuner-twin-server script does, wherever the test runs from)."""
    path = folder / "tuner-twin-server"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tuner.twin.command "$@"\n')
    path.chmod(0o755)
    return path


def twin_spec_args(folder: Path, *, speed: float = 20.0, noise: bool = True) -> list[str]:
    """`--set` options that point TWIN_SPEC at the bench world served by twin_server_script,
    simulated time running `speed` times the wall's."""
    server_args = ["--kv-unified", "--speed", f"{speed:g}", *([] if noise else ["--noise", "off"])]
    overrides = [
        f"server.binary={twin_server_script(folder)}",
        f"server.model={TWIN_BENCH_WORLD}",
        "server.args=[" + ", ".join(f'"{a}"' for a in server_args) + "]",
    ]
    return [item for o in overrides for item in ("--set", o)]
