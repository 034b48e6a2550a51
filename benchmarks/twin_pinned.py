"""The twin against the pinned build: what each speculative type costs in llama.cpp 11434's
source, and the bench's probe figures beside a twin calibrated from the same run.

1. The source: per speculative type (draft-simple, MTP, n-gram), what it costs at admission,
   per step while the slot does not draft (the off arm), on resuming drafts (catch-up) and per
   draft, the world kind and terms that follow it, and the source lines (tuner.twin.drafters).
2. A profile of the bench (`tuner profile SPEC --budget 0`: plain, always draft and the off arm
   on the live switch at 1, 2, 4, 8 streams, then the arrival probes; or the newest completed
   profile of --db), its fit: the join probe's cost beyond a join's prompt tokens, the catch-up
   probe's cost a token behind, the draft model's prompt cost a token (time-to-first-token
   slopes), and the off arm against plain at each level (the threshold server not drafting
   over plain, tok/s, less 1), each with its 90 % interval (bootstrap replicates of the fit for
   the off arm).
3. The twin calibrated from that run (tuner.twin.from_run, as `tuner dev twin calibrate --run`:
   an eager drafter, its re-evaluation from the run's off arms), probed the same way in-process
   (the same probes, workload and repeats, the twin's quiet noise, several seeds): join,
   catch-up, draft prompt cost; its off arm against plain from its noise-free closed levels.
4. Side by side: each bench figure's interval beside the twin's, "agree" where each value lies
   in the other's interval (or the intervals overlap), else "differ" with the gap.

--stand-in WORLD measures a twin world in-process in the bench's place (a minute, no bench):
the script's own check, with the world's own terms printed beside.

    .venv/bin/python benchmarks/twin_pinned.py [--spec profiles/bench-smollm2-cpu.toml]
        [--db URL] [--seeds 3] [--stand-in WORLD]

On the bench it needs the machine to itself, nothing else running (the profile with its
probes takes about 5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import tuner, tuner_env
from lab.method import HOST, twin_spec
from record import Table, record_arguments, save_run

from tuner.decide.adaptive import profile_adaptively
from tuner.measure.load import Workload
from tuner.measure.probes import catch_up_rounds, join_rounds
from tuner.model.arrivals import Figure, fit_catch_up, fit_join
from tuner.policy import Policy
from tuner.storage.fits import current_fit
from tuner.storage.queries import list_runs
from tuner.storage.store import Store
from tuner.twin.drafters import DRAFTERS, SOURCE
from tuner.twin.from_run import calibrate_run, run_levels
from tuner.twin.inprocess import TwinBackend
from tuner.twin.truth import closed_truth
from tuner.twin.world import World, load_world, world_to_toml

REPO = Path(__file__).resolve().parent.parent
PROBE_REPEATS = 2  # rounds of each probe shape on the twin (the profile's default)
SOURCE_COLUMNS = [
    "spec type", "kind", "admission", "off arm", "resume", "per draft", "terms", "source",
]  # fmt: skip


def source_rows() -> list[list[str]]:
    return [
        [d.spec_type, d.kind, d.admission, d.off_step, d.resume, d.per_draft, d.terms, d.source]
        for d in DRAFTERS
    ]


def profiled_run(args: argparse.Namespace, work: Path) -> tuple[Store, int, str, str, Any]:
    """The profile (bench or stand-in) and its run id, model, host and the measured workload."""
    if args.stand_in is not None:
        world = load_world(args.stand_in)
        spec = twin_spec(world, levels=(1, 2, 4, 8), max_tokens=64, seed=args.seed)
        store = Store(f"sqlite:///{work / 'tuner.db'}")
        backend = TwinBackend(world, switch="live", seed=args.seed)
        run = profile_adaptively(
            store, spec, work / "logs", host_name=HOST, backend=backend, budget_s=0.0,
            switch="live",
        )  # fmt: skip
        return store, run.run_id, world.model_name, HOST, spec.workload
    from tuner.bench import load_bench
    from tuner.measure.spec import load_spec
    from tuner.settings import Settings

    spec = load_spec(args.spec, [], load_bench(Settings().bench_manifest_path).as_refs)
    db = args.db or f"sqlite:///{work / 'tuner.db'}"
    if not args.db:
        began = time.monotonic()
        tuner(tuner_env(db, work / "cache"), "profile", str(args.spec), "--budget", "0")
        print(f"profile: {time.monotonic() - began:.0f} s", flush=True)
    store = Store(db)
    done = [
        r
        for r in list_runs(store, spec.model_name, 200)
        if r.kind == "profile" and r.status == "completed"
    ]
    if not done:
        raise SystemExit(f"no completed profile run of {spec.model_name} in {db}")
    return store, done[0].id, spec.model_name, socket.gethostname(), spec.workload


def off_against_plain(model: Any) -> dict[int, tuple[float, float, float]]:
    """The threshold server not drafting over plain, less 1, at each level from 2 up: the fit's
    point and its replicates' 90 % interval."""
    levels = np.arange(2, model.n_parallel + 1, dtype=float)

    def share(m: Any) -> np.ndarray:
        return m.threshold_tps(levels) / m.plain_tps(levels) - 1.0

    point = share(model)
    reps = model.samples(share)
    lo, hi = np.quantile(reps, 0.05, axis=0), np.quantile(reps, 0.95, axis=0)
    rows = zip(levels, point, lo, hi, strict=True)
    return {int(c): (float(p), float(a), float(b)) for c, p, a, b in rows}


