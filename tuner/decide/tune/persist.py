"""What `tuner tune` keeps: every evaluated N as a trial of an Optuna study in the tuner's
database (`tuner:live:run<ID>`), and the answer as the recommendation that stands (source
"live"), with its reasons."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from tuner.decide import advice, choice, search, settle
from tuner.decide.paired import AHEAD, BEHIND
from tuner.decide.predict import prediction_table
from tuner.decide.tune.describe import head_reason, plain_live_reason
from tuner.decide.tune.outcome import PlainLive, TuneReport
from tuner.policy import Policy
from tuner.recommendation import Reason, ReasonCode, Recommendation
from tuner.storage import recommendations
from tuner.storage.fits import current_fit
from tuner.storage.store import Store, optuna_storage


def open_study(store: Store, name: str, seed: int) -> Any:
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


def tell(
    study: Any, standing: settle.Standing, answer: int, n_max: int, objective: float, both: bool
) -> None:
    """Every evaluated N as a trial: the answer with its model objective, each contender with
    the answer's plus its measured advantage; pruned when shown behind."""
    import optuna

    def params(n: int) -> dict[str, int]:
        out = {search.MAX_SLOTS_PARAM: n}
        if both:
            out[search.N_MAX_PARAM] = n_max
        return out

    study.enqueue_trial(params(answer))
    trial = study.ask()
    trial.suggest_int(search.MAX_SLOTS_PARAM, 0, max(answer, 1))
    trial.set_user_attr("role", "answer")
    trial.set_user_attr("status", standing.status)
    trial.set_user_attr("tie", standing.tie)
    study.tell(trial, objective)
    for comp in standing.comparisons:
        study.enqueue_trial(params(comp.contender))
        trial = study.ask()
        trial.suggest_int(search.MAX_SLOTS_PARAM, 0, max(comp.contender, 1))
        for key, value in comp.as_dict().items():
            if isinstance(value, float) and not math.isfinite(value):
                value = None
            trial.set_user_attr(key, value)
        trial.set_user_attr("role", "contender")
        if comp.verdict == BEHIND:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif math.isfinite(comp.advantage.estimate):
            study.tell(trial, objective + comp.advantage.estimate)
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)


def store_live(
    store: Store,
    model_name: str,
    host: str,
    answer: int,
    n_max: int,
    objective: float,
    report: TuneReport,
    started: Recommendation,
    tune_n_max: bool,
    weights: np.ndarray,
) -> Recommendation:
    """The settled answer as the recommendation that stands for the fit of the data now. Live
    pairs compare thresholds on the drafting launch; whether to draft at all rests on plain's
    launches, so the model says it, on the fit of the data now, as recommend does."""
    standing = report.settled
    assert standing is not None
    fit = current_fit(store, model_name, host)
    policy = Policy.of_max_slots(answer, n_max)
    reasons = [head_reason(standing, answer, report)]
    plain = choice.plain_verdict(fit.model, np.asarray(weights), policy)
    said, plain_advantage, drafting_pays = _whether_to_draft(
        plain, report.plain, answer, objective, reasons
    )
    if said is not None:
        reasons.insert(0, said)
    reasons = [*advice.disturbed_reason(fit), *reasons, *_comparison_reasons(standing, answer)]
    rec = Recommendation(
        id=0,
        model=model_name,
        host=host,
        policy=policy,
        fit_id=fit.id,
        objective=objective,
        objective_interval=None,
        tune_n_max=tune_n_max or started.tune_n_max,
        study_name=report.study_name,
        sampler="live comparisons",
        trials=1 + len(standing.comparisons),
        reasons=reasons,
        measure_next=list(standing.measure_next),
        table=prediction_table(fit.model, policy, fit.measured),
        alternatives=[c.as_dict() for c in standing.comparisons],
        source="live",
        tie=list(standing.tie),
        plain_advantage=plain_advantage,
        drafting_pays=drafting_pays,
    )
    recommendations.save(store, rec, {"tune": report.as_dict()})
    return rec


def _whether_to_draft(
    plain: choice.PlainVerdict,
    live: PlainLive | None,
    answer: int,
    objective: float,
    reasons: list[Reason],
) -> tuple[Reason | None, tuple[float, float, float] | None, bool]:
    """Whether to draft at all: the reason that says it first (None: none to say), plain's
    advantage and whether drafting pays; as measured side by side where that resolved, else
    the model's verdict, with an unresolved side by side added to `reasons` where the model
    showed plain ahead."""
    said = plain.reason(objective)
    plain_advantage, drafting_pays = plain.advantage, not plain.plain_ahead
    if live is not None and live.verdict != settle.UNRESOLVED:
        said = plain_live_reason(live, answer)
        low, high = live.advantage.bounds(settle.CONFIDENCE)
        plain_advantage = (live.advantage.estimate, low, high)
        drafting_pays = live.verdict != AHEAD
    elif live is not None and live.passes > 0:
        # measured and unresolved: said, whichever side the model's estimate leans to, so that
        # an answer that keeps drafting does not read as one that showed drafting pays
        unresolved = plain_live_reason(live, answer, model=plain.advantage)
        if drafting_pays:
            said = unresolved
        else:  # the model showed plain ahead; the side by side, unresolved, does not overturn it
            reasons.append(unresolved)
    return said, plain_advantage, drafting_pays


def _comparison_reasons(standing: settle.Standing, answer: int) -> list[Reason]:
    """A reason for each contender against the answer, and for the tie where there is one."""
    reasons = []
    for comp in standing.comparisons:
        code = ReasonCode.PRUNED if comp.verdict == BEHIND else ReasonCode.LIVE_TRIALS
        if comp.verdict == settle.UNRESOLVED:
            code = ReasonCode.UNRESOLVED
        reasons.append(
            Reason(
                code,
                f"N={comp.contender} against N={answer}, weighted, one-sided 95 % bounds at "
                f"{', '.join(map(str, comp.levels))} streams: "
                f"{comp.advantage.figures(confidence=settle.CONFIDENCE)}: {comp.verdict}",
            )
        )
    if len(standing.tie) > 1:
        # settled, the smallest of a tie is the answer; still open, it is a tie so far and the
        # answer the best estimate (README: Reading an answer)
        chosen = (
            f"the smallest, N={min(standing.tie)}, is the answer"
            if standing.status == settle.SETTLED
            else f"a tie so far: N={answer} stands as the best estimate while the comparisons "
            "are open"
        )
        reasons.append(
            Reason(
                ReasonCode.TIE,
                f"N in {standing.tie} are equivalent within +-{standing.tolerance:.2f} tok/s: "
                + chosen,
            )
        )
    return reasons
