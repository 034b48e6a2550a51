"""Grade the tuner's answers for open-loop traffic on the open-loop set of twin worlds against
each world's open-loop truth (issue 45).

For every world of profiles/twin/openloop/ (or a --worlds subset): the truth once
(tuner.twin.truth.open_loop_truth on the world's own traffic from its manifest: its arrivals,
prompt and output lengths and content classes, truth_requests of them; plain and N = 0..-np,
noise-free, every policy serving the same requests at the same times with the same request
seeds; cached beside the output), then the methods of tests/lab/openmethod.py: "closed" (today's
tuner: profile, observe the traffic under its standing answer, `recommend --traffic --objective
tpot`), "naive" (the last of 1, 2, 4, 8 streams where always draft beat plain, closed loop;
plain where none) and "open" (the slot for issue 45's method, skipped until it is built).

The figure of merit is the mean time per output token over all tokens (generation time over
tokens after the first, token-weighted): regret = (TPOT of the answer - best TPOT) / best TPOT,
in %, among the policies that keep up. A policy the world's arrivals outrun (its backlog grows
through the run: tuner.twin.truth's overload) ranks behind every policy that keeps up whatever
its TPOT, and an answer that is overloaded where another policy keeps up has infinite regret
(where every policy is overloaded, regret is in throughput). The truth's resolution: the
standard error of each policy's difference from the best, from ten stretches of requests in
arrival order (the same requests under every policy, so the arrivals' own variation cancels);
the tie is every policy within two such errors of the best, and an answer in the tie is as good
as the truth can tell. Per world it prints the truth's best, its margin to the runner-up (and
the margin's error), plain's and always draft's place, and each method's answer, regret and
simulated cost; then median, 95th percentile and max regret and the answers in the tie over all
worlds and by each tag of the manifest.

Rows are written to --out (JSON; a CSV beside it) after every world, so a long run resumes where
it stopped (--redo runs worlds again) and --render prints the tables again without running.

    .venv/bin/python benchmarks/openloop_regret.py [--worlds openloop-03,10-12] [--jobs 2]
        [--out out/openloop-regret.json] [--methods closed,naive,open] [--render] [--redo]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import (
    cached_json,
    chosen_methods,
    grading_arguments,
    load_rows,
    percentile,
    run_grading,
    save_rows_json,
)
from lab.frozen import select
from lab.openmethod import METHODS, MethodMissing, run_open_method
from lab.openworlds import Entry, load_manifest
from record import fmt

from tuner.policy import Policy
from tuner.twin.truth import OpenLoopTruth, open_loop_truth
from tuner.twin.world import World, load_world

REPO = Path(__file__).resolve().parent.parent
OPENLOOP = REPO / "profiles" / "twin" / "openloop"
TIE_SE = 2.0  # the tie: within this many standard errors of the best


# -- the truth, once per world ------------------------------------------------------------------


def canonical(policy: Policy, n_parallel: int) -> str:
    """A policy's label as the truth keeps it: plain, N=0 (always draft, and any N >= -np, the
    same server) or N=k."""
    if policy.is_plain:
        return Policy.plain().label
    n = policy.max_slots or 0
    return Policy.always().label if n == 0 or n >= n_parallel else Policy.threshold(n).label


TRUTH_VERSION = 3  # 3: end-to-end latency and overload (by capacity) beside the TPOT


def truth_summary(world: World, entry: Entry, objective: str = "tpot") -> dict[str, Any]:
    """What grading needs of a world's open-loop truth, JSON-ready: every policy's figures, the
    overloaded ones (their backlog grows through the run: ranked behind every policy that keeps
    up, tuner.twin.truth.ranked), the best by that ranking in the objective, each policy's
    regret (infinite for an overloaded one where another keeps up), the tie; and the best as
    the time per output token alone would rank it (`best_tpot_only`, the rule before overload
    was told apart)."""
    start = time.perf_counter()
    figures = open_loop_truth(world, entry.rate, workload=entry.truth_workload())
    seconds = time.perf_counter() - start
    by_label: dict[str, OpenLoopTruth] = {}
    for policy, f in figures.items():
        by_label.setdefault(canonical(policy, world.n_parallel), f)
    values = {label: f.value(objective) for label, f in by_label.items()}
    order = sorted(values, key=lambda k: (by_label[k].rank_key(objective), _order(k)))
    best = order[0]
    top = by_label[best]
    se = {k: by_label[k].difference_se(top, objective) if k != best else 0.0 for k in values}
    regret = {k: 100.0 * by_label[k].regret(top, objective) for k in values}
    ties = [
        k
        for k in order
        if by_label[k].overloaded == top.overloaded
        and (k == best or (not top.overloaded and values[k] - values[best] <= TIE_SE * se[k]))
    ]
    runner = order[1] if len(order) > 1 else None
    value = values[best]
    tpot_only = min(by_label, key=lambda k: (by_label[k].tpot_mean_ms, _order(k)))

    def pct(x: float) -> float:
        return 100.0 * x / value

    return {
        "version": TRUTH_VERSION,
        "objective": objective,
        "best": best,
        "best_tpot_only": tpot_only,
        "value": value,
        "runner_up": runner,
        "margin_pct": regret[runner] if runner else 0.0,
        "margin_se_pct": pct(se[runner]) if runner else 0.0,
        "ties": ties,
        "values": values,
        "regret_pct": regret,
        "overloaded": [k for k in order if by_label[k].overloaded],
        "backlog_rise": {k: f.backlog_rise for k, f in by_label.items()},
        "capacity_rps": {k: f.capacity_rps for k, f in by_label.items()},
        "tpot_ms": {k: f.tpot_mean_ms for k, f in by_label.items()},
        "latency_ms": {k: f.latency_mean_ms for k, f in by_label.items()},
        "latency_p95_ms": {k: f.latency_p95_ms for k, f in by_label.items()},
        "se_pct": {k: pct(v) for k, v in se.items()},
        "plain_pct": regret["plain"],
        "always_pct": regret["N=0"],
        "resolution_pct": max(pct(v) for v in se.values() if math.isfinite(v)),
        "mean_generating": {k: f.mean_generating for k, f in by_label.items()},
        "accept_len": {k: f.accept_len for k, f in by_label.items() if k != "plain"},
        "ttft_p95_ms": {k: f.ttft_ms[1] for k, f in by_label.items()},
        "tokens_per_second": {k: f.tokens_per_second for k, f in by_label.items()},
        "requests": by_label[best].requests,
        "span_s": by_label[best].span_s,
        "seconds": seconds,
    }


def _order(label: str) -> tuple[int, int]:
    """Equal values: plain first (no draft model to run), then N=0, then the smaller N."""
    if label == "plain":
        return (0, 0)
    return (1, int(label.split("=")[1]))


# -- one world ----------------------------------------------------------------------------------


def world_truth(folder: str, entry: Entry, truth_dir: str) -> tuple[World, dict[str, Any]]:
    """A world of the set and its truth (truth_summary), cached in truth_dir: keyed by the
    world file and its traffic, so a regenerated set never reads a stale truth."""
    path = Path(folder) / entry.file
    world = load_world(path)
    traffic = json.dumps(entry.traffic.as_dict(), sort_keys=True)
    stamp = f"{entry.truth_seed}:{entry.truth_requests}:{traffic}:v{TRUTH_VERSION}".encode()
    key = hashlib.sha256(path.read_bytes() + stamp).hexdigest()[:12]
    cache = Path(truth_dir) / f"{entry.name}-{key}.json"
    return world, cached_json(cache, lambda: truth_summary(world, entry))


def grade_world(
    folder: str, entry: Entry, truth_dir: str, methods: Sequence[str]
) -> dict[str, Any]:
    """The truth (cached in truth_dir) and every method on one world: its row."""
    start = time.perf_counter()
    world, truth = world_truth(folder, entry, truth_dir)
    row: dict[str, Any] = {
        "name": entry.name,
        "tags": list(entry.tags),
        "n_parallel": entry.n_parallel,
        "n_max": entry.n_max,
        "load": entry.traffic.load,
        "rate": entry.rate,
        "arrivals": entry.traffic.arrivals,
        "truth": truth,
        "methods": {},
        "skipped": {},
    }
    for method in methods:
        began = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix="openloop-regret-") as tmp:
                result = run_open_method(world, entry, method, Path(tmp))
        except MethodMissing as exc:
            row["skipped"][method] = str(exc)
            continue
        label = canonical(result.answer, entry.n_parallel)
        row["methods"][method] = {
            "label": label,
            "value": truth["values"][label],
            "overloaded": label in truth["overloaded"],
            "regret_pct": truth["regret_pct"][label],
            "in_ties": label in truth["ties"],
            "seconds": result.seconds,
            "wall_s": time.perf_counter() - began,
            "details": result.details,
        }
    row["wall_s"] = time.perf_counter() - start
    return row


# -- the run --------------------------------------------------------------------------------------


CSV_COLUMNS = [
    "world",
    "method",
    "tags",
    "load",
    "arrivals",
    "truth_best",
    "margin_pct",
    "resolution_pct",
    "answer",
    "regret_pct",
    "in_ties",
    "sim_seconds",
]


def save_rows(out: Path, folder: Path, rows: dict[str, dict[str, Any]]) -> None:
    save_rows_json(out, folder, rows)
    with out.with_suffix(".csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_COLUMNS)
        for name in sorted(rows):
            row = rows[name]
            t = row["truth"]
            for method, r in row["methods"].items():
                writer.writerow(
                    [
                        *(name, method, " ".join(row["tags"]), row["load"], row["arrivals"]),
                        *(t["best"], f"{t['margin_pct']:.4f}", f"{t['resolution_pct']:.4f}"),
                        *(r["label"], f"{r['regret_pct']:.4f}", r["in_ties"]),
                        f"{r['seconds']:.1f}",
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
        answers = (
            f"{m} {r['label']} {pc(r['regret_pct'], width=0)}" for m, r in row["methods"].items()
        )
        return f"truth {row['truth']['best']}; " + ", ".join(answers)

    return run_grading(folder, entries, out, jobs, methods, redo, grade_world, save_rows, said)


# -- the tables -----------------------------------------------------------------------------------


def _pct(values: Sequence[float], q: float) -> float:
    return percentile(values, q)


def pc(value: float, spec: str = ".2f", width: int = 8) -> str:
    """A percentage for the printed tables, right-aligned in width: unbounded where a policy's
    queue grows without bound (an infinite regret), never inf."""
    text = fmt(value, spec)
    return (text if text.endswith("unbounded") else f"{text}%").rjust(width)


def world_columns(methods: Sequence[str]) -> list[str]:
    head = ["world", "np", "tags", "load", "arrivals", "truth best", "margin %", "margin se %"]
    head += ["plain %", "always %", "ties", "overloaded"]
    for m in methods:
        head += [f"{m} answer", f"{m} in tie", f"{m} regret %", f"{m} cost s"]
    return head


def world_rows(rows: Sequence[dict[str, Any]], methods: Sequence[str]) -> list[list]:
    """Per world: its tags and traffic, the truth's best, margin (and its error), how far plain
    and always draft are behind, the tie; each method's answer, whether in the tie, its regret
    and simulated cost (None where it was skipped)."""
    out: list[list] = []
    for row in rows:
        t = row["truth"]
        line: list[Any] = [row["name"], row["n_parallel"], _short(row["tags"]), row["load"]]
        line += [row["arrivals"], t["best"], t["margin_pct"], t["margin_se_pct"]]
        line += [t["plain_pct"], t["always_pct"], t["ties"], t["overloaded"]]
        for m in methods:
            r = row["methods"].get(m)
            keys = ("label", "in_ties", "regret_pct", "seconds")
            line += [None] * len(keys) if r is None else [r[k] for k in keys]
        out.append(line)
    return out


def _short(tags: Sequence[str]) -> str:
    """Tags without their family names (surface-apu -> apu, draft-prefill-high -> high ...)."""
    prefixes = ("surface-", "draft-prefill-", "accept-drafting-", "content-", "prompts-")
    prefixes += ("load-", "arrivals-")
    out = []
    for tag in tags:
        for p in prefixes:
            if tag.startswith(p):
                tag = tag[len(p) :]
                break
        out.append(tag)
    return " ".join(out)


SUMMARY_COLUMNS = [
    "group",
    "worlds",
    "method",
    "median regret %",
    "p95 regret %",
    "max regret %",
    "in tie",
    "plain best",
    "cost s (median)",
]


def groups_of(rows: Sequence[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """All worlds; those where the truth's best is plain and those where it drafts (an answer
    of plain everywhere is graded apart on each); then the worlds of each tag, by family."""
    tags: list[str] = []
    for row in rows:
        tags += [t for t in row["tags"] if t not in tags]
    tags.sort(key=lambda t: (t.rsplit("-", 1)[0], _tag_order(t)))
    plain = [r for r in rows if r["truth"]["best"] == "plain"]
    drafts = [r for r in rows if r["truth"]["best"] != "plain"]
    return [
        ("all", list(rows)),
        ("truth: plain best", plain),
        ("truth: drafting best", drafts),
    ] + [(t, [r for r in rows if t in r["tags"]]) for t in tags]


def _tag_order(tag: str) -> int:
    known = ("none", "low", "mid", "high", "dominant", "flat", "mild", "steep")
    last = tag.rsplit("-", 1)[1]
    return known.index(last) if last in known else len(known)


def summary_rows(rows: Sequence[dict[str, Any]], methods: Sequence[str]) -> list[list]:
    """Per group of worlds (all, then each tag) and method: worlds, median, 95th percentile and
    max regret, answers in the truth's tie, worlds where plain is best, median simulated cost."""
    out: list[list] = []
    for name, members in groups_of(rows):
        for m in methods:
            graded = [r for r in members if m in r["methods"]]
            if not graded:
                continue
            regrets = [r["methods"][m]["regret_pct"] for r in graded]
            ties = sum(r["methods"][m]["in_ties"] for r in graded)
            plain = sum(r["truth"]["best"] == "plain" for r in graded)
            cost = statistics.median(r["methods"][m]["seconds"] for r in graded)
            spread = [_pct(regrets, 50), _pct(regrets, 95), max(regrets)]
            out.append([name, len(graded), m, *spread, ties, plain, cost])
    return out