def twin_probes(world: World, workload: Workload, repeats: int, seeds: int) -> dict[str, Figure]:
    """The join and catch-up probes on the twin in-process, pooled over seeds, fitted as the
    profile fits them; the draft prompt cost is the world's own term (exact)."""
    joins, resumes = [], []
    for seed in range(seeds):
        backend = TwinBackend(world, switch="live", seed=1000 + seed)
        joins += join_rounds(backend, workload, world.n_max, repeats)
        resumes += catch_up_rounds(backend, workload, world.n_max, repeats)
    prefill = Figure.assumed("the world's term", world.prefill.ms_per_token)
    draft = Figure.assumed("the world's term", world.prefill.draft_ms_per_token)
    return {
        "join": fit_join(joins, prefill, draft),
        "catch_up": fit_catch_up(resumes),
        "draft_prefill": draft,
    }


def twin_off(world: World, workload: Workload) -> dict[int, float]:
    """The twin's threshold server not drafting over plain, less 1, noise-free, per level."""
    truth = closed_truth(
        world,
        output_tokens=workload.max_tokens,
        prompt_tokens=workload.prompt_tokens,
        concurrency=list(range(2, world.n_parallel + 1)),
    )
    return {
        c: truth.tps(Policy.threshold(c - 1), c) / truth.tps(Policy.plain(), c) - 1.0
        for c in range(2, world.n_parallel + 1)
    }


def verdict(a: tuple[float, float, float], b: tuple[float, float, float]) -> str:
    """Agree where either value lies in the other's interval or the intervals overlap."""
    if a[1] <= b[0] <= a[2] or b[1] <= a[0] <= b[2] or (a[1] <= b[2] and b[1] <= a[2]):
        return "agree"
    return f"differ by {b[0] - a[0]:+.3g}"


def triple(f: Figure) -> tuple[float, float, float]:
    return (f.value, f.lower, f.upper)


def shown(t: tuple[float, float, float], digits: str = ".3g") -> str:
    return f"{t[0]:{digits}} [{t[1]:{digits}}, {t[2]:{digits}}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=REPO / "profiles" / "bench-smollm2-cpu.toml")
    parser.add_argument("--db", help="a database holding the profile (else one is made)")
    parser.add_argument("--seeds", type=int, default=3, help="twin probe runs to pool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stand-in", type=Path, help="a twin world in the bench's place")
    record_arguments(parser)
    args = parser.parse_args()
    print(f"== 1. what each speculative type costs in {SOURCE}")
    for d in DRAFTERS:
        print(
            f"- {d.spec_type} ({d.kind}): admission: {d.admission}; off arm: {d.off_step}; "
            f"resume: {d.resume}; per draft: {d.per_draft}. World terms: {d.terms}. "
            f"Source: {d.source}"
        )
    work = Path(tempfile.mkdtemp(prefix="tuner-twin-pinned-"))
    store, run_id, model, host, workload = profiled_run(args, work)
    fit = current_fit(store, model, host)
    costs = fit.model.arrivals
    if costs is None:
        raise SystemExit("the profile stored no arrival probes (probes.enabled off?)")
    print(f"\n== 2. the profile: run {run_id} in {store.url}; its fit's arrival costs")
    for line in costs.lines():
        print(f"- {line}")
    cal = calibrate_run(run_levels(store, run_id))
    world = cal.world
    (work / "twin-world.toml").write_text(world_to_toml(world))
    print(f"\n== 3. the twin calibrated from run {run_id} (kind {world.draft.kind})")
    print(cal.report())
    load = Workload(workload.prompt_tokens, workload.max_tokens)
    mine = twin_probes(world, load, PROBE_REPEATS, args.seeds)
    off_bench = off_against_plain(fit.model)
    off_twin = twin_off(world, load)
    rows: list[list[Any]] = []
    for name, unit in (
        ("join", "ms a join beyond its prompt"),
        ("catch_up", "ms a token behind"),
        ("draft_prefill", "ms a prompt token"),
    ):
        bench, twin = triple(getattr(costs, name)), triple(mine[name])
        rows.append([name, unit, *bench, *twin, verdict(bench, twin)])
    for c, bench in sorted(off_bench.items()):
        t = (off_twin[c],) * 3
        rows.append([f"off arm at {c}", "share vs plain", *bench, *t, verdict(bench, t)])
    label = "stand-in" if args.stand_in else "bench"
    print(f"\n== 4. the {label} beside the twin (90 % intervals)")
    for r in rows:
        print(
            f"{r[0]:<14} {r[1]:<28} {label} {shown((r[2], r[3], r[4]))}   twin "
            f"{shown((r[5], r[6], r[7]))}   {r[8]}"
        )
    if args.stand_in is not None:
        truth = load_world(args.stand_in)
        print(
            f"(the stand-in's own terms: kind {truth.draft.kind}, draft prompt "
            f"{truth.prefill.draft_ms_per_token} ms a token, catch-up "
            f"{truth.draft.catch_up_ms_per_token} ms a token)"
        )
    agree = sum(r[-1] == "agree" for r in rows)
    summary = {
        "measured on": label,
        "run": run_id,
        "twin kind": world.draft.kind,
        "figures": len(rows),
        "agree": agree,
        "twin reeval share": cal.reeval_share,
    }
    columns = [
        "figure", "unit", f"{label}", f"{label} low", f"{label} high", "twin", "twin low",
        "twin high", "verdict",
    ]  # fmt: skip
    save_run(
        __file__,
        args,
        summary,
        [
            Table("speculative types at the pinned build", SOURCE_COLUMNS, source_rows()),
            Table("the profile beside the twin calibrated from it", columns, rows),
        ],
    )
    store.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
