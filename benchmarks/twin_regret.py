"""Grade the tuner's decisions on the frozen set of twin worlds against each world's known truth
(issue 25).

For every world of profiles/twin/frozen/ (or a --worlds subset): the truth once
(tuner.twin.truth.closed_truth, noise-free, cached beside the output: tens of seconds a world),
then the three methods of tests/lab/method.py with the world's traffic weights and seed: "full"
(live profile, adaptive levels, recommend, tune), "model" (relaunching profile and recommend:
the method before) and "naive" (1/2/4/8 profile, the last level where always draft beat plain).
Per world it prints the truth's best N and its margin, each method's answer, its regret against
the truth's best N (in % of the best objective; the best over N = 0..-np, which is what the
tuner chooses among), its cost in simulated seconds, and the full method's tune status. Then
summaries over all worlds and split by the manifest's tags (crossover inside/outside the base
measured levels, quiet/noisy, uniform/concentrated traffic): median and 95th percentile regret
per method, how often the answer is among the truth's ties, and the coverage of the fit's 90 %
intervals at the cells no run measured (MethodResult.held_out against the truth's tok/s there),
with the targets beside; then the design tags checked on the truth, and the worst worlds of the
full method with what tune saw there.

Rows are written to --out (JSON; a CSV beside it) after every world, so a long run resumes
where it stopped (worlds already in the file are skipped unless --redo) and --render prints the
tables again without running anything.

    .venv/bin/python benchmarks/twin_regret.py [--worlds frozen-03,10-12] [--jobs 2]
        [--out out/twin-regret.json] [--methods full,model,naive] [--render] [--redo]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    cached_json,
    chosen_methods,
    grading_arguments,
    load_rows,
    run_grading,
    save_rows_json,
)
from lab.frozen import Entry, load_manifest, select
from lab.method import METHODS, run_method

from tuner.policy import Policy
from tuner.twin.truth import closed_truth
from tuner.twin.world import World, load_world

REPO = Path(__file__).resolve().parent.parent
FROZEN = REPO / "profiles" / "twin" / "frozen"
TARGET_MEDIAN = 0.3  # % regret, full method
TARGET_P95 = 1.5
TARGET_COVERAGE = (85.0, 95.0)


# -- the truth, once per world ------------------------------------------------------------------


def truth_summary(world: World, entry: Entry) -> dict[str, Any]:
    """What grading needs of a world's truth (see the module docstring), JSON-ready."""
    start = time.perf_counter()
    truth = closed_truth(world)
    seconds = time.perf_counter() - start
    weights = entry.weight_map()
    choice = truth.best(weights)
    with_plain = truth.best(weights, include_plain=True)
    levels = truth.concurrency
    gains = [truth.gain(c) for c in levels]
    wins = 0
    for c, g in zip(levels, gains, strict=True):
        if g <= 0:
            break
        wins = c
    return {
        "best": choice.best.label,
        "best_n": choice.best.effective(world.n_parallel),
        "value": choice.value,
        "runner_up": choice.runner_up.label if choice.runner_up else None,
        "margin_pct": choice.margin_pct,
        "margin_se_pct": 100.0 * choice.margin_se / choice.value if choice.value else 0.0,
        "ties": [p.label for p in choice.ties],
        "values": {p.label: v for p, v in with_plain.values.items()},
        "plain_beats_best": with_plain.best.is_plain,
        "gains": gains,
        "gain_signs": "".join("+" if g > 0 else "-" for g in gains),
        "spec_wins_through": wins,
        "cells": {
            p.label: [[truth.tps(p, c), truth.cell(p, c).se] for c in levels]
            for p in (Policy.plain(), Policy.always())
        },
        "largest_rel_se": max(cell.rel_se for cell in truth.cells.values()),
        "seconds": seconds,
    }


def _tps(summary: dict[str, Any], label: str, c: int) -> float:
    return summary["cells"][label][c - 1][0]


# -- one world ----------------------------------------------------------------------------------


def answer_label(answer: int, n_parallel: int) -> str:
    """A method's answer (effective N: 0 plain, -np always draft) as the truth labels it."""
    if answer <= 0:
        return Policy.plain().label
    return Policy.threshold(min(answer, n_parallel)).label