def summary_table(rows: Sequence[dict[str, Any]], methods: Sequence[str]) -> list[str]:
    lines = [
        f"Summary over {len(rows)} worlds. Regret: (mean TPOT of the answer - the best's) / the "
        "best's, open-loop truth, noise-free; percentiles interpolated linearly; in tie: the "
        f"answer within {TIE_SE:g} standard errors (paired) of the best; cost: simulated seconds "
        "of measuring.",
        "",
        f"{'group':<28} {'n':>3} {'method':<6} {'median':>8} {'p95':>8} {'max':>8} "
        f"{'in tie':>8} {'plain best':>10} {'cost s':>7}",
    ]
    previous = None
    for name, n, m, med, p95, top, ties, plain, cost in summary_rows(rows, methods):
        if previous is not None and name != previous:
            lines.append("")
        previous = name
        lines.append(
            f"{name:<28} {n:>3} {m:<6} {pc(med)} {pc(p95)} {pc(top)} "
            f"{ties:>3}/{n:<4} {plain:>10} {cost:>7.0f}"
        )
    lines.append("")
    return lines


def world_table(rows: Sequence[dict[str, Any]], methods: Sequence[str]) -> list[str]:
    head = (
        f"{'world':<17} {'np':>2} {'load':>4} {'arrivals':<8} {'truth':>6} {'margin':>13} "
        f"{'plain':>8} {'always':>8}"
    )
    for m in methods:
        head += f" | {m:>6} {'regret':>7}"
    lines = [head, "-" * len(head)]
    for row in rows:
        t = row["truth"]
        margin = f"{fmt(t['margin_pct'])}+-{fmt(t['margin_se_pct'])}%"
        line = (
            f"{row['name']:<17} {row['n_parallel']:>2} {row['load']:>4.2f} {row['arrivals']:<8} "
            f"{t['best']:>6} {margin:>13} {pc(t['plain_pct'], '+.1f')} "
            f"{pc(t['always_pct'], '+.1f')}"
        )
        for m in methods:
            r = row["methods"].get(m)
            if r is None:
                line += f" | {'skip':>6} {'-':>7}"
                continue
            mark = "=" if r["in_ties"] else "!" if r.get("overloaded") else " "
            line += f" | {r['label']:>5}{mark} {pc(r['regret_pct'], width=7)}"
        lines.append(line)
    lines.append(
        "margin: the best over the runner-up +- its paired standard error; plain, always: how "
        "far behind the best (%; unbounded: overloaded where another policy keeps up); '=' the "
        "answer is in the truth's tie, '!' it is overloaded (its backlog grows: regret unbounded)"
    )
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
    skipped = sorted({m for r in rows for m in r.get("skipped", {})})
    for m in skipped:
        reason = next(r["skipped"][m] for r in rows if m in r.get("skipped", {}))
        lines.append(f"Skipped: {m} ({reason}).")
    truth_s = sum(r["truth"]["seconds"] for r in rows)
    resolution = [r["truth"]["resolution_pct"] for r in rows]
    lines.append(
        f"Truth: {rows[0]['truth']['requests']} requests a world; the largest paired standard "
        f"error of a policy's difference from the best, median over worlds "
        f"{statistics.median(resolution):.2f} %, max {max(resolution):.2f} %; "
        f"{truth_s / 60:.1f} min to compute (cached)."
    )
    return "\n".join(lines)


