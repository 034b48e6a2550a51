"""`tuner tune`: an Optuna ask/tell study over live measurements, started from the cost model.

1. The cost model's study ranks every N. The recommendation that stands goes first, then every N
   that beats it in at least CANDIDATE_SHARE of the bootstrap replicates (the model cannot rule it
   out), best first, at most the trial budget: these are enqueued in a live study kept in the
   tuner's database (`tuner:live:run<ID>`), so an interrupted tuning resumes.
2. A round measures its trials side by side: every policy is launched once per pass, in
   alternating order, at the levels where the round's policies differ (between the smallest and
   the largest effective N: elsewhere they are the same server). After each pass from the second
   on, a trial whose paired difference to the round's leader is below zero by more than two
   standard errors is pruned (it cannot win) and measured no further.
3. A trial's value is the workload-weighted tok/s over 1..n_parallel: measured where the round
   measured, the cost model elsewhere (the same for every policy of the round). A later round
   measures new trials against the incumbent (the best so far) and anchors them to it: value =
   incumbent's value + the mean paired difference.
4. When the first round confirms the model (its recommendation is the best live trial), the study
   stops there: every N the model could not rule out has been measured against it. When live data
   overturned the model, the model is suspect: a neighbour of the new incumbent on the untried side
   is enqueued, and the study's sampler proposes beyond that while the trial budget lasts.

The best completed trial becomes the recommendation that stands (source "live", stored for the
fit that now includes the trials' levels), so `recommend` and `report` give the same N.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tuner.decide import recommend, search, validate
from tuner.decide.choice import Reason, ReasonCode
from tuner.decide.recommendation import Recommendation
from tuner.errors import ConfigError
from tuner.measure.plan import Observer, ProgressEvent, quiet
from tuner.measure.profiler import Profiler
from tuner.model.costmodel import CostModel
from tuner.policy import Policy
from tuner.storage import recommendations
from tuner.storage.engine import Store, optuna_storage
from tuner.storage.fits import current_fit

#: A candidate the model gives at least this share of replicates to beat the first is measured.
CANDIDATE_SHARE = 0.05
DEFAULT_TRIALS = 5
DEFAULT_PASSES = 3
PRUNE_SE = 2.0  # standard errors below the leader that prune a trial


# --- the pure parts ---------------------------------------------------------------------------


def server_key(policy: Policy, n_parallel: int) -> tuple[int, int | None]:
    """What the server does with a policy: its effective N and draft length (N=0 and N=np are
    the same server on np slots)."""
    return (policy.effective(n_parallel), policy.n_max)


def live_candidates(
    evaluations: Sequence[search.Evaluation], first: Policy, n_parallel: int, limit: int
) -> list[Policy]:
    """first, then every policy (twins once) that beats it in at least CANDIDATE_SHARE of the
    replicates, best model objective first; at most limit. When the model rules every other
    policy out, the runner-up still goes live (limit permitting): one policy alone has nothing
    to be measured against. Policies carry their n_max (several with --tune-n-max)."""
    by_key = {e.policy: e for e in evaluations if e.feasible}
    if first not in by_key:
        raise ValueError(f"{first.label} at n_max {first.n_max} is not among the candidates")
    anchor = np.asarray(by_key[first].samples)
    chosen = [first]
    seen = {server_key(first, n_parallel)}
    ranked = sorted(by_key.values(), key=lambda e: -e.value)
    for e in ranked:
        key = server_key(e.policy, n_parallel)
        if key in seen or len(chosen) >= limit:
            continue
        samples = np.asarray(e.samples)
        share = float(np.mean(samples > anchor)) if len(samples) == len(anchor) else 1.0
        if share >= CANDIDATE_SHARE:
            chosen.append(e.policy)
            seen.add(key)
    if len(chosen) == 1 and limit > 1:
        runner_up = next(
            (e for e in ranked if server_key(e.policy, n_parallel) not in seen),
            None,
        )
        if runner_up is not None:
            chosen.append(runner_up.policy)
    return chosen


def decision_levels(policies: Sequence[Policy], n_parallel: int) -> list[int]:
    """The levels where the policies differ: where one drafts and another does not, or where
    they draft at different lengths (elsewhere they are the same server)."""

    def behaviour(policy: Policy, c: int) -> tuple[bool, int | None]:
        return (True, policy.n_max) if policy.drafts_at(c) else (False, None)

    return [c for c in range(1, n_parallel + 1) if len({behaviour(p, c) for p in policies}) > 1]


PassTable = Mapping[int, Mapping[int, float]]  # pass -> concurrency -> tok/s


def pass_objectives(
    table: PassTable, levels: Sequence[int], weights: np.ndarray
) -> dict[int, float]:
    """sum over the levels of w_c * tok/s, per pass that measured every level."""
    return {
        p: float(sum(weights[c - 1] * row[c] for c in levels))
        for p, row in table.items()
        if all(c in row for c in levels)
    }


@dataclass(frozen=True)
class Paired:
    """A trial against a reference over the passes both measured: mean difference, its standard
    error and how many passes."""

    mean: float
    se: float
    passes: int

    @property
    def cannot_win(self) -> bool:
        return self.passes >= 2 and self.mean + PRUNE_SE * self.se < 0

    @classmethod
    def of(cls, mine: Mapping[int, float], reference: Mapping[int, float]) -> Paired:
        both = sorted(mine.keys() & reference.keys())
        diffs = [mine[p] - reference[p] for p in both]
        if not diffs:
            return cls(math.nan, math.nan, 0)
        se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.inf
        return cls(statistics.fmean(diffs), se, len(diffs))


def model_outside(
    model: CostModel, policy: Policy, levels: Sequence[int], weights: np.ndarray
) -> float:
    """The cost model's share of the objective at the levels a round did not measure."""
    others = [c for c in range(1, model.n_parallel + 1) if c not in set(levels)]
    if not others:
        return 0.0
    tps = model.policy_tps(others, policy)
    return float(sum(weights[c - 1] * t for c, t in zip(others, tps, strict=True)))


