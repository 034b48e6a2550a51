"""The Optuna study: it reaches the enumerated optimum, resumes, lives in the tuner's database."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest
from benchdata import store_profile
from sqlalchemy import inspect

from tuner.decide import search
from tuner.decide.advice import current_fit
from tuner.model.acceptance import Acceptance
from tuner.model.costmodel import CostModel
from tuner.model.curves import Curve
from tuner.policy import Policy
from tuner.storage.store import Store


def crossing_model(
    n_parallel: int = 8, n_max: int = 4, draft: float = 30.0, replicates: int = 0
) -> CostModel:
    """plain steps 10 + 0.9c ms; the profiled spec step 14 + draft*c; acceptance 0.8^i.

    With replicates: bootstrap-like replicates whose slopes spread a few % around those.
    """
    rates = tuple(0.8**i for i in range(1, n_max + 1))
    spread = np.linspace(-0.05, 0.05, replicates)
    return CostModel(
        n_parallel,
        n_max,
        Curve("linear", (10.0, 0.9)),
        Curve("linear", (14.0, draft)),
        Acceptance(n_max, 1.0 + sum(rates), rates, "measured"),
        replicates=[
            {"plain": [10.0, 0.9 * (1 + d)], "spec": [14.0, draft * (1 - d)]} for d in spread
        ],
    )


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'search.db'}")


def test_weights_default_uniform_and_normalised() -> None:
    assert search.objective_weights(4) == pytest.approx([0.25] * 4)
    w = search.objective_weights(4, {"1": 3.0, "4": 1.0, "9": 5.0})
    assert w == pytest.approx([0.75, 0.0, 0.0, 0.25])
    with pytest.raises(ValueError):
        search.objective_weights(4, {"9": 1.0})


@pytest.mark.parametrize("tune", [False, True])
def test_brute_force_study_finds_the_enumerated_optimum(store: Store, tune: bool) -> None:
    model = crossing_model()
    weights = search.objective_weights(model.n_parallel)
    n_values = model.n_values() if tune else [model.n_max]
    expected = search.best_candidate(
        search.enumerate_space(model, weights, n_values), model.n_parallel, model.n_max
    )
    result = search.run_study(store.url, f"t-{tune}", model, weights, tune_n_max=tune, seed=3)
    assert result.sampler == "BruteForceSampler"
    assert result.trials == search.space_size(model.n_parallel, n_values)
    assert result.best.policy == expected.policy
    assert result.best.policy.n_max in n_values  # explicit, also when n_max is not tuned
    assert result.best.value == pytest.approx(expected.value)
    # the enumerated space and the study's trials are the same evaluations
    assert result.candidates == search.enumerate_space(model, weights, n_values)


def test_study_lives_in_the_same_database_and_resumes(store: Store) -> None:
    model = crossing_model()
    weights = search.objective_weights(model.n_parallel)
    first = search.run_study(store.url, "resume-me", model, weights, tune_n_max=True)
    assert first.new_trials == first.trials
    tables = set(inspect(store.engine).get_table_names())
    assert {"studies", "trials"} <= tables and "tuner_fits" in tables
    again = search.run_study(store.url, "resume-me", model, weights, tune_n_max=True)
    assert again.new_trials == 0
    assert again.best == first.best
    loaded = optuna.load_study(study_name="resume-me", storage=store.url)
    assert len(loaded.trials) == first.trials


def test_a_study_searched_by_two_processes_at_once_stores_each_point_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second process read the study before the first wrote its points: it writes none of
    them again."""
    model = crossing_model()
    weights = search.objective_weights(model.n_parallel)
    complete = search._complete
    first: list[search.SearchResult] = []

    def other_process_writes_first(trials: list[optuna.trial.FrozenTrial]) -> list:
        # Called first on what this process read (an empty study); the other search runs then.
        if not first:
            monkeypatch.setattr(search, "_complete", complete)
            first.append(search.run_study(store.url, "twice", model, weights))
        return complete(trials)

    monkeypatch.setattr(search, "_complete", other_process_writes_first)
    second = search.run_study(store.url, "twice", model, weights)
    assert first and first[0].new_trials == second.new_trials == model.n_parallel + 1
    assert second.best == first[0].best
    loaded = optuna.load_study(study_name="twice", storage=store.url)
    points = [t.params[search.MAX_SLOTS_PARAM] for t in loaded.trials]
    assert sorted(points) == list(range(model.n_parallel + 1))


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_interrupted_study_finishes_the_rest(store: Store) -> None:
    model = crossing_model()
    weights = search.objective_weights(model.n_parallel)
    partial = optuna.create_study(
        study_name="half",
        storage=store.url,
        sampler=optuna.samplers.BruteForceSampler(seed=0),
        direction="maximize",
    )

    def objective(trial: optuna.Trial) -> float:
        n = trial.suggest_int(search.MAX_SLOTS_PARAM, 0, model.n_parallel)
        found = search.evaluate(model, Policy.of_max_slots(n, model.n_max), weights)
        for key, value in found.attrs().items():
            trial.set_user_attr(key, value)
        return found.value

    partial.optimize(objective, n_trials=4)
    result = search.run_study(store.url, "half", model, weights)
    assert result.new_trials == model.n_parallel + 1 - 4
    assert result.trials == model.n_parallel + 1
    assert sorted(result.row(model.n_max)) == list(range(model.n_parallel + 1))


