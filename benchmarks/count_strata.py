"""What `watch --experiment` reads at a count of generating slots, against what a threshold does
to the whole run: a twin world of an open-loop set served its own traffic under several N.

The experiment keeps each window by the number of slots generating and compares, at each count
where two thresholds differ, the rate drafting against the rate not drafting (tok/s there).
A step at a count either only decodes, or also reads an arriving request's prompt (the reading
slot is not generating, so the count is the same); the two kinds run at very different rates,
and drafting changes them differently: in a step that reads a long prompt, draft rows add
tokens at little extra cost, while in a step that only decodes they may cost more than they
return. Drafting also makes the reading steps longer, so more of the run is spent in them.

This runs the twin's engine (tuner.twin.engine, noise off) over the same arrivals (the world's
own traffic, Poisson or bursty, as benchmarks/watch_experiment.py --openloop makes it) under each
N, and prints, per count at or above --from: the time and tokens in reading and in decode-only
steps and their rates; the count's pooled rate (what an experiment window sees there); and the
run's slot-seconds per output token (the objective's inverse, lower better). The summary gives,
for each N against N-1, the pooled gain at count N, the decode-only gain there, and the change
of the objective: where the pooled gain and the objective disagree in sign, a per-count
experiment is misled by the mixture.

    .venv/bin/python benchmarks/count_strata.py [--world openloop-28] [--traffic bursty]
        [--n 5,6,7,8] [--requests 400] [--from 6]
"""

from __future__ import annotations

import argparse
import itertools
import sys

import common  # noqa: F401  (puts tests/ on sys.path: lab)
from lab.openworlds import load_entry_world, load_manifest
from record import Table, cell, record_arguments, save_run
from watch_experiment import OPENLOOP, variant

from tuner.policy import Policy
from tuner.twin.engine import Engine
from tuner.twin.world import World

READING, DECODE = "reading a prompt", "decode only"


def serve(world: World, n: int, requests: list, arrivals: list[float], seed: int) -> dict:
    """Per (count, kind): [seconds, tokens]; and the run's slot-seconds and tokens."""
    engine = Engine(
        world.with_updates(noise={"preset": "off"}), Policy.threshold(n, world.n_max), seed=seed
    )
    for request, at in zip(requests, arrivals, strict=True):
        engine.submit(request, at=at)
    cells: dict[tuple[int, str], list[float]] = {}
    slot_s = tokens = 0.0
    while (step := engine.step()) is not None:
        kind = READING if step.prompt_rows > 0 else DECODE
        cell = cells.setdefault((step.generating, kind), [0.0, 0.0])
        cell[0] += step.duration
        cell[1] += step.tokens
        slot_s += step.duration * step.generating
        tokens += step.tokens
    return {"cells": cells, "slot_ms_per_token": 1000.0 * slot_s / tokens}


def rate(cells: dict, count: int, kinds: tuple[str, ...]) -> float | None:
    seconds = sum(cells.get((count, k), [0.0, 0.0])[0] for k in kinds)
    tokens = sum(cells.get((count, k), [0.0, 0.0])[1] for k in kinds)
    return tokens / seconds if seconds > 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", default="openloop-28", help="a world of the open-loop set")
    parser.add_argument("--worlds", default=str(OPENLOOP), help="the set's folder")
    parser.add_argument("--traffic", choices=("poisson", "bursty"), default="bursty")
    parser.add_argument("--n", default="5,6,7,8", help="thresholds, ascending")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--from", dest="least", type=int, default=6, help="lowest count shown")
    parser.add_argument("--seed", type=int, default=3)
    record_arguments(parser)
    args = parser.parse_args()
    entries = [e for e in load_manifest(args.worlds) if e.name == args.world]
    if not entries:
        sys.exit(f"no world {args.world!r} in {args.worlds}")
    mine = variant(entries[0], args.traffic)
    world = load_entry_world(args.worlds, mine)
    workload = mine.traffic.workload(args.requests, mine.observe_seed)
    values = [int(v) for v in args.n.split(",")]
    runs = {
        n: serve(world, n, list(workload.requests), list(workload.arrivals), args.seed)
        for n in values
    }

    per_count = Table(
        f"{args.world} {args.traffic}: time and rate at each count, by kind of step",
        ["N", "count", "drafting there", "kind", "seconds", "tokens", "tok/s"],
    )
    for n in values:
        cells = runs[n]["cells"]
        for count, kind in sorted(k for k in cells if k[0] >= args.least):
            seconds, tokens = cells[(count, kind)]
            per_count.rows.append(
                [n, count, "yes" if count <= n else "no", kind, seconds, tokens,
                 tokens / seconds if seconds else None]
            )  # fmt: skip
    pairs = Table(
        "N against N-1: the gain at count N as an experiment pools it and decode-only, and "
        "the run's objective",
        ["N", "pooled gain at N, tok/s", "decode-only gain at N, tok/s",
         "reading time at N, s (N-1 / N)", "slot ms per token (N-1 / N)",
         "objective change %", "pooled gain misleads"],
    )  # fmt: skip
    misled = 0
    for low, high in itertools.pairwise(values):
        if high != low + 1:
            continue
        a, b = runs[low]["cells"], runs[high]["cells"]
        both = (READING, DECODE)
        pooled = _diff(rate(b, high, both), rate(a, high, both))
        decode = _diff(rate(b, high, (DECODE,)), rate(a, high, (DECODE,)))
        ta, tb = runs[low]["slot_ms_per_token"], runs[high]["slot_ms_per_token"]
        change = 100.0 * (ta / tb - 1.0)  # the objective is 1 / time per token
        wrong = pooled is not None and (pooled > 0) != (change > 0)
        misled += wrong
        reading = (a.get((high, READING), [0.0])[0], b.get((high, READING), [0.0])[0])
        pairs.rows.append(
            [high, pooled, decode, f"{reading[0]:.0f} / {reading[1]:.0f}",
             f"{ta:.1f} / {tb:.1f}", change, "yes" if wrong else "no"]
        )  # fmt: skip
    for table in (per_count, pairs):
        print(table.title)
        print(" | ".join(table.columns))
        for row in table.rows:
            print(" | ".join(cell(value) for value in row))
        print()
    summary = {
        "world": args.world,
        "traffic": args.traffic,
        "requests": args.requests,
        "thresholds": values,
        "pairs where the pooled gain and the objective disagree": misled,
    }
    save_run(__file__, args, summary, [per_count, pairs])


def _diff(x: float | None, y: float | None) -> float | None:
    return x - y if x is not None and y is not None else None


if __name__ == "__main__":
    main()
