"""The search: an Optuna study over spec_draft_max_slots (and n_max) on a fitted cost model.

The study lives in the tuner's own database (Optuna's tables beside the `tuner_` ones), one per
model, host, build, fit and search options, so a rerun resumes it and the same data gives the same
answer. Parameters: `spec_draft_max_slots` in 0..n_parallel (0 = always draft) and, when asked,
`spec_draft_n_max` in 1..the profiled n_max. Objective: workload-weighted aggregate tok/s over
concurrency 1..n_parallel (weights from the profile, default uniform) or another of
tuner.decide.objective's (mean time per output token, capacity under a latency limit), with an
optional floor on single-stream tok/s (a constraint: trials below it are infeasible, not optimal).

The space is small ((n_parallel + 1) x n_max points), so it is enumerated with Optuna's
BruteForceSampler: the study's best feasible trial is the model's true optimum. Spaces above
BRUTE_FORCE_LIMIT use a seeded multivariate TPE sampler with TPE_TRIALS trials, after which the
whole row of N at the best n_max is enqueued, so the choice rule sees every N there;
tests/test_search.py shows that budget reaching the enumerated optimum on a larger space.

`evaluate` is the one evaluator: each trial stores its Evaluation (objective, the objective under
every bootstrap replicate, single-stream tok/s, feasibility) and the study's trials are all the
choice (tuner.decide.choice) reads.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.decide.objective import Objective, as_objective
from tuner.model.costmodel import CostModel
from tuner.policy import Policy
from tuner.storage.store import optuna_storage

if TYPE_CHECKING:
    import optuna

MAX_SLOTS_PARAM = "spec_draft_max_slots"
N_MAX_PARAM = "spec_draft_n_max"
BRUTE_FORCE_LIMIT = 1024
TPE_TRIALS = 400


def objective_weights(
    n_parallel: int, weights: Mapping[int, float] | Mapping[str, float] | None = None
) -> np.ndarray:
    """Weights w_c for c = 1..n_parallel, summing to 1 (uniform when none are given).

    Keys may be ints or int strings (weights stored in JSON); levels above n_parallel are dropped.
    """
    w = np.zeros(n_parallel)
    if not weights:
        w[:] = 1.0
    else:
        for key, value in weights.items():
            c = int(key)
            if 1 <= c <= n_parallel and value > 0:
                w[c - 1] = float(value)
        if w.sum() <= 0:
            raise ValueError(f"no workload weight falls on concurrency 1..{n_parallel}")
    normed: np.ndarray = w / w.sum()
    return normed


def policy_objective(model: CostModel, policy: Policy, weights: np.ndarray) -> float:
    """sum_c w_c * tok/s at c under the policy (the point estimate of the tps objective)."""
    return Objective.throughput(weights).value(model, policy)


def space_size(n_parallel: int, n_values: list[int]) -> int:
    return (n_parallel + 1) * len(n_values)


def preference(policy: Policy, n_parallel: int, profiled_n: int) -> tuple[int, int, bool, int]:
    """Order among equal objectives: N = 0 (the server default) over its twin N = n_parallel,
    then smaller N; the profiled n_max (measured, not extrapolated) first, then larger n."""
    n_max = policy.n_max or profiled_n
    return (policy.effective(n_parallel), 0 if policy.is_always else 1, n_max != profiled_n, -n_max)


@dataclass(frozen=True)
class Evaluation:
    """One candidate policy on the cost model: what a trial of the study records."""

    policy: Policy  # a drafting policy at an explicit n_max
    value: float  # the objective, workload-weighted tok/s
    samples: tuple[float, ...]  # the objective under every bootstrap replicate
    single_stream: float
    feasible: bool  # meets the single-stream floor

    def attrs(self) -> dict[str, Any]:
        return {
            "objective_samples": list(self.samples),
            "single_stream_tps": self.single_stream,
            "feasible": self.feasible,
        }


def evaluate(
    model: CostModel,
    policy: Policy,
    objective: Objective | np.ndarray,
    floor: float | None = None,
) -> Evaluation:
    """The objective of a policy (an Objective, or tps weights), its replicate spread, and
    whether it meets the floor."""
    goal = as_objective(objective)
    value = goal.value(model, policy)
    samples = model.samples(lambda m: np.array(goal.value(m, policy)))
    single = float(model.policy_tps([1], policy)[0])
    return Evaluation(
        policy,
        value,
        tuple(float(v) for v in np.ravel(samples)),
        single,
        floor is None or single >= floor,
    )


def enumerate_space(
    model: CostModel,
    objective: Objective | np.ndarray,
    n_values: list[int],
    floor: float | None = None,
) -> list[Evaluation]:
    """Every (N, n_max) through the same evaluator, without Optuna (a reference for tests)."""
    return [
        evaluate(model, Policy.of_max_slots(max_slots, n), objective, floor)
        for n in n_values
        for max_slots in range(model.n_parallel + 1)
    ]


def best_candidate(candidates: list[Evaluation], n_parallel: int, profiled_n: int) -> Evaluation:
    feasible = [c for c in candidates if c.feasible]
    if not feasible:
        raise ValueError("no candidate meets the single-stream floor")
    top = max(c.value for c in feasible)
    ties = [c for c in feasible if c.value >= top - 1e-9 * max(1.0, abs(top))]
    return min(ties, key=lambda c: preference(c.policy, n_parallel, profiled_n))


@dataclass
class SearchResult:
    """The study's outcome: its name, sampler, trials and best feasible candidate."""

    study_name: str
    sampler: str
    space_size: int
    trials: int
    new_trials: int
    best: Evaluation
    candidates: list[Evaluation] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    objective: Objective | None = None  # None: tps over weights

    def row(self, n_max: int) -> dict[int, Evaluation]:
        """Every evaluated N at one draft length, by N."""
        return {
            c.policy.max_slots: c
            for c in self.candidates
            if c.policy.max_slots is not None and c.policy.n_max == n_max
        }

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {
            "study_name": self.study_name,
            "sampler": self.sampler,
            "space_size": self.space_size,
            "trials": self.trials,
            "new_trials": self.new_trials,
            "best": {
                "max_slots": best.policy.max_slots,
                "n_max": best.policy.n_max,
                "value": best.value,
                "single_stream": best.single_stream,
                "feasible": best.feasible,
            },
            "weights": self.weights,
            "objective": self.objective.options() if self.objective else None,
        }


