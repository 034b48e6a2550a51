"""Regret, cost and accuracy of the tuner against an exhaustive live sweep, per bench regime.

For each regime (profiles/bench-smollm2-cpu.toml: n-max 6 / synth-len 3.5,
profiles/bench-smollm2-cpu-nmax3.toml: n-max 3 / synth-len 2.0, and
profiles/bench-smollm2-cpu-late.toml where it exists: a crossover above 4 streams), in one run
on one machine:

1. the tuner's way, timed, twice into fresh databases: today's method (`tuner profile` with
   interleaved passes and adaptive levels, `recommend`, `tuner tune`) and the one before it
   (`--budget 0`, `workload.interleave=false`: levels 1, 2, 4, 8 in blocks per configuration,
   then `recommend`); for each, the held-out coverage of the profile's levels (leave one level
   out, 90 % intervals) and its mean absolute error;
2. the exhaustive way: a live sweep of every --spec-draft-max-slots N in 0..8 at every
   concurrency 1..8 with the same workload, timed. Launch-to-launch swings on a shared machine
   are as large as the differences being judged, so instead of repeating a cell within one
   launch the sweep makes --passes passes (default 3, the profile's repeat limit) of one repeat
   each, N in alternating order, and each cell is the median over passes; its cost is all
   passes together (every cell measured as often as a profile level at most is).

Then it prints, from the sweep weighted uniformly over levels 1..8, per method: the best N, the
answer's regret (target: at most 1 %) and its paired difference to the best N over the passes
(mean and standard error: a regret inside two standard errors is not one the sweep resolves),
the cost ratio tuner / sweep (target: at most 0.2), and
the model's accuracy on levels it was not fitted on, two ways (targets: mean absolute error at
most 5 %, 90 % interval coverage at least 80 %):
- held out: leave one of the profile's levels out, refit, predict it;
- unseen: the profile's model (before any live trial) predicts every sweep cell at a level the
  profile never measured; the sweep measured them in other launches, minutes later.

It also prints the sweep's own noise: N=0 and N=8 are the same server policy at every level
(with -np 8 no level has more than 8 slots generating), so their paired difference is launch
noise alone; and the pass-to-pass spread of each N's weighted tok/s, pooled.

    .venv/bin/python benchmarks/regret.py [--regime NAME] [--passes 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np
from common import fresh_env, tuner

from tuner.bench import load_bench
from tuner.decide.tune import Paired, pass_objectives
from tuner.measure.profiler import Profiler, gather_context
from tuner.measure.spec import load_spec
from tuner.model.costmodel import CostModel
from tuner.model.coverage import Coverage, HeldOutPoint, leave_one_level_out
from tuner.model.fitting import fit
from tuner.policy import Policy
from tuner.settings import Settings
from tuner.storage.engine import Store
from tuner.storage.fits import select_data
from tuner.storage.queries import run_points

REPO = Path(__file__).resolve().parent.parent
REGIMES = tuple(
    name
    for name in ("bench-smollm2-cpu", "bench-smollm2-cpu-nmax3", "bench-smollm2-cpu-late")
    if (REPO / "profiles" / f"{name}.toml").exists()
)
METHODS = {
    "new": [],
    "before": ["--budget", "0", "--set", "workload.interleave=false"],
}
N_PARALLEL = 8
LEVELS = range(1, N_PARALLEL + 1)


def tuner_way(spec: Path, model: str, workdir: Path, method: str) -> tuple[float, dict]:
    """The method's steps as a user runs them, timed: profile and recommend, and for "new" the
    live trials (`tuner tune`) too. Returns the timed wall seconds and what the method answered,
    with the profile's model and its held-out coverage (the sweep grades the answer)."""
    env = fresh_env(workdir / f"tuner-{method}.db", workdir / "cache")
    db = env["TUNER_DB"]
    started = time.monotonic()
    tuner(env, "profile", str(spec), *METHODS[method])
    line = tuner(env, "recommend", "--model", model, "-q").strip()
    store = Store(db)
    data = select_data(store, model, None)[0]
    store.dispose()
    coverage = leave_one_level_out(data)
    profiled = fit(data).model
    if method == "new":
        tuned = json.loads(tuner(env, "tune", "--model", model, "--format", "json"))
        line = f"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS={tuned['standing']}"
    wall = time.monotonic() - started
    report: dict = {"env_line": line, "recommended": int(line.rpartition("=")[2])}
    report["coverage"] = coverage
    report["model"] = profiled
    report["profiled_levels"] = sorted({lv.concurrency for lv in data.levels})
    return wall, report


