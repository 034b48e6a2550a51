"""The twin's truth (tuner.twin.truth): deterministic, the tuner's estimand, paired, with its
error stated; the best N with its ties; a surface whose gain changes sign twice; open loop.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
from lab.openworlds import load_manifest
from twinworlds import BENCH_WORLD, zigzag_world

from tuner.policy import Policy
from tuner.twin import closed_level, load_world
from tuner.twin.engine import Workload
from tuner.twin.truth import closed_truth, open_loop_capacity, open_loop_truth, ranked


def test_a_gain_can_change_sign_twice() -> None:
    truth = closed_truth(zigzag_world(), rel_se=0.004)
    signs = [truth.gain(c) > 0 for c in truth.concurrency]
    assert signs == [True, True, False, False, True, True], [
        round(truth.gain(c), 3) for c in truth.concurrency
    ]


def test_the_truth_is_deterministic_and_is_the_mean_of_paired_closed_levels() -> None:
    world = zigzag_world()
    one = closed_truth(world, concurrency=[1, 3], rel_se=0.004)
    two = closed_truth(world, concurrency=[1, 3], rel_se=0.004)
    assert one.cells == two.cells
    cell = one.cell(Policy.always(), 3)
    assert not cell.deterministic and cell.repeats >= 16
    assert cell.rel_se <= 0.004
    direct = [
        closed_level(world, Policy.always(), 3, seed=r, noise=False).window_tps()
        for r in range(cell.repeats)
    ]
    assert list(cell.values) == direct
    assert cell.tps == pytest.approx(statistics.fmean(direct), rel=1e-12)


def test_cells_that_cannot_differ_are_shared_and_deterministic_ones_run_once() -> None:
    world = zigzag_world()
    truth = closed_truth(world, concurrency=[2, 4], rel_se=0.004)
    for c in (2, 4):
        always = truth.cell(Policy.always(), c)
        for n in range(c, world.n_parallel + 1):
            assert truth.cell(Policy.threshold(n), c) is always
        plain = truth.cell(Policy.plain(), c)
        assert plain.deterministic and plain.repeats == 1 and plain.se == 0.0
        for n in range(1, c):
            held = truth.cell(Policy.threshold(n), c)
            # all c generate from the first step: a threshold below c never drafts, and with no
            # draft-model cost in this world it runs exactly as plain
            assert held.deterministic and held.tps == pytest.approx(plain.tps, rel=1e-12)


def test_drawn_output_lengths_make_every_cell_repeat() -> None:
    world = zigzag_world()

    def lengths(streams: int, repeat: int) -> list[int]:
        return [96 + 16 * ((repeat + i) % 4) for i in range(streams)]

    truth = closed_truth(world, output_tokens=lengths, concurrency=[3], rel_se=0.01)
    assert truth.output_tokens is None
    held, always = truth.cell(Policy.threshold(1), 3), truth.cell(Policy.always(), 3)
    assert not held.deterministic and held.repeats == always.repeats >= 16
    assert len(set(always.values)) > 1
    # The window ends when the first stream finishes, and until then all 3 generate: a
    # threshold below 3 never drafts inside it, whatever the lengths (here: as plain, this
    # world's draft model costs nothing when it does not draft).
    assert held.values == truth.cell(Policy.plain(), 3).values


def test_the_best_n_follows_the_weights_and_shows_its_ties() -> None:
    truth = closed_truth(zigzag_world(), rel_se=0.004)
    # Only 1 stream: every drafting policy is the same server there; N=0 (the default) first.
    only_one = truth.best({1: 1.0})
    assert only_one.best == Policy.always(3)
    assert set(only_one.ties) == {Policy.always(3)} | {Policy.threshold(n, 3) for n in range(1, 7)}
    assert only_one.runner_up is None and only_one.margin == 0.0
    # Only 3 streams, where spec loses: N = 1 or 2 (no drafts at 3) tie, the smaller first.
    only_three = truth.best({3: 1.0})
    assert only_three.best == Policy.threshold(1, 3)
    assert set(only_three.ties) == {Policy.threshold(1, 3), Policy.threshold(2, 3)}
    assert only_three.margin > 0 and only_three.regret(Policy.always(3)) > 0
    # Uniform: the value of each N is the mean of its row.
    uniform = truth.best()
    for p, value in uniform.values.items():
        assert value == pytest.approx(statistics.fmean(truth.row(p)))
    assert uniform.value == max(uniform.values.values())
    assert uniform.margin == pytest.approx(uniform.value - (uniform.runner_up_value or 0.0))
    assert uniform.margin_se > 0
    with_plain = truth.best(include_plain=True)
    assert Policy.plain() in with_plain.values
    with pytest.raises(ValueError, match="concurrencies the truth lacks"):
        truth.best({9: 1.0})


@pytest.mark.slow
def test_the_bench_world_truth_meets_its_table_and_crosses_over_like_the_bench() -> None:
    truth = closed_truth(load_world(BENCH_WORLD))
    table_plain = {1: 27.0, 2: 38.0, 4: 62.5, 8: 95.9}
    table_spec = {1: 40.2, 2: 48.5, 4: 69.4, 8: 77.3}
    for c, value in table_plain.items():
        assert truth.tps(Policy.plain(), c) == pytest.approx(value, rel=0.005)
    for c, value in table_spec.items():
        assert truth.tps(Policy.always(), c) == pytest.approx(value, rel=0.01)
    assert truth.gain(1) > 0.4 and truth.gain(4) > 0 and truth.gain(8) < -0.15
    assert max(cell.rel_se for cell in truth.cells.values()) <= 0.002
    print(truth.table())


@pytest.mark.slow
def test_open_loop_truth_pairs_every_n_on_the_same_arrivals() -> None:
    world = load_world(BENCH_WORLD)
    policies = [Policy.plain(), Policy.always(6), Policy.threshold(3, 6), Policy.threshold(8, 6)]
    figures = open_loop_truth(world, 0.4, duration_s=900.0, candidates=policies)
    assert figures == open_loop_truth(world, 0.4, duration_s=900.0, candidates=policies)
    offered = 0.4 * 900.0 * 128
    for f in figures.values():
        assert f.requests == 360
        # a stable server serves what is offered
        assert f.tokens_per_second * f.span_s == pytest.approx(offered)
        assert 0 < f.mean_generating < world.n_parallel
        assert f.tpot_ms[0] <= f.tpot_ms[1] <= f.tpot_ms[2]
    always, top = figures[Policy.always(6)], figures[Policy.threshold(8, 6)]
    assert always.tpot_mean_ms == top.tpot_mean_ms  # the same server at -np 8
    # drafting while few generate beats plain on time per token at this light load
    assert figures[Policy.threshold(3, 6)].tpot_mean_ms < figures[Policy.plain()].tpot_mean_ms


def test_an_overloaded_policy_ranks_behind_every_one_that_keeps_up() -> None:
    """openloop-24 of the open-loop set: always draft decodes each token fastest but serves
    fewer requests a second than arrive (the draft model's prompts on the CPU); its TPOT
    would put it first, the truth puts it behind plain and every threshold, which keep up."""
    folder = Path(__file__).resolve().parent.parent / "profiles" / "twin" / "openloop"
    entry = next(e for e in load_manifest(folder) if e.name == "openloop-24")
    world = load_world(folder / entry.file)
    full = entry.truth_workload()
    work = Workload(full.requests[:500], full.arrivals[:500])
    always, plain, two = Policy.always(world.n_max), Policy.plain(), Policy.threshold(2)
    figures = open_loop_truth(world, entry.rate, candidates=[always, plain, two], workload=work)
    assert figures[always].overloaded and not figures[plain].overloaded
    assert not figures[two].overloaded
    assert figures[always].capacity_rps <= entry.rate < figures[plain].capacity_rps
    order = [p for p, _ in ranked(figures)]
    assert order[-1] == always
    best = figures[order[0]]
    assert figures[always].regret(best) == math.inf
    assert figures[two].regret(best) >= 0.0
    for f in figures.values():  # end to end: queueing, first token and generation
        assert f.latency_mean_ms >= f.ttft_ms[0] * 0.5 and f.latency_p95_ms >= f.latency_mean_ms
    # its backlog rises through the run; the others' do not
    assert figures[always].backlog_rise > 10 * max(0.0, figures[plain].backlog_rise)


def test_capacity_under_a_latency_limit_brackets_the_limit() -> None:
    world = load_world(BENCH_WORLD)
    work = Workload.poisson(0.1, 1200.0, 64, 32, seed=3)
    plain = Policy.plain()
    base = open_loop_truth(world, 0.1, candidates=[plain], workload=work)[plain]
    limit = 2.0 * base.latency_p95_ms
    factor = open_loop_capacity(world, work, plain, limit, steps=4)
    assert factor > 1.0
    at = Workload(work.requests, tuple(t / factor for t in work.arrivals))
    met = open_loop_truth(world, 1.0, candidates=[plain], workload=at)[plain]
    assert met.latency_p95_ms <= limit and not met.overloaded
