"""How long a switch of the threshold disturbs what a window measures: the washout
`watch --experiment` leaves out after every switch (tuner.decide.experiment, WASHOUT_S).

A window is read count by count: at each number c of generating slots, its tok/s there (tokens
the generating slots got over the seconds spent at c). A switch leaves state behind that is not
the new N's: drafts in flight (replayed in the next step on a checkpoint target), and with a lazy
drafter the tokens each slot generated without drafting, caught up at its first draft after the
switch. Both fall on the first steps after it.

On the twin, in-process and in virtual time: for each world (--worlds; default the bench's twin,
an eager drafter with no transient, and seed-flapping, a drafter that catches up on resuming: a
known transient), a long run of Poisson arrivals at a rate that keeps about half its slots
generating, its threshold switched between two values every --period seconds (a value that
drafts at a count and one that does not). Every step is kept with the time since the last switch,
its count, whether drafts may start and its tokens. Per bin of time since the switch, the pooled
tok/s at each count against the same count's tok/s at the same threshold beyond --steady seconds
after a switch, weighted by the seconds at each count: the bias, with a 95 % interval from the
switches as blocks. The washout is the first bin edge from which on every bin's interval holds
0 or stays within +-1 %; and the experiment's washout (WASHOUT_S) set against it.

    .venv/bin/python benchmarks/washout.py [--worlds W1.toml,W2.toml] [--minutes 240] [--period 30]
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from record import Table, record_arguments, save_run
from scipy import stats

from tuner.decide.experiment import WASHOUT_S
from tuner.policy import Policy
from tuner.twin.engine import Engine, Request, arrival_offsets, request_seed
from tuner.twin.world import World, load_world

REPO = Path(__file__).resolve().parent.parent
WORLDS = ("profiles/twin/bench-smollm2-cpu.toml", "profiles/twin/seed-flapping.toml")
BINS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
PROMPT, OUTPUT = 32, 128


def switched_run(
    world: World, rate: float, minutes: float, period: float, pair: tuple[int, int], seed: int
) -> list[tuple[int, int, float, int, float, float]]:
    """Every step of one run: (switch index, threshold, seconds since the switch, count,
    seconds, tokens after each request's first)."""
    engine = Engine(world, Policy.threshold(pair[0], world.n_max), seed)
    for i, at in enumerate(arrival_offsets("poisson", rate, 60.0 * minutes, seed)):
        engine.submit(Request(PROMPT, OUTPUT, request_seed(seed, i)), at=at)
    steps = []
    switch, since, current = 0, 0.0, pair[0]
    while (step := engine.step()) is not None:
        firsts = sum(
            1 for e in step.emitted if len(engine.result(e.request).token_times) == e.tokens
        )
        steps.append(
            (
                switch,
                current,
                step.start - since,
                step.generating,
                step.duration,
                step.tokens - firsts,
            )
        )
        if engine.now - since >= period:
            switch += 1
            current = pair[switch % 2]
            engine.set_max_slots(current)
            since = engine.now
    return steps


def rate_for(world: World) -> float:
    """Poisson arrivals that keep about half the slots generating: by a short run's throughput
    at always draft (requests finish as they arrive below capacity)."""
    rate = 0.05
    for _ in range(12):
        engine = Engine(world, Policy.always(world.n_max), 1, noise=False)
        for i, at in enumerate(arrival_offsets("poisson", rate, 600.0, 1)):
            engine.submit(Request(PROMPT, OUTPUT, request_seed(1, i)), at=at)
        area, last = 0.0, 0.0
        while (step := engine.step()) is not None:
            area += step.generating * step.duration
            last = step.end
        mean = area / last if last else 0.0
        if abs(mean - world.n_parallel / 2) < 0.25:
            break
        rate *= (world.n_parallel / 2) / max(mean, 0.1)
    return rate


def biases(
    steps: list[tuple[int, int, float, int, float, float]],
    steady: float,
    bins: list[tuple[float, float]] | None = None,
) -> list[list]:
    """Per bin of time since the switch (default BINS up to `steady`): the seconds-weighted bias
    of the count rates against the steady ones (each threshold's, each count's, beyond `steady`
    seconds after a switch), its 95 % interval over the switches, and the seconds in it."""
    steady_cells: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for _, n, t, c, sec, tok in steps:
        if t >= steady and c > 0:
            steady_cells[(n, c)][0] += sec
            steady_cells[(n, c)][1] += tok
    ref = {k: v[1] / v[0] for k, v in steady_cells.items() if v[0] > 0 and v[1] > 0}
    rows = []
    for lo, hi in bins or list(itertools.pairwise([*BINS, steady])):
        per_switch: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        for sw, n, t, c, sec, tok in steps:
            if lo <= t < hi and (n, c) in ref and sec > 0:
                cell = per_switch[sw]  # seconds, tokens beyond the steady rate, expected tokens
                cell[0] += sec
                cell[1] += tok - ref[(n, c)] * sec
                cell[2] += ref[(n, c)] * sec
        blocks = [v for v in per_switch.values() if v[0] > 0]
        if len(blocks) < 3:
            continue
        expected = sum(v[2] for v in blocks)
        bias = sum(v[1] for v in blocks) / expected
        shares = [v[1] / expected * len(blocks) for v in blocks]
        q = float(stats.t.ppf(0.975, len(blocks) - 1))
        half = q * statistics.stdev(shares) / math.sqrt(len(blocks))
        seconds = sum(v[0] for v in blocks)
        rows.append([lo, hi, 100 * bias, 100 * (bias - half), 100 * (bias + half), seconds])
    return rows


def window_bias(
    steps: list[tuple[int, int, float, int, float, float]], steady: float, skip: float, end: float
) -> float:
    """The seconds-weighted bias (%) of the count rates over whole windows read from `skip`
    seconds after the switch to `end`, against the steady ones."""
    whole = biases(steps, steady, [(skip, end)])
    return float(whole[0][2]) if whole else math.nan


def washout_of(rows: list[list]) -> float:
    """The first bin edge from which on every bin holds 0 in its interval or is within 1 %."""
    for i, row in enumerate(rows):
        if all(r[3] <= 0 <= r[4] or abs(r[2]) <= 1.0 for r in rows[i:]):
            return float(row[0])
    return math.inf


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default=",".join(WORLDS))
    parser.add_argument("--minutes", type=float, default=240.0)
    parser.add_argument("--period", type=float, default=30.0, help="seconds between switches")
    parser.add_argument("--steady", type=float, default=15.0, help="seconds after a switch")
    parser.add_argument("--seed", type=int, default=0)
    record_arguments(parser)
    args = parser.parse_args()
    tables, summary = [], {"experiment washout s": WASHOUT_S}
    for path in args.worlds.split(","):
        world = load_world(REPO / path if not Path(path).is_absolute() else path)
        rate = rate_for(world)
        pair = (1, world.n_parallel)
        steps = switched_run(world, rate, args.minutes, args.period, pair, args.seed)
        rows = biases(steps, args.steady)
        wash = washout_of(rows)
        print(
            f"{world.name}: {rate:.3f} req/s, N switched {pair[0]} <-> {pair[1]} every "
            f"{args.period:g} s for {args.minutes:g} min; bias of the count rates by seconds "
            "since the switch (95 %):"
        )
        for lo, hi, b, low, high, sec in rows:
            print(
                f"  [{lo:5.2f}, {hi:5.2f}) s  {b:+6.2f} % [{low:+6.2f}, {high:+6.2f}]  {sec:7.0f} s"
            )
        # a window as the experiment reads it: from the switch, or from the washout on
        whole = window_bias(steps, args.steady, 0.0, args.period)
        washed = window_bias(steps, args.steady, WASHOUT_S, args.period)
        print(
            f"  washout: {wash:g} s; windows of {args.period:g} s read from the switch "
            f"{whole:+.2f} %, from {WASHOUT_S:g} s on (the experiment's washout) {washed:+.2f} %"
        )
        summary[f"{world.name}: washout s"] = wash
        summary[f"{world.name}: window bias without washout %"] = whole
        summary[f"{world.name}: window bias with the experiment's washout %"] = washed
        tables.append(
            Table(
                f"{world.name}: bias of the count rates after a switch",
                ["from s", "to s", "bias %", "low %", "high %", "seconds"],
                rows,
            )
        )
    save_run(__file__, args, summary, tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
