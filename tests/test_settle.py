"""The statistics that settle N (decide/paired.py) and the rule over them (decide/settle.py):
paired differences with t-quantiles for the degrees of freedom taken, one-sided verdicts, the
contenders, the tie rule and what an unresolved standing asks for. Pure: the twin-based tests
(test_decisions.py) run the same rule against known truth."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from tuner.decide import settle
from tuner.decide.paired import (
    AHEAD,
    BEHIND,
    UNRESOLVED,
    WITHIN,
    Acceptance,
    Contrast,
    LevelDiffs,
    equivalent,
    t_quantile,
    verdict,
)
from tuner.decide.tune import sweep_text
from tuner.decide.tune.describe import head_reason

NP = 8
UNIFORM = [1 / NP] * NP


def diffs(mean: float, sd: float, n: int, seed: int = 0) -> LevelDiffs:
    """n paired differences with exactly this mean and sample SD."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(n)
    z = (z - z.mean()) / z.std(ddof=1)
    return LevelDiffs(tuple(mean + sd * z))


def test_two_pairs_are_one_degree_of_freedom() -> None:
    two = diffs(5.0, 2.0, 2)
    assert two.df == 1
    low, high = Contrast.of({3: two}, {3: 1.0}).bounds(0.95)
    # t(0.95, 1) = 6.31: the bound sits 6.31 standard errors out, not 2.
    assert (high - 5.0) / two.se == pytest.approx(6.314, abs=1e-3)
    assert low == pytest.approx(5.0 - 6.3138 * two.se, rel=1e-4)
    assert t_quantile(0.95, 30) == pytest.approx(1.697, abs=1e-3)
    assert t_quantile(0.95, 0) == math.inf


def test_a_contrast_sums_levels_with_welch_degrees_of_freedom() -> None:
    a, b = diffs(4.0, 1.0, 5), diffs(-2.0, 3.0, 10, seed=1)
    c = Contrast.of({2: a, 3: b}, {2: 0.5, 3: 0.25})
    assert c.estimate == pytest.approx(0.5 * 4.0 + 0.25 * -2.0)
    var_a, var_b = (0.5 * a.se) ** 2, (0.25 * b.se) ** 2
    assert c.se == pytest.approx(math.sqrt(var_a + var_b))
    assert c.df == pytest.approx((var_a + var_b) ** 2 / (var_a**2 / 4 + var_b**2 / 9))
    # a level without pairs cannot be part of a contrast
    assert math.isnan(Contrast.of({2: a}, {2: 1.0, 4: 1.0}).estimate)
    # no level at all: zero by construction, exactly
    assert Contrast.of({}, {}).bounds() == (0.0, 0.0)


def test_levels_of_the_same_passes_are_summed_pass_by_pass() -> None:
    """Stream i of a pass draws the same seed at every level, so a pass's luck lifts all its
    levels: a contrast over levels measured in the same passes has the spread of its per-pass
    sums and their degrees of freedom, not the levels' spreads added as if independent and
    Welch's degrees of freedom across them."""
    rng = np.random.default_rng(3)
    luck = rng.normal(0.0, 2.0, 5)  # one value a pass, shared by its levels
    a = luck + rng.normal(4.0, 0.5, 5)
    b = luck + rng.normal(-1.0, 0.5, 5)
    passes = tuple((7, p) for p in range(5))  # (run, pass)
    levels = {2: LevelDiffs(tuple(a), blocks=passes), 3: LevelDiffs(tuple(b), blocks=passes)}
    c = Contrast.of(levels, {2: 1.0, 3: 1.0})
    sums = a + b
    assert c.estimate == pytest.approx(sums.mean())
    assert c.se == pytest.approx(sums.std(ddof=1) / math.sqrt(5))
    assert c.df == 4
    apart = Contrast.of({k: LevelDiffs(v.diffs) for k, v in levels.items()}, {2: 1.0, 3: 1.0})
    assert c.se > 1.3 * apart.se and apart.df > 4  # what independence would have said
    # opposite signs: the shared luck cancels, and the bounds are narrower than apart
    d = Contrast.of(levels, {2: 1.0, 3: -1.0})
    assert d.se == pytest.approx((a - b).std(ddof=1) / math.sqrt(5))
    assert d.se < 0.5 * apart.se


