"""The Optuna study: it reaches the enumerated optimum, resumes, lives in the tuner's database."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest
from benchdata import store_profile
from sqlalchemy import inspect

from tuner.decide import search
from tuner.decide.recommend import current_fit
from tuner.model.costmodel import Acceptance, CostModel, Curve
from tuner.storage.engine import Store


def crossing_model(n_parallel: int = 8, n_max: int = 4, draft: float = 30.0) -> CostModel:
    """plain steps 10 + 0.9c ms; the profiled spec step 14 + draft*c; acceptance 0.8^i."""
    rates = tuple(0.8**i for i in range(1, n_max + 1))
    return CostModel(
        n_parallel,
        n_max,
        Curve("linear", (10.0, 0.9)),
        Curve("linear", (14.0, draft)),
        Acceptance(n_max, 1.0 + sum(rates), rates, "measured"),
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
    assert (result.best.max_slots, result.best.n_max) == (expected.max_slots, expected.n_max)
    assert result.best.value == pytest.approx(expected.value)


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
        trial.set_user_attr("single_stream_tps", search.single_stream(model, n, None))
        return search.policy_objective(model, n, None, weights)

    partial.optimize(objective, n_trials=4)
    result = search.run_study(store.url, "half", model, weights)
    assert result.new_trials == model.n_parallel + 1 - 4
    assert result.trials == model.n_parallel + 1


def test_same_data_same_answer(tmp_path: Path) -> None:
    answers = []
    for i in range(2):
        store = Store(f"sqlite:///{tmp_path / f'{i}.db'}")
        store_profile(store)
        stored = current_fit(store, "smollm2-bench", "bench-host", host_explicit=True)
        weights = search.objective_weights(stored.model.n_parallel)
        result = search.run_study(
            store.url, "s", stored.model, weights, tune_n_max=True, seed=i
        )  # the seed orders the enumeration; it does not change the answer
        answers.append((stored.model.to_dict(), result.best))
    assert answers[0] == answers[1]


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
    assert result.trials == search.TPE_TRIALS
    assert result.best.value == pytest.approx(expected.value, rel=1e-12)
    assert (result.best.max_slots, result.best.n_max) == (expected.max_slots, expected.n_max)


def test_single_stream_floor_constrains_n_max() -> None:
    model = crossing_model(n_max=6, draft=12.0)
    weights = search.objective_weights(model.n_parallel)
    free = search.run_study(None, "free", model, weights, tune_n_max=True)
    singles = {n: search.single_stream(model, 1, n) for n in model.n_values()}
    floor = singles[free.best.n_max] + 1e-6  # the unconstrained choice falls just short
    assert any(v >= floor for v in singles.values())
    bound = search.run_study(
        None, "bound", model, weights, tune_n_max=True, min_single_stream=floor
    )
    assert bound.best.feasible and bound.best.single_stream >= floor
    assert bound.best.n_max != free.best.n_max
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
    for n in range(0, 9):
        row = model.policy_tps(model.levels, n)
        assert search.policy_objective(model, n, None, weights) == pytest.approx(
            0.5 * row[0] + 0.5 * row[7]
        )
    assert np.isclose(
        search.policy_objective(model, 0, None, weights),
        search.policy_objective(model, 8, None, weights),
    )