# --- the study --------------------------------------------------------------------------------


@dataclass
class TrialResult:
    """One live trial: its policy, state (complete | pruned), value and paired difference."""

    number: int
    policy: Policy
    state: str
    value: float | None
    paired: Paired | None
    reference: Policy | None  # the policy it was paired with
    levels: list[int]
    round: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "trial": self.number,
            "max_slots": self.policy.max_slots,
            "n_max": self.policy.n_max,
            "state": self.state,
            "value": self.value,
            "paired_mean": self.paired.mean if self.paired else None,
            "paired_se": self.paired.se if self.paired else None,
            "passes": self.paired.passes if self.paired else None,
            "reference": self.reference.label if self.reference else None,
            "reference_n_max": self.reference.n_max if self.reference else None,
            "levels": self.levels,
            "round": self.round,
        }


@dataclass
class TuneReport:
    """What `tuner tune` did: its trials, the recommendation it started from, the one that
    stands now."""

    run_id: int
    study_name: str
    started_from: Recommendation
    trials: list[TrialResult] = field(default_factory=list)
    standing: Recommendation | None = None

    @property
    def changed(self) -> bool:
        return self.standing is not None and (
            self.standing.max_slots != self.started_from.max_slots
            or self.standing.n_max != self.started_from.n_max
        )

    def standing_text(self) -> str:
        if self.standing is None:
            return ""
        line = " ".join(f"{k}={v}" for k, v in self.standing.env().items())
        if self.changed:
            return (
                f"{line} now stands: the live trials changed the recommendation from "
                f"N={self.started_from.max_slots} (n_max {self.started_from.n_max})"
            )
        return f"{line} stands after the live trials (unchanged)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "study_name": self.study_name,
            "started_from": self.started_from.max_slots,
            "trials": [t.as_dict() for t in self.trials],
            "standing": self.standing.max_slots if self.standing else None,
            "standing_n_max": self.standing.n_max if self.standing else None,
            "changed": self.changed,
        }


