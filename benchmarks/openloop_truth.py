"""The open-loop truth as users feel it, on a set of open-loop worlds: which answers change when
the truth ranks what users feel (time per output token and end-to-end latency) and tells apart
the policies that do not keep up, and where each world's load sits against the capacity of
every policy compared.

For every world of a set (profiles/twin/openloop by default, or --set): the open-loop truth of
benchmarks/openloop_regret.py (its own traffic, every policy serving the same requests; cached
beside its output, shared with it). Per world it prints:

- the best policy as the mean time per output token alone ranks them (the rule before overload
  was told apart) and as the truth ranks them now (tuner.twin.truth.ranked: a policy whose
  backlog of requests waiting for a slot grows through the run ranks behind every policy that
  keeps up), and whether the answer changed;
- the best by mean and by 95th-percentile end-to-end latency (queueing + time to first token +
  generation), ranked the same way;
- the overloaded policies, each with its backlog's rise through the run (requests);
- the world's rate against each compared policy's capacity (requests/s served with a backlog of
  the world's own requests, every slot busy: lab.openworlds.capacities): the load against the
  better of plain and always draft (what version 1 of the set was drawn against) and against
  the weakest policy compared;
- with --capacity, capacity under a latency limit (tuner.twin.truth.open_loop_capacity: the
  highest rate each policy keeps up at with p95 end-to-end latency within twice the best's p95
  at the world's own rate, on the truth's first --capacity-requests requests), and its best.

    .venv/bin/python benchmarks/openloop_truth.py [--set profiles/twin/openloop] [--worlds a,b]
        [--capacity] [--capacity-requests 600] [--truth-dir out/openloop-regret.truth]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from common import grading_arguments
from lab.frozen import select
from lab.openworlds import Entry, capacities, load_manifest
from openloop_regret import OPENLOOP, canonical, world_truth

from tuner.twin.engine import Workload, policies
from tuner.twin.truth import open_loop_capacity
from tuner.twin.world import World

REPO = Path(__file__).resolve().parent.parent


def best_by(truth: dict[str, Any], figure: str) -> str:
    """The best label by a figure of the truth summary (ms, lower better), every policy that
    keeps up before every overloaded one (those by throughput), plain first on equal values,
    then N=0, then the smaller N."""
    over = set(truth["overloaded"])

    def key(label: str) -> tuple[int, float, tuple[int, int]]:
        if label in over:
            return (1, -truth["tokens_per_second"][label], _order(label))
        return (0, truth[figure][label], _order(label))

    return min(truth["values"], key=key)


def _order(label: str) -> tuple[int, int]:
    return (0, 0) if label == "plain" else (1, int(label.split("=")[1]))


def loads(world: World, entry: Entry) -> dict[str, Any]:
    """The world's rate against the capacity of every policy compared (see the docstring)."""
    got = capacities(world, entry.traffic, entry.truth_seed, policies(world))
    by_label: dict[str, float] = {}
    for policy, value in got.items():
        by_label.setdefault(canonical(policy, world.n_parallel), value)
    better = max(by_label["plain"], by_label["N=0"])
    weakest = min(by_label, key=lambda k: by_label[k])
    return {
        "capacity": by_label,
        "load_vs_better": entry.rate / better,
        "load_vs_weakest": entry.rate / by_label[weakest],
        "weakest": weakest,
    }


def capacity_row(
    world: World, entry: Entry, truth: dict[str, Any], requests: int
) -> dict[str, Any] | None:
    """Capacity under a latency limit per policy (see the docstring); None where every policy is
    overloaded at the world's own rate (no limit to take from it)."""
    keeping = [k for k in truth["values"] if k not in truth["overloaded"]]
    if not keeping:
        return None
    limit = 2.0 * min(truth["latency_p95_ms"][k] for k in keeping)
    full = entry.truth_workload()
    work = Workload(full.requests[:requests], full.arrivals[:requests])
    out: dict[str, float] = {}
    for policy in policies(world):
        label = canonical(policy, world.n_parallel)
        if label not in out:
            out[label] = entry.rate * open_loop_capacity(world, work, policy, limit)
    best = min(out, key=lambda k: (-out[k], _order(k)))
    return {"limit_ms": limit, "rates": out, "best": best}


def world_row(
    folder: Path, entry: Entry, truth_dir: Path, capacity: bool, requests: int
) -> dict[str, Any]:
    world, truth = world_truth(str(folder), entry, str(truth_dir))
    row = {
        "name": entry.name,
        "n_parallel": entry.n_parallel,
        "arrivals": entry.traffic.arrivals,
        "load": entry.traffic.load,
        "truth": truth,
        "best_latency": best_by(truth, "latency_ms"),
        "best_latency_p95": best_by(truth, "latency_p95_ms"),
        **loads(world, entry),
    }
    if capacity:
        row["capacity_under_limit"] = capacity_row(world, entry, truth, requests)
    return row


