"""The open-loop answer: a twin made from the fit serves the traffic under every policy; on a world
whose draft model is on the CPU (1.2 ms a prompt token, catch-up on resuming) it answers
drafting at low rates and plain at high ones, where the open-loop truth does."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from lab.method import HOST, twin_spec
from twinworlds import CPU_DRAFT_TRAFFIC, cpu_draft_world

from tuner.decide import advice
from tuner.decide.adaptive import profile_adaptively
from tuner.decide.openanswer import open_answer
from tuner.policy import Policy
from tuner.recommendation import ObjectiveKind, ReasonCode
from tuner.storage.fits import StoredFit, current_fit
from tuner.storage.store import Store
from tuner.twin.engine import simulate
from tuner.twin.fitted import world_from_model
from tuner.twin.inprocess import TwinBackend
from tuner.twin.serving import capacity, offered_poisson, scaled
from tuner.twin.truth import closed_truth, open_loop_truth

PROMPT, OUTPUT = CPU_DRAFT_TRAFFIC["prompt_tokens"], CPU_DRAFT_TRAFFIC["output_tokens"]


@functools.cache
def _profiled(folder: str) -> tuple[Store, StoredFit]:
    world = cpu_draft_world()
    store = Store(f"sqlite:///{Path(folder) / 'cpu-draft.db'}")
    backend = TwinBackend(world, switch="live", seed=4)
    profile_adaptively(
        store,
        twin_spec(world, seed=4),
        Path(folder),
        host_name=HOST,
        backend=backend,
        switch="live",
        budget_s=0,
    )
    return store, current_fit(store, world.model_name, HOST, seed=4)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, StoredFit]:
    return _profiled(str(tmp_path_factory.mktemp("open")))


def test_the_fitted_world_serves_closed_levels_as_the_model_predicts(profiled) -> None:
    _, fit = profiled
    model = fit.model
    assert model.arrivals is not None
    world = world_from_model(model, model.arrivals.point())
    truth = closed_truth(world, rel_se=0.004)
    plain = np.asarray(model.predict(Policy.plain()).tokens_per_second)
    for policy in (Policy.plain(), Policy.always(3), Policy.threshold(2, 3)):
        predicted = np.asarray(model.predict(policy).tokens_per_second)
        # a server with a draft model loaded is never faster than plain where it does not
        # draft (a world cannot make it so): the off regime is the slower of the two
        drafts = policy.drafts_at(np.arange(1, 9))
        expected = np.where(drafts | policy.is_plain, predicted, np.minimum(predicted, plain))
        served = np.asarray(truth.row(policy))
        assert np.max(np.abs(served / expected - 1.0)) < 0.015, policy
    assert world.prefill.draft_ms_per_token == pytest.approx(model.arrivals.draft_prefill.value)


@pytest.mark.parametrize(("rate", "drafts"), [(0.05, True), (0.45, False)])
def test_the_open_loop_answer_drafts_at_low_rates_and_not_at_high_ones(
    profiled, rate: float, drafts: bool
) -> None:
    _, fit = profiled
    served = offered_poisson(rate, [(PROMPT, OUTPUT)], "given", seed=1)
    answer = open_answer(fit.model, served, seed=1, replicates=2)
    truth = open_loop_truth(
        cpu_draft_world(), rate, duration_s=2400, output_tokens=OUTPUT, prompt_tokens=PROMPT
    )
    best = min(truth, key=lambda p: truth[p].tpot_mean_ms)
    assert best.drafting == drafts  # the world is what this test says it is
    chosen = answer.policy if not answer.plain_ahead else Policy.plain()
    assert chosen.drafting == drafts
    regret = truth[chosen].tpot_mean_ms / truth[best].tpot_mean_ms - 1.0
    assert regret < 0.01
    # the closed levels alone (the birth-death queue) draft where plain wins by far
    if not drafts:
        assert truth[Policy.always(3)].tpot_mean_ms > 1.2 * truth[best].tpot_mean_ms


def test_recommend_answers_a_rate_in_the_open_loop_and_says_where_figures_came_from(
    profiled,
) -> None:
    store, _ = profiled
    asked = {
        "objective": ObjectiveKind.TPOT,
        "rate": 0.45,
        "output_tokens": OUTPUT,
        "prompt_tokens": PROMPT,
        "host_explicit": True,
    }
    rec = advice.recommend(store, "twin-cpu-draft", HOST, replicates=2, **asked)
    codes = [r.code for r in rec.reasons]
    assert ReasonCode.OPEN_LOOP in codes
    sources = next(r.text for r in rec.reasons if r.code is ReasonCode.OPEN_LOOP)
    assert "draft model prompt processing" in sources and "catch-up" in sources
    assert "Poisson arrivals at 0.45" in sources and "--prompt-tokens" in sources
    # plain wins here by far, and the answer says so first
    assert not rec.drafting_pays and rec.reasons[0].code is ReasonCode.PLAIN_AHEAD
    assert rec.plain_advantage is not None and rec.plain_advantage[1] > 0
    closed = advice.recommend(store, "twin-cpu-draft", HOST, closed_loop=True, **asked)
    assert ReasonCode.CLOSED_LOOP in [r.code for r in closed.reasons]
    assert ReasonCode.OPEN_LOOP not in [r.code for r in closed.reasons]


def test_capacity_is_the_fastest_pace_within_the_limit() -> None:
    world = cpu_draft_world()
    served = offered_poisson(0.2, [(PROMPT, OUTPUT)], "given", seed=3).head(300)

    def p95(policy: Policy, factor: float) -> float:
        result = simulate(world, policy, scaled(served, factor), noise=False)
        per = [1000 * r.generation_time / (r.tokens - 1) for r in result.requests if r.tokens > 1]
        return float(np.percentile(per, 95))

    for policy in (Policy.plain(), Policy.always(3)):
        factor, runs = capacity(world, served, policy, 60.0)
        assert runs > 6 and factor > 0
        assert p95(policy, factor) <= 60.0 < p95(policy, factor * 1.1)
    # a limit no single stream meets: no pace does
    assert capacity(world, served, Policy.plain(), 5.0)[0] == 0.0
