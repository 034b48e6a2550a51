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
changes of N, whether the truth sits on a tie (another N within 1 % of its best) and the start
within it. Summary: the share of worlds within 1 %, the mean cost, and flaps: on a tie, started
within it, N changed more than once (it never moves back within one experiment by its rule; a
walk from outside the tie to it may take two moves and is no flap).

Bench mode (--bench; the lead runs it, it needs the machine to itself): the bench spec profiled
into a fresh database (or --db holding it), a patched drafting llama-server of the spec started
with --props --metrics at the model's answer, the bench's open-loop load (Poisson arrivals at
two rates in turn, each for half of --minutes: those the cost model says keep --loads of the
slots generating, a quarter and 60 % by default; the spec's requests), and `tuner watch --apply
live --experiment` (the CLI, as a user runs it) beside it for the same time. Afterwards: that it
switched (windows at a contender in the stored experiments), that the server's threshold is the
env file's (given back, or moved by a verdict and applied) with no hold left behind, that every
verdict line carries its bounds; the windows, the verdicts and the cost to users are recorded.

    .venv/bin/python benchmarks/watch_experiment.py [--worlds DIR] [--select a,b]
        [--traffic poisson,bursty] [--load 0.5] [--minutes 30] [--start offset|best]
    .venv/bin/python benchmarks/watch_experiment.py --bench --minutes 20 [--db URL]
        [--loads 0.25,0.6]

Twin mode with --openloop grades an open-loop set (--worlds profiles/twin/openloop2 for version
2) with each world's own traffic (its rate, lengths and content classes) under Poisson and
bursty arrivals (--traffic), --seeds seeds each, against that traffic's open-loop truth
(thresholds only: plain is out of the experiment's reach): besides the share within 1 %, the
coverage of "settled" (the settled answers within 1 % of the best threshold) and, where the
start was 5 % or more behind at 0.1 requests/s or more, the share within 1 % at the end.
Seeds can run apart and be graded together: `--first-seed 1 --seeds 2` runs the second and
third seeds (each world profiled from its first seed's traffic, as in one run of all three),
and `--pool RUN ...` (files, or their date stems) grades the cases of several runs of one set
as one run.
A bench smoke run (a few minutes, the machine to itself):
`--bench --minutes 3 --every 1`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts tests/ on sys.path: lab)
from lab.experiment import (
    OUTPUT_TOKENS,
    TRAFFIC,
    arrival_rate,
    arrivals_of,
    grade,
    model_start,
    open_loop_best,
    profiled,
    run_experiment,
)
from lab.frozen import load_entry_world, load_manifest, select
from record import Table, fmt, record_arguments, save_run
from scipy import stats

from tuner.decide import settle
from tuner.decide.experiment import ExperimentOptions
from tuner.decide.objective import ObjectiveKind
from tuner.errors import TunerError
from tuner.twin.engine import Workload
from tuner.twin.production import ServedTraffic
from tuner.twin.world import World

REPO = Path(__file__).resolve().parent.parent
FROZEN = REPO / "profiles" / "twin" / "frozen"
OPENLOOP = REPO / "profiles" / "twin" / "openloop"
WITHIN = 0.01


def start_of(best: int, n_parallel: int, how: str, rng: random.Random) -> int:
    if how == "best":
        return best
    offsets = [d for d in (-2, -1, 1, 2) if 1 <= best + d <= n_parallel]
    return best + rng.choice(offsets) if offsets else best


@dataclass
class Case:
    """One world under one traffic to grade: the world, the rate, the truth (mean TPOT by N,
    N = -np always draft), the world serving the traffic from a threshold (noise on, the
    method's seed), the traffic's mean output length."""

    name: str
    kind: str
    world: World
    rate: float
    seed: int
    truth: dict[int, float]
    served: Callable[[int], ServedTraffic]
    output_tokens: float
    profile_seed: int | None = None  # the world's profile's, where not seed: one for its seeds


def _served_kind(world: World, kind: str, rate: float, seed: int, n: int) -> ServedTraffic:
    return ServedTraffic(world, arrivals_of(kind, rate, seed), n, seed=seed)


def _served_workload(world: World, workload: Workload, seed: int, n: int) -> ServedTraffic:
    return ServedTraffic(world, workload, n, seed=seed)


def frozen_cases(args: argparse.Namespace) -> Iterator[Case]:
    """The frozen set's worlds under each --traffic kind at --load (see the docstring)."""
    kinds = [t.strip() for t in args.traffic.split(",") if t.strip()]
    for kind in kinds:
        if kind not in TRAFFIC:
            sys.exit(f"--traffic {kind!r}: known are {', '.join(TRAFFIC)}")
    for entry in select(load_manifest(args.worlds), args.select):
        world = load_entry_world(args.worlds, entry)
        rate = arrival_rate(world, args.load)
        seed = entry.seed + args.seed
        for kind in kinds:
            truth = open_loop_best(world, kind, rate, duration_s=args.truth_s)
            served = partial(_served_kind, world, kind, rate, seed)
            yield Case(entry.name, kind, world, rate, seed, truth, served, OUTPUT_TOKENS)


BURSTS = {"peak": 8.0, "busy_share": 0.2, "busy_gaps": 30.0}  # --openloop's bursty arrivals


def variant(entry: Any, kind: str) -> Any:
    """An open-loop world's entry with its traffic's arrivals made `kind`: poisson, or bursty
    (a two-state MMPP, BURSTS: busy spells at 8 times the quiet rate, a fifth of the time, each
    as long as 30 mean gaps); its rate, lengths and content classes its own."""
    t = entry.traffic
    if kind == "poisson":
        traffic = dataclasses.replace(t, arrivals="poisson")
    else:
        busy_s = round(BURSTS["busy_gaps"] / t.rate, 1)
        traffic = dataclasses.replace(
            t, arrivals="mmpp", peak=BURSTS["peak"], busy_share=BURSTS["busy_share"], busy_s=busy_s
        )
    return dataclasses.replace(entry, traffic=traffic)


def threshold_values(truth: dict[str, Any], n_parallel: int) -> dict[int, float]:
    """Every threshold's figure to grade by (lower better; N = -np always draft): its mean time
    per output token where it keeps up; infinite where the arrivals outrun it and another keeps
    up; where every threshold is overloaded, 1000 / its throughput (the one that serves most
    first): the best it can serve, plain out of its reach."""
    labels = [k for k in truth["values"] if k.startswith("N=")]
    over = set(truth["overloaded"])
    all_over = all(k in over for k in labels)
    out = {}
    for label in labels:
        n = int(label[2:]) or n_parallel
        if all_over:
            out[n] = 1000.0 / truth["tokens_per_second"][label]
        else:
            out[n] = math.inf if label in over else truth["values"][label]
    return out


def openloop_cases(args: argparse.Namespace) -> Iterator[Case]:
    """An open-loop set's worlds, each with its own traffic (lab.openworlds: rate, prompt and
    output lengths, content classes) under each --traffic kind's arrivals and --seeds seeds; the
    truth openloop_regret's (that traffic, cached), thresholds only: plain is out of reach."""
    from lab.openworlds import load_manifest as load_open_manifest
    from openloop_regret import world_truth

    kinds = [t.strip() for t in args.traffic.split(",") if t.strip()]
    for entry in select(load_open_manifest(args.worlds), args.select):
        for kind in kinds:
            mine = variant(entry, kind)
            world, truth = world_truth(str(args.worlds), mine, str(args.truth_dir))
            thresholds = threshold_values(truth, world.n_parallel)
            output = mine.traffic.output
            mean_output = output.median * math.exp(output.sigma**2 / 2)
            for k in range(args.first_seed, args.first_seed + args.seeds):
                count = int(mine.rate * 60.0 * args.minutes * 1.5) + 100
                workload = mine.traffic.workload(count, mine.observe_seed + k)
                seed = mine.seed + k
                served = partial(_served_workload, world, workload, seed)
                yield Case(
                    entry.name,
                    kind,
                    world,
                    mine.rate,
                    seed,
                    thresholds,
                    served,
                    mean_output,
                    profile_seed=mine.seed,
                )


def graded(case: Case, args: argparse.Namespace, db: str) -> list:
    """The experiment on one case, from the model's answer (db: the world's profile) or an
    offset from the truth's best: its row."""
    world, truth = case.world, case.truth
    best = min(truth, key=lambda n: (truth[n], n))
    budget, tie, output = 60.0 * args.minutes, [], case.output_tokens
    served = case.served(0)
    if args.start == "model":
        try:
            began = model_start(world, served, case.rate, db, seed=case.seed)
        except (TunerError, TypeError, ValueError) as exc:
            # recommend --objective tpot fails on some fits (a bootstrap replicate with no
            # tok/s at a level); watch's default objective answers instead
            print(f"{case.name} {case.kind}: --objective tpot failed ({exc}); tps instead")
            served = case.served(0)
            began = model_start(
                world, served, case.rate, db, seed=case.seed, objective=ObjectiveKind.TPS
            )
        start, tie = began.standing or world.n_parallel, began.tie
        output = began.traffic.mean_output_tokens or output
        budget -= served.elapsed
    else:
        rng = random.Random(f"start:{case.name}:{case.kind}:{args.seed}")
        start = start_of(best, world.n_parallel, args.start, rng)
        served.switch(start)
    options = ExperimentOptions(
        budget_s=budget,
        seed=case.seed,
        always=args.always,
        reach=args.reach,
        max_moves=args.max_moves,
        share=args.share,
        max_window_s=args.max_window,
        min_tokens=args.min_tokens,
    )
    report, _ = run_experiment(
        world, case.kind, case.rate, start, seed=case.seed, options=options, tie=tie,
        served=served, output_tokens=output,
    )  # fmt: skip
    # the minutes of traffic in all: the observation at the start included
    result = grade(report, truth, served.elapsed)
    near = sorted(n for n, v in truth.items() if v <= truth[best] * (1 + WITHIN))
    cost = report.cost
    row = [
        case.name,
        case.kind,
        round(case.rate, 4),
        best,
        start,
        report.answer or world.n_parallel,
        report.status,
        100 * result.regret,
        result.minutes,
        100 * cost.away_s / cost.seconds if cost.seconds else None,
        100 * cost.requests_away / cost.requests if cost.requests else None,
        100 * cost.tpot_ratio if cost.tpot_ratio is not None else None,
        result.changes,
        len(near) > 1,
        start in near,
        100 * (truth[start] / truth[best] - 1.0),
        case.seed,
        *why_behind(report, truth, world.n_parallel),
    ]
    print(
        f"{case.name:<12} {case.kind:<8} rate {case.rate:6.3f}  best N={best:<2} start N={start:<2}"
        f" -> N={row[5]:<2} {report.status:<10} regret {fmt(row[7], '5.2f')} %  "
        f"{row[8]:5.1f} min  away {fmt(row[9], '.0f')} % of time, {fmt(row[10], '.0f')} % of "
        f"requests, TPOT {fmt(row[11], '+.1f')} %  changes {row[12]}",
        flush=True,
    )
    if args.explain:
        explain(report)
    return row


def why_behind(report: Any, truth: dict[int, float], n_parallel: int) -> tuple[str, float | None]:
    """Why an answer more than 1 % behind the truth's best is still there, in the experiment's
    own figures, and the minutes more of this traffic it says the contender ahead nearest a
    verdict needs: to tell its sides apart where it has bounds, to give its counts their data
    where it has none (None where neither applies). The contenders ahead are those the truth
    puts more than 1 % ahead of the answer."""

    def value(n: int) -> int:  # as the truth keys N: always draft is n_parallel
        return n or n_parallel

    answer = value(report.answer)
    if truth[answer] <= min(truth.values()) * (1 + WITHIN):
        return "", None
    ahead = {m for m in truth if truth[m] * (1 + WITHIN) < truth[answer]}
    told = [more for n, more in report.to_tell.items() if value(n) in ahead]
    waits = {value(n): more for n, more in report.to_wait.items() if value(n) in ahead}
    if report.status != settle.OPEN:
        return f"{report.status}", min(told, default=None)
    if told:
        return "needs more traffic to tell", min(told)
    if any(more is not None for more in waits.values()):
        return "needs more traffic at its counts", min(m for m in waits.values() if m is not None)
    if waits:
        return "its counts not reached by the traffic", None
    if {value(n) for n in report.confounded} & ahead:
        return "contender ahead confounded by reading steps", None
    return "no contender ahead within reach", None


def explain(report: Any) -> None:
    """A case's last verdicts with their bounds, its notes, and its windows by contender."""
    for line in report.verdicts() + report.notes:
        print(f"    {line}")
    by: dict[int, list[float]] = {}
    for planned, figures in report.windows:
        if planned.contender:
            by.setdefault(figures.n, []).append(figures.seconds)
    said = ", ".join(f"N={n}: {len(s)} ({sum(s):.0f} s)" for n, s in sorted(by.items()))
    print(f"    contender windows: {said or 'none'}; untested {report.untested}", flush=True)


def twin(args: argparse.Namespace) -> None:
    rows: list[list] = []
    started = time.monotonic()
    cases = openloop_cases(args) if args.openloop else frozen_cases(args)
    profiles: dict[str, str] = {}
    folder = Path(tempfile.mkdtemp(prefix="tuner-watch-"))
    skipped: list[str] = []
    for case in cases:
        if args.start == "model" and case.name not in profiles:
            seed = case.seed if case.profile_seed is None else case.profile_seed
            profiles[case.name] = profiled(case.world, folder / case.name, seed=seed)
        try:
            rows.append(graded(case, args, profiles.get(case.name, "")))
        except TunerError as exc:  # no answer to start from: said, and counted
            print(f"{case.name} {case.kind}: skipped: {exc}", flush=True)
            skipped.append(f"{case.name} {case.kind}")
    shutil.rmtree(folder, ignore_errors=True)
    summarize(rows, skipped, args, f"{time.monotonic() - started:.0f} s")


COLUMNS = [
    "world", "traffic", "rate", "best N", "start N", "answer", "status", "regret %",
    "minutes", "time away %", "requests away %", "contender TPOT %", "changes", "tie",
    "start in tie", "start regret %", "seed", "why behind", "minutes more needed",
]  # fmt: skip


def pooled(args: argparse.Namespace) -> None:
    """--pool: the cases of several runs' files (other seeds of one set and traffic) graded as
    one run, each file named with the checkout it ran. A case (world, traffic, seed) in two
    files is the newer file's: a case run again (its seeds make it the same run) with columns
    added since, say; how many were taken from newer files is said."""
    import json

    records = {}
    for name in args.pool:
        # a file, or a run's date stem under the results folder (2026-12-06T13-01-04Z)
        path = Path(name)
        if not path.exists():
            path = Path(args.results_dir) / Path(__file__).stem / f"{name}.json"
        if not path.exists():
            sys.exit(f"--pool {name}: no such file, nor a run of this benchmark by that name")
        records[path] = json.loads(path.read_text())
    by_case: dict[tuple[str, str, int], list] = {}
    replaced = 0
    skipped: list[str] = []
    for path, record in sorted(records.items(), key=lambda item: item[1]["date"]):
        table = record["tables"][0]
        known = len(table["columns"])  # runs before the last columns were added lack them
        if table["columns"] != COLUMNS[:known] or known < COLUMNS.index("why behind"):
            sys.exit(f"{path}: not a run of this benchmark's table")
        for row in table["rows"]:
            replaced += (row[0], row[1], row[16]) in by_case
            by_case[(row[0], row[1], row[16])] = row + [None] * (len(COLUMNS) - known)
        found = record["summary"].get("skipped (no answer to start from)", "none")
        skipped.extend([] if found == "none" else found.split(", "))
    rows = list(by_case.values())
    sets = {record["summary"]["set"] for record in records.values()}
    if len(sets) != 1:
        sys.exit(f"--pool: the files grade different sets: {', '.join(sorted(sets))}")
    if replaced:
        print(f"--pool: {replaced} case(s) in two files: the newer file's row is kept")
    args.worlds = Path(sets.pop())
    args.openloop = True  # only open-loop runs take seeds apart
    args.seeds = max(Counter((r[0], r[1]) for r in rows).values())
    sources = ", ".join(f"{p.stem} ({r['version']['checkout']})" for p, r in records.items())
    noted = {"pooled from": sources, "cases taken from a newer file": replaced}
    summarize(rows, skipped, args, f"pooled from {sources}", noted)


def summarize(
    rows: list[list],
    skipped: list[str],
    args: argparse.Namespace,
    took: str,
    noted: dict[str, Any] | None = None,
) -> None:
    """The grading of rows (one per world, traffic and seed): printed (took: how long it took,
    or where it came from), and saved with noted in its summary."""
    kinds = sorted({r[1] for r in rows})
    within = [r for r in rows if r[7] <= 100 * WITHIN + 1e-9]
    ties = [r for r in rows if r[13]]
    # a flap: N changed more than once where it started within the truth's tie (a walk from
    # outside it to the best may take two moves and is none)
    flaps = [r for r in ties if r[14] and r[12] > 1]
    share = len(within) / len(rows) if rows else 0.0
    settled = [r for r in rows if r[6] == "settled"]
    right = [r for r in settled if r[7] <= 100 * WITHIN + 1e-9]
    behind = [r for r in rows if r[15] >= 5.0 and r[2] >= 0.1]
    reached = [r for r in behind if r[7] <= 100 * WITHIN + 1e-9]
    coverage = len(right) / len(settled) if settled else None
    # what so few settled cases can show: the coverage's one-sided 95 % lower bound (exact,
    # Clopper-Pearson), beside the 95 % the issue asks for
    floor = (
        stats.binomtest(len(right), len(settled), alternative="greater").proportion_ci(0.95).low
        if settled
        else 0.0
    )
    moved = len(reached) / len(behind) if behind else None
    print(
        f"\nwithin 1 % of the open-loop best: {len(within)} of {len(rows)} ({share:.0%}); "
        f"truth on a tie (another N within 1 %): {len(ties)}, of them started within it and N "
        f"changed more than once (flaps): {len(flaps)}; {took}\n"
        f"settled: {len(settled)} of {len(rows)}; coverage of settled (within 1 % of the best "
        f"it can serve): {len(right)} of {len(settled)}"
        + (f" ({coverage:.1%}, at least {floor:.1%} at 95 %)" if coverage is not None else "")
        + f"; started 5 % or more behind at 0.1 req/s or more: {len(behind)}, of them within "
        f"1 % of the best at the end: {len(reached)}"
        + (f" ({moved:.0%})" if moved is not None else "")
    )
    for r in settled:
        if r not in right:
            print(f"  settled but {r[7]:.1f} % behind: {r[0]} {r[1]} seed {r[16]} N={r[5]}")
    # why the cases that started behind did not reach the best: the experiment's own account
    stuck = [r for r in behind if r not in reached and r[17] is not None]
    reasons = Counter(r[17] for r in stuck)
    # the minutes more of the traffic each reason's cases said they needed, median and least
    needs = {
        why: minutes
        for why in reasons
        if (minutes := sorted(r[18] for r in stuck if r[17] == why and r[18] is not None))
    }
    if stuck:
        print(
            "  started behind, not reached: "
            + ", ".join(f"{why} {n}" for why, n in reasons.most_common())
            + "".join(
                f"; {why}: median {statistics.median(m):.0f} minutes more, least {m[0]:.0f}"
                for why, m in needs.items()
            )
            + f" (of {args.minutes:g} in all)"
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
        "settled": len(settled),
        "coverage of settled (share within 1 %)": coverage,
        "coverage of settled, one-sided 95 % lower bound": floor if settled else None,
        "started 5 % or more behind at 0.1 req/s or more": len(behind),
        "of them within 1 % at the end (share)": moved,
        **{f"started behind, not reached: {why}": n for why, n in reasons.items()},
        **{
            f"started behind, not reached: {why}: median minutes more": statistics.median(m)
            for why, m in needs.items()
        },
        **{f"within 1 %, {k} (share)": v for k, v in by_kind.items()},
        "truth on a tie": len(ties),
        "flaps (on a tie, started within it, N changed more than once)": len(flaps),
        "set": args.worlds.name,
        "seeds": args.seeds if args.openloop else 1,
        "skipped (no answer to start from)": ", ".join(skipped) or "none",
        "load (mean generating share under always draft)": None if args.openloop else args.load,
        "minutes of traffic at most": args.minutes,
        "start": args.start,
        **(noted or {}),
    }
    save_run(__file__, args, summary, [Table("per world and traffic", COLUMNS, rows)])


def bench(args: argparse.Namespace) -> None:
    """`tuner watch --experiment` against the real bench (see the module docstring)."""
    import re
    import socket
    import threading

    from common import tuner, tuner_env
    from tunerproc import finish, start_tuner

    from tuner.bench import load_bench
    from tuner.decide.advice import standing
    from tuner.measure.arrivals import poisson_offsets
    from tuner.measure.client import LlamaClient
    from tuner.measure.hold import hold_paths
    from tuner.measure.launcher import ManagedServer
    from tuner.measure.load import LoadGenerator, Workload
    from tuner.measure.plan import launch_config
    from tuner.measure.spec import load_spec
    from tuner.model import queue
    from tuner.policy import Policy
    from tuner.settings import Settings
    from tuner.storage.fits import current_fit
    from tuner.storage.store import Store
    from tuner.storage.traffic_profiles import stored_dict

    spec_path, model = args.spec, args.model
    work = Path(tempfile.mkdtemp(prefix="tuner-watch-experiment-"))
    db = args.db or f"sqlite:///{work / 'tuner.db'}"
    env = tuner_env(db, work / "cache", TUNER_STATE_DIR=str(work / "state"))
    if not args.db:
        began = time.monotonic()
        tuner(env, "profile", str(spec_path))
        print(f"profile: {time.monotonic() - began:.0f} s", flush=True)
    host = socket.gethostname()
    store = Store(db)
    answer = standing(store, model, host)
    cm = current_fit(store, model, host).model
    spec = load_spec(spec_path, [], lambda: load_bench(Settings().bench_manifest_path).as_refs())
    length = float(spec.workload.max_tokens)
    tps = cm.policy_tps(cm.levels, answer.policy)
    loads = [float(x) for x in args.loads.split(",")]
    rates = [queue.rate_for_mean_generating(tps, length, cm.n_parallel * x) for x in loads]
    turn_s = 60.0 * args.minutes / len(rates)  # each rate in turn, an equal share of the run
    config = launch_config(spec, Policy.of_max_slots(answer.max_slots, spec.speculative.n_max))
    config.args += ["--props", "--metrics"]
    env_file = work / "server.env"
    env_file.write_text(f"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS={answer.max_slots}\n")
    print(
        f"standing N={answer.max_slots}; Poisson arrivals at "
        + " then ".join(f"{r:.3f}/s" for r in rates)
        + f", {turn_s:.0f} s each",
        flush=True,
    )
    stop = threading.Event()
    served: list = []
    with ManagedServer(config, work / "server.log", start_timeout_s=180) as server:

        def offer() -> None:
            generator = LoadGenerator(
                server.url,
                Workload(prompt_tokens=spec.workload.prompt_tokens, max_tokens=int(length)),
            )
            key, began = 0, time.monotonic()
            while not stop.is_set():
                turn = min(len(rates) - 1, int((time.monotonic() - began) / turn_s))
                span = min(300.0, turn_s)
                offsets = poisson_offsets(rates[turn], span, seed=args.seed * 1000 + key)
                served.extend(generator.run_arrivals(offsets, round_key=key)[1])
                key += 1

        load = threading.Thread(target=offer, daemon=True)
        load.start()
        name = "bench-experiment"
        proc = start_tuner(
            [
                "watch", "--model", model, "--url", server.url, "--env-file", str(env_file),
                "--apply", "live", "--experiment", "--every", f"{args.every:g}m", "--name", name,
                "--duration", f"{args.minutes:g}m",
                "--experiment-budget", f"{args.minutes - args.every:g}m",
            ],
            env,
        )  # fmt: skip
        watched = finish(proc, timeout_s=60.0 * args.minutes + 900)
        stop.set()
        with LlamaClient(server.url) as api:
            after = api.max_slots()
        load.join(timeout=600)
    log = watched.stdout + watched.stderr
    print(log[-6000:])
    stored = stored_dict(store, name) or {}
    store.dispose()
    experiments = stored.get("experiments") or []
    windows = [w for e in experiments for w in e.get("windows", [])]
    switched = any(w.get("contender") for w in windows)
    env_n = int(env_file.read_text().strip().rsplit("=", 1)[-1])
    restored = after == env_n and not hold_paths(server.url, work / "state")[1].exists()
    verdicts = [line for line in log.splitlines() if re.search(r"experiment: N=\d+ against", line)]
    # a verdict carries its one-sided bounds, or says its comparison was not measured enough
    bounded = bool(verdicts) and all(
        re.search(r"\[[-+0-9.]+, [-+0-9.]+\]", v) or "not measured enough" in v for v in verdicts
    )
    print(
        f"exit {watched.returncode}; {len(experiments)} experiment(s), {len(windows)} windows, "
        f"switched: {switched}; server at N={after}, env file N={env_n}: restored {restored}; "
        f"{len(verdicts)} verdicts, all with bounds: {bounded}; {len(served)} requests offered"
    )
    costs = [e["cost"] for e in experiments]
    summary = {
        "exit status": watched.returncode,
        "experiments": len(experiments),
        "windows": len(windows),
        "switched": switched,
        "restored": restored,
        "verdicts with bounds": bounded,
        "standing N": answer.max_slots,
        "answer N": env_n,
        "rates /s": ", ".join(f"{r:.3f}" for r in rates),
        "minutes": args.minutes,
    }
    cost_rows = [
        [
            e["start"], e["answer"], e["status"], c["seconds"],
            100 * c["away_s"] / c["seconds"] if c["seconds"] else None,
            100 * c["requests_away"] / c["requests"] if c["requests"] else None,
            100 * c["tpot_ratio"] if c["tpot_ratio"] is not None else None,
        ]
        for e, c in zip(experiments, costs, strict=True)
    ]  # fmt: skip
    verdict_rows = [
        [c["contender"], c.get("against"), c["advantage"], c["lower"], c["upper"], c["verdict"]]
        for e in experiments
        for c in e["comparisons"] + e["questions"]
    ]
    save_run(
        __file__,
        args,
        summary,
        [
            Table(
                "experiments and their cost to users",
                [
                    "from N",
                    "to N",
                    "status",
                    "seconds",
                    "time away %",
                    "requests away %",
                    "contender TPOT %",
                ],
                cost_rows,
            ),
            Table(
                "verdicts (advantage in the objective's units, one-sided 95 % bounds)",
                ["contender", "against", "advantage", "lower", "upper", "verdict"],
                verdict_rows,
            ),
        ],
    )
    if not (watched.returncode == 0 and switched and restored and bounded):
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=Path, default=None, help="the set's folder")
    parser.add_argument(
        "--openloop",
        action="store_true",
        help="the open-loop set (profiles/twin/openloop), each world under its own traffic",
    )
    parser.add_argument(
        "--truth-dir",
        type=Path,
        default=REPO / "out" / "openloop-regret.truth",
        help="--openloop: where the truths are cached (openloop_regret's)",
    )
    parser.add_argument("--select", default=None, help="world names, comma-separated")
    parser.add_argument("--traffic", default="poisson,bursty")
    parser.add_argument("--load", type=float, default=0.5)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--start", choices=("model", "offset", "best"), default="model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--seeds", type=int, default=1, help="--openloop: seeds a world and traffic (3 for the set)"
    )
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="--openloop: the first of the --seeds (0): runs of other seeds to --pool later",
    )
    parser.add_argument(
        "--pool",
        nargs="+",
        metavar="RUN",
        help="grade the cases of these runs (JSON files, or their date stems under the results "
        "folder) as one run: other seeds of one set",
    )
    parser.add_argument(
        "--truth-s",
        type=float,
        default=3600.0,
        help="simulated seconds of the truth's run of every N (the same arrivals for each)",
    )
    parser.add_argument("--reach", type=int, default=1, help="neighbours this far are contenders")
    parser.add_argument("--share", type=float, default=0.25, help="most of the time away")
    parser.add_argument(
        "--max-window",
        type=float,
        default=ExperimentOptions.max_window_s,
        help="longest window, s (the experiment's default)",
    )
    parser.add_argument("--min-tokens", type=float, default=30.0, help="tokens a count needs")
    parser.add_argument("--max-moves", type=int, default=4, help="moves one experiment may make")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print each case's last verdicts, notes and windows a contender after its row",
    )
    parser.add_argument(
        "--no-always",
        dest="always",
        action="store_false",
        help="always draft is no contender unless the model's tie set or a neighbour",
    )
    parser.add_argument("--bench", action="store_true", help="against the real bench server")
    parser.add_argument("--db", help="--bench: a database holding the bench's profile")
    parser.add_argument(
        "--spec",
        type=Path,
        default=REPO / "profiles" / "bench-smollm2-cpu.toml",
        help="--bench: the profile spec of the server (profiles/twin/bench-twin.toml: a dry run)",
    )
    parser.add_argument("--model", default="smollm2-135m-f32", help="--bench: its model_name")
    parser.add_argument(
        "--loads",
        default="0.25,0.6",
        help="--bench: the Poisson rates in turn, as shares of the slots generating on average",
    )
    parser.add_argument(
        "--every",
        type=float,
        default=2.0,
        help="--bench: watch decides every this many minutes; the experiment has the rest",
    )
    record_arguments(parser)
    args = parser.parse_args()
    args.worlds = args.worlds or (OPENLOOP if args.openloop else FROZEN)
    if args.pool:
        pooled(args)
    elif args.bench:
        bench(args)
    else:
        twin(args)


if __name__ == "__main__":
    main()