def unseen_levels(
    model: CostModel, profiled: list[int], cells: dict[int, dict[int, float]]
) -> Coverage:
    """The profile's model against every sweep cell at a level the profile did not measure."""
    points = []
    for n, row in cells.items():
        policy = Policy.of_max_slots(n)
        for c, measured in row.items():
            if c in profiled:
                continue
            pred = model.predict(policy, concurrency=[c])
            points.append(
                HeldOutPoint(
                    policy, c, measured, pred.tokens_per_second[0], pred.lower[0], pred.upper[0]
                )
            )
    return Coverage(tuple(points), model.interval)


def sweep_pass(spec_path: Path, workdir: Path, order: list[int]) -> tuple[float, dict]:
    """One live pass over N in `order` at every level 1..8: wall time and N -> c -> tok/s."""
    settings = Settings()
    overrides = [
        ("workload.concurrency", list(LEVELS)),
        ("workload.min_repeats", 1),
        ("workload.max_repeats", 1),
        ("model_name", f"{spec_path.stem}-sweep"),
    ]
    spec = load_spec(
        spec_path, overrides, lambda: load_bench(settings.bench_manifest_path).as_refs()
    )
    store = Store(f"sqlite:///{workdir / 'sweep.db'}")
    profiler = Profiler(store, spec, workdir / "logs")
    started = time.monotonic()
    profiler.create_run(gather_context(spec, None), kind="sweep")
    policies = [Policy.of_max_slots(n) for n in order]
    run_id = profiler.execute(policies, kernel_level=False)
    wall = time.monotonic() - started
    _, points = run_points(store, run_id)
    store.dispose()
    table: dict[int, dict[int, float]] = {}
    for p in points:
        if p.policy is not None:
            table.setdefault(p.policy.max_slots or 0, {})[p.concurrency] = p.tokens_per_second
    return wall, table


def percent_of(paired: Paired, reference: dict[int, float]) -> Paired:
    """A paired difference in tok/s as a percentage of the reference's mean over its passes."""
    scale = 100 / statistics.fmean(reference.values())
    return Paired(paired.mean * scale, paired.se * scale, paired.passes)


def sweep_noise(by_pass: dict[int, dict[int, float]]) -> str:
    """What the sweep can resolve, from N -> pass -> weighted tok/s: the twin policies' paired
    difference (N=0 and N=8 run the same server policy at every level) and the pooled
    pass-to-pass coefficient of variation of a row, with the least difference of two rows'
    pass means that is outside two standard errors."""
    passes = len(by_pass[0])
    if passes < 2:
        return "sweep noise: one pass, no spread to tell (--passes 2 or more)\n"
    twin = percent_of(Paired.of(by_pass[0], by_pass[N_PARALLEL]), by_pass[N_PARALLEL])
    cv = 100 * math.sqrt(
        statistics.fmean(
            (statistics.stdev(row.values()) / statistics.fmean(row.values())) ** 2
            for row in by_pass.values()
        )
    )
    return (
        f"sweep noise: N=0 against N={N_PARALLEL} (the same policy at every level) "
        f"{twin.mean:+.2f} ± {twin.se:.2f} % paired over {twin.passes} passes; a row's weighted "
        f"tok/s varies {cv:.1f} % from pass to pass (pooled), so two rows' means over {passes} "
        f"passes differ by noise alone up to about {2 * math.sqrt(2 / passes) * cv:.1f} % "
        "(two standard errors)\n"
    )


