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

from tuner.model.coverage import Coverage, leave_one_level_out
from tuner.storage.fits import select_data
from tuner.storage.importer import import_table
from tuner.storage.store import Store

REPO = Path(__file__).resolve().parent.parent
SEED = REPO / "profiles" / "reference" / "seed-qwen3.8-flash-next-gfx1151.toml"


def report(name: str, store: Store, model: str, seeds: int) -> None:
    data, _ = select_data(store, model, None)
    rows: dict[str, list[Coverage]] = {"honest (costmodel-3)": [], "plain bootstrap (before)": []}
    for seed in range(seeds):
        rows["honest (costmodel-3)"].append(leave_one_level_out(data, seed=seed))
        rows["plain bootstrap (before)"].append(
            leave_one_level_out(data, seed=seed, launch_noise=0.0, form_uncertainty=False)
        )
    print(f"\n{name}: {len(data.levels)} levels")
    for label, covs in rows.items():
        inside = sum(c.inside for c in covs)
        total = sum(len(c.points) for c in covs)
        print(
            f"  {label:26} {inside:>3}/{total:<3} inside ({100 * inside / total:.0f} %), "
            f"mean abs error {covs[0].mean_abs_error_pct:.1f} %"
        )
    print("  held out (seed 0, honest): policy, streams, measured, predicted [90 % interval]")
    for p in rows["honest (costmodel-3)"][0].points:
        print(
            f"    {p.policy.label:8} {p.concurrency:>2}  {p.measured:7.1f}  {p.predicted:7.1f} "
            f"[{p.lower:.1f}, {p.upper:.1f}] {'' if p.inside else 'MISSED'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", action="append", default=[], help="database URL with a profile")
    parser.add_argument("--model", action="append", default=[], help="model name, one per --db")
    parser.add_argument("--seeds", type=int, default=3, help="bootstrap seeds per method")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{Path(tmp) / 'seed.db'}")
        imported = import_table(store, SEED)
        report(f"seed table ({SEED.name})", store, imported.model, args.seeds)
        store.dispose()
    for url, model in zip(args.db, args.model, strict=True):
        store = Store(url)
        report(f"{model} ({url})", store, model, args.seeds)
        store.dispose()


if __name__ == "__main__":
    main()
