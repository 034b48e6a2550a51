"""`tuner tune`'s pure parts: which candidates go live first, where they differ, the paired
difference that prunes, and the values the live study is told."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.decide.search import Evaluation
from tuner.decide.tune import (
    Paired,
    TrialResult,
    _best,
    _neighbour,
    decision_levels,
    explore_further,
    live_candidates,
    model_outside,
    pass_objectives,
)
from tuner.model.costmodel import CostModel
from tuner.model.data import FitData, LevelObs, Repeat
from tuner.model.fitting import fit
from tuner.policy import Policy


def _evaluation(n: int, value: float, samples: list[float], n_max: int = 3) -> Evaluation:
    return Evaluation(Policy.of_max_slots(n, n_max), value, tuple(samples), 50.0, True)


def _ns(policies: list[Policy]) -> list[int | None]:
    return [p.max_slots for p in policies]


def _at3(n: int) -> Policy:
    return Policy.of_max_slots(n, 3)


def test_candidates_start_with_the_standing_n_then_those_the_model_cannot_rule_out() -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(100.0, 1.0, 200)
    evaluations = [
        _evaluation(2, 100.0, list(base)),
        _evaluation(3, 100.5, list(base + 0.5)),  # beats N=2 in every replicate
        _evaluation(4, 99.8, list(base - 0.2 + rng.normal(0, 1.0, 200))),  # sometimes ahead
        _evaluation(1, 90.0, list(base - 10.0)),  # never ahead: not measured
        _evaluation(0, 95.0, list(base - 5.0)),
        _evaluation(8, 95.0, list(base - 5.0)),  # N=8 is N=0's twin at -np 8
    ]
    assert _ns(live_candidates(evaluations, _at3(2), 8, limit=5)) == [2, 3, 4]
    assert _ns(live_candidates(evaluations, _at3(2), 8, limit=2)) == [2, 3]
    assert _ns(live_candidates(evaluations, _at3(2), 8, limit=1)) == [2]
    # The first beats every other N in every replicate: the runner-up still goes live beside it
    clear = [
        _evaluation(3, 120.0, list(base + 20.0)),
        _evaluation(2, 100.0, list(base)),
        _evaluation(4, 110.0, list(base + 10.0)),
    ]
    assert _ns(live_candidates(clear, _at3(3), 8, limit=4)) == [3, 4]
    with pytest.raises(ValueError, match="N=5"):
        live_candidates(evaluations, _at3(5), 8, limit=3)
    # With --tune-n-max the candidates are (N, n_max) pairs: the same N at another draft
    # length is another server.
    lengths = [
        _evaluation(2, 100.0, list(base), n_max=3),
        _evaluation(2, 100.4, list(base + 0.4), n_max=2),
        _evaluation(3, 100.3, list(base + 0.3), n_max=2),
        _evaluation(2, 80.0, list(base - 20.0), n_max=1),
    ]
    chosen = live_candidates(lengths, _at3(2), 8, limit=5)
    assert [(p.max_slots, p.n_max) for p in chosen] == [(2, 3), (2, 2), (3, 2)]


def test_decision_levels_are_where_the_policies_differ() -> None:
    def of(*ns: int) -> list[Policy]:
        return [Policy.of_max_slots(n) for n in ns]

    assert decision_levels(of(2, 3, 4), 8) == [3, 4]
    assert decision_levels(of(3, 4), 8) == [4]
    assert decision_levels(of(0, 2), 8) == [3, 4, 5, 6, 7, 8]  # always draft: N=0 is N=8 here
    # The same N at two draft lengths differs wherever it drafts.
    assert decision_levels([Policy.of_max_slots(2, 3), Policy.of_max_slots(2, 2)], 8) == [1, 2]
    assert decision_levels([Policy.of_max_slots(2, 3), Policy.of_max_slots(3, 2)], 8) == [1, 2, 3]


def test_pass_objectives_weight_each_complete_pass() -> None:
    weights = np.full(8, 1 / 8)
    table = {0: {3: 80.0, 4: 96.0}, 1: {3: 88.0}}  # pass 1 lacks level 4: left out
    assert pass_objectives(table, [3, 4], weights) == {0: pytest.approx(22.0)}


def test_paired_difference_prunes_only_a_clear_loser() -> None:
    leader = {0: 100.0, 1: 104.0, 2: 98.0}
    behind = {0: 95.0, 1: 99.5, 2: 93.2}  # 5 behind in every pass, drift shared
    close = {0: 101.0, 1: 102.0, 2: 98.5}  # within the noise
    clear = Paired.of(behind, leader)
    assert clear.passes == 3 and clear.mean == pytest.approx(-4.766, abs=1e-3)
    assert clear.cannot_win
    assert not Paired.of(close, leader).cannot_win
    # one pass is no evidence of a spread: never pruned on it
    assert not Paired.of({0: 50.0}, {0: 100.0}).cannot_win
    assert Paired.of({}, leader).passes == 0 and math.isnan(Paired.of({}, leader).mean)


def test_model_outside_is_the_same_for_policies_that_agree_there() -> None:
    levels = tuple(
        LevelObs(policy, c, (Repeat(tps),))
        for policy, row in {
            Policy.plain(): [38.7, 54.0, 67.5, 78.3],
            Policy.always(): [56.5, 57.9, 64.8, 69.9],
        }.items()
        for c, tps in zip([1, 2, 4, 8], row, strict=True)
    )
    model: CostModel = fit(FitData(8, 3, levels), replicates=10).model
    weights = np.full(8, 1 / 8)
    at = [3, 4]  # N=2, 3 and 4 differ at 3 and 4 only
    outside = {n: model_outside(model, Policy.of_max_slots(n), at, weights) for n in (2, 3, 4)}
    assert outside[2] == pytest.approx(outside[3]) == pytest.approx(outside[4])
    full = sum(model.policy_tps(range(1, 9), Policy.of_max_slots(3))) / 8
    inside = sum(model.policy_tps(at, Policy.of_max_slots(3))) / 8
    assert outside[3] + inside == pytest.approx(full)


def _trial(n: int, value: float | None, state: str = "complete", n_max: int = 3) -> TrialResult:
    return TrialResult(n, Policy.of_max_slots(n, n_max), state, value, None, None, [], 1)


def _of(*trials: TrialResult) -> dict[Policy, TrialResult]:
    return {t.policy: t for t in trials}


def _tried(*ns: int, n_max: int = 3) -> set[tuple[int, int | None]]:
    return {(n, n_max) for n in ns}


def test_best_trial_and_the_next_neighbour() -> None:
    results = _of(_trial(2, 100.0), _trial(3, 101.0), _trial(4, None, "pruned"))
    best = _best(results, 8)
    assert best is not None and best.policy.max_slots == 3
    # a tie goes to the smaller N
    assert _best(_of(_trial(2, 5.0), _trial(5, 5.0)), 8).policy.max_slots == 2
    assert _best(_of(_trial(4, None, "pruned")), 8) is None
    assert _neighbour(_trial(4, 1.0), _tried(2, 3, 4), 8) == _at3(5)
    assert _neighbour(_trial(2, 1.0), _tried(2, 3, 4), 8) == _at3(1)
    assert _neighbour(_trial(8, 1.0), _tried(7, 8), 8) is None
    # the neighbour keeps the best trial's draft length; tries at another length do not count
    assert _neighbour(_trial(4, 1.0, n_max=2), _tried(3, 4, 5), 8) == Policy.of_max_slots(5, 2)


def test_rounds_beyond_the_candidates_only_when_live_data_overturn_the_model() -> None:
    assert not explore_further(_trial(2, 100.0), _at3(2), 8)
    assert explore_further(_trial(3, 100.0), _at3(2), 8)
    # N=8 and N=0 are the same server on 8 slots
    assert not explore_further(_trial(0, 100.0), _at3(8), 8)
    assert explore_further(None, _at3(2), 8)
    # the same N at another draft length overturns the model too
    assert explore_further(_trial(2, 100.0, n_max=2), _at3(2), 8)
