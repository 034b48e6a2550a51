"""`tuner watch --experiment` (tuner.decide.experiment): the schedule (randomised, balanced, the
share of time away from the standing N capped, each contender window flanked by the standing
N), a block's paired differences count by count, the objective's weights; then on twin worlds
in-process (tuner.twin.production, virtual time): it moves to the truth's best where the truth
is clear, does not flap where the truth sits on a tie, reports what it cost, and stops with a
clear line on windows it cannot read and on a server above its capacity. The grading over many
worlds is benchmarks/watch_experiment.py; the live backend over HTTP is
tests/test_watch_experiment.py."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from lab.experiment import arrival_rate, grade, open_loop_best, run_experiment
from twinworlds import world

from tuner.decide import settle
from tuner.decide.experiment import (
    STOPPED,
    Experiment,
    ExperimentOptions,
    Planned,
    model_tie,
)
from tuner.decide.paired import Contrast
from tuner.errors import ConfigError
from tuner.measure.windows import SlotTokens, WindowFigures
from tuner.policy import Policy
from tuner.recommendation import Recommendation


def test_a_cycle_flanks_its_contender_and_keeps_the_share_away() -> None:
    for share, k in ((0.25, 4), (1 / 3, 3), (0.1, 10)):
        exp = Experiment(4, 8, ExperimentOptions(share=share, seed=7))
        places = Counter()
        for i in range(200):
            plan = exp.plan_cycle(5, i)
            assert len(plan) == k and sum(p.contender for p in plan) == 1
            place = next(j for j, p in enumerate(plan) if p.contender)
            assert 0 < place < k - 1  # flanked by the standing N
            assert {p.n for p in plan if not p.contender} == {4} and plan[place].n == 5
            assert len({p.seconds for p in plan}) == 1
            places[place] += 1
        assert sum(1 for p in plan if p.contender) / len(plan) <= share + 1e-9
        assert len(places) == k - 2  # every inner place is used
    # seeded: the same plan again
    a = [p.n for p in Experiment(4, 8, ExperimentOptions(seed=3)).plan_cycle(5, 0)]
    b = [p.n for p in Experiment(4, 8, ExperimentOptions(seed=3)).plan_cycle(5, 0)]
    assert a == b
    with pytest.raises(ConfigError, match="flanked"):
        ExperimentOptions(share=0.5).check()


def test_the_sides_of_the_answer_take_turns_at_their_farthest_contender() -> None:
    exp = Experiment(4, 8, ExperimentOptions(seed=1, always=False), tie=[4, 6])
    # the model's tie set and its neighbours, and the answer's: never N=1 (nor always draft,
    # here left out)
    assert sorted(exp.contenders()) == [3, 5, 6]
    standing = exp.assess()
    assert standing.status == settle.OPEN
    # the two sides of the answer take turns, each turn at the farthest value wanted there: a
    # window at N=6 drafts at 5 and 6, where N=4 does not, so it feeds N=5's comparison too,
    # and a window at N=5 would feed N=6's at 5 only
    turns = [exp.next_contender(standing) for _ in range(8)]
    for i in range(0, 8, 2):
        assert sorted(turns[i : i + 2]) == [3, 6]  # each side once before either twice
    assert exp.covering(5, standing) == 6 and exp.covering(3, standing) == 3
    assert sorted(Experiment(4, 8, ExperimentOptions(seed=1), tie=[4, 6]).contenders()) == [
        0,
        3,
        5,
        6,
    ]  # always draft by default


def figures(n: int, rates: dict[int, float], seconds: float = 10.0) -> WindowFigures:
    f = WindowFigures(n, seconds=seconds * len(rates))
    for c, r in rates.items():
        f.add(c, seconds, r * seconds)
    return f


def serve(exp: Experiment, cycle: list[tuple[Planned, WindowFigures]]) -> None:
    for planned, f in cycle:
        exp.record(planned, f)


def test_gains_pool_each_side_over_the_cycles() -> None:
    """A count's gain: the contender windows' time there drafting against the standing N's not
    drafting, pooled over every cycle, its spread by cycle; the two sides need not meet in one
    cycle."""
    exp = Experiment(3, 6, ExperimentOptions(min_tokens=1.0))
    home = {1: 50.0, 2: 90.0, 3: 100.0, 4: 110.0, 5: 120.0}
    # the contender N=5 drafts at 4 and 5, where N=3 does not: on and off there, nowhere else
    serve(exp, [
        (Planned(3, False, 10, 0, 3), figures(3, home)),
        (Planned(5, True, 10, 0, 3), figures(5, {**home, 4: 130.0, 5: 100.0})),
        (Planned(3, False, 10, 0, 3), figures(3, {**home, 4: 114.0})),
    ])  # fmt: skip
    assert exp.evidence.blocks()[0][4] == (
        1300.0,
        10.0,
        2240.0,
        20.0,
    )  # on tokens, s; off tokens, s
    assert exp.evidence.gains()[4].n == 0  # one cycle: no spread to tell yet
    # a second cycle: the gain is the pooled on rate less the pooled off rate
    serve(exp, [
        (Planned(3, False, 10, 1, 3), figures(3, home)),
        (Planned(5, True, 10, 1, 3), figures(5, {3: 100.0, 4: 126.0}, seconds=30.0)),
        (Planned(3, False, 10, 1, 3), figures(3, {**home, 4: 114.0})),
    ])  # fmt: skip
    gains = exp.evidence.gains()
    on = (1300.0 + 126.0 * 30) / 40.0
    assert gains[4].mean == pytest.approx(on - 112.0) and gains[4].n == 2
    assert gains[4].blocks == (0, 1) and gains[4].df == 1
    assert gains[5].n == 0  # drafting at 5 in one cycle only
    # a third cycle whose contender window reached 5 while its flanks did not: the drafting
    # side of 5 has its second cycle, the other side has the flanks of the first two
    serve(exp, [
        (Planned(3, False, 10, 2, 3), figures(3, {1: 50.0})),
        (Planned(5, True, 10, 2, 3), figures(5, {5: 90.0})),
        (Planned(3, False, 10, 2, 3), figures(3, {1: 50.0})),
    ])  # fmt: skip
    gains = exp.evidence.gains()
    assert gains[5].mean == pytest.approx(95.0 - 120.0) and gains[5].n == 3
    assert gains[5].blocks == (0, 1, 2)
    # a contender below: N=2 does not draft at 3, where N=3 does: on (the standing) - off
    below = Experiment(3, 6, ExperimentOptions(min_tokens=1.0, min_blocks=1))
    cycle = [
        (Planned(3, False, 10, 1, 3), figures(3, home)),
        (Planned(2, True, 10, 1, 3), figures(2, {**home, 3: 80.0})),
        (Planned(3, False, 10, 1, 3), figures(3, home)),
    ]
    serve(below, cycle)
    assert below.evidence.gains()[3].mean == pytest.approx(20.0)
    # a window it could not read gives nothing
    broken = Experiment(3, 6, ExperimentOptions(min_tokens=1.0, min_blocks=1))
    cycle[1][1].problem = "the server restarted"
    serve(broken, cycle)
    assert 3 not in broken.evidence.gains() or broken.evidence.gains()[3].n == 0


def test_a_comparison_sums_its_counts_cycle_by_cycle() -> None:
    """Counts seen in the same cycles move together (a contender window that drew easy
    requests lifts every count it saw): the comparison's spread is its own sum's over the
    cycles, not the counts' spreads added as if independent. Here the two counts' gains
    swing in opposite directions cycle by cycle and their sum holds still."""
    exp = Experiment(2, 4, ExperimentOptions(min_tokens=1.0))
    for k in range(6):
        swing = 10.0 if k % 2 else -10.0
        serve(exp, [
            (Planned(2, False, 10, k, 2), figures(2, {3: 50.0, 4: 50.0})),
            (Planned(4, True, 10, k, 2), figures(4, {3: 60.0 + swing, 4: 60.0 - swing})),
            (Planned(2, False, 10, k, 2), figures(2, {3: 50.0, 4: 50.0})),
        ])  # fmt: skip
    gains = exp.evidence.gains()
    assert gains[3].se > 1.0 and gains[4].se > 1.0
    both = settle.advantage(gains, [0.0, 0.0, 1.0, 1.0], 2, 4)
    assert both.estimate == pytest.approx(20.0) and both.se == pytest.approx(0.0, abs=1e-9)


def test_pooled_gains_are_not_fooled_by_short_lucky_windows() -> None:
    """Cycles whose contender window saw a drafting count briefly and at a high rate, and
    others that saw it long at a low one: the mean of the cycles' own differences says the
    contender gains, their pooled rates (what it did over all the time seen) that it loses."""
    exp = Experiment(2, 4, ExperimentOptions(min_tokens=1.0))
    per_cycle = []
    for k in range(6):
        rate, seconds = (70.0, 1.0) if k % 2 else (45.0, 20.0)
        serve(exp, [
            (Planned(2, False, 30, k, 2), figures(2, {3: 50.0}, 20.0)),
            (Planned(3, True, 30, k, 2), figures(3, {3: rate}, seconds)),
            (Planned(2, False, 30, k, 2), figures(2, {3: 50.0}, 20.0)),
        ])  # fmt: skip
        per_cycle.append(rate - 50.0)
    assert sum(per_cycle) / 6 > 0 > exp.evidence.gains()[3].mean


def test_the_weights_follow_the_occupancy_the_traffic_causes() -> None:
    """Counts the traffic spends time at weigh, by how much a faster rate there shortens every
    token's time (the queue empties sooner); counts it never reaches weigh nothing."""
    exp = Experiment(2, 6, ExperimentOptions(min_tokens=1.0), rate=0.5, output_tokens=128)
    for _ in range(3):
        exp.report.windows.append(
            (Planned(2, False, 30, 0, 2), figures(2, {1: 60.0, 2: 100.0, 3: 120.0}))
        )
    weights, objective = exp.evidence.weights(exp.answer)
    assert objective > 0 and all(w > 0 for w in weights[:3]) and weights[3:] == [0, 0, 0]
    # nothing known of the arrivals: the occupancy seen alone (p_c / sum p_k k), which is
    # also the least a count the traffic reaches weighs
    blind = Experiment(2, 6, ExperimentOptions(min_tokens=1.0))
    blind.report.windows = exp.report.windows
    seen, value = blind.evidence.weights(blind.answer)
    assert seen[:3] == pytest.approx([1 / 6] * 3) and seen[3:] == [0, 0, 0]
    assert value == pytest.approx((60.0 + 100.0 + 120.0) / 3 / 2)  # 1 / TPOT as seen
    assert all(w >= s for w, s in zip(weights, seen, strict=True))


