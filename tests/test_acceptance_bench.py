"""Acceptance from production on the real bench: `tuner observe`'s poller reads a drafting
llama-server's own acceptance counters (drafts, draft tokens, accepted tokens per draft
position) while tuner's load generator offers Poisson arrivals, and what it read agrees with
what the load generator counted for its own requests (each final response's draft_n and
draft_n_accepted): the same tokens, to the token. The server's synthetic acceptance
(--spec-synth-len 3.5) bounds what it can be: the observed mean accepted length is within its
interval of a value at most 3.5 (the last drafts of a request are cut short) and well above 1.

The twin's counterpart, with the 30 % shift from the profile and recommend's answer, is
tests/test_acceptance_observed.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_watch_live import drafting_server as watch_server

from tuner.bench import Bench
from tuner.measure.arrivals import poisson_offsets
from tuner.measure.launcher import LaunchConfig, ManagedServer
from tuner.measure.load import LoadGenerator, RequestSample, Workload
from tuner.measure.observe import Poller
from tuner.model.acceptance import observed_acceptance
from tuner.traffic import TrafficProfile

pytestmark = pytest.mark.bench

SYNTH_LEN = 3.5  # the watch tests' server's --spec-synth-len


def drafting_server(bench: Bench) -> LaunchConfig:
    """The watch tests' drafting server (--spec-synth-len 3.5), with /metrics and n_max 6."""
    config = watch_server(bench, props=False)
    config.args += ["--spec-draft-n-max", "6", "--metrics"]
    return config


@pytest.fixture
def server(bench: Bench, tmp_path: Path) -> Iterator[ManagedServer]:
    with ManagedServer(drafting_server(bench), tmp_path / "server.log") as running:
        yield running


def test_observe_reads_the_servers_acceptance_as_the_load_generator_counted_it(
    server: ManagedServer,
) -> None:
    # about twenty requests in 20 s: the counters are checked to the token, and the interval
    # only has to hold a mean accepted length at most 3.5 and well above 1
    offsets = poisson_offsets(1.0, 20.0, seed=5)
    samples: list[RequestSample] = []

    def offer() -> None:
        # a request queued for a slot gets no byte until one frees: on a machine others keep
        # busy the queue can hold one past the default silence limit, which is no part of what
        # is checked here (the counters against the requests' own, to the token)
        workload = Workload(prompt_tokens=32, max_tokens=64, request_timeout_s=900.0)
        generator = LoadGenerator(server.url, workload)
        samples.extend(generator.run_arrivals(offsets, round_key=1)[1])

    profile = TrafficProfile(4)
    with Poller(server.url, clock=time.perf_counter) as poller:
        assert poller.view.counters
        for _ in range(2):  # the first reading of the counters, before any request
            poller.step(profile)
        load = threading.Thread(target=offer, daemon=True)
        load.start()
        while load.is_alive():
            poller.step(profile)
        for _ in range(8):  # the last requests' ends, read
            poller.step(profile)
    assert samples and all(s.ok for s in samples), [s.error for s in samples if not s.ok]
    counts = profile.acceptance
    assert counts.dropped == 0 and counts.per_position
    assert counts.accepted == sum(s.draft_accepted for s in samples)
    assert counts.draft_tokens == sum(s.draft_n for s in samples)
    assert sum(counts.positions) == counts.accepted
    observed = observed_acceptance(counts)
    assert observed is not None and observed.rates is not None
    lo, hi = observed.interval(0.99)
    assert lo <= SYNTH_LEN and hi > 2.0, (lo, observed.mean_length, hi)
    assert all(a >= b for a, b in zip(observed.rates, observed.rates[1:], strict=False))
