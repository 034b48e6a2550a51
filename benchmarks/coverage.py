"""Coverage of held-out levels: leave one concurrency level out, refit, and count the measured
points inside their 90 % intervals, for the cost model's intervals (launch-to-launch floor, form
averaging, form error between levels) and the plain bootstrap before them, side by side.

Data: the seed table (profiles/reference, imported into a scratch database) and any stored
model given with --db URL --model NAME (e.g. a demo's out/demo.db, model smollm2-135m-f32).

    .venv/bin/python benchmarks/coverage.py [--db sqlite:///out/demo.db --model smollm2-135m-f32]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from record import Table, record_arguments, save_run

from tuner.model.coverage import Coverage, leave_one_level_out
from tuner.storage.fits import select_data
from tuner.storage.importer import import_table
from tuner.storage.store import Store

REPO = Path(__file__).resolve().parent.parent
SEED = REPO / "profiles" / "reference" / "seed-qwen3.8-flash-next-gfx1151.toml"


def coverage_rows(rows: dict[str, list[Coverage]]) -> list[list]:
    """Per method: points inside their intervals, points held out, the share inside (%), and
    the mean absolute error (%) of the first seed."""
    out: list[list] = []
    for label, covs in rows.items():
        inside = sum(c.inside for c in covs)
        total = sum(len(c.points) for c in covs)
        out.append([label, inside, total, 100 * inside / total, covs[0].mean_abs_error_pct])
    return out


def held_out_rows(cov: Coverage) -> list[list]:
    """Each held-out point: policy, streams, measured, predicted, its 90 % interval, inside."""
    return [
        [p.policy.label, p.concurrency, p.measured, p.predicted, p.lower, p.upper, p.inside]
        for p in cov.points
    ]


def report(name: str, store: Store, model: str, seeds: int) -> list[Table]:
    data, _ = select_data(store, model, None)
    rows: dict[str, list[Coverage]] = {"honest (costmodel-3)": [], "plain bootstrap (before)": []}
    for seed in range(seeds):
        rows["honest (costmodel-3)"].append(leave_one_level_out(data, seed=seed))
        rows["plain bootstrap (before)"].append(
            leave_one_level_out(data, seed=seed, launch_noise=0.0, form_uncertainty=False)
        )
    print(f"\n{name}: {len(data.levels)} levels")
    covered = coverage_rows(rows)
    for label, inside, total, share, error in covered:
        print(
            f"  {label:26} {inside:>3}/{total:<3} inside ({share:.0f} %), "
            f"mean abs error {error:.1f} %"
        )
    print("  held out (seed 0, honest): policy, streams, measured, predicted [90 % interval]")
    held = held_out_rows(rows["honest (costmodel-3)"][0])
    for policy, c, measured, predicted, lower, upper, inside in held:
        print(
            f"    {policy:8} {c:>2}  {measured:7.1f}  {predicted:7.1f} "
            f"[{lower:.1f}, {upper:.1f}] {'' if inside else 'MISSED'}"
        )
    return [
        Table(
            f"{name}: {len(data.levels)} levels, held out one at a time, {seeds} seeds",
            ["intervals", "inside", "points", "inside %", "mean abs error %"],
            covered,
        ),
        Table(
            f"{name}: held out (seed 0, honest)",
            ["policy", "streams", "measured", "predicted", "90 % lower", "90 % upper", "inside"],
            held,
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", action="append", default=[], help="database URL with a profile")
    parser.add_argument("--model", action="append", default=[], help="model name, one per --db")
    parser.add_argument("--seeds", type=int, default=3, help="bootstrap seeds per method")
    record_arguments(parser)
    args = parser.parse_args()
    tables: list[Table] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{Path(tmp) / 'seed.db'}")
        imported = import_table(store, SEED)
        tables += report(f"seed table ({SEED.name})", store, imported.model, args.seeds)
        store.dispose()
    for url, model in zip(args.db, args.model, strict=True):
        store = Store(url)
        tables += report(f"{model} ({url})", store, model, args.seeds)
        store.dispose()
    save_run(__file__, args, {"bootstrap seeds": args.seeds}, tables)


if __name__ == "__main__":
    main()