def grade_world(
    folder: str, entry: Entry, truth_dir: str, methods: Sequence[str]
) -> dict[str, Any]:
    """The truth (cached in truth_dir) and every method on one world: its row."""
    start = time.perf_counter()
    path = Path(folder) / entry.file
    world = load_world(path)
    # keyed by the world file and its weights: a regenerated set never reads a stale truth
    key = hashlib.sha256(path.read_bytes() + repr(entry.weights).encode()).hexdigest()[:12]
    cache = Path(truth_dir) / f"{entry.name}-{key}.json"
    truth = cached_json(cache, lambda: truth_summary(world, entry))
    row: dict[str, Any] = {
        "name": entry.name,
        "shape": entry.shape,
        "regime": entry.regime,
        "n_parallel": entry.n_parallel,
        "n_max": entry.n_max,
        "accept_len": entry.accept_len,
        "crossover": entry.crossover,
        "noise": entry.noise,
        "noise_preset": entry.noise_preset,
        "traffic": entry.traffic,
        "design_best_n": entry.best_n,
        "design_gain_signs": entry.gain_signs,
        "base_levels": list(entry.base_levels),
        "truth": truth,
        "methods": {},
    }
    best = truth["value"]
    for method in methods:
        began = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="twin-regret-") as tmp:
            result = run_method(
                world, method, weights=entry.weight_map(), seed=entry.seed, workdir=Path(tmp)
            )
        label = answer_label(result.answer, entry.n_parallel)
        value = truth["values"][label]
        held = [
            [lab, c, lo, point, hi, _tps(truth, lab, c)]
            for (lab, c), (lo, point, hi) in sorted(result.held_out.items())
        ]
        record: dict[str, Any] = {
            "answer": result.answer,
            "label": label,
            "value": value,
            "regret_pct": 100.0 * (best - value) / best,
            "in_ties": label in truth["ties"],
            "seconds": result.seconds,
            "wall_s": time.perf_counter() - began,
            "status": result.status,
            "tie": result.tie,
            "measured": sorted(result.measured),
            "held_out": held,
        }
        if result.details:
            keep = ("comparisons", "sweeps", "history", "pairs", "tolerance", "started_from")
            record["details"] = {k: result.details.get(k) for k in keep}
        row["methods"][method] = record
    row["wall_s"] = time.perf_counter() - start
    return row


# -- the run --------------------------------------------------------------------------------------


def save_rows(out: Path, folder: Path, rows: dict[str, dict[str, Any]]) -> None:
    save_rows_json(out, folder, rows)
    with out.with_suffix(".csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            [
                "world",
                "method",
                "crossover",
                "noise",
                "traffic",
                "shape",
                "n_parallel",
                "n_max",
                "truth_best",
                "margin_pct",
                "answer",
                "regret_pct",
                "in_ties",
                "sim_seconds",
                "status",
                "held_out",
                "held_inside",
            ]
        )
        for name in sorted(rows):
            row = rows[name]
            for method, r in row["methods"].items():
                inside = sum(lo <= t <= hi for _, _, lo, _, hi, t in r["held_out"])
                writer.writerow(
                    [
                        name,
                        method,
                        row["crossover"],
                        row["noise"],
                        row["traffic"],
                        row["shape"],
                        row["n_parallel"],
                        row["n_max"],
                        row["truth"]["best"],
                        f"{row['truth']['margin_pct']:.4f}",
                        r["label"],
                        f"{r['regret_pct']:.4f}",
                        r["in_ties"],
                        f"{r['seconds']:.1f}",
                        r["status"],
                        len(r["held_out"]),
                        inside,
                    ]
                )


def run(
    folder: Path,
    entries: Sequence[Entry],
    out: Path,
    jobs: int,
    methods: Sequence[str],
    redo: bool,
) -> dict[str, dict[str, Any]]:
    """Grade the worlds not yet in out (common.run_grading)."""

    def said(row: dict[str, Any]) -> str:
        full = row["methods"].get("full")
        what = f"full {full['label']} regret {full['regret_pct']:.2f} %" if full else ""
        return f"truth {row['truth']['best']} {what}"

    return run_grading(folder, entries, out, jobs, methods, redo, grade_world, save_rows, said)


