"""`tuner watch --experiment`: is N, settled on the server's own traffic, within 1 % of the
open-loop best after at most 30 simulated minutes, and what did it cost the users?

Twin mode (the default): for every world of a set (--worlds, default profiles/twin/frozen) and
each traffic (--traffic poisson,bursty), arrivals at the rate that keeps --load of the slots
generating on average under always draft; the experiment runs in-process in virtual time
(tests/lab/experiment.py over tuner.twin.production) from what watch stands on (--start model:
five minutes of the traffic observed at always draft, the world profiled in-process and
`recommend --traffic --objective tpot` on it: the standing N and the model's tie set), or from
an N one or two away from the truth's best (--start offset, drawn per world) or at it (--start
best), for at most --minutes of traffic in all; the truth is every N's noise-free mean time
per output token under the same kind of arrivals (tuner.twin.truth.open_loop_truth for
Poisson). Per world: the answer,
its regret, how the experiment ended, the minutes it served, the cost to users (share of time
and of requests at a contender, their time per output token against the standing N's) and the
changes of N. Summary: the share of worlds within 1 %, the mean cost, flaps (N changed more
than once in one settled experiment, or went back).

Bench mode (--bench): `tuner watch --experiment` against a running patched llama-server under
the bench's open-loop load for --minutes (the lead runs it): prints its log, checks that it
switched, that N is restored on exit and that every verdict carries its bounds.

    .venv/bin/python benchmarks/watch_experiment.py [--worlds DIR] [--select a,b]
        [--traffic poisson,bursty] [--load 0.5] [--minutes 30] [--start offset|best]
    .venv/bin/python benchmarks/watch_experiment.py --bench --minutes 20
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts tests/ on sys.path: lab)
from lab.experiment import (
    TRAFFIC,
    arrival_rate,
    grade,
    model_start,
    open_loop_best,
    run_experiment,
)
from lab.frozen import load_entry_world, load_manifest, select
from record import Table, fmt, record_arguments, save_run

from tuner.decide.experiment import ExperimentOptions

REPO = Path(__file__).resolve().parent.parent
FROZEN = REPO / "profiles" / "twin" / "frozen"
WITHIN = 0.01


def start_of(best: int, n_parallel: int, how: str, rng: random.Random) -> int:
    if how == "best":
        return best
    offsets = [d for d in (-2, -1, 1, 2) if 1 <= best + d <= n_parallel]
    return best + rng.choice(offsets) if offsets else best


def twin(args: argparse.Namespace) -> None:
    entries = select(load_manifest(args.worlds), args.select)
    kinds = [t.strip() for t in args.traffic.split(",") if t.strip()]
    for kind in kinds:
        if kind not in TRAFFIC:
            sys.exit(f"--traffic {kind!r}: known are {', '.join(TRAFFIC)}")
    rows: list[list] = []
    started = time.monotonic()
    for entry in entries:
        world = load_entry_world(args.worlds, entry)
        rate = arrival_rate(world, args.load)
        for kind in kinds:
            truth = open_loop_best(world, kind, rate)
            best = min(truth, key=lambda n: (truth[n], n))
            seed = entry.seed + args.seed
            budget = 60.0 * args.minutes
            tie: list[int] = []
            served = None
            if args.start == "model":
                with tempfile.TemporaryDirectory(prefix="tuner-watch-") as tmp:
                    began = model_start(world, kind, rate, Path(tmp), seed=seed)
                start, tie, served = began.standing, began.tie, began.served
                budget -= served.elapsed
                start = start or world.n_parallel
            else:
                rng = random.Random(f"start:{entry.name}:{kind}:{args.seed}")
                start = start_of(best, world.n_parallel, args.start, rng)
            options = ExperimentOptions(budget_s=budget, seed=seed, always=args.always)
            report, seconds = run_experiment(
                world, kind, rate, start, seed=seed, options=options, tie=tie, served=served
            )
            graded = grade(report, truth, seconds + (served.elapsed - seconds if served else 0.0))
            cost = report.cost
            rows.append(
                [
                    entry.name,
                    kind,
                    round(rate, 4),
                    best,
                    start,
                    report.answer or world.n_parallel,
                    report.status,
                    100 * graded.regret,
                    graded.minutes,
                    100 * cost.away_s / cost.seconds if cost.seconds else None,
                    100 * cost.requests_away / cost.requests if cost.requests else None,
                    100 * cost.tpot_ratio if cost.tpot_ratio is not None else None,
                    graded.changes,
                ]
            )
            r = rows[-1]
            print(
                f"{entry.name:<12} {kind:<8} rate {rate:6.3f}  best N={best:<2} start N={start:<2}"
                f" -> N={r[5]:<2} {report.status:<10} regret {fmt(r[7], '5.2f')} %  "
                f"{r[8]:5.1f} min  away {fmt(r[9], '.0f')} % of time, {fmt(r[10], '.0f')} % of "
                f"requests, TPOT {fmt(r[11], '+.1f')} %  changes {r[12]}",
                flush=True,
            )
    within = [r for r in rows if r[7] <= 100 * WITHIN + 1e-9]
    flaps = [r for r in rows if r[12] > 1]
    share = len(within) / len(rows) if rows else 0.0
    print(
        f"\nwithin 1 % of the open-loop best: {len(within)} of {len(rows)} ({share:.0%}); "
        f"flaps (more than one change of N): {len(flaps)}; "
        f"{time.monotonic() - started:.0f} s"
    )
    by_kind = {}
    for kind in kinds:
        mine = [r for r in rows if r[1] == kind]
        if not mine:
            continue
        by_kind[kind] = sum(r[7] <= 100 * WITHIN + 1e-9 for r in mine) / len(mine)
        away = [r[9] for r in mine if r[9] is not None]
        tpot = [r[11] for r in mine if r[11] is not None]
        print(
            f"  {kind}: {by_kind[kind]:.0%} within 1 %; mean {statistics.fmean(away):.0f} % of the "
            f"time at a contender, their TPOT {statistics.fmean(tpot):+.1f} % on average"
            if away and tpot
            else f"  {kind}: {by_kind[kind]:.0%} within 1 %"
        )
    summary = {
        "worlds x traffic": len(rows),
        "within 1 % of the open-loop best (share)": share,
        **{f"within 1 %, {k} (share)": v for k, v in by_kind.items()},
        "flaps": len(flaps),
        "load (mean generating share under always draft)": args.load,
        "minutes of traffic at most": args.minutes,
        "start": args.start,
    }
    columns = [
        "world", "traffic", "rate", "best N", "start N", "answer", "status", "regret %",
        "minutes", "time away %", "requests away %", "contender TPOT %", "changes",
    ]  # fmt: skip
    save_run(__file__, args, summary, [Table("per world and traffic", columns, rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=Path, default=FROZEN)
    parser.add_argument("--select", default=None, help="world names, comma-separated")
    parser.add_argument("--traffic", default="poisson,bursty")
    parser.add_argument("--load", type=float, default=0.5)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--start", choices=("model", "offset", "best"), default="model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--always", action="store_true", help="always draft a contender too (the default's)"
    )
    parser.add_argument("--bench", action="store_true", help="against the real bench server")
    record_arguments(parser)
    args = parser.parse_args()
    if args.bench:
        sys.exit("--bench: not written yet")
    twin(args)


if __name__ == "__main__":
    main()
