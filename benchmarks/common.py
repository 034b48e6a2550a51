"""What the benchmark scripts share: `tuner` run as a user runs it, into a fresh database that
still finds the bench `tuner bench setup` built.

The subprocess helper is the tests' own (tests/tunerproc.py: tuner_cmd, tuner_env, run_tuner),
so a benchmark and a test start tuner the same way; importing this module puts tests/ on
sys.path for it (benchmarks run from a checkout, never from the installed package).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tunerproc import Finished, run_tuner, tuner_cmd, tuner_env

__all__ = [
    "Finished",
    "cached_json",
    "chosen_methods",
    "grading_arguments",
    "load_rows",
    "percentile",
    "rate_for",
    "run_grading",
    "save_rows_json",
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


# -- graded sets of twin worlds (twin_regret, openloop_regret) ---------------------------------


def load_rows(out: Path) -> dict[str, dict[str, Any]]:
    """The rows a grading run saved so far (none: {})."""
    if not out.exists():
        return {}
    return json.loads(out.read_text()).get("rows", {})


def save_rows_json(out: Path, folder: Path, rows: dict[str, dict[str, Any]]) -> None:
    """The rows as JSON, replaced whole (a run stopped half-way leaves the last complete file)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps({"set": str(folder), "rows": rows}, indent=1))
    os.replace(tmp, out)


def run_grading(
    folder: Path,
    entries: Sequence[Any],
    out: Path,
    jobs: int,
    methods: Sequence[str],
    redo: bool,
    grade: Callable[..., dict[str, Any]],
    save: Callable[[Path, Path, dict[str, dict[str, Any]]], None],
    said: Callable[[dict[str, Any]], str],
) -> dict[str, dict[str, Any]]:
    """Grade the worlds not yet in `out` (all with redo): grade(folder, entry, truth_dir,
    methods) -> the world's row, here (jobs <= 1) or in that many spawned processes; the rows
    saved by save(out, folder, rows) as each world ends, with a line on stderr (said(row) its
    end). A world counts as done when each method has a row or was skipped. The truths are
    cached in <out stem>.truth beside out."""
    rows = load_rows(out)

    def missing(entry: Any) -> bool:
        row = rows.get(entry.name)
        return row is None or any(
            m not in row["methods"] and m not in row.get("skipped", {}) for m in methods
        )

    todo = [e for e in entries if redo or missing(e)]
    truth_dir = out.with_name(out.stem + ".truth")
    print(
        f"{len(entries)} worlds, {len(entries) - len(todo)} already in {out}, "
        f"{len(todo)} to run with {jobs} job(s)",
        file=sys.stderr,
        flush=True,
    )
    started = time.perf_counter()

    def done(row: dict[str, Any], k: int) -> None:
        rows[row["name"]] = row
        save(out, folder, rows)
        print(
            f"[{k}/{len(todo)}] {row['name']} in {row['wall_s']:.0f} s (elapsed "
            f"{time.perf_counter() - started:.0f} s): {said(row)}",
            file=sys.stderr,
            flush=True,
        )

    calls = [(str(folder), e, str(truth_dir), methods) for e in todo]
    if jobs <= 1:
        for k, call in enumerate(calls, start=1):
            done(grade(*call), k)
        return rows
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(grade, *call) for call in calls]
        for k, future in enumerate(as_completed(futures), start=1):
            done(future.result(), k)
    return rows


def grading_arguments(
    parser: argparse.ArgumentParser, folder: Path, out: Path, methods: Sequence[str]
) -> None:
    """The options of a grading run over a set of worlds: --set, --worlds, --jobs, --out,
    --methods, --render, --redo."""
    parser.add_argument("--set", type=Path, default=folder, help="the set's folder")
    parser.add_argument("--worlds", help="comma list of names, indices or a-b ranges (all)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument(
        "--methods", default=",".join(methods), help="comma list; none: the truths alone"
    )
    parser.add_argument("--render", action="store_true", help="print from --out, run nothing")
    parser.add_argument("--redo", action="store_true", help="run worlds already in --out again")


def chosen_methods(parser: argparse.ArgumentParser, text: str, known: Sequence[str]) -> list[str]:
    """--methods as a list ("none": no method), an unknown one a usage error."""
    methods = [m.strip() for m in text.split(",") if m.strip() not in ("", "none")]
    unknown = [m for m in methods if m not in known]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; known: {', '.join(known)}")
    return methods


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile, interpolated linearly as numpy's; infinite where it reaches an
    infinite value (numpy gives nan there): a regret that is infinite (an overloaded answer)
    counts as the largest."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    k = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    if math.isinf(ordered[hi]) and (hi > lo or math.isinf(ordered[lo])):
        return math.inf
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def cached_json(path: Path, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """What path holds, or make() written there first (a truth computed once per world)."""
    if path.exists():
        return json.loads(path.read_text())
    value = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1))
    return value