# -- the tables -----------------------------------------------------------------------------------


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def world_table(rows: Sequence[dict[str, Any]], methods: Sequence[str]) -> list[str]:
    head = (
        f"{'world':<10} {'np':>2} {'n':>1} {'L':>4} {'tags':<5} {'shape':<8} "
        f"{'truth best':>10} {'margin':>7}"
    )
    for m in methods:
        head += f" | {m + ' N':>8} {'regret':>7} {'cost s':>6}"
    head += " | full status"
    lines = [head, "-" * len(head)]
    for row in rows:
        t = row["truth"]
        tags = (
            ("i" if row["crossover"] == "inside" else "o")
            + ("q" if row["noise"] == "quiet" else "n")
            + ("u" if row["traffic"] == "uniform" else "c")
        )
        line = (
            f"{row['name']:<10} {row['n_parallel']:>2} {row['n_max']:>1} "
            f"{row['accept_len']:>4.2f} {tags:<5} {row['shape']:<8} {t['best']:>10} "
            f"{t['margin_pct']:>6.2f}%"
        )
        for m in methods:
            r = row["methods"].get(m)
            if r is None:
                line += f" | {'-':>8} {'-':>7} {'-':>6}"
                continue
            mark = "=" if r["in_ties"] else " "
            line += f" | {r['label']:>7}{mark} {r['regret_pct']:>6.2f}% {r['seconds']:>6.0f}"
        full = row["methods"].get("full")
        if full:
            tie = f" tie {full['tie']}" if full["tie"] else ""
            line += f" | {full['status']}{tie}"
        lines.append(line)
    lines.append(
        "tags: i/o crossover inside/outside the base levels, q/n quiet/noisy, "
        "u/c uniform/concentrated traffic; '=' the answer is among the truth's ties "
        "(within two standard errors of the best)"
    )
    return lines


def world_columns(methods: Sequence[str]) -> list[str]:
    head = ["world", "np", "n_max", "L", "crossover", "noise", "traffic", "shape", "truth best"]
    head.append("margin %")
    for m in methods:
        head += [f"{m} N", f"{m} in ties", f"{m} regret %", f"{m} cost s"]
    return [*head, "full status", "full tie"]


def world_rows(rows: Sequence[dict[str, Any]], methods: Sequence[str]) -> list[list]:
    """Per world: its design, the truth's best and margin, each method's answer (whether among
    the truth's ties), regret and simulated cost, and the full method's tune status and tie."""
    out: list[list] = []
    for row in rows:
        t = row["truth"]
        line: list[Any] = [row["name"], row["n_parallel"], row["n_max"], row["accept_len"]]
        line += [row["crossover"], row["noise"], row["traffic"], row["shape"], t["best"]]
        line.append(t["margin_pct"])
        for m in methods:
            r = row["methods"].get(m)
            if r is None:
                line += [None] * 4
                continue
            line += [r["label"], r["in_ties"], r["regret_pct"], r["seconds"]]
        full = row["methods"].get("full")
        line += [full["status"], full["tie"]] if full else [None, None]
        out.append(line)
    return out


def coverage(rows: Iterable[dict[str, Any]], method: str) -> tuple[int, int]:
    inside = total = 0
    for row in rows:
        r = row["methods"].get(method)
        if r is None:
            continue
        for _, _, lo, _, hi, truth in r["held_out"]:
            total += 1
            inside += lo <= truth <= hi
    return inside, total


SUMMARY_COLUMNS = [
    "group",
    "worlds",
    "method",
    "median regret %",
    "p95 regret %",
    "max regret %",
    "in ties",
    "cost s (median)",
    "held-out inside",
    "held-out cells",
    "target",
]


def summary_rows(rows: Sequence[dict[str, Any]], methods: Sequence[str]) -> list[list]:
    """Per group of worlds (all, then by each tag) and method: worlds, median, 95th percentile
    and max regret, answers among the truth's ties, median cost, held-out cells inside the fit's
    90 % intervals, and for the full method whether the regret targets were met. A group
    without worlds is one row of None."""
    groups: list[tuple[str, list[dict[str, Any]]]] = [("all", list(rows))]
    for key, values in (
        ("crossover", ("inside", "outside")),
        ("noise", ("quiet", "noisy")),
        ("traffic", ("uniform", "concentrated")),
    ):
        for v in values:
            groups.append((f"{key} {v}", [r for r in rows if r[key] == v]))
    out: list[list] = []
    for name, members in groups:
        if not members:
            out.append([name, 0, *[None] * (len(SUMMARY_COLUMNS) - 2)])
            continue
        for m in methods:
            regrets = [r["methods"][m]["regret_pct"] for r in members if m in r["methods"]]
            if not regrets:
                continue
            ties = sum(r["methods"][m]["in_ties"] for r in members if m in r["methods"])
            cost = statistics.median(
                r["methods"][m]["seconds"] for r in members if m in r["methods"]
            )
            inside, total = coverage(members, m)
            med, p95 = _pct(regrets, 50), _pct(regrets, 95)
            flag = None
            if m == "full":
                flag = "ok" if med <= TARGET_MEDIAN and p95 <= TARGET_P95 else "MISSED"
            out.append(
                [name, len(regrets), m, med, p95, max(regrets), ties, cost, inside, total, flag]
            )
    return out


