#!/usr/bin/env python3
"""How often `tuner watch` changes N on a server at the edge of two answers, under bursty
traffic, with and without the guard against thrash (`--dwell` and `--margin`).

The world: the bench as a twin at a mean accepted length of 3.0, where drafting at two or three
slots gains little, so the closed truth at the traffic's weights puts more than one N within
1 % of its best (tests/test_watch_acceptance.py's tie world). It is profiled in-process (the
live switch, virtual time), then serves bursty arrivals (the twin's two-state MMPP: spells at 8x
the rate) at the rate that keeps a third of its slots generating on average, for --hours of
virtual time, on one engine whose threshold the watcher switches; observe's view of it fills the
watch's buckets. The watcher decides every --every seconds on the last three intervals, asking
the closed-loop recommend (tuner.decide.advice) on its rolling traffic. Every arm serves the same
arrivals (the same seeds) and differs only in its guard:

- unguarded: --dwell 0 --margin 0 (every answer that differs moves N);
- margin: --dwell 0 and the default --margin (1 %);
- dwell: the default --dwell (5 minutes) and --margin 0;
- guarded: the defaults, --dwell 5m and --margin 1 %.

Printed per arm and seed: N changes per hour (the first answer, a change from nothing, left
out), the answers recommend gave, and the share of time at each N; the figure is the median over
the seeds with its range. Run it under the shared lock (about two minutes a seed and virtual
hour on 2 cores).

    .venv/bin/python benchmarks/watch_thrash.py [--hours 1] [--seeds 3] [--every 60]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: F401  (puts tests/ on the path)
from lab.experiment import arrival_rate
from lab.method import HOST, twin_spec
from record import Table, fmt, record_arguments, save_run
from twinworlds import world

from tuner.decide import advice
from tuner.decide.adaptive import profile_adaptively
from tuner.decide.settle import TOLERANCE
from tuner.decide.watch import DWELL_S, EnvFile, Watcher, WatchOptions
from tuner.policy import Policy
from tuner.storage.store import Store
from tuner.traffic import ServerView, TrafficProfile
from tuner.twin.inprocess import TwinBackend
from tuner.twin.production import ServedTraffic, arrivals
from tuner.twin.truth import closed_truth
from tuner.twin.world import World

ARMS = {
    "unguarded": {"dwell_s": 0.0, "margin": 0.0},
    "margin": {"dwell_s": 0.0, "margin": 0.01},
    "dwell": {"dwell_s": DWELL_S, "margin": 0.0},
    "guarded": {"dwell_s": DWELL_S, "margin": 0.01},
}
LOAD = 0.33  # mean generating slots over -np


def edge_world() -> World:
    return world("bench").with_updates(acceptance={"synth_len": 3.0}, noise={"preset": "quiet"})


def profiled(edge: World, folder: Path) -> Store:
    store = Store(f"sqlite:///{folder / 'tuner.db'}")
    profile_adaptively(
        store, twin_spec(edge), folder, host_name=HOST,
        backend=TwinBackend(edge, switch="live"), switch="live", budget_s=600.0,
    )  # fmt: skip
    return store


class Virtual:
    """The watcher's clock: the served engine's virtual seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_arm(
    edge: World, store: Store, arm: str, seed: int, hours: float, every_s: float
) -> dict[str, Any]:
    """One watch over `hours` of bursty traffic; its changes, answers and time at each N."""
    rate = arrival_rate(edge, LOAD)
    served = ServedTraffic(edge, arrivals("mmpp", rate, seed), 0, seed=seed)
    clock = Virtual()
    view = ServerView("http://twin", edge.model_name, edge.n_parallel, "slots", True)
    options = WatchOptions(every_s=every_s, window_s=3 * every_s, min_busy_s=1.0, **ARMS[arm])
    answers: list[int] = []

    def recommend(name: str):
        rec = advice.recommend(store, edge.model_name, HOST, traffic=name, closed_loop=True)
        answers.append(rec.max_slots)
        return rec

    with tempfile.TemporaryDirectory() as env_dir:
        w = Watcher(
            store, SimpleNamespace(view=view, interval_s=0.25),  # type: ignore[arg-type]
            EnvFile(Path(env_dir) / "server.env"), f"thrash-{arm}-{seed}", options, recommend,
            clock=clock, wall=clock,
        )  # fmt: skip
        at_n: Counter[int] = Counter()
        seen = TrafficProfile(edge.n_parallel)
        intervals = round(hours * 3600.0 / every_s)
        for _ in range(intervals):
            bucket = w.rolling.open(clock.now)
            served.switch(w.current or 0)
            at_n[w.current or 0] += every_s
            served.window(every_s, bucket.profile)
            seen = seen.plus(bucket.profile)
            clock.now += every_s
            w.end_of_interval()
    changes = w.summary.changes - 1  # the first answer: a change from nothing
    return {
        "arm": arm,
        "seed": seed,
        "changes": changes,
        "per_hour": changes / hours,
        "answers": answers,
        "answer_flips": sum(a != b for a, b in itertools.pairwise(answers)),
        "time_at_n": {n: s / (intervals * every_s) for n, s in sorted(at_n.items())},
        "weights": seen.weights(edge.n_parallel),
    }


