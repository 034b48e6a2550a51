"""What a request costs beyond its decode steps, and acceptance by drafting slots: measured by the
profile (its rounds' time to first token, the catch-up and join probes, its /metrics per round),
fitted with intervals (tuner.model.arrivals, tuner.model.trend), recovered on the twin."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from lab.method import HOST, twin_spec
from twinworlds import cpu_draft_world

from tuner.decide.adaptive import profile_adaptively
from tuner.measure.load import RequestSample
from tuner.measure.probes import catch_up_excess, join_excesses
from tuner.model.arrivals import ProbeRecord, TtftRound, fit_arrival_costs, fit_catch_up
from tuner.model.costmodel import CostModel
from tuner.model.data import FitData, LevelObs, Repeat
from tuner.model.trend import acceptance_trend
from tuner.policy import Policy
from tuner.storage.fits import StoredFit, current_fit
from tuner.storage.store import Store
from tuner.twin.inprocess import TwinBackend


@functools.cache
def _profiled(folder: str) -> StoredFit:
    """The cpu-draft world profiled live on the in-process twin (its probes included)."""
    world = cpu_draft_world()
    store = Store(f"sqlite:///{Path(folder) / 'cpu-draft.db'}")
    backend = TwinBackend(world, switch="live", seed=2)
    spec = twin_spec(world, seed=2)
    profile_adaptively(
        store, spec, Path(folder), host_name=HOST, backend=backend, switch="live", budget_s=0
    )
    return current_fit(store, world.model_name, HOST, seed=2)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> StoredFit:
    return _profiled(str(tmp_path_factory.mktemp("arrivals")))


def test_the_profile_recovers_the_worlds_prompt_and_catch_up_costs(profiled: StoredFit) -> None:
    world = cpu_draft_world()
    costs = profiled.model.arrivals
    assert costs is not None and costs.measured
    for figure, truth in (
        (costs.prefill, world.prefill.ms_per_token),
        (costs.draft_prefill, world.prefill.draft_ms_per_token),
        (costs.catch_up, world.draft.catch_up_ms_per_token),
    ):
        assert figure.measured
        assert figure.lower <= truth <= figure.upper, (figure, truth)
    # the twin has no cost of a join beyond its prompt rows: the join probe finds none
    assert costs.join.lower <= 0.0 <= costs.join.upper
    # the fit says where each came from, and the figures survive the fit's storage
    said = profiled.quality.acceptance["arrivals"]
    assert any("catch-up" in line and "probe" in line for line in said)
    again = CostModel.from_dict(profiled.model.to_dict())
    assert again.arrivals == costs


def test_a_world_without_catch_up_measures_none() -> None:
    """The catch-up probe on a drafter that re-evaluates every batch (catch-up 0) finds an
    interval around 0, not a cost."""
    world = cpu_draft_world(name="no-catch-up", draft={"call_ms": [[1, 6.0], [8, 13.0]]})
    backend = TwinBackend(world, switch="live", seed=3)
    from tuner.measure.load import Workload
    from tuner.measure.probes import catch_up_rounds
    from tuner.measure.spec import ProbesSpec

    workload = Workload(prompt_tokens=32, max_tokens=64)
    records = catch_up_rounds(backend, workload, world.n_max, ProbesSpec().repeats)
    figure = fit_catch_up(records)
    assert figure.measured and figure.lower <= 0.0 <= figure.upper


def _sample(times: list[float], drafts: list[int], prompt: int = 32) -> RequestSample:
    return RequestSample(
        0, ok=True, tokens=len(times), prompt_tokens=prompt, token_times=times, token_drafts=drafts
    )


def test_the_resume_step_is_told_from_the_drafting_steps_after_it() -> None:
    # 4 undrafted steps of 10 ms (the first token from the prompt), then a resume step of
    # 30 ms, then drafting steps of 12 ms giving 3 tokens each
    times = [0.0, 0.01, 0.02, 0.03, 0.04]
    drafts = [0, 0, 0, 0, 0]
    t = 0.04 + 0.03
    for k in range(5):
        times += [t] * 3
        drafts += [3 * (k + 1)] * 3
        t += 0.012
    behind, excess = catch_up_excess(_sample(times, drafts))
    assert behind == 4  # tokens generated without drafting, the prompt's first token apart
    assert excess == pytest.approx(30.0 - 12.0)
    # a request that never stopped drafting has no resume to measure
    assert catch_up_excess(_sample([0.0, 0.1, 0.2, 0.3], [1, 2, 3, 4])) is None


def test_a_join_is_told_by_the_step_its_first_token_ends() -> None:
    running = _sample([0.01 * k for k in range(10)] + [0.09 + 0.025] + [0.125, 0.135], [0] * 13)
    join = _sample([0.115], [0], prompt=64)
    assert join_excesses(running, [join]) == [(64, pytest.approx(15.0))]


def _ttft_rounds(seed: int, noise: float) -> list[TtftRound]:
    """Rounds whose TTFT rises 0.5 ms a prompt token on plain and 2.0 on the drafting server."""
    rng = np.random.default_rng(seed)
    return [
        TtftRound(drafting, p, 30.0 + (0.5 + 1.5 * drafting) * p + rng.normal(0, noise))
        for drafting in (False, True)
        for p in (32, 64, 128, 256)
        for _ in range(3)
    ]


def test_prompt_costs_are_slopes_of_the_time_to_first_token() -> None:
    exact = fit_arrival_costs(_ttft_rounds(0, 0.0))
    assert exact.prefill.value == pytest.approx(0.5)
    assert exact.draft_prefill.value == pytest.approx(1.5)
    # with noise, the 90 % intervals hold the truth about 9 times in 10
    fits = [fit_arrival_costs(_ttft_rounds(seed, 8.0)) for seed in range(40)]
    held = [f.prefill.lower <= 0.5 <= f.prefill.upper for f in fits]
    held += [f.draft_prefill.lower <= 1.5 <= f.draft_prefill.upper for f in fits]
    assert 0.75 <= np.mean(held) <= 1.0
    # nothing probed: catch-up and join are assumed, and say so
    assert not exact.catch_up.measured and "assumed" in exact.catch_up.how
    # one prompt size cannot give a slope: assumed too
    flat = fit_arrival_costs([TtftRound(False, 32, 40.0), TtftRound(True, 32, 45.0)])
    assert not flat.measured and "assumed 0" in flat.prefill.how


def _acceptance_data(per_level: dict[int, float], seed: int = 0) -> FitData:
    """Always-draft levels whose rounds accepted `per_level[c]` tokens a draft, with noise."""
    rng = np.random.default_rng(seed)
    levels = []
    for c, accepted in per_level.items():
        repeats = []
        for _ in range(3):
            drafts = 300.0 * c
            total = accepted * drafts * rng.normal(1.0, 0.01)
            per_position = (0.5 * total, 0.3 * total, 0.2 * total)
            repeats.append(Repeat(10.0 * c, 1 + accepted, None, drafts, per_position))
        levels.append(LevelObs(Policy.always(3), c, tuple(repeats)))
    return FitData(8, 3, tuple(levels))


def test_acceptance_falling_with_the_drafting_slots_is_a_trend() -> None:
    trend = acceptance_trend(_acceptance_data({1: 2.6, 2: 2.5, 4: 2.3, 8: 1.9}))
    assert trend is not None and trend.moving
    assert trend.lower <= -0.1 <= trend.upper
    assert "moves" in trend.text()
    # the model uses it: fewer tokens a step at 8 drafting slots than at 1
    assert trend.factor(8.0) < 1.0 < trend.factor(1.0)


def test_flat_acceptance_stays_flat_and_says_so() -> None:
    trend = acceptance_trend(_acceptance_data({1: 2.5, 2: 2.5, 4: 2.5, 8: 2.5}, seed=1))
    assert trend is not None and not trend.moving
    assert "flat" in trend.text() and "includes 0" in trend.text()
    assert float(trend.factor(8.0)) == pytest.approx(1.0)


def test_probe_records_round_trip() -> None:
    record = ProbeRecord("catch-up", True, 24.0, 29.5)
    assert ProbeRecord(**record.__dict__) == record


def test_the_profile_finds_acceptance_falling_with_the_drafting_slots(tmp_path: Path) -> None:
    """A batched draft model whose drafts get worse as more slots draft together (the twin's
    acceptance.by_drafting): the fit's trend says acceptance moves, downwards, and the model's
    spec at 8 streams keeps to the measured level rather than the pooled mean."""
    world = cpu_draft_world(
        name="falling",
        acceptance={"synth_len": 3.64, "by_drafting": [[1, 1.0], [8, 0.75]]},
    )
    store = Store(f"sqlite:///{tmp_path / 'falling.db'}")
    profile_adaptively(
        store,
        twin_spec(world, seed=5),
        tmp_path,
        host_name=HOST,
        backend=TwinBackend(world, switch="live", seed=5),
        switch="live",
        budget_s=0,
    )
    fit = current_fit(store, world.model_name, HOST, seed=5)
    trend = fit.model.trend
    assert trend is not None and trend.moving and trend.upper < 0, trend
    assert trend.per_level[8] < trend.per_level[1]
    assert "moves" in fit.quality.acceptance["trend"]
    store.dispose()