def summary_table(rows: Sequence[dict[str, Any]], methods: Sequence[str]) -> list[str]:
    lines = [
        f"Summary over {len(rows)} worlds. Targets: full method median regret <= "
        f"{TARGET_MEDIAN} %, 95th percentile <= {TARGET_P95} %; coverage of the 90 % intervals "
        f"at held-out cells {TARGET_COVERAGE[0]:.0f}-{TARGET_COVERAGE[1]:.0f} %.",
        "Regret: (best N's objective - answer's) / best N's, truth noise-free; percentiles "
        "interpolated linearly. cost: simulated seconds of measuring, launches included.",
        "",
        f"{'group':<22} {'n':>3} {'method':<6} {'median':>8} {'p95':>8} {'max':>8} "
        f"{'in ties':>8} {'cost s (median)':>15} {'coverage (held-out cells)':>27}",
    ]
    previous = None
    for name, n, m, med, p95, top, ties, cost, inside, total, flag in summary_rows(rows, methods):
        if previous is not None and name != previous:
            lines.append("")
        previous = name
        if m is None:
            lines.append(f"{name:<22} {0:>3} (no worlds)")
            continue
        cov = f"{100 * inside / total:5.1f} % ({inside}/{total})" if total else "-"
        lines.append(
            f"{name:<22} {n:>3} {m:<6} {med:>7.2f}% {p95:>7.2f}% "
            f"{top:>7.2f}% {ties:>3}/{n:<4} {cost:>15.0f} "
            f"{cov:>27}{' ' + flag if flag else ''}"
        )
    lines.append("")
    return lines


