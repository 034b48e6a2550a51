"""How close `tuner observe`'s histogram of generating slots is to the traffic offered.

A bench llama-server (-np 8, the F32 target, plain) serves a load generator that runs a fixed
cycle of rounds (1, 4, 2 and 6 streams, all starting together, 128 tokens each) for the whole
run; `observe` polls /slots meanwhile. The offered histogram comes from the load generator's own
first- and last-token times over the same seconds. Prints both histograms and their
total-variation distance (target: at most 5 %).

    .venv/bin/python benchmarks/observe_accuracy.py [--seconds 120]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import common  # noqa: F401  (puts tests/ on sys.path: lab)
from lab.traffic import offer_cycle, plain_server

from tuner.bench import load_bench
from tuner.measure.launcher import ManagedServer
from tuner.measure.observe import observe
from tuner.measure.readings import generating_histogram
from tuner.settings import Settings
from tuner.traffic import total_variation

CYCLE = [(1, 128), (4, 128), (2, 128), (6, 128)]


def share_rows(offered: dict[int, float], seen: dict[int, float]) -> list[list]:
    """Per number of slots generating: the share of time offered and observed, in %."""
    return [
        [k, 100 * offered.get(k, 0), 100 * seen.get(k, 0)] for k in sorted(set(offered) | set(seen))
    ]


def main() -> None:
    from record import Table, record_arguments, save_run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    record_arguments(parser)
    args = parser.parse_args()
    bench = load_bench(Settings().bench_manifest_path)
    config = plain_server(bench, n_parallel=8)
    with (
        tempfile.TemporaryDirectory() as tmp,
        ManagedServer(config, Path(tmp) / "server.log", start_timeout_s=120) as server,
    ):
        intervals: list[tuple[float, float]] = []
        stop = threading.Event()
        load = threading.Thread(
            target=offer_cycle, args=(server.url, CYCLE, stop, intervals), daemon=True
        )
        load.start()
        time.sleep(3.0)
        started = time.perf_counter()
        _, profile = observe(server.url, args.seconds, lambda *_: None, clock=time.perf_counter)
        ended = time.perf_counter()
        stop.set()
        load.join(timeout=300)
    offered = generating_histogram(intervals, started, ended)
    total = sum(offered.values())
    offered_shares = {k: v / total for k, v in sorted(offered.items())}
    seen = profile.shares()
    print(f"observed {profile.covered_s:.0f} s in {profile.samples} polls")
    print("slots generating   offered   observed")
    rows = share_rows(offered_shares, seen)
    for k, offered_pct, seen_pct in rows:
        print(f"{k:>16} {offered_pct:>8.1f}% {seen_pct:>9.1f}%")
    distance = total_variation(seen, offered_shares)
    print(f"total-variation distance: {100 * distance:.1f} % (target: at most 5 %)")
    summary = {
        "total-variation distance % (target: at most 5)": 100 * distance,
        "observed s": profile.covered_s,
        "polls": profile.samples,
    }
    table = Table("share of time by slots generating", ["slots", "offered %", "observed %"], rows)
    save_run(__file__, args, summary, [table])


if __name__ == "__main__":
    main()