def test_slot_tokens_count_decoded_tokens_by_generating_slots() -> None:
    def slot(i: int, task: int | None, decoded: int) -> dict:
        busy = task is not None
        return {"id": i, "id_task": task, "is_processing": busy,
                "next_token": [{"n_decoded": decoded}]}  # fmt: skip

    counting = SlotTokens()
    assert counting.update([slot(0, 1, 5), slot(1, None, 0)]) == (None, 0, 0)
    # slot 0 decoded 7 more at one generating; slot 1 took a request in between: left out
    assert counting.update([slot(0, 1, 12), slot(1, 2, 3)]) == (1, 7, 0)
    # slot 0's request ended and another took the slot; slot 1 went on: 6 tokens at one
    assert counting.update([slot(0, 3, 2), slot(1, 2, 9)]) == (1, 6, 1)
    # both went on: 2 + 4 tokens at two; then slot 1 went idle
    assert counting.update([slot(0, 3, 4), slot(1, 2, 13)]) == (2, 6, 0)
    assert not counting.reading
    assert counting.update([slot(0, 3, 5), slot(1, None, 0)]) == (1, 1, 1)
    # slot 1 takes a request and reads its prompt (processing, nothing decoded yet): the
    # interval up to this poll and the next one had steps that read a prompt
    assert counting.update([slot(0, 3, 7), slot(1, 4, 0)]) == (1, 2, 0)
    assert counting.reading
    counting.update([slot(0, 3, 9), slot(1, 4, 1)])
    assert counting.reading
    counting.update([slot(0, 3, 11), slot(1, 4, 3)])
    assert not counting.reading