@pytest.mark.slow
def test_same_data_same_answer(tmp_path: Path) -> None:
    answers = []
    for i in range(2):
        store = Store(f"sqlite:///{tmp_path / f'{i}.db'}")
        store_profile(store)
        # A small bootstrap: the study's cost grows with it, the determinism asked for does not.
        stored = current_fit(
            store, "smollm2-bench", "bench-host", host_explicit=True, replicates=20
        )
        weights = search.objective_weights(stored.model.n_parallel)
        result = search.run_study(
            store.url, "s", stored.model, weights, tune_n_max=True, seed=i
        )  # the seed orders the enumeration; it does not change the answer
        answers.append((stored.model.to_dict(), result.best))
    assert answers[0] == answers[1]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tpe_budget_reaches_the_enumerated_optimum_on_a_larger_space(seed: int) -> None:
    """Above BRUTE_FORCE_LIMIT the study samples with TPE: its budget must still find the top."""
    model = crossing_model(n_parallel=64, n_max=16)
    weights = search.objective_weights(model.n_parallel)
    assert search.space_size(64, model.n_values()) > search.BRUTE_FORCE_LIMIT
    expected = search.best_candidate(
        search.enumerate_space(model, weights, model.n_values()), 64, 16
    )
    result = search.run_study(None, f"tpe-{seed}", model, weights, tune_n_max=True, seed=seed)
    assert result.sampler == "TPESampler"
    # the TPE budget, then the N it left out at the best n_max
    assert search.TPE_TRIALS <= result.trials == result.new_trials
    assert result.trials < search.TPE_TRIALS + model.n_parallel + 1
    assert result.best.value == pytest.approx(expected.value, rel=1e-12)
    assert result.best.policy == expected.policy


def test_single_stream_floor_constrains_n_max() -> None:
    model = crossing_model(n_max=6, draft=12.0)
    weights = search.objective_weights(model.n_parallel)
    free = search.run_study(None, "free", model, weights, tune_n_max=True)
    singles = {
        n: search.evaluate(model, Policy.threshold(1, n), weights).single_stream
        for n in model.n_values()
    }
    assert singles[free.best.policy.n_max] == free.best.single_stream
    floor = singles[free.best.policy.n_max] + 1e-6  # the unconstrained choice falls just short
    assert any(v >= floor for v in singles.values())
    bound = search.run_study(
        None, "bound", model, weights, tune_n_max=True, min_single_stream=floor
    )
    assert bound.best.feasible and bound.best.single_stream >= floor
    assert bound.best.policy.n_max != free.best.policy.n_max
    assert bound.best.value < free.best.value  # the floor costs throughput
    # every candidate's feasibility is the floor applied to its own single-stream tok/s
    assert {c.feasible for c in bound.candidates} == {True, False}
    assert all(c.feasible == (c.single_stream >= floor) for c in bound.candidates)
    with pytest.raises(ValueError, match="floor"):
        search.run_study(
            None,
            "none",
            model,
            weights,
            tune_n_max=True,
            min_single_stream=max(singles.values()) + 1,
        )


