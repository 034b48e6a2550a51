"""The live switch check's verdict (tuner.measure.switchcheck.switch_problem), on the counts it is
given: the draft tokens a server made while both of 2 streams generated, at threshold 1 and 0;
and the check's rounds run again where their streams never met.
The check's rounds against the real bench are in every bench profile (test_profile.py asserts
its message); against a server that does not follow the switch, only this verdict can say."""

from __future__ import annotations

import pytest

from tuner.measure import switchcheck
from tuner.measure.load import RequestSample
from tuner.measure.switchcheck import CHECK_TRIES, check_live_switch, switch_problem

N_MAX = 6  # 2 streams: 12 draft tokens may be in flight when the second stream starts


def test_a_server_that_follows_the_switch_passes() -> None:
    # what the bench gave at 32 tokens a stream: 0-3 at threshold 1, 44-47 at 0
    assert switch_problem("s", {1: 0, 0: 44}, N_MAX) is None
    assert switch_problem("s", {1: 3, 0: 47}, N_MAX) is None
    # the drafts in flight when the second stream started may finish at threshold 1
    assert switch_problem("s", {1: 12, 0: 47}, N_MAX) is None


def test_drafting_on_at_threshold_one_is_named() -> None:
    problem = switch_problem("llama-server (drafting-n6)", {1: 13, 0: 47}, N_MAX)
    assert problem is not None and "did not follow the switch" in problem
    assert "13 draft tokens" in problem and "more than the 12" in problem


@pytest.mark.parametrize("at_zero", [0, 12])
def test_too_little_drafting_at_zero_shows_nothing(at_zero: int) -> None:
    problem = switch_problem("s", {1: 0, 0: at_zero}, N_MAX)
    assert problem is not None and "cannot be seen to work" in problem
    assert f"drafted {at_zero} tokens" in problem


def test_no_per_token_counters_shows_nothing() -> None:
    problem = switch_problem("s", {1: None, 0: 40}, N_MAX)
    assert problem is not None and "per-token draft counters" in problem


def test_the_allowance_grows_with_n_max() -> None:
    assert switch_problem("s", {1: 20, 0: 60}, 10) is None
    assert switch_problem("s", {1: 21, 0: 60}, 10) is not None


def _stream(stream: int, start: float, drafts_each: int) -> RequestSample:
    """A streamed request of 10 tokens a step of 0.1 s apart from start, drafting drafts_each
    tokens a step."""
    times = [start + 0.1 * i for i in range(10)]
    drafts = [drafts_each * i for i in range(10)]
    return RequestSample(stream, ok=True, tokens=10, token_times=times, token_drafts=drafts)


def _check(monkeypatch: pytest.MonkeyPatch, rounds: list[list[RequestSample]]):
    """check_live_switch over canned rounds (in the order the check asks for them)."""
    left = iter(rounds)
    monkeypatch.setattr(switchcheck.client, "max_slots", lambda url, key=None: 3)
    monkeypatch.setattr(switchcheck.LoadGenerator, "run", lambda self, n, round_key=0: next(left))
    return check_live_switch("http://x", N_MAX, set_threshold=lambda n: None)


def test_streams_that_never_met_are_run_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A round whose second stream reached the server after the first ended (a busy machine)
    shows nothing about the switch: the check runs it again rather than call the counters
    missing."""
    apart = [_stream(0, 0.0, 0), _stream(1, 5.0, 0)]
    at_one = [_stream(0, 0.0, 0), _stream(1, 0.05, 0)]
    at_zero = [_stream(0, 0.0, 5), _stream(1, 0.05, 5)]
    checked = _check(monkeypatch, [apart, at_one, apart, at_zero])
    assert checked.problem is None, checked.problem
    assert checked.drafted[1] == 0 and checked.drafted[0] > 12


def test_streams_that_never_meet_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    apart = [_stream(0, 0.0, 0), _stream(1, 5.0, 0)]
    checked = _check(monkeypatch, [apart] * CHECK_TRIES)
    assert checked.problem is not None and "never generated together" in checked.problem
    assert "per-token draft counters" not in checked.problem