def test_model_tie_is_the_values_within_the_tolerance() -> None:
    rec = Recommendation(
        id=0, model="m", host="h", policy=Policy.threshold(3, 4), fit_id=0, objective=100.0,
        alternatives=[{"max_slots": n, "objective": v}
                      for n, v in {1: 90.0, 2: 99.5, 3: 100.0, 4: 98.0}.items()],
    )  # fmt: skip
    assert model_tie(rec) == [2, 3]
    assert model_tie(rec, tolerance=0.03) == [2, 3, 4]


def test_it_moves_to_the_truths_best_and_says_what_it_cost() -> None:
    """zigzag (quiet) under Poisson arrivals: N=2 is the open-loop best by far (drafting at
    three slots lands on the steep stretch of rows). From N=1 and from N=3 the experiment moves
    to it within 30 simulated minutes, its verdicts carry their bounds, and it reports the
    share of time and requests served at a contender and their time per output token."""
    w = world("zigzag-quiet")
    truth = open_loop_best(w, "poisson", 0.4, duration_s=1800.0)
    assert min(truth, key=truth.__getitem__) == 2
    for start in (1, 3):
        report, seconds = run_experiment(w, "poisson", 0.4, start, seed=start)
        graded = grade(report, truth, seconds)
        assert report.answer == 2 and graded.regret == 0.0, report.notes
        assert graded.minutes <= 30.0 and report.moves == [2]
        lines = report.verdicts()
        bounded = [line for line in lines if "[" in line and "one-sided" in line]
        assert bounded and all(line in bounded or "not measured enough" in line for line in lines)
        cost = report.cost
        assert 0 < cost.away_s <= 0.26 * cost.seconds  # a quarter of the time at most
        assert 0 < cost.requests_away < cost.requests
        assert cost.tpot_ratio is not None and "cost to users" in cost.text()
        stored = report.as_dict()
        assert stored["comparisons"] and stored["cost"]["requests"] == cost.requests