def test_objective_is_the_weighted_sum_of_the_policy_row() -> None:
    model = crossing_model()
    weights = search.objective_weights(8, {"1": 1.0, "8": 1.0})
    spec, plain = model.spec_tps([1, 8]), model.plain_tps([1, 8])
    for N in range(0, 9):
        at_8 = spec[1] if N in (0, 8) else plain[1]  # drafting at 8 streams: N=0 and N=8 only
        expected = 0.5 * spec[0] + 0.5 * at_8
        objective = search.policy_objective(model, Policy.of_max_slots(N), weights)
        assert objective == pytest.approx(expected)
    plain_objective = search.policy_objective(model, Policy.plain(), weights)
    assert plain_objective == pytest.approx(0.5 * plain[0] + 0.5 * plain[1])
    assert search.policy_objective(model, Policy.always(), weights) == search.policy_objective(
        model, Policy.threshold(8), weights
    )


def test_evaluate_spreads_the_objective_over_the_replicates() -> None:
    model = crossing_model(replicates=5)
    weights = search.objective_weights(model.n_parallel)
    policy = Policy.threshold(2, 3)
    found = search.evaluate(model, policy, weights)
    assert found.policy == policy

    c = np.arange(1, 9, dtype=float)

    def objective(plain_slope: float, spec_slope: float) -> float:
        """Uniform objective of N=2 at n_max 3 from the step curves: without kernel rows the
        step at n = 3 of a profiled 4 is plain + 3/4 of the way to the profiled spec step."""
        plain_step = 10.0 + plain_slope * c
        step_3 = plain_step + 0.75 * (14.0 + spec_slope * c - plain_step)
        tps = np.where(
            c <= 2, 1000 * c * model.acceptance.length(3) / step_3, 1000 * c / plain_step
        )
        return float(tps.mean())

    assert found.value == pytest.approx(objective(0.9, 30.0))
    spread = np.linspace(-0.05, 0.05, 5)
    assert found.samples == pytest.approx(
        [objective(0.9 * (1 + d), 30.0 * (1 - d)) for d in spread]
    )
    assert len(set(found.samples)) == 5  # one per replicate, each its own
    assert min(found.samples) < found.value < max(found.samples)
    single = 1000 * model.acceptance.length(3) / (10.9 + 0.75 * (44.0 - 10.9))
    assert found.single_stream == pytest.approx(single)  # N=2 drafts at 1 stream
    assert search.evaluate(model, policy, weights, floor=found.single_stream).feasible
    assert not search.evaluate(model, policy, weights, floor=found.single_stream + 1e-6).feasible
    # without replicates the spread is the point estimate alone
    bare = search.evaluate(crossing_model(), policy, weights)
    assert bare.samples == (bare.value,)


@pytest.mark.parametrize(
    "preferred, other",
    [
        (Policy.always(4), Policy.threshold(8, 4)),  # the server default over its twin
        (Policy.threshold(2, 4), Policy.threshold(3, 4)),  # smaller N
        (Policy.threshold(2, 4), Policy.threshold(2, 3)),  # the profiled n_max
        (Policy.threshold(2, 3), Policy.threshold(2, 2)),  # then the larger n_max
    ],
)
def test_ties_go_to_the_preferred_policy(preferred: Policy, other: Policy) -> None:
    tie = [
        search.Evaluation(other, 100.0, (100.0,), 10.0, True),
        search.Evaluation(preferred, 100.0, (100.0,), 10.0, True),
    ]
    assert search.best_candidate(tie, 8, 4).policy == preferred
    assert search.best_candidate(tie[::-1], 8, 4).policy == preferred
    # a strictly higher objective beats any preference
    ahead = search.Evaluation(other, 100.001, (100.0,), 10.0, True)
    assert search.best_candidate([tie[1], ahead], 8, 4).policy == other