def study_name(
    model_name: str,
    host: str | None,
    build: str | None,
    fit_id: int | None,
    options: Mapping[str, Any],
) -> str:
    """One study per model, host, build and fit; the search options are hashed into the name."""
    digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:10]
    build_part = (build or "unknown-build")[:16]
    fit_part = f"fit{fit_id}" if fit_id is not None else "unsaved"
    where = f"{model_name}@{host or 'unknown-host'}"
    if len(where) > 400:  # Optuna keeps study names up to 512 characters
        where = hashlib.sha256(where.encode()).hexdigest()[:16]
    return f"tuner:{where}:{build_part}:{fit_part}:{digest}"


def run_study(
    storage_url: str | None,
    name: str,
    model: CostModel,
    objective: Objective | np.ndarray,
    *,
    tune_n_max: bool = False,
    min_single_stream: float | None = None,
    seed: int = 0,
    brute_force_limit: int = BRUTE_FORCE_LIMIT,
    tpe_trials: int = TPE_TRIALS,
    user_attrs: Mapping[str, Any] | None = None,
) -> SearchResult:
    """Create or resume the study and run the trials it still needs; return its best candidate.

    storage_url None keeps the study in memory (tests, benchmarks). objective: an Objective, or
    the weights of the tps objective.
    """
    import optuna

    goal = as_objective(objective)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    n_values = model.n_values() if tune_n_max else [model.n_max]
    size = space_size(model.n_parallel, n_values)
    floor = min_single_stream
    sampler, sampler_name, budget = _sampler(size, brute_force_limit, tpe_trials, seed, floor)
    stored = None
    if storage_url:
        stored = optuna.create_study(
            study_name=name,
            storage=optuna_storage(storage_url),
            sampler=sampler,
            direction="maximize",
            load_if_exists=True,
        )
        if not stored.user_attrs:
            attrs = {**(user_attrs or {}), "sampler": sampler_name, "seed": seed}
            for key, value in attrs.items():
                stored.set_user_attr(key, value)
    # The trials run in memory on what the stored study holds, and only the new ones are
    # written, in one insert each: through RDBStorage every suggest re-reads the whole study and
    # every user attribute is a commit of its own, which made the search most of a first
    # `recommend`'s time. Of two processes that search one study at once, the later writer
    # adds only the points the earlier did not store (_new_points).
    study = optuna.create_study(sampler=sampler, direction="maximize")
    if stored is not None:
        study.add_trials(_complete(stored.trials))
    held = len(study.trials)
    trial_objective = _trial_objective(model, goal, floor, n_values, tune_n_max)

    remaining = max(0, budget - len(_complete(study.trials)))
    if remaining:
        study.optimize(trial_objective, n_trials=remaining)
    candidates = _evaluations(_complete(study.trials), n_values[0])
    best = best_candidate(candidates, model.n_parallel, model.n_max)
    # A sampled search may have skipped some N at the best n_max; the choice weighs the whole
    # row, so those are trials of the same study too.
    missing = [N for N in range(model.n_parallel + 1) if N not in _row(candidates, best)]
    for N in missing:
        params = {MAX_SLOTS_PARAM: N}
        if tune_n_max:
            assert best.policy.n_max is not None  # every trial names its n_max (_evaluations)
            params[N_MAX_PARAM] = best.policy.n_max
        study.enqueue_trial(params)
    if missing:
        study.optimize(trial_objective, n_trials=len(missing))
        remaining += len(missing)
        candidates = _evaluations(_complete(study.trials), n_values[0])
        best = best_candidate(candidates, model.n_parallel, model.n_max)
    if stored is not None:
        stored.add_trials(_new_points(_complete(study.trials[held:]), stored.get_trials()))
    return SearchResult(
        name,
        sampler_name,
        size,
        len(_complete(study.trials)),
        remaining,
        best,
        candidates,
        list(goal.weights),
        goal,
    )