def _study(store: Store, name: str, seed: int) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna.create_study(
        study_name=name,
        storage=optuna_storage(store.url),
        sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=0),
        direction="maximize",
        load_if_exists=True,
    )


def trial_policy(params: Mapping[str, Any], n_max: int) -> Policy:
    """The policy a live trial's parameters name (n_max: the tuning's own unless tuned)."""
    return Policy.of_max_slots(
        int(params[search.MAX_SLOTS_PARAM]), int(params.get(search.N_MAX_PARAM, n_max))
    )


def trial_params(policy: Policy, tune_n_max: bool) -> dict[str, int]:
    params = {search.MAX_SLOTS_PARAM: int(policy.max_slots or 0)}
    if tune_n_max and policy.n_max is not None:
        params[search.N_MAX_PARAM] = policy.n_max
    return params


def _known(study: Any, n_max: int) -> dict[Policy, TrialResult]:
    """Finished trials of the study by policy (a resumed study keeps them)."""
    import optuna

    out: dict[Policy, TrialResult] = {}
    for t in study.trials:
        if t.state not in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED):
            continue
        if t.user_attrs.get("repeat_of") is not None:
            continue  # a proposal of what was measured already: told its value, not measured
        attrs = t.user_attrs
        policy = trial_policy(t.params, n_max)
        paired = (
            Paired(attrs["paired_mean"], attrs["paired_se"], attrs["passes"])
            if attrs.get("paired_mean") is not None
            else None
        )
        reference = (
            Policy.parse(attrs["reference"], attrs.get("reference_n_max") or n_max)
            if attrs.get("reference")
            else None
        )
        out[policy] = TrialResult(
            t.number,
            policy,
            "complete" if t.state == optuna.trial.TrialState.COMPLETE else "pruned",
            t.value,
            paired,
            reference,
            list(attrs.get("levels", [])),
            int(attrs.get("round", 0)),
        )
    return out