def test_levels_sharing_some_passes_count_the_covariance_over_those() -> None:
    """Level 2 measured in passes 0-5, level 3 in passes 2-7 (a later sweep measured it alone):
    the four shared passes carry the covariance, Cov(mean_2, mean_3) = 4 s_23 / (6 * 6); the
    degrees of freedom stay Welch's over the levels' own, at most the 8 passes less one."""
    rng = np.random.default_rng(5)
    luck = rng.normal(0.0, 2.0, 8)
    a = luck[:6] + rng.normal(4.0, 0.5, 6)
    b = luck[2:] + rng.normal(-1.0, 0.5, 6)
    two = LevelDiffs(tuple(a), blocks=tuple(range(6)))
    three = LevelDiffs(tuple(b), blocks=tuple(range(2, 8)))
    c = Contrast.of({2: two, 3: three}, {2: 0.5, 3: 0.25})
    var_a, var_b = (0.5 * two.se) ** 2, (0.25 * three.se) ** 2
    cov = float(np.cov(a[2:], b[:4])[0, 1])
    assert cov > 0
    assert c.se == pytest.approx(math.sqrt(var_a + var_b + 2 * 0.5 * 0.25 * cov * 4 / 36))
    welch = (var_a + var_b) ** 2 / (var_a**2 / 5 + var_b**2 / 5)
    assert welch > 7 and c.df == 7
    # passes in common with no other level: the levels are independent
    alone = LevelDiffs(tuple(b), blocks=tuple(range(10, 16)))
    c2 = Contrast.of({2: two, 3: alone}, {2: 0.5, 3: 0.25})
    assert c2.se == pytest.approx(math.sqrt(var_a + var_b))


def test_levels_scaled_by_one_acceptance_anchor_share_its_uncertainty() -> None:
    """Two levels whose drafting halves were scaled to one mean acceptance move together when
    that mean is off: its variance enters once, times the square of the summed slopes, not
    once a level (which would understate it where the slopes share a sign)."""
    anchor = Acceptance(mean=3.3, var=0.0004, seeds=300)
    a, b = diffs(4.0, 1.0, 8), diffs(-2.0, 3.0, 10, seed=1)
    a_scaled = LevelDiffs(a.diffs, slope=30.0, anchor=anchor)
    b_scaled = LevelDiffs(b.diffs, slope=35.0, anchor=anchor)
    coef = {2: 0.5, 3: 0.25}
    c = Contrast.of({2: a_scaled, 3: b_scaled}, coef)
    var_a, var_b = (0.5 * a.se) ** 2, (0.25 * b.se) ** 2
    shared = (0.5 * 30.0 + 0.25 * 35.0) ** 2 * anchor.var
    assert c.se == pytest.approx(math.sqrt(var_a + var_b + shared))
    assert c.df == pytest.approx(
        (var_a + var_b + shared) ** 2 / (var_a**2 / 7 + var_b**2 / 9 + shared**2 / 299)
    )
    # opposite sides of a difference (the contender drafts at one, the answer at the other)
    # cancel in part: the same anchor's error moves both the same way
    c2 = Contrast.of({2: a_scaled, 3: b_scaled}, {2: 0.5, 3: -0.25})
    shared2 = (0.5 * 30.0 - 0.25 * 35.0) ** 2 * anchor.var
    assert c2.se == pytest.approx(math.sqrt(var_a + var_b + shared2))


