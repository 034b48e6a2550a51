"""`tuner observe` against the real bench: a load generator offers a known cycle of concurrency
(1, 3 and 2 streams in turn) while observe polls /slots; the time-share histogram it stores is
close to the one the load generator's own token times give. Both see the same seconds, so the
contrast is not a matter of machine speed; the test allows 0.15 of total-variation distance
(benchmarks/observe_accuracy.py prints the figure over a longer run)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tuner.bench import Bench
from tuner.bench.traffic import offer_cycle, plain_server
from tuner.measure.observe import generating_histogram, observe, total_variation
from tuner.measure.server import ManagedServer
from tuner.storage.engine import Store
from tuner.storage.traffic import TrafficSaver, load

pytestmark = pytest.mark.bench


@pytest.fixture
def server(bench: Bench, tmp_path: Path) -> Iterator[ManagedServer]:
    config = plain_server(bench, n_parallel=4)
    with ManagedServer(config, tmp_path / "server.log", start_timeout_s=120) as running:
        yield running


def test_observe_sees_the_offered_concurrency(server: ManagedServer, tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'tuner.db'}")
    intervals: list[tuple[float, float]] = []
    stop = threading.Event()
    load_thread = threading.Thread(
        target=offer_cycle,
        args=(server.url, [(1, 96), (3, 96), (2, 96)], stop, intervals),
        daemon=True,
    )
    load_thread.start()
    time.sleep(2.0)
    saver = TrafficSaver(store, "bench-test")
    started = time.perf_counter()
    view, profile = observe(server.url, 30.0, saver, clock=time.perf_counter)
    ended = time.perf_counter()
    stop.set()
    load_thread.join(timeout=120)

    assert view.source == "slots" and view.n_slots == 4
    offered = generating_histogram(intervals, started, ended)
    total = sum(offered.values())
    offered_shares = {k: v / total for k, v in offered.items()}
    distance = total_variation(profile.shares(), offered_shares)
    assert distance < 0.15, (profile.shares(), offered_shares)
    assert profile.seconds.get(3, 0.0) > 3.0  # the 3-stream rounds were seen
    # It was saved, and finished requests' lengths were recorded from /slots.
    stored = load(store, "bench-test")
    assert stored.covered_s == pytest.approx(profile.covered_s)
    # Lengths as last seen: at most one poll's worth of tokens short of the 96 generated.
    lengths = profile.output_tokens
    assert lengths and all(48 <= n <= 97 for n in lengths), lengths
    store.dispose()
