#!/usr/bin/env python3
"""How long a `tuner` command takes to start and answer: most commands a user types, and most of
the suite's subprocesses, read stored data and spend their time importing the libraries.

Stores the bundled bench profile (tests/benchdata.py) in a fresh SQLite database, answers it once
(`recommend` fits and stores), then times `tuner --version`, `tuner runs` and
`tuner recommend --quiet`, --repeats times each, in turn. With --against DIR it times that
checkout's tuner too (same virtualenv, its package first on the path), each run of one beside a
run of the other, and prints the paired difference with its 95 % t-interval. Also lists which
heavy libraries a command's import pulls in.

    .venv/bin/python benchmarks/startup_time.py [--repeats 15] [--against /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import tuner_env  # first: it puts tests/ on the path
from record import Table, record_arguments, save_run

from tuner.decide.paired import Contrast, LevelDiffs

REPO = Path(__file__).resolve().parent.parent
MODEL, HOST = "smollm2-bench", "bench-host"
COMMANDS = {
    "--version": ["--version"],
    "runs": ["runs"],
    "recommend --quiet": ["recommend", "--model", MODEL, "--host", HOST, "--quiet"],
}
HEAVY = [
    "scipy.stats",
    "scipy.optimize",
    "scipy.special",
    "sqlalchemy",
    "alembic",
    "optuna",
    "matplotlib",
]


def env_for(checkout: Path, db: str, cache: Path) -> dict[str, str]:
    """The tuner's environment (tunerproc's), its package taken from checkout."""
    return tuner_env(db, cache, PYTHONPATH=str(checkout))


def timed(env: dict[str, str], args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        cwd=env["PYTHONPATH"],  # python -m and -c put the working folder first on the path
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def heavy_imports(env: dict[str, str]) -> list[str]:
    """The heavy libraries importing the CLI and what recommend runs pulls in."""
    code = (
        "import sys, tuner.cli.app, tuner.decide.advice; "
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=env["PYTHONPATH"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--against", type=Path, help="another checkout, timed beside this one")
    record_arguments(parser)
    args = parser.parse_args()
    if args.repeats < 2:
        parser.error("--repeats must be 2 or more")
    checkouts = {"this checkout": REPO}
    if args.against is not None:
        if not (args.against / "tuner" / "__init__.py").exists():
            parser.error(f"--against {args.against}: no tuner package there")
        checkouts["against"] = args.against.resolve()
    from benchdata import store_profile

    from tuner.storage.store import Store

    with tempfile.TemporaryDirectory(prefix="tuner-startup-") as folder:
        db = f"sqlite:///{Path(folder) / 'bench.db'}"
        store = Store(db)
        store_profile(store, model=MODEL, host=HOST)
        store.dispose()
        envs = {name: env_for(path, db, Path(folder) / "cache") for name, path in checkouts.items()}
        for env in envs.values():  # the fit and recommendation stored once, before timing
            timed(env, COMMANDS["recommend --quiet"][:-1])
        seconds: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):
            for command, argv in COMMANDS.items():
                for name, env in envs.items():
                    seconds.setdefault((name, command), []).append(timed(env, argv))
        imports = {name: heavy_imports(env) for name, env in envs.items()}

    table = Table(
        "seconds per command (median over repeats, run in turn)",
        ["checkout", "command", "median s", "min s", "max s"],
    )
    for (name, command), values in seconds.items():
        table.rows.append(
            [
                name,
                command,
                round(statistics.median(values), 3),
                round(min(values), 3),
                round(max(values), 3),
            ]
        )
    tables = [table]
    summary: dict[str, object] = {"repeats": args.repeats}
    for name in checkouts:
        median = statistics.median(seconds[(name, "recommend --quiet")])
        summary[f"recommend --quiet, median s ({name})"] = round(median, 3)
        summary[f"heavy imports ({name})"] = " ".join(imports[name]) or "none"
    if "against" in checkouts:
        paired = Table(
            "this checkout less the other, paired run by run (s)",
            ["command", "mean", "95 % low", "95 % high"],
        )
        for command in COMMANDS:
            diffs = [
                a - b
                for a, b in zip(
                    seconds[("this checkout", command)], seconds[("against", command)], strict=True
                )
            ]
            paired_mean = Contrast.of({0: LevelDiffs(tuple(diffs))}, {0: 1.0})
            mean, (low, high) = paired_mean.estimate, paired_mean.interval(0.95)
            paired.rows.append([command, round(mean, 3), round(low, 3), round(high, 3)])
            summary[f"{command}: this less the other, s (95 %)"] = (
                f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"
            )
        tables.append(paired)
    for t in tables:
        print(f"\n{t.title}")
        print("  " + " | ".join(t.columns))
        for row in t.rows:
            print("  " + " | ".join(str(c) for c in row))
    for name in checkouts:
        print(f"heavy imports ({name}): {' '.join(imports[name]) or 'none'}")
    save_run(__file__, args, summary, tables)


if __name__ == "__main__":
    main()
