#!/usr/bin/env python3
"""From a clone to an applied N, following the README's own-server section on the bench: the
time each step takes as written (the README's default budgets; only `watch`, a service, gets a
--duration), and what every surface says the answer is, side by side.

    .venv/bin/python benchmarks/readme_path.py [--clone] [--watch 60s] [--both-tunes]

By default it walks the path of a user who starts the second server: step 4's
`tune --plain-url` in place of the tune without it, as the README says; --both-tunes runs every
line (the README test's walk).

--clone starts from a fresh `git clone` of this checkout and its `scripts/setup-venv.sh`
(timed), and runs the clone's tuner; without it, this checkout's. The bench (llama-server and
the models) comes from `tuner bench setup`'s cache either way: building it is not part of the
path a user with their own llama-server walks. Prints the timeline and the surfaces; writes
benchmarks/results/readme_path/<date>.json (--no-record: print only).
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import tuner_env  # first: it puts tests/ on the path
from readme import Step, readme_commands, surfaces, walk, with_plain_url
from record import Table, record_arguments, save_run

from tuner.bench import load_bench
from tuner.measure.client import model_stem
from tuner.measure.launcher import free_port
from tuner.settings import Settings

REPO = Path(__file__).resolve().parent.parent


def clone(into: Path) -> tuple[Path, float]:
    """A fresh clone of this checkout with its virtualenv: its python, and the seconds taken."""
    started = time.monotonic()
    subprocess.run(["git", "clone", "-q", str(REPO), str(into)], check=True)
    subprocess.run([str(into / "scripts" / "setup-venv.sh")], check=True, cwd=into)
    return into / ".venv" / "bin" / "python", time.monotonic() - started


def applied_at(steps: list[Step]) -> float:
    """Seconds from the walk's start to watch's line setting N on the running server: the
    watch step's start plus the span of its log's time stamps (whole seconds, UTC) from its first
    line to that one; the watch's whole run where it never set N."""
    watch = next(s for s in steps if s.line.startswith("tuner watch"))
    assert watch.result is not None
    stamps = []
    for line in watch.result.stderr.splitlines():
        stamp, _, text = line.partition(" ")
        try:
            at = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")
        except ValueError:
            continue
        stamps.append(at)
        if "on the running server" in text:
            return watch.started_s + (at - stamps[0]).total_seconds()
    return watch.started_s + watch.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clone", action="store_true", help="start from a fresh clone")
    parser.add_argument("--watch", default="60s", help="how long watch runs (default 60s)")
    parser.add_argument(
        "--both-tunes",
        action="store_true",
        help="run the tune without --plain-url too (every README line)",
    )
    record_arguments(parser)
    args = parser.parse_args()
    bench = load_bench(Settings().bench_manifest_path)
    with tempfile.TemporaryDirectory(prefix="tuner-readme-") as folder:
        tmp = Path(folder)
        setup_s = 0.0
        if args.clone:
            python, setup_s = clone(tmp / "tuner")
            sys.executable = str(python)  # the clone's tuner runs every command (tunerproc)
            print(f"clone and scripts/setup-venv.sh: {setup_s:.0f} s", flush=True)
        ports = {"8080": str(free_port()), "8081": str(free_port())}
        env = tuner_env(tmp / "tuner.db", tmp / "cache", TUNER_STATE_DIR=str(tmp / "state"))
        name = model_stem(str(bench.target))
        lines = readme_commands() if args.both_tunes else with_plain_url(readme_commands())
        steps = walk(
            bench, tmp, env, ports, name, {"watch": ["--duration", args.watch]}, None, lines
        )
        said = surfaces(steps, tmp)
    total = setup_s + sum(s.seconds for s in steps)
    applied = setup_s + applied_at(steps)
    timeline = Table("timeline", ["from s", "seconds", "step"])
    if args.clone:
        timeline.rows.append([0.0, round(setup_s, 1), "git clone + scripts/setup-venv.sh"])
    for s in steps:
        timeline.rows.append([round(setup_s + s.started_s, 1), round(s.seconds, 1), s.line])
    answers = Table("what each surface says", ["surface", "answer"])
    answers.rows += [[k, v.replace("\n", " | ")] for k, v in said.items()]
    for table in (timeline, answers):
        print(f"\n{table.title}")
        for row in table.rows:
            print("  " + "  ".join(str(c) for c in row))
    print(
        f"\nclone to N applied on the running server by watch: {applied:.0f} s "
        f"({applied / 60:.1f} min); the whole path, watch's {args.watch} included: {total:.0f} s"
    )
    summary = {
        "applied_s": round(applied, 1),
        "total_s": round(total, 1),
        "setup_s": round(setup_s, 1),
        "clone": args.clone,
        "path": "every line" if args.both_tunes else "tune --plain-url in place of tune",
        "tune_s": round(sum(s.seconds for s in steps if s.line.startswith("tuner tune")), 1),
    }
    save_run(__file__, args, summary, [timeline, answers])


if __name__ == "__main__":
    main()