def _overloaded_text(truth: dict[str, Any]) -> str:
    over = truth["overloaded"]
    if not over:
        return "none"
    if len(over) == len(truth["values"]):
        return "all"
    return " ".join(f"{k}(+{truth['backlog_rise'][k]:.0f})" for k in over)


COLUMNS = [
    "world",
    "np",
    "arrivals",
    "load (v1: vs better of plain, always)",
    "load vs weakest policy",
    "weakest",
    "best, tpot alone",
    "best, tpot with overload",
    "changed",
    "best, latency mean",
    "best, latency p95",
    "overloaded (backlog rise, requests)",
    "capacity-under-limit best",
]


def table_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    out = []
    for row in rows:
        t = row["truth"]
        cap = row.get("capacity_under_limit")
        out.append(
            [
                row["name"],
                row["n_parallel"],
                row["arrivals"],
                round(row["load_vs_better"], 3),
                round(row["load_vs_weakest"], 3),
                row["weakest"],
                t["best_tpot_only"],
                t["best"],
                t["best"] != t["best_tpot_only"],
                row["best_latency"],
                row["best_latency_p95"],
                _overloaded_text(t),
                cap["best"] if cap else None,
            ]
        )
    return out


def render(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'world':<17} {'np':>2} {'arrivals':<8} {'load':>5} {'vs weak':>7} {'tpot':>6} "
        f"{'+overl':>6} {'lat':>6} {'lat95':>6} {'cap':>6}  overloaded (backlog rise)"
    )
    lines = [head, "-" * len(head)]
    for r in table_rows(rows):
        mark = "*" if r[8] else " "
        cap = r[12] or "-"
        lines.append(
            f"{r[0]:<17} {r[1]:>2} {r[2]:<8} {r[3]:>5.2f} {r[4]:>7.2f} {r[6]:>6} {r[7]:>5}{mark} "
            f"{r[9]:>6} {r[10]:>6} {cap:>6}  {r[11]}"
        )
    changed = [r for r in rows if r["truth"]["best"] != r["truth"]["best_tpot_only"]]
    any_over = [r for r in rows if r["truth"]["overloaded"]]
    above = [r for r in rows if r["load_vs_weakest"] >= 1.0]
    lines += [
        "load: the world's rate over the better of plain and always draft's capacity (how the "
        "set was drawn); vs weak: over the weakest compared policy's; tpot: the best by mean "
        "time per output token alone; +overl: the truth's best now, overloaded policies behind "
        "every one that keeps up ('*': changed); lat, lat95: the best by mean and p95 "
        "end-to-end latency; cap: the best capacity under the latency limit",
        f"{len(changed)} of {len(rows)} answers changed; {len(any_over)} worlds have overloaded "
        f"policies; {len(above)} worlds offer more than the weakest compared policy's capacity",
    ]
    return "\n".join(lines)


def main() -> int:
    from record import Table, record_arguments, save_run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    grading_arguments(parser, OPENLOOP, REPO / "out" / "openloop-regret.json", ())
    parser.add_argument("--capacity", action="store_true", help="capacity under a latency limit")
    parser.add_argument("--capacity-requests", type=int, default=600)
    record_arguments(parser)
    args = parser.parse_args()
    entries = select(load_manifest(args.set), args.worlds)
    truth_dir = args.out.with_suffix(".truth")
    rows = []
    began = time.monotonic()
    for entry in entries:
        rows.append(world_row(args.set, entry, truth_dir, args.capacity, args.capacity_requests))
        t = rows[-1]["truth"]
        print(
            f"{entry.name}: {t['best_tpot_only']} -> {t['best']}, overloaded "
            f"{_overloaded_text(t)} ({time.monotonic() - began:.0f} s)",
            flush=True,
        )
    print(render(rows))
    changed = sum(r["truth"]["best"] != r["truth"]["best_tpot_only"] for r in rows)
    summary = {
        "worlds": len(rows),
        "set": args.set.name,
        "answers changed": changed,
        "worlds with overloaded policies": sum(bool(r["truth"]["overloaded"]) for r in rows),
        "worlds where every policy is overloaded": sum(
            len(r["truth"]["overloaded"]) == len(r["truth"]["values"]) for r in rows
        ),
        "worlds above the weakest policy's capacity": sum(r["load_vs_weakest"] >= 1 for r in rows),
        "capacity under a latency limit": args.capacity,
    }
    per_policy = [
        [
            r["name"],
            k,
            r["truth"]["tpot_ms"][k],
            r["truth"]["latency_ms"][k],
            r["truth"]["latency_p95_ms"][k],
            r["truth"]["backlog_rise"][k],
            k in r["truth"]["overloaded"],
            r["capacity"][k],
        ]
        for r in rows
        for k in sorted(r["truth"]["values"], key=_order)
    ]
    policy_columns = [
        "world", "policy", "tpot ms", "latency mean ms", "latency p95 ms", "backlog rise",
        "overloaded", "capacity req/s (backlog)",
    ]  # fmt: skip
    save_run(
        __file__,
        args,
        summary,
        [
            Table("per world", COLUMNS, table_rows(rows)),
            Table("per world and policy", policy_columns, per_policy),
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
