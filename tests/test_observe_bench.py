"""`tuner observe` against the real bench: a load generator offers a known cycle of concurrency
(1, 3 and 2 streams in turn) while observe polls /slots; the time-share histogram it stores is
close to the one the load generator's own token times give. Both see the same seconds, so the
contrast is not a matter of machine speed; the test allows 0.15 of total-variation distance
(benchmarks/observe_accuracy.py prints the figure over a longer run). Every request seen
finishing is recorded with the output it generated, exactly, and its prompt: the second test
offers a fixed number of 48-token requests and observes from before the first to after the
last, so it does not depend on how fast the machine is."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab.traffic import offer_cycle, plain_server

from tuner.bench import Bench
from tuner.measure.launcher import ManagedServer
from tuner.measure.load import LoadGenerator, RequestSample, Workload
from tuner.measure.observe import Poller, observe
from tuner.measure.readings import generating_histogram
from tuner.storage.store import Store
from tuner.storage.traffic_profiles import TrafficSaver, load
from tuner.traffic import TrafficProfile, total_variation

pytestmark = pytest.mark.bench

CYCLE = [(1, 96), (3, 96), (2, 96)]  # streams and output tokens of each round


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
        args=(server.url, CYCLE, stop, intervals),
        daemon=True,
    )
    load_thread.start()
    time.sleep(2.0)
    saver = TrafficSaver(store, "bench-test")
    started = time.perf_counter()
    view, profile = observe(server.url, 15.0, saver, clock=time.perf_counter)
    ended = time.perf_counter()
    stop.set()
    load_thread.join(timeout=120)

    assert view.source == "slots" and view.n_slots == 4
    offered = generating_histogram(intervals, started, ended)
    total = sum(offered.values())
    offered_shares = {k: v / total for k, v in offered.items()}
    distance = total_variation(profile.shares(), offered_shares)
    assert distance < 0.15, (profile.shares(), offered_shares)
    # the 3-stream rounds were seen: most of the seconds the client spent at 3 (the same seconds,
    # so not a matter of machine speed)
    assert profile.seconds.get(3, 0.0) > 0.5 * offered.get(3, 0.0) > 0.0, (profile, offered)
    # It was saved, and finished requests' lengths were recorded: outputs exactly as generated
    # (from the server's counter, not as last polled), prompts as sent.
    stored = load(store, "bench-test")
    assert stored.covered_s == pytest.approx(profile.covered_s)
    assert view.counters
    assert profile.finished and set(profile.output_tokens) == {96}, profile.output_tokens
    assert set(profile.prompt_tokens) == {32}, profile.prompt_tokens
    store.dispose()


def test_outputs_are_recorded_as_generated(server: ManagedServer) -> None:
    """Two cycles of 1, 3 and 2 streams of 48 tokens: the streams of a round end at the same
    step, so several end between two polls, usually after their last sight (at four polls a
    second they were recorded as 44 in the median, 47 at p90, before outputs came from the
    server's counter). Each is recorded with exactly 48 tokens and its 32-token prompt."""
    rounds = [1, 3, 2] * 2
    samples: list[RequestSample] = []

    def offer() -> None:
        generator = LoadGenerator(server.url, Workload(prompt_tokens=32, max_tokens=48))
        for key, streams in enumerate(rounds):
            samples.extend(generator.run(streams, round_key=key))
            time.sleep(0.05)

    profile = TrafficProfile(4)
    with Poller(server.url, clock=time.perf_counter) as poller:
        assert poller.view.counters  # outputs come from tokens_predicted_total
        load_thread = threading.Thread(target=offer, daemon=True)
        load_thread.start()
        while load_thread.is_alive():
            poller.step(profile)
        for _ in range(4):  # the last round's ends, settled once nothing ends around a reading
            poller.step(profile)
    assert len(samples) == sum(rounds) and all(s.ok and s.tokens == 48 for s in samples)
    assert profile.finished == sum(rounds), list(profile.requests)
    assert profile.output_tokens == [48] * sum(rounds), profile.output_tokens
    assert profile.prompt_tokens == [32] * sum(rounds), profile.prompt_tokens
