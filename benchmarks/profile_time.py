"""How long a full bench profile takes, and how stable its figures are.

Runs `tuner profile profiles/bench-smollm2-cpu.toml` (2 configurations x 4 levels x up to 3
repeats) into a throwaway database, --runs times, and prints the wall time (median over runs) and,
per level, the spread across repeats (MAD/median of step time and of aggregate tok/s) and, with
several runs, the spread of each level's median across runs. Target: under 10 minutes per profile
on 2 cores.

    .venv/bin/python benchmarks/profile_time.py [--runs 2] [--spec profiles/...toml]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import tuner_env, tuner_run
from record import Table, fmt, record_arguments, save_run
from sqlalchemy import select

from tuner.measure.stats import relative_mad
from tuner.storage.orm import Level
from tuner.storage.store import Store

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 600


def profile_once(spec: Path, workdir: Path) -> tuple[float, dict[tuple[str, int], Level]]:
    db_url = f"sqlite:///{workdir / 'bench.db'}"
    started = time.monotonic()
    tuner_run(tuner_env(db_url, workdir / "cache"), "profile", str(spec))
    wall = time.monotonic() - started
    store = Store(db_url)
    with store.session() as session:
        levels = {(lv.config, lv.concurrency): lv for lv in session.scalars(select(Level))}
    store.dispose()
    return wall, levels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--spec", type=Path, default=REPO / "profiles" / "bench-smollm2-cpu.toml")
    record_arguments(parser)
    args = parser.parse_args()

    walls, runs = [], []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            wall, levels = profile_once(args.spec, Path(tmp))
        walls.append(wall)
        runs.append(levels)
        print(f"run {i + 1}: {wall:.0f} s", flush=True)

    print(
        f"\nprofile wall time: median {statistics.median(walls):.0f} s over {len(walls)} run(s) "
        f"(target < {TARGET_S} s: {'met' if statistics.median(walls) < TARGET_S else 'MISSED'})"
    )
    print(
        f"\n{'config':>8} {'c':>3} {'repeats':>7} {'tok/s':>8} {'tps MAD%':>8} "
        f"{'ms/step':>8} {'step MAD%':>9} {'across runs tps MAD%':>21}"
    )
    rows = level_rows(runs)
    for config, c, repeats, tps, tps_mad, step_ms, step_mad, across in rows:
        spread = "" if across is None else f"{across:.1f}"
        print(
            f"{config:>8} {c:>3} {repeats:>7} {fmt(tps, '.1f'):>8} {tps_mad:>8.1f} "
            f"{fmt(step_ms, '.1f'):>8} {step_mad:>9.1f} {spread:>21}"
        )
    median = statistics.median(walls)
    save_run(
        __file__,
        args,
        {
            "profile wall time: median s": median,
            "runs": len(walls),
            f"target < {TARGET_S} s": median < TARGET_S,
            "spec": args.spec.name,
        },
        [Table("levels of run 1 (spreads as MAD / median, %)", LEVEL_COLUMNS, rows)],
    )


LEVEL_COLUMNS = [
    "config",
    "streams",
    "repeats",
    "tok/s",
    "tps MAD %",
    "ms/step",
    "step MAD %",
    "across runs tps MAD %",
]


def level_rows(runs: list[dict[tuple[str, int], Level]]) -> list[list]:
    """Per level of the first run: repeats, tok/s and step time with their spreads across
    repeats, and the spread of the level's tok/s across runs (None with one run)."""
    rows: list[list] = []
    for key in sorted(runs[0], key=lambda k: (k[0], k[1])):
        level = runs[0][key]
        across = relative_mad([r[key].tokens_per_second for r in runs if key in r])
        rows.append(
            [
                key[0],
                key[1],
                level.repeats,
                level.tokens_per_second,
                100 * (level.tokens_per_second_spread or 0),
                level.step_ms,
                100 * (level.step_ms_spread or 0),
                None if across is None else 100 * across,
            ]
        )
    return rows


if __name__ == "__main__":
    main()
