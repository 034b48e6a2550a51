"""Open-loop load's pure parts: seeded Poisson arrivals and the serving summary."""

from __future__ import annotations

import itertools
import statistics

import pytest

from tuner.measure.arrivals import poisson_offsets, summarize_open_loop
from tuner.measure.load import RequestSample


def test_poisson_arrivals_are_seeded_and_have_their_rate() -> None:
    a = poisson_offsets(2.0, 2000.0, seed=1)
    assert a == poisson_offsets(2.0, 2000.0, seed=1)
    assert a != poisson_offsets(2.0, 2000.0, seed=2)
    # conditioned on its count: the window holds exactly rate x duration arrivals
    assert len(a) == 4000
    assert [len(poisson_offsets(0.324, 45.0, seed)) for seed in range(5)] == [15] * 5
    assert len(poisson_offsets(0.01, 10.0, seed=1)) == 1
    gaps = [b - a_ for a_, b in itertools.pairwise(a)]
    # exponential gaps: the standard deviation equals the mean
    assert statistics.pstdev(gaps) == pytest.approx(statistics.fmean(gaps), rel=0.1)
    assert all(0 < t < 2000.0 for t in a)
    with pytest.raises(ValueError, match="above 0"):
        poisson_offsets(0.0, 10.0, seed=1)
    with pytest.raises(ValueError, match="above 0 s"):
        poisson_offsets(1.0, 0.0, seed=1)


def _sample(i: int, start: float, first: float, step: float, tokens: int) -> RequestSample:
    times = [first + k * step for k in range(tokens)]
    return RequestSample(
        stream=i,
        ok=True,
        tokens=tokens,
        start=start,
        ttft_ms=1000 * (first - start),
        token_times=times,
    )


def test_the_summary_gives_throughput_latencies_and_occupancy() -> None:
    samples = [
        _sample(0, 0.0, 0.1, 0.01, 101),  # generates 0.1..1.1
        _sample(1, 0.5, 0.7, 0.02, 51),  # generates 0.7..1.7
        RequestSample(stream=2, ok=False, error="HTTP 500", start=0.8),
    ]
    f = summarize_open_loop(samples, rate=2.0)
    assert (f.offered, f.completed, f.failed) == (3, 2, 1)
    assert f.span_s == pytest.approx(1.7)
    assert f.tokens_per_second == pytest.approx(152 / 1.7)
    assert f.ttft_ms[0] == pytest.approx(150.0)  # median of 100 and 200 ms
    assert f.tpot_ms[0] == pytest.approx(15.0)  # median of 10 and 20 ms
    # 1.0 s + 1.0 s of generating over 1.7 s
    assert f.mean_generating == pytest.approx(2.0 / 1.7)
    empty = summarize_open_loop([RequestSample(stream=0, ok=False)], rate=1.0)
    assert empty.completed == 0 and empty.tokens_per_second == 0.0


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--arrivals", "poisson", "--rate", "0"], "every arrival rate must be above 0"),
        (["--arrivals", "poisson", "--rate", "-1,2"], "every arrival rate must be above 0"),
        (["--arrivals", "poisson", "--rate", "fast"], "expected requests per second"),
        (["--arrivals", "poisson"], "needs --rate"),
        (["--arrivals", "uniform", "--rate", "1"], "poisson (random arrivals at each --rate)"),
        (["--arrivals", "trace"], "--arrivals trace needs --traffic NAME"),
        (["--arrivals", "trace", "--traffic", "t", "--rate", "1"], "drop --rate"),
        (["--arrivals", "trace", "--traffic", "nope"], "no traffic profile named 'nope'"),
        (["--arrivals", "poisson", "--rate", "1", "--window", "0"], "--window must be above 0"),
    ],
)
def test_bad_open_loop_options_are_one_line(args: list[str], fragment: str) -> None:
    from typer.testing import CliRunner

    from tuner.cli.app import app

    result = CliRunner().invoke(app, ["validate", "--model", "m", *args])
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip() and "━" not in line]
    assert len(lines) == 1 and fragment in lines[0], result.stderr


def test_a_trace_replays_observed_offsets_and_lengths() -> None:
    from tuner.measure.arrivals import trace_schedule
    from tuner.traffic import Finished

    seen = [Finished(1005.0, 20, 64), Finished(1000.0, 10, 32), Finished(1002.5, 5, 0)]
    schedule = trace_schedule(seen, window_s=60.0)
    assert schedule.offsets == [0.0, 2.5, 5.0]  # in arrival order, from the first
    assert schedule.max_tokens == [32, 1, 64]  # at least one token each
    assert schedule.rate == pytest.approx(2 / 5.0) and schedule.source == "trace"
    assert trace_schedule(seen, window_s=3.0).offsets == [0.0, 2.5]