class Tuner:
    """Runs the live study: rounds of trials measured side by side through a Profiler."""

    def __init__(
        self,
        profiler: Profiler,
        model: CostModel,
        weights: np.ndarray,
        study: Any,
        observer: Observer,
        passes: int,
    ) -> None:
        self.profiler, self.model, self.weights, self.study = profiler, model, weights, study
        self.observer, self.passes = observer, passes
        self.round_number = 0

    def _objectives(
        self, policies: Sequence[Policy], levels: list[int], passes: Sequence[int]
    ) -> dict[Policy, dict[int, float]]:
        """Per policy, the objective at the levels in every pass of these that measured them."""
        state = self.profiler.repeats_by_level(list(policies))
        out = {}
        for policy in policies:
            name = self.profiler.level_name(policy)
            table: dict[int, dict[int, float]] = {}
            for (config, c), reps in state.items():
                if config != name:
                    continue
                for r in reps:
                    if r.get("pass") in passes and r.get("tokens_per_second"):
                        table.setdefault(r["pass"], {})[c] = float(r["tokens_per_second"])
            out[policy] = pass_objectives(table, levels, self.weights)
        return out

    def run_round(
        self, trials: dict[Policy, Any], incumbent: TrialResult | None
    ) -> list[TrialResult]:
        """Measure asked trials and the incumbent side by side, prune, tell."""
        self.round_number += 1
        for trial in trials.values():
            trial.set_user_attr("round", self.round_number)
        policies = list(trials)
        if incumbent is not None and incumbent.policy not in trials:
            policies.append(incumbent.policy)
        levels = decision_levels(policies, self.model.n_parallel)
        if not levels:
            raise ValueError(f"live trials of {', '.join(map(str, policies))} differ nowhere")
        active = list(policies)
        done_passes: list[int] = []
        pruned: dict[Policy, tuple[Policy, Paired]] = {}
        objectives: dict[Policy, dict[int, float]] = {}
        leader = policies[0]
        self.observer(
            ProgressEvent(
                "message",
                text=f"live trials, round {self.round_number}: "
                + ", ".join(self.profiler.level_name(p) for p in policies)
                + f" at {', '.join(map(str, levels))} streams, up to {self.passes} passes",
            )
        )
        last = self.profiler.last_pass()
        first = 0 if last is None else last + 1
        for k in range(self.passes):
            p = first + k
            order = active if k % 2 == 0 else list(reversed(active))
            for policy in order:
                self.profiler.run_config(policy, levels, pass_index=p)
            done_passes.append(p)
            objectives = self._objectives(policies, levels, done_passes)
            means = {q: statistics.fmean(o.values()) for q, o in objectives.items() if o}
            leader = max((q for q in active if q in means), key=lambda q: means[q])
            for q in list(active):
                if q == leader or (incumbent is not None and q == incumbent.policy):
                    continue
                paired = Paired.of(objectives[q], objectives[leader])
                if paired.cannot_win:
                    pruned[q] = (leader, paired)
                    active.remove(q)
                    self.observer(
                        ProgressEvent(
                            "message",
                            text=f"pruned {self.profiler.level_name(q)}: {paired.mean:+.1f} "
                            f"tok/s against {self.profiler.level_name(leader)} (se "
                            f"{paired.se:.1f}, {paired.passes} passes side by side)",
                        )
                    )
            if len(active) <= 1:
                break
        self.profiler.close_open_levels()
        return self._tell(trials, incumbent, leader, levels, objectives, pruned)

    def _tell(
        self,
        trials: dict[Policy, Any],
        incumbent: TrialResult | None,
        leader: Policy,
        levels: list[int],
        objectives: dict[Policy, dict[int, float]],
        pruned: dict[Policy, tuple[Policy, Paired]],
    ) -> list[TrialResult]:
        """Tell the study each trial's value: in the first round the measured objective plus the
        model where the round's policies agree; later, the incumbent's value plus the paired
        difference to it."""
        import optuna

        out = []
        for policy, trial in trials.items():
            mine = objectives.get(policy, {})
            ref: Policy | None
            if incumbent is not None:
                ref = incumbent.policy
                paired: Paired | None = Paired.of(mine, objectives.get(ref, {}))
                value = (incumbent.value or 0.0) + paired.mean
            else:
                ref = leader if policy != leader else None
                paired = Paired.of(mine, objectives[leader]) if ref is not None else None
                value = model_outside(self.model, policy, levels, self.weights) + (
                    statistics.fmean(mine.values()) if mine else math.nan
                )
            if policy in pruned:
                ref, paired = pruned[policy]
            attrs = {
                "levels": levels,
                "reference": ref.label if ref is not None else None,
                "reference_n_max": ref.n_max if ref is not None else None,
                "paired_mean": paired.mean if paired else None,
                "paired_se": paired.se if paired and math.isfinite(paired.se) else None,
                "passes": paired.passes if paired else len(mine),
            }
            for key, v in attrs.items():
                trial.set_user_attr(key, v)
            state = "pruned" if policy in pruned or not math.isfinite(value) else "complete"
            if state == "pruned":
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                self.study.tell(trial, value)
            out.append(
                TrialResult(
                    trial.number,
                    policy,
                    state,
                    value if state == "complete" else None,
                    paired,
                    ref,
                    levels,
                    self.round_number,
                )
            )
        return out


def _best(results: Mapping[Policy, TrialResult], n_parallel: int) -> TrialResult | None:
    complete = [t for t in results.values() if t.state == "complete" and t.value is not None]
    if not complete:
        return None
    return max(complete, key=lambda t: (t.value, -t.policy.effective(n_parallel)))


def explore_further(incumbent: TrialResult | None, started_from: Policy, n_parallel: int) -> bool:
    """Whether rounds beyond the model's candidates are worth their cost: only when the live
    trials overturned the model's recommendation (or none completed)."""
    if incumbent is None:
        return True
    return server_key(incumbent.policy, n_parallel) != server_key(started_from, n_parallel)


