#!/usr/bin/env python3
"""How long the README's main job takes once the bench is built: `scripts/demo.sh` (profile the
bench, settle N live, write the report) run as a user runs it, --runs times, each into a fresh
output folder and database. Target: under 6 minutes on 2 cores after the build.

    .venv/bin/python benchmarks/demo_time.py [--runs 2]

The bench build is done first (`scripts/setup.sh`, cached; timed apart and not counted: the
target is the time after the build). Each run's lines are time-stamped as they come, which
splits its wall time into the set-up check, the profile (up to the cost model's answer), and
tune with recommend and the report (up to the demo's last line). Prints each run's phases and
answer and the median; writes benchmarks/results/demo_time/<date>.json (--no-record: print
only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from record import Table, fmt, record_arguments, save_run

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 360.0
PROFILE_DONE = "the cost model's answer after the profile"
SETUP_DONE = "bench manifest:"
ANSWER = "recommendation: "


def run_demo(out: Path) -> tuple[dict[str, float], str, int]:
    """One demo into out: (seconds per phase, the answer it printed, its exit status)."""
    env = {**os.environ, "OUT": str(out), "TUNER_DB": f"sqlite:///{out / 'demo.db'}"}
    started = time.monotonic()
    marks: dict[str, float] = {}
    answer = ""
    proc = subprocess.Popen(
        [str(REPO / "scripts" / "demo.sh")],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.monotonic() - started
        if line.startswith(SETUP_DONE):
            marks["setup"] = now
        elif line.startswith(PROFILE_DONE):
            marks["profile"] = now
        elif line.startswith(ANSWER):
            answer = line[len(ANSWER) :].strip()
    rc = proc.wait()
    total = time.monotonic() - started
    setup = marks.get("setup", 0.0)
    profile = marks.get("profile", total)
    phases = {
        "set-up check": setup,
        "profile": profile - setup,
        "tune, recommend, report": total - profile,
        "total": total,
    }
    return phases, answer, rc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    record_arguments(parser)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be 1 or more")
    started = time.monotonic()
    subprocess.run([str(REPO / "scripts" / "setup.sh")], cwd=REPO, check=True)
    build_s = time.monotonic() - started
    print(f"scripts/setup.sh (the bench build, cached): {build_s:.0f} s", flush=True)
    runs = Table(
        "runs",
        [
            "run",
            "set-up check s",
            "profile s",
            "tune, recommend, report s",
            "total s",
            "rc",
            "answer",
        ],
    )
    totals = []
    for i in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix="tuner-demo-") as folder:
            phases, answer, rc = run_demo(Path(folder))
        totals.append(phases["total"])
        row = [i, *(round(phases[k], 1) for k in phases), rc, answer]
        runs.rows.append(row)
        print(
            f"run {i}: "
            + ", ".join(f"{k} {v:.0f} s" for k, v in phases.items())
            + f"; rc {rc}; {answer}",
            flush=True,
        )
    median = statistics.median(totals)
    failed = sum(1 for r in runs.rows if r[5] != 0)
    print(
        f"demo after the build: median {fmt(median, '.0f')} s over {args.runs} run(s) "
        f"(range {min(totals):.0f}-{max(totals):.0f} s); target < {TARGET_S:.0f} s: "
        f"{'yes' if median < TARGET_S and not failed else 'no'}"
    )
    summary = {
        "demo wall time after the build: median s": round(median, 1),
        "range s": f"{min(totals):.0f}-{max(totals):.0f}",
        "runs": args.runs,
        "failed runs": failed,
        f"target < {TARGET_S:.0f} s": "yes" if median < TARGET_S and not failed else "no",
        "bench set-up (cached build) s": round(build_s, 1),
    }
    save_run(__file__, args, summary, [runs])


if __name__ == "__main__":
    main()