def test_it_does_not_flap_where_the_truth_sits_on_a_tie() -> None:
    """The bench world at a mean accepted length of 3.0: drafting at three slots gains about
    nothing, so N=2 and N=3 are within 0.7 % of each other under these arrivals (the next, N=4,
    1.3 % behind). From either, in several runs, N changes at most once and never back, and
    the answer stays within the tolerance of the best."""
    w = world("bench").with_updates(acceptance={"synth_len": 3.0}, noise={"preset": "quiet"})
    rate = arrival_rate(w, 0.35)
    truth = open_loop_best(w, "poisson", rate, duration_s=1800.0)
    best = min(truth.values())
    tied = sorted(n for n, v in truth.items() if v <= best * (1 + settle.TOLERANCE))
    assert tied == [2, 3], truth
    for start in tied:
        for seed in range(3):
            report, seconds = run_experiment(w, "poisson", rate, start, seed=seed)
            assert len(report.moves) <= 1, report.moves
            assert start not in report.moves
            assert grade(report, truth, seconds).regret <= settle.TOLERANCE, report.answer


class Broken:
    """A window backend whose windows cannot be read (a server that keeps restarting), or whose
    queue only grows (arrivals above its capacity)."""

    def __init__(self, kind: str) -> None:
        self.kind, self.clock, self.n, self.backlog = kind, 0.0, 0, 0
        self.switched: list[int] = []

    n_slots = 4

    @property
    def elapsed(self) -> float:
        return self.clock

    def switch(self, n: int) -> None:
        self.n = n
        self.switched.append(n)

    def window(self, seconds: float) -> WindowFigures:
        self.clock += seconds
        f = figures(self.n, {2: 80.0, 3: 90.0, 4: 100.0}, seconds / 3)
        if self.kind == "restarts":
            f.problem = "a counter went down during the window (the server restarted)"
        else:
            self.backlog += 5
            f.backlog, f.waited_s = self.backlog, seconds
        return f