def _neighbour(
    best: TrialResult, tried: set[tuple[int, int | None]], n_parallel: int
) -> Policy | None:
    """The untried neighbour N of the best trial (at its n_max) on the side away from the
    others."""
    n = best.policy.effective(n_parallel)
    n_max = best.policy.n_max
    for step in (1, -1):
        m = n + step
        if (
            1 <= m <= n_parallel
            and (m, n_max) not in tried
            and ((n_parallel, n_max) not in tried or m != n_parallel)
        ):
            return Policy.of_max_slots(m, n_max)
    return None


def tune(
    store: Store,
    model_name: str,
    host: str,
    log_dir: Path,
    observer: Observer = quiet,
    *,
    trials: int = DEFAULT_TRIALS,
    passes: int = DEFAULT_PASSES,
    tune_n_max: bool = False,
    resume: bool = False,
    overrides: list[tuple[str, Any]] | None = None,
    skip_preflight: bool = False,
    seed: int = 0,
) -> TuneReport:
    """`tuner tune`: the live study (see the module docstring); returns its report.

    tune_n_max: trials are (N, n_max) pairs, n_max in 1..the profiled one, from the model's
    study over both."""
    if trials < 1 or passes < 1:
        raise ConfigError("--trials and --passes must be at least 1")
    rec = recommend.standing(store, model_name, host)
    study_now = recommend.model_study(store, model_name, host, seed=seed, tune_n_max=tune_n_max)
    cm, weights = study_now.fit.model, study_now.weights
    started = rec.policy.with_n_max(rec.n_max or cm.n_max)
    if not tune_n_max and started.n_max != cm.n_max:
        # The standing recommendation tuned n_max; without --tune-n-max trials stay at the
        # profiled n_max, where the model's candidates are.
        started = started.with_n_max(cm.n_max)
    candidates = live_candidates(study_now.result.candidates, started, cm.n_parallel, trials)

    stored_spec = validate.profile_spec_of(store, model_name, host)
    spec = validate.validation_spec(stored_spec, [1], cm.n_max, overrides, kind="tune")
    profiler = validate.open_live_run(
        store,
        spec,
        model_name,
        host,
        rec,
        "tune",
        candidates,
        log_dir,
        observer,
        resume=resume,
        skip_preflight=skip_preflight,
    )
    run_id = profiler.run_id
    assert run_id is not None
    name = f"tuner:live:run{run_id}"
    study = _study(store, name, seed)
    _requeue_unfinished(study)
    known = _known(study, cm.n_max)
    if not known and not _waiting(study, cm.n_max):
        for policy in candidates:
            study.enqueue_trial(trial_params(policy, tune_n_max))
    report = TuneReport(run_id, name, rec)
    tuner = Tuner(profiler, cm, weights, study, observer, passes)
    tuner.round_number = max((t.round for t in known.values()), default=0)
    n_values = cm.n_values() if tune_n_max else [cm.n_max]

    def ask(policy: Policy | None) -> tuple[Policy, Any]:
        """A trial of the policy (enqueued first so the study measures what was chosen), or of
        what the sampler proposes when policy is None."""
        if policy is not None and policy not in _waiting(study, cm.n_max):
            study.enqueue_trial(trial_params(policy, tune_n_max))
        trial = study.ask()
        n = trial.suggest_int(search.MAX_SLOTS_PARAM, 0, cm.n_parallel)
        n_max = (
            trial.suggest_int(search.N_MAX_PARAM, n_values[0], n_values[-1])
            if tune_n_max
            else cm.n_max
        )
        return Policy.of_max_slots(n, n_max), trial

    def body() -> None:
        repeats_asked = 0
        while len(known) < trials:
            incumbent = _best(known, cm.n_parallel)
            tried = {server_key(t.policy, cm.n_parallel) for t in known.values()}
            waiting = [p for p in _waiting(study, cm.n_max) if p not in known]
            if waiting:
                asked = dict(ask(p) for p in waiting[: trials - len(known)])
            else:
                if not explore_further(incumbent, started, cm.n_parallel):
                    observer(
                        ProgressEvent(
                            "message",
                            text=f"the live trials confirm {profiler.level_name(started)} "
                            "against every policy the model could not rule out: no further "
                            "rounds",
                        )
                    )
                    return
                nxt = _neighbour(incumbent, tried, cm.n_parallel) if incumbent else None
                policy, trial = ask(nxt)
                key = server_key(policy, cm.n_parallel)
                if key in tried:
                    # The sampler proposed what was measured: it learns the known value.
                    same = next(
                        t for t in known.values() if server_key(t.policy, cm.n_parallel) == key
                    )
                    _tell_known(study, trial, same)
                    repeats_asked += 1
                    if repeats_asked >= 3:
                        return
                    continue
                asked = {policy: trial}
            for t in tuner.run_round(asked, incumbent):
                known[t.policy] = t

    profiler.guarded(body)
    report.trials = sorted(known.values(), key=lambda t: t.number)
    best = _best(known, cm.n_parallel)
    if best is not None:
        report.standing = _store_live(
            store, model_name, host, best, report.trials, rec, tune_n_max, profiler
        )
    return report