def _sampler(
    size: int, brute_force_limit: int, tpe_trials: int, seed: int, floor: float | None
) -> tuple[optuna.samplers.BaseSampler, str, int]:
    """Every point where the space is small (BruteForceSampler), else TPE (constrained to the
    floor where there is one); its name and the trials it takes."""
    import optuna

    if size <= brute_force_limit:
        return optuna.samplers.BruteForceSampler(seed=seed), "BruteForceSampler", size
    sampler = optuna.samplers.TPESampler(
        seed=seed,
        multivariate=True,
        n_startup_trials=min(50, tpe_trials // 4),
        constraints_func=_floor_violation if floor is not None else None,
    )
    return sampler, "TPESampler", tpe_trials


def _floor_violation(trial: optuna.trial.FrozenTrial) -> list[float]:
    """The constraint TPE keeps to with a floor: how far below it a trial's single stream is."""
    return [float(trial.user_attrs.get("floor_violation", 0.0))]


def _trial_objective(
    model: CostModel,
    goal: Objective,
    floor: float | None,
    n_values: list[int],
    tune_n_max: bool,
) -> Callable[[optuna.trial.Trial], float]:
    """A trial's value: the objective of the (N, n_max) it suggests, its figures kept as the
    trial's user attributes."""

    def objective(trial: optuna.trial.Trial) -> float:
        max_slots = trial.suggest_int(MAX_SLOTS_PARAM, 0, model.n_parallel)
        n = trial.suggest_int(N_MAX_PARAM, n_values[0], n_values[-1]) if tune_n_max else n_values[0]
        found = evaluate(model, Policy.of_max_slots(max_slots, n), goal, floor)
        for key, value in found.attrs().items():
            trial.set_user_attr(key, value)
        violation = (floor - found.single_stream) if floor is not None else 0.0
        trial.set_user_attr("floor_violation", violation)
        return found.value

    return objective


def _complete(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    import optuna

    return [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]


def _new_points(
    trials: list[optuna.trial.FrozenTrial], stored: list[optuna.trial.FrozenTrial]
) -> list[optuna.trial.FrozenTrial]:
    """The trials whose point (their parameters) no complete stored trial holds yet."""
    have = {tuple(sorted(t.params.items())) for t in _complete(stored)}
    return [t for t in trials if tuple(sorted(t.params.items())) not in have]


def _row(candidates: list[Evaluation], best: Evaluation) -> set[int | None]:
    return {c.policy.max_slots for c in candidates if c.policy.n_max == best.policy.n_max}


def _evaluations(trials: list[Any], default_n: int) -> list[Evaluation]:
    """The study's trials as evaluations (a repeated point keeps its newest trial)."""
    seen: dict[tuple[int, int], Evaluation] = {}
    for t in trials:
        n = int(t.params.get(N_MAX_PARAM, default_n))
        max_slots = int(t.params[MAX_SLOTS_PARAM])
        policy = Policy.of_max_slots(max_slots, n)
        seen[(max_slots, n)] = Evaluation(
            policy,
            float(t.value),
            tuple(float(v) for v in t.user_attrs.get("objective_samples", [])),
            float(t.user_attrs.get("single_stream_tps", 0.0)),
            bool(t.user_attrs.get("feasible", True)),
        )
    return sorted(seen.values(), key=lambda c: (c.policy.n_max, c.policy.max_slots))
