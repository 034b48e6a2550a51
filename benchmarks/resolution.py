"""Benchmark: what it costs to resolve the drafting gain at one level, today's way against the
live switch, measured side by side on the bench.

At each level c (2, 4, 8 streams by default) the quantity a decision between thresholds needs
is g(c) = on(c) - off(c): always draft against a threshold that does not draft at c. Two ways
to measure its pairs, both driven by the same schedule (tuner/measure/schedule.py) and stored
by the same recorder:

- relaunch (today's way): always draft and threshold 1 on launches of their own, passes in
  alternating order (A B, B A; the launch that ends a pass starts the next), one round per
  level per launch: a pair's halves are a launch apart;
- live: one drafting launch, the threshold switched through POST /props round by round,
  A B B A at each level: a pair's halves are seconds apart.

Blocks of passes of the two ways alternate (relaunch, live, relaunch, live), so the machine's
drift over the run lands on both. Per way and level it prints the pair standard deviation (of
on - off, as a share of always-draft's tok/s), pairs per minute of wall time (launches, warm-up
and switching included), and the minutes each needs for a one-sided 95 % bound within 5 % of
the level's tok/s (t-quantiles for the pairs it would take).

    .venv/bin/python benchmarks/resolution.py [--levels 2,4,8] [--blocks 2] [--passes 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import say_text
from record import Table, fmt, record_arguments, save_run

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="2,4,8")
    parser.add_argument("--blocks", type=int, default=2, help="blocks of passes per way")
    parser.add_argument("--passes", type=int, default=3, help="passes per block")
    parser.add_argument("--target", type=float, default=0.05, help="half-width, share of tok/s")
    parser.add_argument("--spec", default=str(REPO / "profiles" / "bench-smollm2-cpu.toml"))
    record_arguments(parser)
    args = parser.parse_args()

    from tuner.bench import load_bench
    from tuner.decide.tune import sweep_arms
    from tuner.measure.backend import ServerBackend
    from tuner.measure.profiler import Profiler, gather_context
    from tuner.measure.spec import load_spec
    from tuner.settings import get_settings
    from tuner.storage.store import Store

    settings = get_settings()
    bench = load_bench(settings.bench_manifest_path)
    spec = load_spec(Path(args.spec), [], lambda: bench.as_refs())
    levels = [int(c) for c in args.levels.split(",")]
    work = Path(tempfile.mkdtemp(prefix="tuner-resolution-"))
    print(f"spec {spec.name}, levels {levels}, work in {work}", flush=True)
    context = gather_context(spec, None)
    ways = {}
    for way in ("relaunch", "live"):
        store = Store(f"sqlite:///{work / f'{way}.db'}")
        backend = ServerBackend(spec, work / "logs" / way, say_text, switch=way)
        profiler = Profiler(store, spec, work / "logs" / way, lambda e: None, backend=backend)
        profiler.create_run(context, kind="sweep")
        ways[way] = {"profiler": profiler, "backend": backend, "seconds": 0.0}

    for block in range(args.blocks):
        order = ("relaunch", "live") if block % 2 == 0 else ("live", "relaunch")
        for way in order:
            w = ways[way]
            arms = sweep_arms(
                levels, spec.workload.context_tokens[0], spec.speculative.n_max, live=way == "live"
            )
            started = time.perf_counter()
            for _ in range(args.passes):
                w["profiler"].run_pass(arms, pairs=2 if way == "live" else 1)
            if way == "relaunch":
                w["backend"].close()  # the next block starts on a fresh launch, as a run would
            w["seconds"] += time.perf_counter() - started
            print(
                f"block {block + 1}: {way} {args.passes} passes in "
                f"{time.perf_counter() - started:.0f} s",
                flush=True,
            )
    for w in ways.values():
        w["backend"].close()

    print()
    print(
        f"| way | streams | pairs | pair SD (% of tok/s) | pairs/min | minutes for +-"
        f"{100 * args.target:.0f} % (95 %, one-sided) |"
    )
    print("|---|---|---|---|---|---|")
    rows = []
    for way, w in ways.items():
        rows += way_rows(way, w["profiler"].repeats_by_cell(), w["seconds"], levels, args.target)
    for way, c, n, sd_pct, rate, minutes, need in rows:
        print(
            f"| {way} | {c} | {n} | {fmt(sd_pct, '.1f')} | {rate:.2f} | "
            f"{fmt(minutes, '.1f')} ({need} pairs) |"
        )
    print("\nwall: " + ", ".join(f"{way} {w['seconds']:.0f} s" for way, w in ways.items()))
    save_run(
        __file__,
        args,
        {f"{way} wall s": w["seconds"] for way, w in ways.items()},
        [
            Table(
                f"pairs of on - off per way and level; minutes for +-{100 * args.target:.0f} % "
                "(95 %, one-sided)",
                WAY_COLUMNS,
                rows,
            )
        ],
    )
    return 0


WAY_COLUMNS = ["way", "streams", "pairs", "pair SD % of tok/s", "pairs/min", "minutes", "pairs"]


def way_rows(way: str, rounds: dict, seconds: float, levels: list[int], target: float) -> list:
    """Per level of one way: its pairs, their SD as a share of always draft's tok/s, pairs per
    minute of wall time, and the minutes (and pairs) a one-sided 95 % bound within target of
    the level's tok/s needs."""
    from tuner.decide.paired import LevelDiffs, pairs_needed
    from tuner.decide.tune import live_gains

    gains = live_gains({(0, config, c): reps for (config, _, c), reps in rounds.items()})
    total_pairs = sum(gains[c].n for c in levels if c in gains)
    per_minute_all = total_pairs / (seconds / 60)
    rows = []
    for c in levels:
        d: LevelDiffs = gains.get(c, LevelDiffs(()))
        on = [
            r["tokens_per_second"]
            for (config, _, cc), reps in rounds.items()
            if cc == c and config == "spec"
            for r in reps
        ]
        tps = statistics.median(on) if on else float("nan")
        sd_rel = d.sd / tps if d.n > 1 else float("nan")
        # pairs at this level per minute: the level's share of the pairs, the run's rate
        rate = per_minute_all * d.n / max(total_pairs, 1)
        need = pairs_needed(d.sd, target * tps) if d.n > 1 else float("inf")
        minutes = need / rate if rate > 0 else float("inf")
        rows.append([way, c, d.n, 100 * sd_rel, rate, minutes, need])
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
