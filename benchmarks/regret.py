"""Regret, cost and accuracy of the tuner against an exhaustive live sweep, in both bench regimes.

For each regime (profiles/bench-smollm2-cpu.toml: n-max 6 / synth-len 3.5, and
profiles/bench-smollm2-cpu-nmax3.toml: n-max 3 / synth-len 2.0), in one run on one machine:

1. the tuner's way, timed: `tuner profile` (levels 1, 2, 4, 8), `tuner recommend`,
   `tuner validate`, into a fresh database;
2. the exhaustive way, timed: a live sweep of every --spec-draft-max-slots N in 0..8 at every
   concurrency 1..8 (same workload and repeat rules), into another database;

then prints, from the sweep's measurements weighted uniformly over levels 1..8: the best N, the
recommended N's regret (target: within 2 %), the cost ratio tuner / sweep wall time (target: at
most 0.5), and the model's error on the validation points (target: at most 8 % mean absolute).

    .venv/bin/python benchmarks/regret.py [--regime NAME] [--set workload.max_repeats=2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tuner.profiler import Profiler, ServerConfig, gather_context
from tuner.settings import Settings
from tuner.spec import load_spec, parse_override
from tuner.store import Store

REPO = Path(__file__).resolve().parent.parent
REGIMES = ("bench-smollm2-cpu", "bench-smollm2-cpu-nmax3")
N_PARALLEL = 8


def tuner(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "tuner", *args], env=env, text=True,
                            capture_output=True, check=False)
    if result.returncode != 0:
        sys.exit(f"tuner {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result


def tuner_way(spec: Path, model: str, workdir: Path, overrides: list[str]) -> tuple[float, dict]:
    env = {**os.environ, "TUNER_DB": f"sqlite:///{workdir / 'tuner.db'}",
           "TUNER_CACHE_DIR": str(workdir / "cache"),
           "TUNER_BENCH_MANIFEST": str(Settings().bench_manifest_path)}
    sets = [arg for o in overrides for arg in ("--set", o)]
    started = time.monotonic()
    tuner(env, "profile", str(spec), *sets)
    line = tuner(env, "recommend", "--model", model, "-q").stdout.strip()
    report = json.loads(tuner(env, "validate", "--model", model, "--format", "json",
                              *sets).stdout)
    wall = time.monotonic() - started
    report["env_line"] = line
    return wall, report


def sweep(spec_path: Path, workdir: Path, overrides: list[str]) -> tuple[float, dict]:
    """Every N in 0..8 at every level 1..8, measured live; returns wall time and N -> c -> tok/s."""
    settings = Settings()
    from tuner.bench import load_bench

    parsed = [parse_override(o) for o in overrides]
    parsed.append(("workload.concurrency", list(range(1, N_PARALLEL + 1))))
    parsed.append(("model_name", f"{spec_path.stem}-sweep"))
    spec = load_spec(spec_path, parsed, lambda: load_bench(settings.bench_manifest_path).as_refs())
    store = Store(f"sqlite:///{workdir / 'sweep.db'}")
    profiler = Profiler(store, spec, workdir / "logs")
    started = time.monotonic()
    profiler.create_run(gather_context(spec, None), kind="sweep")
    configs = [ServerConfig.spec()] + [ServerConfig.threshold(n) for n in range(1, N_PARALLEL + 1)]
    run_id = profiler.execute(configs, kernel_level=False)
    wall = time.monotonic() - started
    from tuner.results import run_points

    _, points = run_points(store, run_id)
    table: dict[int, dict[int, float]] = {}
    for p in points:
        table.setdefault(p.max_slots or 0, {})[p.concurrency] = p.tokens_per_second
    return wall, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regime", choices=REGIMES, action="append")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="spec override for both ways")
    args = parser.parse_args()
    summary = []
    for regime in args.regime or REGIMES:
        spec = REPO / "profiles" / f"{regime}.toml"
        model = _model_name(spec)
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            tuner_s, report = tuner_way(spec, model, work, args.overrides)
            print(f"[{regime}] tuner: {tuner_s:.0f} s, {report['env_line']}", flush=True)
            sweep_s, table = sweep(spec, work, args.overrides)
            print(f"[{regime}] sweep: {sweep_s:.0f} s", flush=True)
        levels = range(1, N_PARALLEL + 1)
        weighted = {n: sum(row[c] for c in levels) / len(levels) for n, row in table.items()}
        best = max(weighted, key=lambda n: weighted[n])
        rec = report["recommended"]
        regret = 100 * (weighted[best] - weighted[rec]) / weighted[best]
        print(f"\n[{regime}] sweep tok/s by N (rows) and streams (columns):")
        print("  N  " + " ".join(f"{c:>7}" for c in levels) + "  weighted")
        for n in sorted(table):
            print(f"{n:>3}  " + " ".join(f"{table[n][c]:>7.1f}" for c in levels)
                  + f"  {weighted[n]:>8.1f}{'  <- best' if n == best else ''}"
                  + ("  <- recommended" if n == rec else ""))
        summary.append((regime, rec, best, regret, tuner_s / sweep_s,
                        report["mean_abs_error_pct"], report["worst_abs_error_pct"]))
    print("\nregime                     rec  best  regret%  cost ratio  model err mean% / worst%")
    for regime, rec, best, regret, ratio, mean_err, worst_err in summary:
        print(f"{regime:<26} {rec:>3} {best:>5} {regret:>8.2f} {ratio:>11.2f} "
              f"{mean_err:>10.1f} / {worst_err:.1f}")
    print("targets: regret <= 2 %, cost ratio <= 0.5, mean model error <= 8 %")


def _model_name(spec: Path) -> str:
    import tomllib

    return tomllib.loads(spec.read_text())["model_name"]


if __name__ == "__main__":
    main()