def test_verdicts_need_a_side_not_a_decimal() -> None:
    tol = 1.0
    assert verdict(Contrast(3.0, 0.5, 20), tol) == AHEAD
    assert verdict(Contrast(-3.0, 0.5, 20), tol) == BEHIND
    assert verdict(Contrast(0.2, 0.3, 20), tol) == WITHIN
    assert verdict(Contrast(0.2, 3.0, 20), tol) == UNRESOLVED
    # surely ahead, but by less than the tolerance: moving would gain less than it, and the tie
    # rule would move back; the answer holds
    assert verdict(Contrast(0.6, 0.1, 20), tol) == WITHIN
    assert equivalent(Contrast(0.1, 0.2, 50), tol)
    assert not equivalent(Contrast(0.1, 2.0, 50), tol)


def test_contenders_are_the_neighbours_and_always_draft() -> None:
    assert settle.contenders(4, NP) == [2, 3, 5, 6, 8]
    assert settle.contenders(1, NP) == [2, 3, 8]
    assert settle.contenders(8, NP) == [6, 7]
    assert settle.between(2, 5) == [3, 4, 5]


def gains_with(signs: dict[int, float], sd: float = 1.0, n: int = 12) -> dict[int, LevelDiffs]:
    return {c: diffs(g, sd, n, seed=c) for c, g in signs.items()}


CROSSING_AT_3 = {2: 20.0, 3: 10.0, 4: -10.0, 5: -15.0, 6: -20.0, 7: -20.0, 8: -25.0}


@pytest.mark.parametrize("start", [1, 2, 3, 4, 5, 6])
def test_clear_gains_settle_on_the_last_level_drafting_wins(start: int) -> None:
    gains = gains_with(CROSSING_AT_3)
    answer = start
    for _ in range(10):
        standing = settle.assess(gains, UNIFORM, answer, NP, objective=100.0)
        if standing.status == settle.SETTLED:
            break
        assert standing.status == settle.MOVED
        answer = standing.answer
    assert standing.status == settle.SETTLED and standing.answer == 3
    assert {c.verdict for c in standing.comparisons} == {BEHIND}


def test_equivalent_values_tie_and_the_smaller_is_chosen() -> None:
    # drafting at 4 streams is worth nothing: N=3 and N=4 are the same objective
    flat = {**CROSSING_AT_3, 4: 0.0}
    gains = gains_with(flat, sd=0.5, n=30)
    standing = settle.assess(gains, UNIFORM, 4, NP, objective=100.0)
    assert standing.status == settle.MOVED and standing.answer == 3
    assert standing.tie == [3, 4]
    again = settle.assess(gains, UNIFORM, 3, NP, objective=100.0)
    assert again.status == settle.SETTLED and again.answer == 3 and again.tie == [3, 4]


def test_a_smaller_contender_only_within_the_tolerance_stays_open_until_it_ties() -> None:
    """Drafting at 4 streams is worth about nothing. Answer N=4: N=3 is at most the tolerance
    ahead but perhaps far behind (not yet equivalent), so N=4 must not settle there, or a run
    starting from N=3 would settle on 3 and one from 4 on 4. More pairs show the tie, and the
    smaller value is the answer, as it is from N=3."""
    near_zero = {**CROSSING_AT_3, 4: 4.0}
    few = {**gains_with(CROSSING_AT_3), 4: diffs(4.0, 10.0, 4, seed=4)}
    standing = settle.assess(few, UNIFORM, 4, NP, objective=100.0)
    three = next(c for c in standing.comparisons if c.contender == 3)
    assert three.verdict == WITHIN and not equivalent(three.advantage, 1.0)
    assert standing.status == settle.OPEN and standing.answer == 4
    assert standing.measure_next[0] == 4
    # the sweep names what it measures: no contender is unresolved, N=3 is measured for the tie
    # (and N=2, surely behind but perhaps by less than the tolerance, for the same question)
    assert not standing.unresolved and [c.contender for c in standing.measuring] == [2, 3]
    assert sweep_text(4, standing) == "N=4 against N=2 (equivalent?), N=3 (equivalent?)"
    many = gains_with(near_zero, sd=10.0, n=400)
    moved = settle.assess(many, UNIFORM, 4, NP, objective=100.0)
    assert moved.status == settle.MOVED and moved.answer == 3 and 3 in moved.tie
    from_three = settle.assess(many, UNIFORM, 3, NP, objective=100.0)
    assert from_three.status == settle.SETTLED and from_three.answer == 3