def _requeue_unfinished(study: Any) -> None:
    """Trials a killed tuning left running are failed and asked again."""
    import optuna

    for t in study.trials:
        if t.state == optuna.trial.TrialState.RUNNING:
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
            if search.MAX_SLOTS_PARAM in t.params:
                study.enqueue_trial(dict(t.params))


def _waiting(study: Any, n_max: int) -> list[Policy]:
    import optuna

    return [
        trial_policy(t.system_attrs["fixed_params"], n_max)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        if search.MAX_SLOTS_PARAM in t.system_attrs.get("fixed_params", {})
    ]


def _tell_known(study: Any, trial: Any, known: TrialResult) -> None:
    import optuna

    trial.set_user_attr("repeat_of", known.number)
    if known.state == "complete" and known.value is not None:
        study.tell(trial, known.value)
    else:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)


def _store_live(
    store: Store,
    model_name: str,
    host: str,
    best: TrialResult,
    results: list[TrialResult],
    started: Recommendation,
    tune_n_max: bool,
    profiler: Profiler,
) -> Recommendation:
    """The best live trial as the recommendation that stands for the fit of the data now."""
    fit = current_fit(store, model_name, host)
    others = [t for t in results if t is not best]

    def name(policy: Policy) -> str:
        return f"{policy.label} (n_max {policy.n_max})" if tune_n_max else policy.label

    reasons = [
        Reason(
            ReasonCode.LIVE_TRIALS,
            f"{name(best.policy)}: best of {len(results)} live trials "
            f"(objective {best.value:.1f} tok/s"
            + (
                f", {best.paired.mean:+.1f} ± {best.paired.se:.1f} against "
                f"{name(best.reference)} side by side"
                if best.paired and best.reference is not None and math.isfinite(best.paired.se)
                else ""
            )
            + f"); the model's recommendation was {name(started.policy)}",
        )
    ]
    for t in others:
        if t.state == "pruned" and t.paired is not None:
            reasons.append(
                Reason(
                    ReasonCode.PRUNED,
                    f"{name(t.policy)} pruned: {t.paired.mean:+.1f} tok/s (se "
                    f"{t.paired.se:.1f}) behind over {t.paired.passes} passes side by side",
                )
            )
        elif t.value is not None:
            reasons.append(
                Reason(
                    ReasonCode.LIVE_TRIALS, f"{name(t.policy)}: objective {t.value:.1f} tok/s live"
                )
            )
    rec = Recommendation(
        id=0,
        model=model_name,
        host=host,
        policy=best.policy,
        fit_id=fit.id,
        objective=best.value,
        objective_interval=None,
        tune_n_max=tune_n_max or started.tune_n_max,
        study_name=f"live:{best.number}",
        sampler="live trials",
        trials=len(results),
        reasons=reasons,
        table=recommend.prediction_table(fit.model, best.policy, fit.measured),
        alternatives=[
            {
                "max_slots": t.policy.max_slots,
                "n_max": t.policy.n_max,
                "objective": t.value,
                "state": t.state,
                "config": profiler.level_name(t.policy),
            }
            for t in results
        ],
        source="live",
    )
    recommendations.save(store, rec, {"live_trials": [t.as_dict() for t in results]})
    return rec
