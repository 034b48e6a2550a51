"""The open-loop answer: a twin made from the fit serves the traffic under every policy; on a world
whose draft model is on the CPU (1.2 ms a prompt token, catch-up on resuming) it answers
drafting at low rates and plain at high ones, where the open-loop truth does."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from lab.method import HOST, twin_spec
from lab.openworlds import load_manifest
from twinworlds import CPU_DRAFT_TRAFFIC, cpu_draft_world

from tuner.decide import advice
from tuner.decide.adaptive import profile_adaptively
from tuner.decide.choice import least_bad_within
from tuner.decide.observed import drafting_mix
from tuner.decide.openanswer import OpenAnswer, _plain_reason, open_answer
from tuner.errors import ConfigError
from tuner.policy import Policy
from tuner.recommendation import ObjectiveKind, ReasonCode
from tuner.storage import traffic_profiles
from tuner.storage.fits import StoredFit, current_fit
from tuner.storage.store import Store
from tuner.traffic import SOURCE_SLOTS, Finished, ServerView, TrafficProfile
from tuner.twin.engine import Workload, simulate
from tuner.twin.fitted import world_from_model
from tuner.twin.inprocess import TwinBackend
from tuner.twin.serving import capacity, offered_drawn, offered_poisson, scaled, score_policies
from tuner.twin.truth import closed_truth, open_loop_truth
from tuner.twin.world import load_world

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


def _recommendations(store: Store) -> int:
    from sqlalchemy import func, select

    from tuner.storage.orm import RecommendationRow

    with store.session() as s:
        return int(s.scalar(select(func.count()).select_from(RecommendationRow)) or 0)


@pytest.mark.parametrize("finished", [0, 1, -2])
def test_bad_arrivals_are_one_line_and_store_nothing(profiled, finished: int) -> None:
    """--rate 0 on a fit with measured arrival costs, and traffic that saw too few requests
    finish (-2: two that arrived at the same instant, as streams a closed-loop client starts
    together do: no rate): a ConfigError (the CLI's one line), no recommendation stored."""
    store, _ = profiled
    before = _recommendations(store)
    asked = {"objective": ObjectiveKind.TPOT, "host_explicit": True, "replicates": 2}
    with pytest.raises(ConfigError, match="an arrival rate must be above 0"):
        advice.recommend(store, "twin-cpu-draft", HOST, rate=0.0, **asked)
    profile = TrafficProfile(8, source=SOURCE_SLOTS)
    profile.add(1, 30.0)
    for i in range(abs(finished)):
        profile.add_finished(Finished(1.0 + (i if finished > 0 else 0), PROMPT, OUTPUT))
    view = ServerView("http://twin/cpu-draft", "twin-cpu-draft", 8, "slots")
    traffic_profiles.save(store, f"few-{finished}", view, profile.to_dict(), "complete")
    with pytest.raises(ConfigError, match=r"too few|no request|all arrived at once"):
        advice.recommend(store, "twin-cpu-draft", HOST, traffic=f"few-{finished}", **asked)
    assert _recommendations(store) == before


def test_offered_traffic_is_drawn_from_the_observed_distribution() -> None:
    """Not a replay: as many requests as asked, at the observed rate, lengths from the observed
    requests, bursts kept in blocks of gaps; the same seed draws the same traffic."""
    bursty = [0.0]
    rng = np.random.default_rng(5)
    for i in range(399):  # bursts of ten quick arrivals, then a lull
        bursty.append(bursty[-1] + (0.2 if i % 10 else 30.0) * rng.exponential())
    profile = TrafficProfile(8, source=SOURCE_SLOTS)
    for i, t in enumerate(bursty):
        profile.add_finished(Finished(float(t), 100 + i % 7, 50 + 3 * (i % 5)))
    drawn = offered_drawn(profile, "bursty", seed=2, count=3000)
    work = drawn.workload
    assert len(work.requests) == 3000 and drawn == offered_drawn(profile, "bursty", 2, 3000)
    observed_rate = 399 / (bursty[-1] - bursty[0])
    assert drawn.rate == pytest.approx(observed_rate)
    assert (len(work.arrivals) - 1) / work.arrivals[-1] == pytest.approx(observed_rate, rel=0.15)
    pairs = {(r.prompt, r.output) for r in profile.requests}
    assert {(r.prompt_tokens, r.max_tokens) for r in work.requests} <= pairs
    gaps = np.diff(work.arrivals)
    assert np.std(gaps) / np.mean(gaps) > 2.0  # still bursty: lulls between quick runs
    with pytest.raises(ValueError, match="too few"):
        offered_drawn(TrafficProfile(8), "empty")


def test_ties_go_to_the_least_bad_worst_case_not_simply_the_smallest() -> None:
    one, two, three = (Policy.threshold(n, 3) for n in (1, 2, 3))
    values = {three: 100.0, two: 99.8, one: 99.7}
    # within the spread of the best all three; N=1 falls far behind in one replicate world,
    # N=3 a little, N=2 never more than about half a percent
    samples = {three: [100.0, 101.0, 97.5], two: [99.9, 100.6, 99.1], one: [99.9, 101.2, 90.0]}
    order = [three, two, one]
    chosen, within, worst = least_bad_within(values, samples, order, lambda p: p.max_slots or 0)
    assert set(within) == {one, two, three}
    assert chosen == two and worst[one] > worst[two]


def _plain_question(plain_samples: list[float]) -> OpenAnswer:
    """An answer whose point world puts plain 5 % ahead of N=1 (objective 100), with the
    replicates given."""
    plain, one = Policy.plain(), Policy.threshold(1, 4)
    values = {plain: 105.0, one: 100.0}
    samples = {plain: plain_samples, one: [100.0, 100.0, 100.0, 100.0]}
    diff = np.asarray(plain_samples) - 100.0
    advantage = (5.0, float(np.percentile(diff, 5)), float(np.percentile(diff, 95)))
    return OpenAnswer(ObjectiveKind.TPOT, values, samples, one, advantage, 0)


def test_plain_predicted_ahead_but_not_shown_is_answered_by_its_worst_case() -> None:
    # one replicate puts plain 2 % behind N=1 (not shown ahead), the others 10-25 % ahead: N=1's
    # worst case (20 % short) is far worse than plain's (2 %): serve without the draft model
    answer = _plain_question([98.0, 110.0, 120.0, 125.0])
    assert not answer.plain_shown and answer.plain_ahead
    assert answer.plain_worst[Policy.plain()] == pytest.approx(0.02)
    # a replicate that puts plain 30 % behind makes plain the worse bet: N=1 stands
    answer = _plain_question([70.0, 106.0, 104.0, 107.0])
    assert not answer.plain_shown and not answer.plain_ahead
    # shown ahead: no weighing needed
    answer = _plain_question([103.0, 106.0, 104.0, 107.0])
    assert answer.plain_shown and answer.plain_ahead and not answer.plain_worst
    # ahead by more than the replicates spread the difference (5 against an SD of 3.2), yet
    # not shown (one replicate 1 % behind): N=1 is not even within plain's spread, so plain is
    # the least bad alone, and the reason says why
    answer = _plain_question([99.0, 104.0, 105.0, 106.0])
    assert not answer.plain_shown and Policy.threshold(1, 4) not in answer.plain_worst
    assert answer.plain_least_bad and answer.plain_ahead
    reason = _plain_reason(answer)
    assert reason.code == ReasonCode.PLAIN_UNRESOLVED
    assert "by more than the replicate worlds spread their difference" in reason.text


def test_observed_acceptance_is_moved_from_the_slots_it_was_seen_at() -> None:
    profile = TrafficProfile(8, source=SOURCE_SLOTS)
    for c, s in {0: 10.0, 1: 5.0, 2: 5.0, 3: 10.0}.items():
        profile.add(c, s)
    assert drafting_mix(profile, 8) is None  # the threshold it ran is not known
    profile.max_slots = 2
    assert drafting_mix(profile, 8) == pytest.approx({1: 1 / 3, 2: 2 / 3})
    profile.max_slots = 0
    assert drafting_mix(profile, 8) == pytest.approx({1: 5 / 45, 2: 10 / 45, 3: 30 / 45})


def test_a_policy_the_arrivals_outrun_is_scored_overloaded() -> None:
    folder = Path(__file__).resolve().parent.parent / "profiles" / "twin" / "openloop"
    entry = next(e for e in load_manifest(folder) if e.name == "openloop-24")
    world = load_world(folder / entry.file)
    full = entry.truth_workload()
    work = Workload(full.requests[:400], full.arrivals[:400])
    scores, _ = score_policies(world, work, [Policy.plain(), Policy.always(world.n_max)])
    assert scores[Policy.always(world.n_max)].overloaded
    assert not scores[Policy.plain()].overloaded