def test_a_smaller_contender_slightly_behind_stays_open_until_it_ties() -> None:
    """Drafting at 5 streams gains a little: N=5 is ahead of N=4 by 0.3 of the tolerance. A
    few pairs may show N=4 behind (the upper bound below zero) before they show the two
    equivalent; settling there would keep N=5 where a run that saw equivalence first chose
    N=4 (the demo's third run on the Xeon VM: N=4 -1.51 [-2.68, -0.35] with a tolerance of
    2.40 settled on N=5 while two others chose N=4, tie [4, 5]). N=4 stays open until it is
    shown equivalent (then it is the answer) or more than the tolerance behind."""
    small_gain = {**CROSSING_AT_3, 4: 10.0, 5: 2.4}  # w5 * g5 = 0.3 tok/s, tolerance 1.0
    few = {**gains_with(small_gain), 5: diffs(6.0, 5.5, 6, seed=5)}
    standing = settle.assess(few, UNIFORM, 5, NP, objective=100.0)
    four = next(c for c in standing.comparisons if c.contender == 4)
    low, high = four.advantage.bounds(0.95)
    assert four.verdict == BEHIND and high > -0.5 and low < -1.0
    assert standing.status == settle.OPEN and standing.answer == 5
    assert [c.contender for c in standing.measuring] == [4] and standing.measure_next == [5]
    # open, the answer says which values the data do not keep apart yet, and why
    assert standing.may_tie == [4, 5]
    report = SimpleNamespace(gains=few, sweeps=3, seconds=90.0, way="live")
    text = head_reason(standing, 5, report).text  # type: ignore[arg-type]
    assert "N=4 may tie with it" in text and "not yet shown within +-1.00" in text
    assert "measure next at 5 streams" in text and "neither" not in text
    assert sweep_text(5, standing) == "N=5 against N=4 (equivalent?)"
    many = {**gains_with(small_gain), 5: diffs(2.4, 4.0, 60, seed=5)}
    moved = settle.assess(many, UNIFORM, 5, NP, objective=100.0)
    assert moved.status == settle.MOVED and moved.answer == 4 and moved.tie == [4, 5]
    from_four = settle.assess(many, UNIFORM, 4, NP, objective=100.0)
    assert from_four.status == settle.SETTLED and from_four.answer == 4
    # surely behind, perhaps by more than the tolerance, perhaps by less: still open
    between = {**gains_with(small_gain), 5: diffs(9.6, 6.0, 6, seed=5)}
    still = settle.assess(between, UNIFORM, 5, NP, objective=100.0)
    low, high = next(c for c in still.comparisons if c.contender == 4).advantage.bounds(0.95)
    assert -1.0 < high < -0.5 and low < -1.0
    assert still.status == settle.OPEN and [c.contender for c in still.measuring] == [4]
    # placed within half the tolerance of its estimate without a side, it is at the
    # tolerance's edge: no longer measured, named, and the better N=5 stands
    edge = {**gains_with(small_gain), 5: diffs(7.6, 4.0, 8, seed=5)}
    placed = settle.assess(edge, UNIFORM, 5, NP, objective=100.0)
    low, high = next(c for c in placed.comparisons if c.contender == 4).advantage.bounds(0.95)
    assert low < -1.0 < high < 0 and 0.25 < (high - low) / 2 <= 0.5
    assert placed.status == settle.SETTLED and placed.answer == 5 and placed.edge == [4]
    assert placed.tie == [5] and placed.may_tie == [4, 5]
    text = head_reason(placed, 5, report).text  # type: ignore[arg-type]
    assert "N=4 sits at the tolerance's edge" in text
    # shown more than the tolerance behind, the question is closed: no tie to ask about
    far = {**gains_with(small_gain), 5: diffs(12.0, 2.5, 30, seed=5)}
    held = settle.assess(far, UNIFORM, 5, NP, objective=100.0)
    assert next(c for c in held.comparisons if c.contender == 4).advantage.bounds(0.95)[1] < -1
    assert held.status == settle.SETTLED and held.answer == 5 and held.tie == [5]