def near_best(edge: World, weights: dict[int, float]) -> tuple[int | None, list[int]]:
    """The closed truth's best N at these weights, and every N within the tolerance of it."""
    weights = {c: v for c, v in weights.items() if v > 0}
    truth = closed_truth(edge).best(weights)
    near = [
        n
        for n in range(1, edge.n_parallel + 1)
        if truth.regret(Policy.threshold(n, edge.n_max)) <= TOLERANCE
    ]
    return truth.best.max_slots, near


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.0, help="virtual hours per watch")
    parser.add_argument("--seeds", type=int, default=3, help="arrival seeds (each arm alike)")
    parser.add_argument("--every", type=float, default=60.0, help="--every of the watch, s")
    record_arguments(parser)
    args = parser.parse_args(argv)
    edge = edge_world()
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        store = profiled(edge, Path(folder))
        for seed in range(args.seeds):
            for arm in ARMS:
                row = run_arm(edge, store, arm, seed, args.hours, args.every)
                rows.append(row)
                print(
                    f"seed {seed} {arm:>9}: {row['changes']:3d} changes, "
                    f"{row['per_hour']:5.1f} an hour; recommend's answers changed "
                    f"{row['answer_flips']} times; time at N "
                    + ", ".join(f"{n}: {s:.0%}" for n, s in row["time_at_n"].items()),
                    flush=True,
                )
        store.dispose()
    best, near = near_best(edge, rows[0]["weights"])
    print(
        f"edge world: the closed truth's best N at the traffic's weights is {best}; "
        f"within {TOLERANCE:.0%} of it: {near}"
    )
    summary: dict[str, Any] = {}
    table = Table(
        "N changes an hour by guard (median over seeds, min-max)",
        ["arm", "dwell s", "margin", "median per hour", "min", "max", "answers changed (median)"],
    )
    for arm, guard in ARMS.items():
        mine = [r for r in rows if r["arm"] == arm]
        per_hour = [r["per_hour"] for r in mine]
        flips = statistics.median(r["answer_flips"] for r in mine)
        median = statistics.median(per_hour)
        summary[f"{arm}: changes per hour (median)"] = median
        table.rows.append(
            [arm, guard["dwell_s"], guard["margin"], median, min(per_hour), max(per_hour), flips]
        )
        print(
            f"{arm:>9} (dwell {guard['dwell_s']:.0f} s, margin {guard['margin']:.0%}): "
            f"{fmt(median, '.1f')} changes an hour (median of {len(mine)}; "
            f"{fmt(min(per_hour), '.1f')} to {fmt(max(per_hour), '.1f')})"
        )
    summary.update(
        {"hours": args.hours, "seeds": args.seeds, "every_s": args.every, "truth_near_best": near}
    )
    runs = Table(
        "every watch",
        ["arm", "seed", "changes", "per hour", "answers changed", "time at each N"],
        [
            [r["arm"], r["seed"], r["changes"], r["per_hour"], r["answer_flips"],
             ", ".join(f"{n}: {s:.2f}" for n, s in r["time_at_n"].items())]
            for r in rows
        ],
    )  # fmt: skip
    print(f"({time.monotonic() - started:.0f} s)")
    save_run(__file__, args, summary, [table, runs])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
