"""How long a bench profile takes (with --tune: profile + tune), and how stable its figures are.

Runs `tuner profile profiles/bench-smollm2-cpu.toml` (2 configurations x 4 levels x up to 3
repeats) into a throwaway database, --runs times, and prints the wall time (median over runs) and,
per level, the spread across repeats (MAD/median of step time and of aggregate tok/s) and, with
several runs, the spread of each level's median across runs. Target: under 10 minutes per profile
on 2 cores. With --tune each run then runs `tuner tune` on what it profiled and prints both
times and the answer; target for the two together: under 6 minutes. --set passes spec overrides
to the profile, e.g. rounds of 192 tokens and up to 3 passes:

    .venv/bin/python benchmarks/profile_time.py [--runs 2] [--spec profiles/...toml]
        [--tune] [--set workload.max_tokens=192 --set workload.max_repeats=3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from common import tuner_env, tuner_run
from record import Table, fmt, record_arguments, save_run
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuner.measure.stats import relative_mad
from tuner.storage.orm import Level, Sample
from tuner.storage.store import Store

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 600


TUNE_TARGET_S = 360


@dataclass
class Timed:
    """One run: the profile's wall time, the tune's (None without --tune) and its answer."""

    profile_s: float
    tune_s: float | None = None
    answer: str = ""
    # per stored run (the profile's, then the tune's): its rounds and their own seconds
    rounds: list[tuple[int, float]] = field(default_factory=list)


def profile_once(
    spec: Path, workdir: Path, sets: list[str], tune: bool
) -> tuple[Timed, dict[tuple[str, int], Level]]:
    db_url = f"sqlite:///{workdir / 'bench.db'}"
    env = tuner_env(db_url, workdir / "cache")
    started = time.monotonic()
    tuner_run(env, "profile", str(spec), *(a for s in sets for a in ("--set", s)))
    timed = Timed(time.monotonic() - started)
    if tune:
        model = tomllib.loads(spec.read_text())["model_name"]
        started = time.monotonic()
        done = tuner_run(env, "tune", "--model", model)
        timed.tune_s = time.monotonic() - started
        lines = (done.stdout + "\n" + done.stderr).splitlines()
        timed.answer = next((ln for ln in lines if ln.startswith("answer:")), "")
    store = Store(db_url)
    with store.session() as session:
        # the profile's levels only: a tune stores its sweeps' rounds as a run of its own
        first = session.scalar(select(func.min(Level.run_id)))
        rows = session.scalars(select(Level).where(Level.run_id == first))
        levels = {(lv.config, lv.concurrency): lv for lv in rows}
        timed.rounds = rounds_by_run(session)
    store.dispose()
    return timed, levels


def rounds_by_run(session: Session) -> list[tuple[int, float]]:
    """Per stored run in order: its rounds (a level's repeat, probes included) and their own
    seconds, each round's as long as its longest request (the streams of a round run
    together). What the wall time holds beyond them is the rest of the work: launches and
    health waits, warm-up rounds (never stored), switches, the model's fits."""
    longest = (
        select(Level.run_id, Sample.repeat, func.max(Sample.latency_ms))
        .join(Sample, Sample.level_id == Level.id)
        .group_by(Level.id, Sample.repeat)
    )
    out: dict[int, list[float]] = {}
    for run_id, _, ms in session.execute(longest):
        out.setdefault(run_id, []).append((ms or 0.0) / 1000.0)
    return [(len(out[r]), sum(out[r])) for r in sorted(out)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--spec", type=Path, default=REPO / "profiles" / "bench-smollm2-cpu.toml")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a spec override for the profile (tuner profile --set)")  # fmt: skip
    parser.add_argument("--tune", action="store_true", help="then tune, and time both")
    record_arguments(parser)
    args = parser.parse_args()

    walls, runs, timings = [], [], []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            timed, levels = profile_once(args.spec, Path(tmp), args.sets, args.tune)
        walls.append(timed.profile_s)
        runs.append(levels)
        timings.append(timed)
        line = f"run {i + 1}: profile {timed.profile_s:.0f} s"
        if timed.tune_s is not None:
            total = timed.profile_s + timed.tune_s
            line += f", tune {timed.tune_s:.0f} s, together {total:.0f} s: {timed.answer}"
        print(line, flush=True)
        for what, (n, seconds) in zip(("profile", "tune"), timed.rounds, strict=False):
            print(
                f"  {what}: {n} rounds, {seconds:.0f} s of them (each as long as its longest "
                "request); the rest is launches, warm-ups, switches and fits",
                flush=True,
            )

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
    summary: dict[str, object] = {
        "profile wall time: median s": median,
        "runs": len(walls),
        f"target < {TARGET_S} s": median < TARGET_S,
        "spec": args.spec.name,
        "overrides": " ".join(args.sets),
    }
    for i, what in enumerate(("profile", "tune")):
        own = [t.rounds[i] for t in timings if len(t.rounds) > i]
        if own:
            summary[f"{what}: rounds (median)"] = statistics.median(n for n, _ in own)
            summary[f"{what}: the rounds' own s (median)"] = statistics.median(s for _, s in own)
    if args.tune:
        tunes = [t.tune_s or 0.0 for t in timings]
        together = statistics.median(t.profile_s + (t.tune_s or 0.0) for t in timings)
        summary |= {
            "tune wall time: median s": statistics.median(tunes),
            "profile + tune: median s": together,
            f"profile + tune < {TUNE_TARGET_S} s": together < TUNE_TARGET_S,
            "answers": " | ".join(t.answer for t in timings),
        }
        print(
            f"profile + tune: median {together:.0f} s (target < {TUNE_TARGET_S} s: "
            f"{'met' if together < TUNE_TARGET_S else 'MISSED'})"
        )
    save_run(
        __file__,
        args,
        summary,
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