class Burst(Broken):
    """A backlog that grows for twelve windows (a burst above capacity), then drains."""

    def __init__(self) -> None:
        super().__init__("overload")
        self.windows = 0

    def window(self, seconds: float) -> WindowFigures:
        self.windows += 1
        f = super().window(seconds)
        if self.windows > 12:
            self.backlog = 0
            f.backlog = 0
        return f


def test_a_burst_pauses_the_contender_windows_and_the_experiment_goes_on() -> None:
    lines: list[str] = []
    backend = Burst()
    exp = Experiment(2, 4, ExperimentOptions(budget_s=900.0), say=lines.append)
    report = exp.run(backend)
    assert report.status != STOPPED, lines
    paused = next(i for i, line in enumerate(lines) if "contender windows pause" in line)
    assert any("the burst passed" in line for line in lines[paused:]), lines
    # contender windows came after the pause again
    after = [p for p, f in report.windows if f.backlog == 0]
    assert any(p.contender for p in after)
    assert backend.switched[-1] == report.answer


@pytest.mark.parametrize(
    ("kind", "said"),
    [("restarts", "3 windows in a row could not be used"), ("overload", "above its capacity")],
)
def test_windows_it_cannot_use_stop_it_with_a_clear_line(kind: str, said: str) -> None:
    lines: list[str] = []
    backend = Broken(kind)
    exp = Experiment(2, 4, ExperimentOptions(), say=lines.append)
    report = exp.run(backend)
    assert report.status == STOPPED and report.answer == 2 and not report.moves
    assert any(said in line for line in lines), lines
    assert backend.switched[-1] == 2  # left at the standing N
    # every second served: the windows, and a washout after each switch in no window
    washed = report.washouts * ExperimentOptions().washout_s
    assert report.washouts > 0
    assert math.isclose(backend.elapsed, sum(f.seconds for _, f in report.windows) + washed)


def test_the_twin_serves_windows_as_watch_would_see_them() -> None:
    """tuner.twin.production: a window's time at each count adds up to it, the threshold is
    switched between windows, observe's view of a window covers it, and the arrival processes
    give their count."""
    from tuner.traffic import TrafficProfile
    from tuner.twin.production import ServedTraffic, arrivals

    for process in ("poisson", "mmpp"):
        times = list(arrivals(process, 0.5, 3, horizon_s=8000.0))
        assert len(times) == 4000 and times[-1] <= 8000.0
    w = world("zigzag-quiet")
    served = ServedTraffic(w, arrivals("poisson", 0.3, 1), 0, seed=1, noise=False)
    first = served.window(600.0)
    assert first.seconds == pytest.approx(600.0, abs=1.0)
    assert sum(s for s, _ in first.levels.values()) == pytest.approx(first.seconds, rel=1e-6)
    served.switch(1)
    seen = TrafficProfile(w.n_parallel)
    second = served.window(600.0, seen)
    assert served.elapsed == pytest.approx(first.seconds + second.seconds)
    results = [r for r in served.engine.results() if r.finished_at and r.finished_at > 600.5]
    assert results and all(r.tokens == 128 for r in results)
    assert served.engine.policy.max_slots == 1
    # observe's view of the second window: its time, the requests it saw end, the counters
    assert seen.covered_s == pytest.approx(second.seconds, rel=1e-6)
    assert seen.finished > 0 and seen.acceptance.readings > 0
    assert second.tokens <= sum(r.tokens - 1 for r in served.engine.results() if r.token_times)
    # the steps that read a prompt beside generating slots are kept apart, within each count's
    # time, and the figures survive being stored
    assert second.reading and all(0 < s <= second.at(c)[0] for c, s in second.reading.items())
    assert WindowFigures.from_dict(second.to_dict()) == second


