"""Benchmark: how fast the twin serves open-loop traffic, coasting against stepping.

The open-loop answer (`recommend --traffic/--rate`) and every open-loop truth serve minutes of
arrivals for each policy in the twin's decode loop. `run()` passes the steps in which nothing
drafts, reads a prompt, arrives or finishes in one go (tuner.twin.decode's `_coast`); stepping
runs the same loop one step at a time. Per world and offered rate it serves the same Poisson
arrivals under every policy both ways, --repeats times in alternation, checks that both give the
same token times to the last bit, and prints the median seconds of each with their range and the
speed-up. The load is said as the mean number of slots generating while busy.

    .venv/bin/python benchmarks/twin_speed.py [--repeats 3] [--span 900]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from record import Table, fmt, record_arguments, save_run

from tuner.policy import Policy
from tuner.twin.engine import Engine, SimResult, Workload, policies, simulate
from tuner.twin.serving import score
from tuner.twin.world import World, load_world

REPO = Path(__file__).resolve().parent.parent
# (world file, rates offered in requests/s): a light and a heavy load for each
CASES = [
    ("profiles/twin/bench-smollm2-cpu.toml", (0.05, 0.3)),
    ("profiles/twin/openloop/openloop-00.toml", (0.1, 0.5)),
    ("profiles/twin/openloop/openloop-03.toml", (0.2, 1.0)),
]
COLUMNS = [
    "world",
    "slots",
    "rate req/s",
    "mean generating",
    "policies",
    "steps",
    "coasting s (median)",
    "coasting range",
    "stepping s (median)",
    "stepping range",
    "speed-up",
    "same token times",
]


def stepped(world: World, policy: Policy, workload: Workload) -> list[list[float]]:
    """The workload served one step at a time (no coasting): each request's token times."""
    engine = Engine(world, policy, 0, noise=False)
    arrivals = zip(workload.requests, workload.arrivals, strict=True)
    ids = [engine.submit(r, at=t) for r, t in arrivals]
    while engine._step(False) is not None:
        pass
    return [engine.result(i).token_times for i in ids]


def one_case(world: World, rate: float, span: float, repeats: int) -> list:
    workload = Workload.poisson(rate, span, output_tokens=200, prompt_tokens=64, seed=1)
    every = policies(world)
    coasting: list[float] = []
    stepping: list[float] = []
    results: list[SimResult] = []
    same = True
    for p in every:  # the world's cost tables are built on first use: not timed
        simulate(world, p, Workload.closed(2, 16), noise=False)
    for _ in range(repeats):
        started = time.perf_counter()
        results = [simulate(world, p, workload, noise=False) for p in every]
        coasting.append(time.perf_counter() - started)
        started = time.perf_counter()
        times = [stepped(world, p, workload) for p in every]
        stepping.append(time.perf_counter() - started)
        pairs = zip(results, times, strict=True)
        same = same and all([r.token_times for r in res.requests] == t for res, t in pairs)
    generating = statistics.fmean(score(r).mean_generating for r in results)
    coast, step = statistics.median(coasting), statistics.median(stepping)
    print(
        f"{world.name} ({world.n_parallel} slots) at {rate:g} req/s, {generating:.1f} generating: "
        f"coasting {coast:.2f} s [{min(coasting):.2f}, {max(coasting):.2f}], stepping "
        f"{step:.2f} s [{min(stepping):.2f}, {max(stepping):.2f}], x{step / coast:.2f}"
        + ("" if same else "  DIFFERENT RESULTS"),
        flush=True,
    )
    return [
        world.name,
        world.n_parallel,
        rate,
        generating,
        len(every),
        sum(r.steps for r in results),
        coast,
        f"[{fmt(min(coasting))}, {fmt(max(coasting))}]",
        step,
        f"[{fmt(min(stepping))}, {fmt(max(stepping))}]",
        step / coast,
        "yes" if same else "NO",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--span", type=float, default=900.0, help="seconds of arrivals")
    record_arguments(parser)
    args = parser.parse_args()
    rows = [
        one_case(load_world(REPO / path), rate, args.span, args.repeats)
        for path, rates in CASES
        for rate in rates
    ]
    speedups = [row[10] for row in rows]
    all_same = all(row[11] == "yes" for row in rows)
    print(
        f"speed-up: median x{statistics.median(speedups):.2f} (x{min(speedups):.2f} to "
        f"x{max(speedups):.2f}); the same token times in every case: {all_same}"
    )
    save_run(
        __file__,
        args,
        {
            "speed-up, median": statistics.median(speedups),
            "speed-up, least": min(speedups),
            "speed-up, most": max(speedups),
            "same token times in every case": all_same,
        },
        [Table("open-loop traffic served by every policy", COLUMNS, rows)],
    )
    return 0 if all_same else 1


if __name__ == "__main__":
    raise SystemExit(main())