def test_a_tie_question_is_asked_against_the_best_estimate() -> None:
    """Answer N=4; N=6 estimates best (within the tolerance); N=3 is shown equivalent to N=4
    but not yet to N=6, the value the tie is measured from. Asked against the answer, the
    question closed and N=3 fell out of the tie [4, 5, 6] unasked, while a run that reached
    N=3 first (N=6 no contender there) kept [3, 4, 5]. It stays open against N=6, at the
    levels where the two differ, until placed: here at the tolerance's edge."""
    base = {2: 20.0, 3: 10.0, 4: 4.0, 7: -20.0, 8: -25.0}

    def gains(pairs: int) -> dict[int, LevelDiffs]:
        noisy = {5: diffs(1.0, 5.0, pairs, seed=5), 6: diffs(1.6, 5.0, pairs, seed=6)}
        return {**gains_with(base), 4: diffs(4.0, 1.0, 30, seed=4), **noisy}

    six = gains(6)
    few = settle.assess(six, UNIFORM, 4, NP, objective=100.0)
    three = next(c for c in few.comparisons if c.contender == 3)
    assert equivalent(three.advantage, 1.0)  # against the answer: equivalent
    assert settle.best_estimate(4, few.comparisons) == 6
    question = few.question(3)
    assert question is not None and question.against == 6 and question.levels == [4, 5, 6]
    low, high = question.advantage.bounds(0.95)
    assert low < -1.0 < high < 0 and (high - low) / 2 > 0.5  # neither side, not yet placed
    assert few.status == settle.OPEN and few.answer == 4 and few.measuring == [question]
    assert few.measure_next[0] in (5, 6) and set(few.measure_next) == {4, 5, 6}
    assert few.may_tie == [3, 4, 5, 6]  # the tie shown so far, [4, 5, 6], and the open N=3
    assert sweep_text(4, few) == "N=4 against N=3 (equivalent to N=6, the best estimate?)"
    report = SimpleNamespace(gains=six, sweeps=3, seconds=90.0, way="live")
    text = head_reason(few, 4, report).text  # type: ignore[arg-type]
    assert "N=3 may tie with it: -0.83 [-1.48, -0.17] tok/s against N=6, the best" in text
    # placed within half the tolerance without a side: at the edge, named, N=4 stands
    many = settle.assess(gains(40), UNIFORM, 4, NP, objective=100.0)
    assert many.status == settle.SETTLED and many.answer == 4 and many.tie == [4, 5, 6]
    assert many.edge == [3] and many.may_tie == [3, 4, 5, 6]
    text = head_reason(many, 4, report).text  # type: ignore[arg-type]
    assert "N=3 sits at the tolerance's edge (-0.82 [-1.06, -0.59] tok/s against N=6" in text


def test_a_flat_stretch_of_four_ties_on_its_smallest_value_from_either_side() -> None:
    """N=3, 4, 5 and 6 within a quarter of the tolerance of each other, N=2 beyond it. From
    N=4, N=6 estimates best and all four are shown equivalent to it; the tie keeps the best
    and the smallest equivalent values, so the answer moves to N=3, where a run that started
    from N=3 (N=6 no contender there) settles too. Kept nearest the best, the tie from N=4 was
    [4, 5, 6] and N=4 stood."""
    flat = {2: 20.0, 3: 10.0, 7: -20.0, 8: -25.0}
    gains = {
        **gains_with(flat),
        4: diffs(1.0, 1.0, 40, seed=4),
        5: diffs(1.0, 1.0, 40, seed=5),
        6: diffs(1.6, 1.0, 40, seed=6),
    }
    from_four = settle.assess(gains, UNIFORM, 4, NP, objective=100.0)
    assert settle.best_estimate(4, from_four.comparisons) == 6
    assert from_four.status == settle.MOVED and from_four.answer == 3
    assert from_four.tie == [3, 4, 6]
    from_three = settle.assess(gains, UNIFORM, 3, NP, objective=100.0)
    assert from_three.status == settle.SETTLED and from_three.answer == 3
    assert from_three.tie == [3, 4, 5]