def test_contenders_stay_within_one_and_np() -> None:
    for standing, tie in ((1, [1, 2]), (8, [7, 8]), (0, [0])):
        exp = Experiment(standing, 8, ExperimentOptions(), tie=tie)
        assert all(1 <= m <= 8 for m in exp.allowed())
        assert exp.assess().status == settle.OPEN  # nothing measured: every comparison open


class Light:
    """Traffic that never has more than two slots generating, where drafting pays at two: N=1
    is behind N=2, and always draft and N=3 differ from N=2 only at 3 and 4, which no window
    sees."""

    n_slots = 4

    def __init__(self) -> None:
        self.clock, self.n = 0.0, 2

    @property
    def elapsed(self) -> float:
        return self.clock

    def switch(self, n: int) -> None:
        self.n = n

    def window(self, seconds: float) -> WindowFigures:
        self.clock += seconds
        drafts_at_two = self.n == 0 or self.n >= 2
        f = figures(self.n, {1: 50.0, 2: 80.0 if drafts_at_two else 60.0}, seconds / 2)
        f.finished = int(seconds)
        return f


def test_absence_of_data_is_never_evidence() -> None:
    """A contender that differs from the answer only at counts the traffic has not reached is
    not yet tested: the answer stays unresolved, naming the counts it waits for."""
    lines: list[str] = []
    options = ExperimentOptions(budget_s=600.0, seed=2)
    exp = Experiment(2, 4, options, tie=[2, 3], say=lines.append)
    report = exp.run(Light())
    assert report.status == settle.OPEN and report.answer == 2
    assert 0 in report.untested and 3 in report.untested  # always draft, N=3
    said = next(line for line in lines if "not yet tested" in line)
    assert "N=2 stands unresolved" in said and "at 3-4 generating slots" in said
    assert "the traffic has not reached 3-4 yet" in said
    assert any("out of the experiment's reach" in line for line in lines)  # plain


def test_the_wait_is_counted_in_the_data_each_rare_count_lacks() -> None:
    """At a count the traffic spends 2 % of its time at, 20 tok/s there: each side needs 60
    tokens (two cycles of 30), which at 2 % of the time at 20 tok/s is 150 s of contender
    window; contender windows a quarter of the time: 600 s, 10 minutes (count 2, with half
    its data and plenty of time, is not the one waited for)."""
    exp = Experiment(1, 3, ExperimentOptions(seed=1), tie=[1, 3])
    # one cycle with 30 tokens on each side at count 2; nothing at 3
    exp.evidence.blocks = lambda: {0: {2: (30.0, 1.0, 30.0, 1.0)}}  # type: ignore[method-assign]
    exp.evidence.time_shares = lambda: {0: 0.5, 1: 0.3, 2: 0.18, 3: 0.02}  # type: ignore[method-assign]
    exp.evidence.level_rates = lambda: ([None, 40.0, 40.0, 20.0], [None, 50.0, 50.0, 25.0])  # type: ignore[method-assign]
    exp.report.untested = [0]
    said = exp.waiting_for()
    assert "waits for data at 2-3 generating slots (each side in 2 cycles, 60 tokens)" in said
    assert "about 10 more minutes" in said
    # the same wait kept per contender: N=3 rests on counts 2 and 3; N=2 on count 2, which has
    # its data in 2 cycles' time (a cycle of four 10 s windows at least per missing cycle)
    assert exp.wait_s([2, 3]) == pytest.approx(600.0)
    assert exp.wait_s([2]) == pytest.approx(40.0)
    assert exp.minutes_to_wait(settle.Standing(1, settle.OPEN, [])) == {0: pytest.approx(10.0)}
    # count 2 seen in one cycle of five: its missing cycle is five cycles away, not one
    exp.evidence.blocks = lambda: {  # type: ignore[method-assign]
        k: {2 if k == 0 else 1: (30.0, 1.0, 30.0, 1.0)} for k in range(5)
    }
    assert exp.wait_s([2]) == pytest.approx(5 * 40.0)
    exp.evidence.time_shares = lambda: {0: 0.5, 1: 0.3, 2: 0.2}  # type: ignore[method-assign]
    assert exp.wait_s([2, 3]) is None  # count 3 not reached: no time can be said


