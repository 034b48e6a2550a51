"""Benchmark: what the bench's portable build costs in tok/s against ggml's native build.

The bench builds llama.cpp for a named instruction set (x86-64-v3: AVX2/FMA/F16C/BMI2, no
AVX-512, no AMX) so that it runs on every machine this project lands on; ggml's default
(-march=native) may be faster on the machine that built it. This builds (or reuses) the native
variant beside the bench's, proves both here, then measures plain and always-draft decode of
the bench spec at 1 and 8 streams with each build, interleaved by the schedule (builds and
policies alternate from round to round), and prints per-cell medians and the portable/native
ratio.

    .venv/bin/python benchmarks/build_variants.py [--rounds 3] [--levels 1,8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from record import Table, fmt, record_arguments, save_run

REPO = Path(__file__).resolve().parent.parent


def median_rows(
    tps: dict[tuple[str, str, int], list[float]], levels: list[int], portable: str
) -> list[list]:
    """Per configuration and level: the portable build's median tok/s, native's, their ratio."""
    rows: list[list] = []
    for config in ("plain", "spec"):
        for c in levels:
            mine = statistics.median(tps[(portable, config, c)])
            native = statistics.median(tps[("native", config, c)])
            rows.append([config, c, mine, native, mine / native])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--levels", default="1,8")
    parser.add_argument("--spec", default=str(REPO / "profiles" / "bench-smollm2-cpu.toml"))
    record_arguments(parser)
    args = parser.parse_args()

    from tuner.bench import load_bench, proven_build
    from tuner.measure.launcher import ManagedServer
    from tuner.measure.load import LoadGenerator, Workload, summarize
    from tuner.measure.plan import launch_config
    from tuner.measure.schedule import plan_pass
    from tuner.measure.spec import load_spec
    from tuner.policy import Policy
    from tuner.settings import get_settings

    settings = get_settings()
    bench = load_bench(settings.bench_manifest_path)
    models = {"target": bench.target, "draft": bench.draft, "q4": bench.source_q4}
    record, proof = proven_build(settings.cache_dir, models, print, variant="native")
    builds = {bench.variant: bench.server, "native": Path(record["binaries"]["llama-server"])}
    print(f"native build here: {proof.system_info}")
    levels = [int(c) for c in args.levels.split(",")]
    spec = load_spec(Path(args.spec), [], lambda: bench.as_refs())
    workload = Workload(
        prompt_tokens=spec.workload.prompt_tokens, max_tokens=spec.workload.max_tokens, stream=True
    )
    tps: dict[tuple[str, str, int], list[float]] = {}
    # The schedule's passes with the builds as its places: each policy's launches of the two
    # builds side by side, the order of builds and of policies alternating from round to round.
    arms = {build: [Policy.plain(), Policy.always()] for build in builds}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for step in plan_pass(arms, lambda p: p.config_name, round_):
                build, policy = step.cell, step.policy
                launch = launch_config(spec, policy)
                launch.binary = builds[build]
                log = Path(tmp) / f"{build}-{policy.config_name}-{round_}.log"
                with ManagedServer(launch, log, name=f"{build} {policy.config_name}") as server:
                    generator = LoadGenerator(server.url, workload)
                    generator.run(max(levels))  # warm-up
                    for c in levels:
                        figures = summarize(generator.run(c, step.round_key), c)
                        tps.setdefault((build, policy.config_name, c), []).append(
                            figures.tokens_per_second or 0.0
                        )
                        print(
                            f"round {round_ + 1} {build:>8} {policy.config_name:>5} c={c}: "
                            f"{fmt(figures.tokens_per_second, '.1f')} tok/s",
                            flush=True,
                        )
    portable = bench.variant
    rows = median_rows(tps, levels, portable)
    print(f"\nmedian tok/s over {args.rounds} interleaved rounds ({portable} vs native):")
    print(f"{'config':>6} {'c':>3} {portable:>9} {'native':>9} {'ratio':>7}")
    for config, c, mine, native, ratio in rows:
        print(f"{config:>6} {c:>3} {mine:>9.1f} {native:>9.1f} {ratio:>7.3f}")
    save_run(
        __file__,
        args,
        {"rounds": args.rounds, "portable build": portable, "native build": proof.system_info},
        [
            Table(
                f"median tok/s over {args.rounds} interleaved rounds",
                ["config", "streams", portable, "native", "ratio"],
                rows,
            )
        ],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
