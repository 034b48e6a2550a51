"""Benchmark: wall time of fit + search (`tuner recommend` without the CLI) on bench data.

Stores the bundled bench profile (tests/benchdata.py: SmolLM2 F32 on 2 cores, -np 8, n-max 6,
kernel rows) in a fresh SQLite database, then times, per repeat, a new fit (select data, fit with
200 bootstrap replicates, store) and a new Optuna study over N (and, with --tune-n-max, n_max)
with the choice and the stored recommendation. Prints every repeat and the median; the target is
under 5 s. Or point it at a real database: --db URL --model NAME [--host HOST].

    .venv/bin/python benchmarks/fit_search_speed.py [--repeats 5] [--tune-n-max]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from record import Table, record_arguments, save_run

TARGET_S = 5.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tune-n-max", action="store_true", help="also search n_max")
    parser.add_argument("--db", help="an existing database (default: the bench data, in /tmp)")
    parser.add_argument("--model", default="smollm2-bench")
    parser.add_argument("--host", default="bench-host")
    record_arguments(parser)
    args = parser.parse_args()

    from tuner.decide import advice as rec
    from tuner.storage.fits import fit_model
    from tuner.storage.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        if args.db:
            store = Store(args.db)
        else:
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from benchdata import store_profile

            store = Store(f"sqlite:///{Path(tmp) / 'bench.db'}")
            store_profile(store, model=args.model, host=args.host)
        times, fit_times, rows = [], [], []
        for i in range(args.repeats):
            started = time.perf_counter()
            # A fresh fit each time (a new seed: nothing is reused), then a fresh study on it.
            stored = fit_model(store, args.model, args.host, host_explicit=True, seed=i)
            fitted = time.perf_counter()
            report = rec.recommend(
                store,
                args.model,
                args.host,
                host_explicit=True,
                tune_n_max=args.tune_n_max,
                fit_id=stored.id,
                seed=i,
            )
            done = time.perf_counter()
            times.append(done - started)
            fit_times.append(fitted - started)
            rows.append(repeat_row(i, started, fitted, done, report, args.tune_n_max))
            print(
                f"repeat {i + 1}: fit {fitted - started:.2f} s + search {done - fitted:.2f} s "
                f"({report.trials} trials, {report.sampler}) = {done - started:.2f} s -> "
                f"N={report.max_slots}" + (f", n_max={report.n_max}" if args.tune_n_max else "")
            )
        median = statistics.median(times)
        print(
            f"fit + search: median {median:.2f} s over {args.repeats} repeats "
            f"(fit alone {statistics.median(fit_times):.2f} s); target < {TARGET_S:.0f} s: "
            + ("ok" if median < TARGET_S else "TOO SLOW")
        )
        store.dispose()
    save_run(
        __file__,
        args,
        {
            "fit + search: median s": median,
            "fit alone: median s": statistics.median(fit_times),
            f"target < {TARGET_S:.0f} s": median < TARGET_S,
            "data": args.db or "the bundled bench profile (tests/benchdata.py)",
        },
        [Table("repeats", REPEAT_COLUMNS, rows)],
    )
    return 0 if median < TARGET_S else 1


REPEAT_COLUMNS = ["repeat", "fit s", "search s", "total s", "trials", "sampler", "N", "n_max"]


def repeat_row(i: int, started: float, fitted: float, done: float, report, n_max: bool) -> list:
    """One repeat: its fit and search times, the study's trials and sampler, the answer."""
    return [
        i + 1,
        fitted - started,
        done - fitted,
        done - started,
        report.trials,
        report.sampler,
        report.max_slots,
        report.n_max if n_max else None,
    ]


if __name__ == "__main__":
    raise SystemExit(main())