def test_an_unresolved_answer_says_how_long_its_comparisons_take_to_tell_apart() -> None:
    """The judge's own resolution beside the unresolved answer: at the spread seen after ten
    minutes, N=5's advantage of 0.5 with a standard error of 0.5 needs its lower bound up to
    zero, (1.645 * 0.5 / 0.5)^2 = 2.7 times the time: 17 more minutes; N=3's -0.2 with 0.05
    is as good as told (its upper bound below the tolerance of 0.1 within the time seen)."""
    exp = Experiment(4, 8, ExperimentOptions())
    far = settle.Comparison(5, Contrast(0.5, 0.5, 9.0), settle.UNRESOLVED, [5])
    near = settle.Comparison(3, Contrast(-0.2, 0.05, 9.0), settle.UNRESOLVED, [4])
    standing = settle.Standing(4, settle.OPEN, [far, near], tolerance=0.1, measuring=[far, near])
    found = exp.minutes_to_tell(standing, 600.0)
    assert [(n, m) for _, n, m in found] == [(5, 4), (3, 4)]
    assert found[0][0] == pytest.approx(10.0 * ((1.6449 * 0.5 / 0.5) ** 2 - 1.0), rel=1e-3)
    said = exp._time_to_tell(found)
    assert "N=5 against N=4 about 17, N=3 against N=4 under one" in said
    assert exp._time_to_tell(exp.minutes_to_tell(settle.Standing(4, settle.OPEN, []), 600.0)) == ""


def test_a_tie_question_against_the_answer_is_said_once() -> None:
    """A smaller contender within the tolerance is asked again as a tie question; held against
    the answer itself it is the same contrast, and its line is not said twice; held against a
    larger best estimate it is a question of its own."""
    exp = Experiment(4, 8, ExperimentOptions())
    within = settle.Comparison(2, Contrast(-0.5, 0.3, 9.0), settle.WITHIN, [3, 4])
    again = settle.Comparison(2, Contrast(-0.5, 0.3, 9.0), settle.WITHIN, [3, 4], against=4)
    other = settle.Comparison(2, Contrast(-0.9, 0.3, 9.0), settle.BEHIND, [3, 4, 5], against=5)
    for questions, lines in (([again], 1), ([other], 2)):
        exp.report.standing = settle.Standing(
            4, settle.OPEN, [within], tolerance=0.2, questions=questions
        )
        said = exp.report.verdicts()
        assert len(said) == lines and said[0].startswith("N=2 against N=4: -0.500"), said


def test_counts_mostly_reading_a_prompt_do_not_settle_a_comparison() -> None:
    """At 4 generating slots the windows spent most of their time in steps that also read a
    prompt: there a rate per count does not price drafting (it lengthens the read), so N=4
    against N=3 is not told by the counts: it moves nothing and the answer does not settle,
    however clear the figures look; N=2, told at 3 where nothing is read, is."""
    exp = Experiment(3, 5, ExperimentOptions(min_tokens=1.0, always=False), tie=[3])
    for k in range(8):
        cycle = []
        for n, contender in ((3, False), (4 if k % 2 else 2, True), (3, False)):
            f = figures(n, {1: 30.0, 2: 50.0, 3: 60.0 if n >= 3 else 40.0, 4: 30.0})
            f.add(4, 0.0, 0.0, reading=True)
            f.reading[4] = 8.0  # of its 10 s at 4
            cycle.append((Planned(n, contender, 10, k, 3), f))
        serve(exp, cycle)
    # drafting at 4 looks no different here; what matters is that it is not used
    standing = exp.assess()
    assert exp.evidence.reading_shares()[4] == pytest.approx(0.8)
    assert exp.report.confounded == [4] and 4 not in [c.contender for c in standing.comparisons]
    assert standing.status != settle.SETTLED
    behind = next(c for c in standing.comparisons if c.contender == 2)
    assert behind.verdict == settle.BEHIND
