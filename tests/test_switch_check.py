"""The live switch check's verdict (tuner.measure.backend.switch_problem), on the counts it is
given: the draft tokens a server made while both of 2 streams generated, at threshold 1 and 0.
The check's rounds against the real bench are in every bench profile (test_profile.py asserts
its message); against a server that does not follow the switch, only this verdict can say."""

from __future__ import annotations

import pytest

from tuner.measure.backend import switch_problem

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
