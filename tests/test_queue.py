"""The birth-death occupancy model against queueing theory's closed forms, and the objectives
built on it (tpot, capacity) choosing N the way the arithmetic says they should."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.decide import search
from tuner.decide.objective import Objective, ObjectiveKind
from tuner.model import queue
from tuner.model.acceptance import Acceptance
from tuner.model.costmodel import CostModel
from tuner.model.curves import Curve
from tuner.policy import Policy


def test_one_server_is_m_m_1() -> None:
    # tps the same at every level: service never speeds up with more slots, so P(idle) = 1 - rho.
    tps = np.array([100.0])
    occ = queue.occupancy(tps, rate=0.5, mean_output_tokens=100.0)  # mu = 1/s, rho = 0.5
    assert occ.probabilities[0] == pytest.approx(0.5)
    assert not occ.saturated


def test_linear_batching_is_m_m_c_erlang() -> None:
    # tps(c) = c * r: c independent servers of rate r / L each. Compare with Erlang C.
    n, r, length, lam = 4, 20.0, 100.0, 0.6
    tps = r * np.arange(1, n + 1)
    occ = queue.occupancy(tps, lam, length)
    a = lam / (r / length)  # offered load in servers
    rho = a / n
    terms = [a**k / math.factorial(k) for k in range(n)]
    tail = a**n / math.factorial(n) / (1 - rho)
    p0 = 1 / (sum(terms) + tail)
    assert occ.probabilities[0] == pytest.approx(p0)
    assert occ.probabilities[2] == pytest.approx(p0 * a**2 / 2)
    assert occ.probabilities[-1] == pytest.approx(p0 * tail)  # waiting folded into "all busy"
    # Every stream gets r tok/s whatever the occupancy: mean TPOT is 1000 / r ms.
    assert queue.mean_tpot_ms(tps, occ) == pytest.approx(1000 / r)


def test_arrivals_beyond_the_full_server_saturate() -> None:
    tps = np.array([30.0, 50.0, 60.0])
    assert queue.occupancy(tps, queue.saturation_rate(tps, 100.0) * 1.01, 100.0).saturated
    occ = queue.occupancy(tps, 0.99 * queue.saturation_rate(tps, 100.0), 100.0)
    assert occ.probabilities[-1] > 0.9 and not occ.saturated


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        queue.occupancy(np.array([10.0]), 0.0, 10.0)
    with pytest.raises(ValueError):
        queue.occupancy(np.array([10.0]), 1.0, 0.0)
    with pytest.raises(ValueError):
        queue.capacity(np.array([10.0]), 10.0, 0.0)


@given(
    slopes=st.floats(0.2, 0.95),
    first=st.floats(10.0, 80.0),
    rates=st.lists(st.floats(0.01, 0.99), min_size=2, max_size=2),
)
def test_more_arrivals_mean_more_slots_and_slower_tokens(
    slopes: float, first: float, rates: list[float]
) -> None:
    # Sublinear batching (each extra slot adds less): the usual shape of a server.
    tps = first * np.arange(1, 9) ** slopes
    top = queue.saturation_rate(tps, 128.0)
    lo, hi = sorted(r * top for r in rates)
    a, b = queue.occupancy(tps, lo, 128.0), queue.occupancy(tps, hi, 128.0)
    assert a.mean_generating <= b.mean_generating + 1e-9
    assert queue.mean_tpot_ms(tps, a) <= queue.mean_tpot_ms(tps, b) + 1e-9
    assert queue.tpot_quantile_ms(tps, a) <= queue.tpot_quantile_ms(tps, b) + 1e-9


def test_capacity_is_the_edge_of_the_limit() -> None:
    tps = 40.0 * np.arange(1, 9) ** 0.6  # per-stream time per token grows with occupancy
    slo = 1000 * 4 / tps[3]  # the time per token at 4 slots
    cap = queue.capacity(tps, 100.0, slo)
    assert 0 < cap < queue.saturation_rate(tps, 100.0)
    assert queue.tpot_quantile_ms(tps, queue.occupancy(tps, cap, 100.0)) <= slo
    assert queue.tpot_quantile_ms(tps, queue.occupancy(tps, cap * 1.05, 100.0)) > slo
    # A limit one stream alone cannot meet: nothing is served within it.
    assert queue.capacity(tps, 100.0, 0.5 * 1000 / tps[0]) == 0.0
    # A limit the full server meets: capacity is the saturation rate.
    assert queue.capacity(tps, 100.0, 1e6) == pytest.approx(queue.saturation_rate(tps, 100.0))


def test_rate_for_a_mean_occupancy() -> None:
    tps = 40.0 * np.arange(1, 9) ** 0.6
    rate = queue.rate_for_mean_generating(tps, 128.0, 4.0)
    assert queue.occupancy(tps, rate, 128.0).mean_generating == pytest.approx(4.0, abs=1e-6)


def spec_wins_alone() -> CostModel:
    """Spec 37 % ahead at 1 stream, even at 4, 18 % behind at 8: plain steps 20 + 2c ms, spec
    30 + 10c with 2.5 tokens per step."""
    return CostModel(
        8,
        3,
        Curve("linear", (20.0, 2.0)),
        Curve("linear", (30.0, 10.0)),
        Acceptance(3, 2.5, (0.7, 0.5, 0.3), "measured"),
    )


def test_tpot_objective_follows_the_arrival_rate() -> None:
    model = spec_wins_alone()
    light = Objective(ObjectiveKind.TPOT, rate=0.05, mean_output_tokens=128.0)
    heavy = Objective(ObjectiveKind.TPOT, rate=1.3, mean_output_tokens=128.0)

    def best(goal: Objective) -> int:
        result = search.run_study(None, f"q-{goal.rate}", model, goal)
        assert result.best.policy.max_slots is not None
        return result.best.policy.effective(model.n_parallel)

    # Light traffic is mostly one stream: drafting's lower time per token wins there.
    assert (
        search.evaluate(model, Policy.always(), light).value
        > search.evaluate(model, Policy.plain(), light).value
    )
    # Near saturation, drafting at every level slows every token: a low N beats always.
    assert best(heavy) < model.n_parallel
    assert (
        search.evaluate(model, Policy.threshold(2), heavy).value
        > search.evaluate(model, Policy.always(), heavy).value
    )
    assert light.describe(search.evaluate(model, Policy.always(), light).value).startswith(
        "mean TPOT"
    )


def test_capacity_objective_prefers_what_serves_more_within_the_limit() -> None:
    model = spec_wins_alone()
    # A limit plain cannot meet at one stream (22 ms/token) but drafting can (16 ms/token).
    goal = Objective(ObjectiveKind.CAPACITY, mean_output_tokens=128.0, slo_tpot_ms=20.0)
    assert search.evaluate(model, Policy.plain(), goal).value == 0.0
    assert search.evaluate(model, Policy.threshold(1), goal).value > 0.0
    # A loose limit: what serves the most arrivals wins, and that is not always-draft.
    loose = Objective(ObjectiveKind.CAPACITY, mean_output_tokens=128.0, slo_tpot_ms=200.0)
    result = search.run_study(None, "cap", model, loose)
    assert result.best.policy.effective(8) < 8
    assert result.objective is loose


def test_objectives_are_checked() -> None:
    with pytest.raises(ValueError):
        Objective(ObjectiveKind.TPOT, mean_output_tokens=100.0)  # no rate
    with pytest.raises(ValueError):
        Objective(ObjectiveKind.CAPACITY, mean_output_tokens=100.0)  # no limit
    with pytest.raises(ValueError):
        Objective(ObjectiveKind.TPS)  # no weights