def tag_checks(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The manifest's design tags against the truth."""
    cross = [
        r
        for r in rows
        if (r["truth"]["best_n"] in r["base_levels"]) != (r["crossover"] == "inside")
    ]
    best = [r for r in rows if r["truth"]["best_n"] != r["design_best_n"]]
    signs = [r for r in rows if r["truth"]["gain_signs"] != r["design_gain_signs"]]
    plain = [r for r in rows if r["truth"]["plain_beats_best"]]
    lines = [
        f"Design tags on the truth ({len(rows)} worlds): crossover tag holds on "
        f"{len(rows) - len(cross)}, best N as designed on {len(rows) - len(best)}, gain signs "
        f"as designed on {len(rows) - len(signs)}; plain beats every N on {len(plain)}.",
    ]
    for r in best:
        t = r["truth"]
        lines.append(
            f"  {r['name']}: truth best {t['best']} (margin {t['margin_pct']:.2f} %, ties "
            f"{', '.join(t['ties'])}), design N={r['design_best_n']}; gains truth "
            f"{t['gain_signs']} design {r['design_gain_signs']}"
        )
    for r in signs:
        if r in best:
            continue
        t = r["truth"]
        lines.append(
            f"  {r['name']}: gains truth {t['gain_signs']} design "
            f"{r['design_gain_signs']} (best N as designed)"
        )
    return lines


def pruning(rows: Sequence[dict[str, Any]]) -> list[str]:
    """How often tune's pruning (a contender shown behind, one-sided 95 %) dropped the truth's
    best N: a contender is dropped for good, so this is the error that cannot be undone."""
    full = [r for r in rows if "full" in r["methods"]]
    dropped = []
    for row in full:
        comps = (row["methods"]["full"].get("details") or {}).get("comparisons") or []
        behind = {c["contender"] for c in comps if c["verdict"] == "behind"}  # effective N
        if row["truth"]["best_n"] in behind:
            dropped.append(row["name"])
    share = 100.0 * len(dropped) / len(full) if full else 0.0
    flag = "ok" if share <= 5.0 else "MISSED"
    return [
        f"Pruning: tune showed the truth's best N behind (and dropped it) in {len(dropped)} of "
        f"{len(full)} worlds ({share:.1f} %; target at most 5 %: {flag})"
        + (f": {', '.join(dropped)}" if dropped else "")
    ]


def worst(rows: Sequence[dict[str, Any]], count: int = 3) -> list[str]:
    full = [r for r in rows if "full" in r["methods"]]
    full.sort(key=lambda r: -r["methods"]["full"]["regret_pct"])
    lines = [f"The {min(count, len(full))} worst worlds of the full method:"]
    for row in full[:count]:
        r, t = row["methods"]["full"], row["truth"]
        lines.append(
            f"- {row['name']} ({row['shape']}, {row['regime']}, -np {row['n_parallel']}, n_max "
            f"{row['n_max']}, L {row['accept_len']:.2f}, {row['noise_preset']} noise, "
            f"{row['traffic']}): truth {t['best']} (runner-up {t['runner_up']}, margin "
            f"{t['margin_pct']:.2f} %), full answered {r['label']} (regret "
            f"{r['regret_pct']:.2f} %), {r['status']}" + (f" tie {r['tie']}" if r["tie"] else "")
        )
        lines.append(
            "  truth gains spec/plain by level: " + " ".join(f"{100 * g:+.1f}" for g in t["gains"])
        )
        lines.append(
            f"  measured levels {r['measured']}; model method answered "
            f"{row['methods'].get('model', {}).get('label', '-')}"
        )
        values = t["values"]
        top = sorted(values.items(), key=lambda kv: -kv[1])[:4]
        lines.append(
            "  truth objective: "
            + ", ".join(f"{k} {v:.2f}" for k, v in top)
            + f"; answer {r['label']} {values[r['label']]:.2f}"
        )
        details = r.get("details") or {}
        for comp in details.get("comparisons") or []:
            lines.append(
                f"  tune: N={comp['contender']} vs answer: advantage {comp['advantage']:+.2f} "
                f"tok/s (se {comp['se']:.2f}, bounds {comp['lower']:+.2f}..{comp['upper']:+.2f}) "
                f"at levels {comp['levels']}: {comp['verdict']}"
            )
        if details.get("history"):
            lines.append(f"  tune history: {details['history']}")
    return lines


def render(
    rows_by_name: dict[str, dict[str, Any]], entries: Sequence[Entry], methods: Sequence[str]
) -> str:
    order = [e.name for e in entries if e.name in rows_by_name]
    rows = [rows_by_name[n] for n in order]
    if not rows:
        return "no rows yet"
    lines = world_table(rows, methods)
    lines.append("")
    lines += summary_table(rows, methods)
    lines += tag_checks(rows)
    lines.append("")
    lines += pruning(rows)
    lines.append("")
    lines += worst(rows)
    truth_s = sum(r["truth"]["seconds"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    lines.append("")
    lines.append(
        f"Wall time: truths {truth_s / 60:.1f} min (computed once, cached), worlds in all "
        f"{wall / 60:.1f} min of worker time."
    )
    return "\n".join(lines)


def main() -> int:
    from record import Table, record_arguments, save_run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    grading_arguments(parser, FROZEN, REPO / "out" / "twin-regret.json", METHODS)
    record_arguments(parser)
    args = parser.parse_args()
    methods = chosen_methods(parser, args.methods, METHODS)
    entries = select(load_manifest(args.set), args.worlds)
    if args.render:
        rows = load_rows(args.out)
    else:
        rows = run(args.set, entries, args.out, max(1, args.jobs), methods, args.redo)
    print(render(rows, entries, methods))
    graded = [rows[e.name] for e in entries if e.name in rows]
    if graded and not args.render:  # --render measured nothing: no run to record
        summary = {
            "worlds": len(graded),
            "set": args.set.name,
            "pruning": pruning(graded)[0],
            "design tags": tag_checks(graded)[0],
        }
        tables = [
            Table("per world", world_columns(methods), world_rows(graded, methods)),
            Table("summary by group", SUMMARY_COLUMNS, summary_rows(graded, methods)),
        ]
        save_run(__file__, args, summary, tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
