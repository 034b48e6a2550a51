"""Do two runs of the tuner on one server agree? Counted on a twin world, where the truth is
known and only the noise seed differs from run to run (issue 24: the demo, three times, must
give the same N or tie sets that hold each other's answers).

The full method (tests/lab/method.py: live profile, adaptive levels, recommend, tune) runs on one
world once per noise seed, with tune's tolerance and budget as given (the defaults are tune's
own; the demo runs `--tolerance 0.02 --budget 150s`). Two runs agree when their answers are
equal or each answer is in the other's "may tie" set (the tie, with the smaller values whose
tie question was still open or placed at the tolerance's edge). Printed: every run's answer,
status, may-tie set and cost in simulated seconds; the pairs that agree; how often each answer
came; the unresolved runs; each answer's regret against the world's noise-free truth; the
median cost.

    .venv/bin/python benchmarks/twin_agreement.py [WORLD] [--seeds 1-24] [--tolerance 0.01]
        [--budget SECONDS (tune's default)] [--jobs 2]

WORLD defaults to profiles/twin/bench-smollm2-cpu.toml (the bench's twin), uniform weights
over its concurrency levels.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts tests/ on sys.path: lab)
from lab.method import run_method
from twin_regret import answer_label

from tuner.decide.tune import DEFAULT_BUDGET_S
from tuner.twin.truth import closed_truth
from tuner.twin.world import load_world

REPO = Path(__file__).resolve().parent.parent
DEFAULT_WORLD = REPO / "profiles" / "twin" / "bench-smollm2-cpu.toml"


def seeds_arg(text: str) -> list[int]:
    """'1-24' or '1,5,9' (or both, comma-separated) as a list of seeds."""
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def one_run(world_path: str, seed: int, tolerance: float, budget_s: float) -> dict[str, Any]:
    """The full method on the world with one noise seed: its answer and what it cost."""
    world = load_world(Path(world_path))
    weights = {c: 1.0 / world.n_parallel for c in range(1, world.n_parallel + 1)}
    began = time.perf_counter()
    result = run_method(
        world, "full", weights=weights, seed=seed, budget_s=budget_s, tolerance=tolerance
    )
    return {
        "seed": seed,
        "answer": result.answer,
        "status": result.status,
        "tie": result.tie,
        "may_tie": result.details.get("may_tie") or [result.answer],
        "seconds": result.seconds,
        "wall_s": time.perf_counter() - began,
    }


def agree(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal answers, or each answer in the other's may-tie set."""
    return a["answer"] == b["answer"] or (
        a["answer"] in b["may_tie"] and b["answer"] in a["may_tie"]
    )


RUN_COLUMNS = ["seed", "N", "status", "may tie", "regret %", "simulated s", "wall s"]


def figures(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[list]]:
    """What the runs say together (pairs that agree, answers, unresolved, regret, cost) and
    one row per run."""
    pairs = list(itertools.combinations(runs, 2))
    answers = Counter(r["answer"] for r in runs)
    regrets = [r["regret_pct"] for r in runs]
    summary = {
        "pairs of runs that agree": f"{sum(agree(a, b) for a, b in pairs)}/{len(pairs)}",
        "pairs with the same N": sum(a["answer"] == b["answer"] for a, b in pairs),
        "answers": ", ".join(f"N={n} x{k}" for n, k in sorted(answers.items())),
        "unresolved": f"{sum(r['status'] == 'unresolved' for r in runs)}/{len(runs)}",
        "regret %: median": statistics.median(regrets),
        "regret %: max": max(regrets),
        "cost: median simulated s": statistics.median(r["seconds"] for r in runs),
    }
    rows = [
        [
            r["seed"],
            r["answer"],
            r["status"],
            r["may_tie"],
            r["regret_pct"],
            r["seconds"],
            r["wall_s"],
        ]
        for r in runs
    ]
    return summary, rows


def main() -> int:
    from record import Table, record_arguments, save_run

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("world", nargs="?", type=Path, default=DEFAULT_WORLD)
    parser.add_argument("--seeds", type=seeds_arg, default=seeds_arg("1-24"))
    parser.add_argument("--tolerance", type=float, default=0.01)
    parser.add_argument(
        "--budget", type=float, default=DEFAULT_BUDGET_S, help="tune's, simulated seconds"
    )
    parser.add_argument("--jobs", type=int, default=2)
    record_arguments(parser)
    args = parser.parse_args()
    if not args.world.exists():
        sys.exit(f"no world file at {args.world}")
    world = load_world(args.world)
    np_ = world.n_parallel
    started = time.perf_counter()
    truth = closed_truth(world)
    weights = {c: 1.0 / np_ for c in range(1, np_ + 1)}
    choice = truth.best(weights)
    values = {p.label: v for p, v in truth.best(weights, include_plain=True).values.items()}
    print(
        f"{world.name}: the truth's best {choice.best.label} ({choice.value:.2f} tok/s), "
        f"{len(args.seeds)} runs, tolerance {args.tolerance:.1%}, budget {args.budget:.0f} s "
        f"(truth in {time.perf_counter() - started:.0f} s)",
        flush=True,
    )
    context = multiprocessing.get_context("spawn")
    runs: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
        futures = [
            pool.submit(one_run, str(args.world), s, args.tolerance, args.budget)
            for s in args.seeds
        ]
        for future in futures:
            run = future.result()
            n = run["answer"]
            run["regret_pct"] = 100.0 * (choice.value - values[answer_label(n, np_)]) / choice.value
            runs.append(run)
            regret = run["regret_pct"]
            print(
                f"seed {run['seed']:3d}: N={n} {run['status']}, may tie {run['may_tie']}, "
                f"regret {regret:.2f} %, {run['seconds']:.0f} simulated s "
                f"({run['wall_s']:.0f} s wall)",
                flush=True,
            )
    summary, rows = figures(runs)
    print()
    print(
        f"pairs of runs that agree: {summary['pairs of runs that agree']} "
        f"(same N: {summary['pairs with the same N']})"
    )
    print(f"answers: {summary['answers']}")
    print(f"unresolved: {summary['unresolved']}")
    print(
        f"regret against the truth's best: median {summary['regret %: median']:.2f} %, "
        f"max {summary['regret %: max']:.2f} %"
    )
    print(f"cost: median {summary['cost: median simulated s']:.0f} simulated s")
    print(f"wall: {time.perf_counter() - started:.0f} s")
    summary = {
        "world": world.name,
        "truth's best": f"{choice.best.label} ({choice.value:.2f} tok/s)",
        "tolerance": args.tolerance,
        "budget simulated s": args.budget,
        **summary,
    }
    save_run(__file__, args, summary, [Table("runs, one per noise seed", RUN_COLUMNS, rows)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
