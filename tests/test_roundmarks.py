"""What a round is stored with beside its figure (tuner.measure.roundmarks): a threshold that
must not draft at the level yet drafted past the drafts in flight is marked drafted_off, streams
that never generated together are marked apart, each with its warning; others' load over a round
makes it a disturbed one, summed up at the end."""

from __future__ import annotations

from tuner.measure.load import RequestSample, drafts_in_flight, summarize
from tuner.measure.roundmarks import Disturbances, round_marks
from tuner.measure.rounds import Measured
from tuner.policy import Policy

N_MAX = 4


def _stream(stream: int, start: float, drafts_each: int) -> RequestSample:
    """10 tokens 0.1 s apart from start, drafting drafts_each tokens a step."""
    times = [start + 0.1 * i for i in range(10)]
    drafts = [drafts_each * i for i in range(10)]
    return RequestSample(stream, ok=True, tokens=10, token_times=times, token_drafts=drafts)


def _marks(policy: Policy, samples: list[RequestSample]) -> tuple[dict, list[str]]:
    measured = Measured(samples, {}, 1.0, max_slots=policy.max_slots)
    figures = summarize(samples, len(samples))
    return round_marks(policy, len(samples), measured, figures, N_MAX, policy.config_name)


def test_a_threshold_that_drafted_where_it_must_not_is_marked_and_said() -> None:
    # threshold 1 at 3 streams starts no draft; 4 tokens a step for 10 steps on each stream is
    # far past the drafts in flight
    together = [_stream(k, 0.0, 4) for k in range(3)]
    assert summarize(together, 3).window_drafted > drafts_in_flight(3, N_MAX)
    extra, warnings = _marks(Policy.threshold(1, N_MAX), together)
    assert extra["drafted_off"] is True and extra["max_slots_set"] == 1
    assert "accept_by_stream" not in extra  # it does not draft at 3 streams
    assert len(warnings) == 1 and "drafted" in warnings[0] and "3 streams" in warnings[0]
    # no drafting inside the window: nothing to say
    quiet = [_stream(k, 0.0, 0) for k in range(3)]
    extra, warnings = _marks(Policy.threshold(1, N_MAX), quiet)
    assert "drafted_off" not in extra and warnings == []
    # always draft drafts there: its acceptance by stream is kept instead
    extra, warnings = _marks(Policy.always(N_MAX), together)
    assert "drafted_off" not in extra and "accept_by_stream" in extra and warnings == []


def test_streams_that_never_met_are_marked_apart() -> None:
    apart = [_stream(0, 0.0, 0), _stream(1, 5.0, 0)]
    extra, warnings = _marks(Policy.plain(), apart)
    assert extra["apart"] is True
    assert len(warnings) == 1 and "never all generated at once" in warnings[0]


def test_a_round_with_nobody_else_is_not_disturbed_and_nothing_is_summed_up() -> None:
    others = Disturbances()
    marks, disturbed = others.mark(Measured([_stream(0, 0.0, 0)], {}, 1.0), 40.0)
    assert marks == {} and disturbed is None
    assert others.rounds == 1 and others.summary() == []
