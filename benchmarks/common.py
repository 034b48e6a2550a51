"""What the benchmark scripts share: `tuner` run as a user runs it, into a fresh database that
still finds the bench `tuner bench setup` built.

The subprocess helper is the tests' own (tests/tunerproc.py: tuner_cmd, tuner_env, run_tuner),
so a benchmark and a test start tuner the same way; importing this module puts tests/ on
sys.path for it (benchmarks run from a checkout, never from the installed package).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tunerproc import Finished, run_tuner, tuner_cmd, tuner_env

__all__ = [
    "Finished",
    "rate_for",
    "tuner",
    "tuner_cmd",
    "tuner_env",
    "tuner_run",
    "world_set_command",
]


def tuner_run(env: dict[str, str], *args: str) -> Finished:
    """Run a tuner command to its end; a failure ends the benchmark with its stderr."""
    result = run_tuner(args, env, timeout_s=None)
    if result.returncode != 0:
        sys.exit(f"tuner {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result


def tuner(env: dict[str, str], *args: str) -> str:
    """Run a tuner command; its stdout. A failure ends the benchmark with its stderr."""
    return tuner_run(env, *args).stdout


def say_text(event: object) -> None:
    """A backend's launches and live-switch check, one line each (the observer benchmarks give
    a ServerBackend; the profiler's round events have their own lines where a benchmark wants
    them)."""
    text = getattr(event, "text", "")
    if text:
        print(f"  {text}", flush=True)


def rate_for(
    generating: Callable[[float], float], target: float, first: float, steps: int
) -> float:
    """The arrival rate at which `generating(rate)` (mean generating slots, growing with the
    rate) reaches target: the bracket doubled from `first` until it holds the target, then
    `steps` bisections; rounded to 4 decimals. Benchmarks pick their rates with it."""
    low, high = 0.0, first
    while generating(high) < target:
        low, high = high, high * 2
    for _ in range(steps):
        mid = 0.5 * (low + high)
        if generating(mid) < target:
            low = mid
        else:
            high = mid
    return round(0.5 * (low + high), 4)


def world_set_command(description: str, default: Path, files: Callable[[], dict[str, str]]) -> int:
    """A set of twin worlds' maker: write what `files()` makes (name -> text) into --out, or
    with --check compare the committed copy (exit 1 on a difference)."""
    from lab.frozen import differences, write_files

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=default, help="folder (default %(default)s)")
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    made = files()
    if args.check:
        found = differences(made, args.out)
        for line in found:
            print(line)
        return 1 if found else 0
    write_files(args.out, made)
    print(f"wrote {len(made) - 1} worlds and the manifest into {args.out}")
    return 0