@pytest.mark.slow
def test_choice_reads_only_the_studys_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a TPE search the whole row of N at the best n_max is in the study, and the result's
    evaluations are its trials: what `evaluate` gives, read back from the trials' attributes."""
    model = crossing_model(n_parallel=64, n_max=16, replicates=3)
    weights = search.objective_weights(model.n_parallel)
    assert search.space_size(64, model.n_values()) > search.BRUTE_FORCE_LIMIT
    studies: list[optuna.Study] = []
    create_study = optuna.create_study

    def keep(*args: object, **kwargs: object) -> optuna.Study:
        studies.append(create_study(*args, **kwargs))
        return studies[-1]

    monkeypatch.setattr(optuna, "create_study", keep)
    result = search.run_study(None, "row", model, weights, tune_n_max=True, seed=0)
    assert result.sampler == "TPESampler"
    (study,) = studies
    trials = study.get_trials(states=[optuna.trial.TrialState.COMPLETE])
    assert len(trials) == result.trials

    n_best = result.best.policy.n_max
    assert n_best is not None
    row = result.row(n_best)
    assert sorted(row) == list(range(model.n_parallel + 1))
    # TPE left some N out there; exactly those were enqueued after it, into the same study
    sampled = {
        t.params[search.MAX_SLOTS_PARAM]
        for t in trials[: search.TPE_TRIALS]
        if t.params[search.N_MAX_PARAM] == n_best
    }
    enqueued = [
        (t.params[search.MAX_SLOTS_PARAM], t.params[search.N_MAX_PARAM])
        for t in trials[search.TPE_TRIALS :]
    ]
    assert sampled != set(row)
    assert sorted(enqueued) == [(N, n_best) for N in sorted(set(row) - sampled)]

    # one evaluation per point the study tried, each equal to the evaluator's own
    tried = {(t.params[search.MAX_SLOTS_PARAM], t.params[search.N_MAX_PARAM]) for t in trials}
    assert {(c.policy.max_slots, c.policy.n_max) for c in result.candidates} == tried
    assert len(result.candidates) < search.space_size(64, model.n_values())
    for c in result.candidates:
        assert c == search.evaluate(model, c.policy, weights)
        assert len(c.samples) == 3
    # and the best is the best of them, row included
    assert result.best == search.best_candidate(result.candidates, 64, 16)


@pytest.mark.slow
def test_a_resumed_study_answers_from_its_trials(store: Store) -> None:
    """A rerun reads the stored trials back, it does not evaluate the model again."""
    model = crossing_model(replicates=4)
    weights = search.objective_weights(model.n_parallel)
    first = search.run_study(store.url, "stored", model, weights, tune_n_max=True)
    assert first.candidates == search.enumerate_space(model, weights, model.n_values())
    other = crossing_model(draft=3.0, replicates=4)  # a model whose answer differs
    assert search.enumerate_space(other, weights, model.n_values()) != first.candidates
    again = search.run_study(store.url, "stored", other, weights, tune_n_max=True)
    assert again.new_trials == 0
    assert again.candidates == first.candidates
    assert again.best == first.best


@pytest.mark.slow
def test_the_best_includes_the_row_filled_after_a_small_tpe_budget(store: Store) -> None:
    """With a budget small enough that TPE misses the top N at its best n_max, the row it enqueues
    holds that N: the best (and a resumed run's best) must be it."""
    model = crossing_model(n_parallel=64, n_max=16)
    weights = search.objective_weights(model.n_parallel)
    expected = search.best_candidate(
        search.enumerate_space(model, weights, model.n_values()), 64, 16
    )
    first = search.run_study(store.url, "small", model, weights, tune_n_max=True, tpe_trials=40)
    assert first.sampler == "TPESampler"
    assert first.row(expected.policy.n_max)[expected.policy.max_slots] == expected
    again = search.run_study(store.url, "small", model, weights, tune_n_max=True, tpe_trials=40)
    assert again.new_trials == 0
    assert first.best == search.best_candidate(first.candidates, 64, 16)
    assert again.best == first.best