def regime(name: str, passes: int, workdir: Path) -> list[tuple]:
    spec = REPO / "profiles" / f"{name}.toml"
    model = tomllib.loads(spec.read_text())["model_name"]
    ways = {}
    for method in METHODS:
        ways[method] = tuner_way(spec, model, workdir, method)
        tuner_s, report = ways[method]
        print(
            f"[{name}] tuner, {method} (timed steps): {tuner_s:.0f} s, "
            f"{report['env_line']}; held-out {report['coverage'].summary()}",
            flush=True,
        )
    walls, tables = [], []
    for p in range(passes):
        order = list(range(N_PARALLEL + 1))
        if p % 2:
            order.reverse()
        wall, table = sweep_pass(spec, workdir, order)
        walls.append(wall)
        tables.append(table)
        print(f"[{name}] sweep pass {p + 1}: {wall:.0f} s", flush=True)
    cells = {n: {c: statistics.median(t[n][c] for t in tables) for c in LEVELS} for n in tables[0]}
    weighted = {n: statistics.fmean(row[c] for c in LEVELS) for n, row in cells.items()}
    uniform = np.full(N_PARALLEL, 1 / N_PARALLEL)
    by_pass = {
        n: pass_objectives(dict(enumerate(t[n] for t in tables)), LEVELS, uniform) for n in cells
    }
    best = max(weighted, key=lambda n: weighted[n])
    sweep_s = sum(walls)
    print(f"\n[{name}] sweep tok/s, median of {passes} pass(es), N (rows) x streams (columns):")
    print("  N  " + " ".join(f"{c:>7}" for c in LEVELS) + "  weighted")
    recs = {method: report["recommended"] for method, (_, report) in ways.items()}
    for n in sorted(cells):
        marks = ("  <- best" if n == best else "") + "".join(
            f"  <- {method}" for method, rec in recs.items() if rec == n
        )
        print(
            f"{n:>3}  "
            + " ".join(f"{cells[n][c]:>7.1f}" for c in LEVELS)
            + f"  {weighted[n]:>8.1f}{marks}"
        )
    print(sweep_noise(by_pass))
    rows = []
    for method, (tuner_s, report) in ways.items():
        rec = report["recommended"]
        regret = 100 * (weighted[best] - weighted[rec]) / weighted[best]
        paired = percent_of(Paired.of(by_pass[rec], by_pass[best]), by_pass[best])
        cov = report["coverage"]
        unseen = unseen_levels(report["model"], report["profiled_levels"], cells)
        print(f"[{name}] {method}: held out: {cov.summary()}")
        print(
            f"[{name}] {method}: unseen levels (profile's model vs sweep cells at levels "
            f"{sorted({p.concurrency for p in unseen.points})}): {unseen.summary()}"
        )
        print(
            f"[{name}] {method}: regret vs sweep {regret:.2f} % (paired over passes, N={rec} "
            f"against N={best}: {paired.mean:+.2f} ± {paired.se:.2f} %), cost ratio "
            f"{tuner_s / sweep_s:.2f} ({tuner_s:.0f} s / {sweep_s:.0f} s)\n",
            flush=True,
        )
        rows.append(
            (
                f"{name} ({method})",
                rec,
                best,
                regret,
                paired,
                tuner_s / sweep_s,
                cov.mean_abs_error_pct,
                100 * cov.fraction,
                unseen.mean_abs_error_pct,
                100 * unseen.fraction,
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regime", choices=REGIMES, action="append")
    parser.add_argument("--passes", type=int, default=3, help="sweep passes (median per cell)")
    parser.add_argument("--keep", type=Path, help="keep the databases and logs here")
    args = parser.parse_args()
    summary = []
    for name in args.regime or REGIMES:
        if args.keep:
            workdir = args.keep / name
            workdir.mkdir(parents=True, exist_ok=True)
            summary += regime(name, args.passes, workdir)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                summary += regime(name, args.passes, Path(tmp))
    print(
        "regime (method)                          rec  best  regret%  paired% ± se  cost ratio  "
        "held-out err% cover%  unseen err% cover%"
    )
    for name, rec, best, regret, paired, ratio, held_err, cov, unseen_err, unseen_cov in summary:
        print(
            f"{name:<40} {rec:>3} {best:>5} {regret:>8.2f} {paired.mean:>+7.2f} ± "
            f"{paired.se:<4.2f} {ratio:>11.2f} "
            f"{held_err:>13.1f} {cov:>6.0f} {unseen_err:>12.1f} {unseen_cov:>6.0f}"
        )
    print(
        "targets: regret <= 1 %, cost ratio <= 0.2, held-out error <= 5 %, "
        "90 % interval coverage >= 80 %"
    )


if __name__ == "__main__":
    main()