def main() -> int:
    from record import Table, record_arguments, save_run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    grading_arguments(parser, OPENLOOP, REPO / "out" / "openloop-regret.json", METHODS)
    record_arguments(parser)
    args = parser.parse_args()
    methods = chosen_methods(parser, args.methods, METHODS)
    entries = select(load_manifest(args.set), args.worlds)
    if args.render:
        rows = load_rows(args.out)
    else:
        rows = run(args.set, entries, args.out, max(1, args.jobs), methods, args.redo)
    graded_methods = [m for m in methods if any(m in r["methods"] for r in rows.values())]
    print(render(rows, entries, graded_methods))
    graded = [rows[e.name] for e in entries if e.name in rows]
    if graded and not args.render:  # --render measured nothing: no run to record
        summary = {
            "worlds": len(graded),
            "set": args.set.name,
            "truth requests a world": graded[0]["truth"]["requests"],
            "plain best on": sum(r["truth"]["best"] == "plain" for r in graded),
            "skipped": sorted({m for r in graded for m in r.get("skipped", {})}),
        }
        tables = [
            Table("per world", world_columns(graded_methods), world_rows(graded, graded_methods)),
            Table("summary by tag", SUMMARY_COLUMNS, summary_rows(graded, graded_methods)),
        ]
        save_run(__file__, args, summary, tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