def test_a_larger_answer_held_before_keeps_a_chain_of_ties_from_walking_down_a_slope() -> None:
    """Each step a half tolerance: N=2 and N=3 0.5 above N=1, N=4 1.25 above it. From N=1 the
    contenders N=2, N=3 and always draft see no value more than the tolerance above, and N=1
    settles in a tie; with N=4 kept (an answer held before ties moved it down), N=4 is shown
    ahead and the answer goes back to it."""
    gains = gains_with({2: 4.0, 3: 0.0, 4: 6.0, 5: -20.0, 6: -20.0, 7: -20.0, 8: -20.0}, sd=1.0)
    alone = settle.assess(gains, UNIFORM, 1, NP, objective=100.0)
    assert alone.status == settle.SETTLED and alone.answer == 1 and alone.tie == [1, 2, 3]
    kept = settle.assess(gains, UNIFORM, 1, NP, objective=100.0, kept=[2, 4])
    assert [c.contender for c in kept.comparisons] == [2, 3, 8, 4]
    assert kept.status == settle.MOVED and kept.answer == 4
    assert settle.contenders(1, NP, kept=[2, 4]) == [2, 3, 8, 4]
    assert settle.contenders(4, NP, kept=[6]) == [2, 3, 5, 6, 8]  # already a contender


def test_an_unresolved_standing_names_what_to_measure_next() -> None:
    gains = gains_with({**CROSSING_AT_3, 4: 2.0}, sd=30.0, n=3)
    standing = settle.assess(gains, UNIFORM, 3, NP, objective=100.0)
    assert standing.status == settle.OPEN
    assert 4 in standing.measure_next
    unresolved = {c.contender for c in standing.unresolved}
    assert 4 in unresolved
    # a level never measured comes first
    gains.pop(5)
    standing = settle.assess(gains, UNIFORM, 3, NP, objective=100.0)
    assert standing.measure_next[0] == 5


def test_paired_rounds_become_level_differences() -> None:
    rounds = {4: {"on": {0: 100.0, 1: 90.0, 2: 95.0}, "off": {0: 98.0, 1: 91.0}}}
    got = settle.gains_from_rounds(rounds)
    assert got[4].diffs == (2.0, -1.0)  # round 2 has no partner


def test_the_data_s_best_is_found_however_far_from_the_answer() -> None:
    """A gain that changes sign twice (ahead at 2, far behind at 4, ahead again at 6, equal
    weights on the measured levels): the measured gains put N=2 first (N=3 the same, level 3
    unweighted: the smaller), which no N+-2 of an answer of 6 reaches; tune adds it as a
    contender, and it is then shown ahead of 6."""
    gains = {2: diffs(10.0, 2.0, 6), 4: diffs(-28.0, 2.0, 6), 6: diffs(12.0, 2.0, 6)}
    weights = [0.25, 0.25, 0.0, 0.25, 0.0, 0.25]
    assert settle.measured_best(gains, weights, 6) == 2
    assert 2 not in settle.contenders(6, 6)
    standing = settle.assess(gains, weights, 6, 6, 150.0, kept=[2])
    assert standing.status == settle.MOVED and standing.answer == 2
    # a weighted level without pairs yet: the data cannot rank every N
    some = {2: diffs(10.0, 2.0, 6), 6: diffs(12.0, 2.0, 6)}
    assert settle.measured_best(some, weights, 6) is None
    # gains that fall steadily: the crossover (level 3 unweighted: 2, not 3)
    falling = {2: diffs(5.0, 1.0, 6), 4: diffs(-1.0, 1.0, 6), 6: diffs(-3.0, 1.0, 6)}
    assert settle.measured_best(falling, weights, 6) == 2
