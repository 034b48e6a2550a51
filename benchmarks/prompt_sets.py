"""Acceptance, crossover and recommended N per bundled prompt set, where acceptance is real.

The regime is profiles/bench-smollm2-cpu-ngram.toml: the bench's F32 target drafts by n-gram
lookup (llama-server's ngram-simple), so what it accepts comes from the text, not from
--spec-synth-len. For each prompt set (profiles/prompts/code-edit.jsonl: "repeat this code with
one change"; profiles/prompts/stories.jsonl: "write a new story") it runs, as a user would and
into a fresh database, `tuner profile` (default budget: adaptive levels included) and reads back
`tuner dev fit` and `tuner recommend`. It prints, per set: the measured acceptance (tokens per
stream per step at n_max and the per-position rates), spec against plain at 1 and 8 streams, the
crossover with its 90 % interval, the recommended N and the profile's wall time.

The sets run one after the other on one machine, so each set's spec/plain ratios are measured in
the same interleaved passes; compare sets by those ratios, not by raw tok/s.

    .venv/bin/python benchmarks/prompt_sets.py [--set code-edit --set stories] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tomllib
from pathlib import Path

from common import tuner, tuner_env
from record import Table, fmt, record_arguments, save_run

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "profiles" / "bench-smollm2-cpu-ngram.toml"
SETS = ("code-edit", "stories")


def one_set(name: str, workdir: Path, extra: list[str]) -> dict:
    env = tuner_env(workdir / f"{name}.db", workdir / "cache")
    model = tomllib.loads(SPEC.read_text())["model_name"]
    started = time.monotonic()
    tuner(env, "profile", str(SPEC), "--set", f'workload.prompts="prompts/{name}.jsonl"', *extra)
    wall = time.monotonic() - started
    fitted = json.loads(tuner(env, "dev", "fit", "--model", model, "--format", "json"))
    rec = json.loads(tuner(env, "recommend", "--model", model, "--format", "json"))
    points = {
        (p["policy"], p["concurrency"]): p["measured_tps"]
        for p in fitted["quality"]["points"]
        if p.get("measured_tps") is not None
    }
    return {
        "set": name,
        "wall_s": wall,
        "acceptance": fitted["quality"]["acceptance"],
        "crossover": fitted["crossover"],
        "recommended": rec["max_slots"],
        "objective": rec["objective"],
        "ratio": {
            c: points[("N=0", c)] / points[("plain", c)]
            for c in (1, 2, 4, 8)
            if ("N=0", c) in points and ("plain", c) in points
        },
        "workload": fitted["inputs"].get("workload"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=SETS, action="append", dest="sets")
    parser.add_argument("--keep", type=Path, help="keep the databases and logs here")
    parser.add_argument(
        "--profile-arg", action="append", default=[], help="extra `tuner profile` argument"
    )
    record_arguments(parser)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in args.sets or SETS:
            r = one_set(name, workdir, args.profile_arg)
            results.append(r)
            acc = r["acceptance"]
            print(
                f"[{name}] {r['workload']}: profile {r['wall_s']:.0f} s; acceptance "
                f"{acc['mean_length']:.2f} tokens/step at n_max {acc['n_max']} (rates "
                + ", ".join(f"{x:.2f}" for x in acc["rates"])
                + f"); recommended N={r['recommended']}",
                flush=True,
            )
    print(
        "\nprompt set   accept len  spec/plain 1  spec/plain 8  crossover [90 %]       N  profile s"
    )
    rows = set_rows(results)
    for name, accept, one, eight, _, _, _, cross, n, wall in rows:
        print(
            f"{name:<12} {accept:>10.2f} {fmt(one):>13} {fmt(eight):>13}  "
            f"{cross:<22} {n:>2} {wall:>10.0f}"
        )
    save_run(
        __file__,
        args,
        {"spec": SPEC.name, "extra profile arguments": args.profile_arg},
        [Table("per prompt set", SET_COLUMNS, rows)],
    )


SET_COLUMNS = [
    "prompt set",
    "accept len",
    "spec/plain 1",
    "spec/plain 8",
    "crossover",
    "lower 90 %",
    "upper 90 %",
    "crossover [90 %]",
    "N",
    "profile s",
]


def set_rows(results: list[dict]) -> list[list]:
    """Per prompt set: acceptance length, spec/plain at 1 and 8 streams, the crossover with its
    90 % interval (and as text), the recommended N and the profile's wall time."""
    rows: list[list] = []
    for r in results:
        x = r["crossover"]
        cross = (
            f"{x['streams']:.1f} [{fmt(x['lower'], '.1f')}, {fmt(x['upper'], '.1f')}]"
            if x.get("streams") is not None
            else f"none (spec wins up to {x.get('spec_wins_upto')})"
        )
        ratio = r["ratio"]
        rows.append(
            [
                r["set"],
                r["acceptance"]["mean_length"],
                ratio.get(1),
                ratio.get(8),
                x.get("streams"),
                x.get("lower"),
                x.get("upper"),
                cross,
                r["recommended"],
                r["wall_s"],
            ]
        )
    return rows


if __name__ == "__main__":
    main()
