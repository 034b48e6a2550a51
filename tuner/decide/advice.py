"""Recommend over stored data, and the answer that stands.

- `recommend`: the current fit of a model's data (tuner.storage.fits), the Optuna study over it
  (tuner.decide.search), the choice (tuner.decide.choice), stored with fit and study.
- `standing`: the recommendation that stands for a host now (what validate checks and the report
  shows): the newest one stored for the current fit, else a new one.
- `model_study`: every N scored on the current fit, for decisions made on the way.
The context depths an answer is for are tuner.decide.depths'; `predict` is tuner.decide.predict's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.decide import search
from tuner.decide.choice import Choice, choose
from tuner.decide.depths import Depths, depths_for, derived_model
from tuner.decide.objective import Objective
from tuner.decide.observed import observed_in_place
from tuner.decide.openadvice import (
    OpenQuestion,
    answers_open,
    closed_loop_reason,
    open_recommendation,
)
from tuner.decide.openanswer import REPLICATES
from tuner.decide.predict import prediction_table
from tuner.errors import ConfigError
from tuner.model.costmodel import VERSION, CostModel
from tuner.recommendation import ObjectiveKind, Reason, ReasonCode, Recommendation, TableRow
from tuner.storage import recommendations
from tuner.storage import traffic_profiles as traffic_store
from tuner.storage.fits import StoredFit, current_fit
from tuner.storage.store import Store
from tuner.traffic import TrafficProfile


def recommend(
    store: Store,
    model: str,
    host: str | None,
    *,
    host_explicit: bool = False,
    tune_n_max: bool = False,
    min_single_stream: float | None = None,
    seed: int = 0,
    fit_id: int | None = None,
    context: int | Mapping[int, float] | None = None,
    traffic: str | None = None,
    objective: ObjectiveKind = ObjectiveKind.TPS,
    slo_tpot_ms: float | None = None,
    rate: float | None = None,
    output_tokens: float | None = None,
    closed_loop: bool = False,
    replicates: int | None = None,
    prompt_tokens: float | None = None,
) -> Recommendation:
    """`tuner recommend`: fit (or reuse the fit of the same data), search, choose, store.

    context: the context depth whose measurements to use (default the shallowest), or a mix
    {depth: share of time}. A depth that was not measured, or a mix, is answered by a model
    combined from the fits at the measured depths (tuner.model.depth); that answer rests on no
    measured level of its own, so it is printed, not stored. traffic: weight the objective by
    an observed traffic profile (share of busy time at each number of generating slots)
    instead of the spec's workload weights, and use the acceptance seen on that traffic in
    place of the profile's where enough was seen (tuner.decide.observed).

    objective: tps (the default), tpot or capacity (tuner.decide.objective). Arrivals (traffic,
    rate, tpot, capacity) are answered in the open loop where the fit has arrival costs and not
    closed_loop (tuner.decide.openadvice), else from closed levels, said so.

    Where live trials (`tuner tune`) stored the answer for exactly this data, that answer stands:
    it rests on measured trials, and the model's choice would only second-guess them.
    """
    where = depths_for(store, model, host, host_explicit, context)
    stored = current_fit(
        store, model, host, host_explicit=host_explicit, fit_id=fit_id, seed=seed, context=where.fit
    )
    lengths = (rate, output_tokens, prompt_tokens)
    plain_question = objective is ObjectiveKind.TPS and lengths == (None, None, None)
    asks_more = tune_n_max or min_single_stream is not None or traffic is not None
    if plain_question and not asks_more and not where.derived:
        newest = recommendations.newest_for_fit(store, stored.id)
        if newest is not None and newest.source == "live":
            return newest
    basis = _answered_by(store, stored, where, model, host, host_explicit, seed, traffic)
    if not plain_question or traffic is not None:
        question = OpenQuestion(
            model=model,
            host=host,
            objective=objective,
            host_explicit=host_explicit,
            traffic=traffic,
            rate=rate,
            output_tokens=output_tokens,
            prompt_tokens=prompt_tokens,
            slo_tpot_ms=slo_tpot_ms,
            seed=seed,
            replicates=replicates or REPLICATES,
        )
        blocked = _open_blocked(where.derived, tune_n_max, min_single_stream, closed_loop)
        answering = dataclasses.replace(stored, model=basis.cm)
        answered = _open_loop(store, answering, question, blocked, basis.levels, basis.reasons)
        if isinstance(answered, Recommendation):
            return _with_plain_live(store, answered, model, host)
        basis.reasons.append(answered)
    weights, goal, said_how = _weighted_goal(
        store, model, basis.cm, stored.weights, traffic, objective, slo_tpot_ms, rate, output_tokens
    )
    basis.reasons += said_how
    options = _study_options(where, traffic, tune_n_max, min_single_stream, weights, seed, goal)
    options |= basis.seen or {}
    rec, details = _studied(
        store, model, stored, basis, goal, options, tune_n_max, min_single_stream, seed
    )
    rec = _with_plain_live(store, rec, model, host)
    if where.interpolated:
        rec.made_now = True
        rec.origin = recommendations.origin(store, rec.fit_id, model)
        return rec
    recommendations.save(store, rec, details)
    return rec


def _with_plain_live(
    store: Store, rec: Recommendation, model: str, host: str | None
) -> Recommendation:
    """A model's answer with, beside its own verdict on whether to draft at all, the one `tune
    --plain-url` measured side by side on the servers (where one was stored): what no
    experiment on one drafting server can measure."""
    if rec.source == "live":
        return rec
    live = recommendations.newest_plain_live(store, model, host)
    said = next((r for r in live.reasons if SIDE_BY_SIDE in r.text), None) if live else None
    if live is None or said is None:
        return rec
    rec.reasons.append(
        Reason(
            ReasonCode.PLAIN_LIVE,
            f"whether to draft at all, as `tune --plain-url` measured it side by side (stored "
            f"answer #{live.id}, N={live.max_slots}): {said.text}",
        )
    )
    return rec


SIDE_BY_SIDE = "measured side by side"  # what tune.describe.plain_live_reason says


@dataclass
class _Basis:
    """What an answer rests on: the model, the measured gains and levels it keeps to, the
    reasons said first, and the observed acceptance the study is of (None: the profile's)."""

    cm: CostModel
    gains: dict[int, float]
    levels: dict[str, list[int]]
    reasons: list[Reason]
    seen: dict[str, Any] | None = None


def _answered_by(
    store: Store,
    stored: StoredFit,
    where: Depths,
    model: str,
    host: str | None,
    host_explicit: bool,
    seed: int,
    traffic: str | None,
) -> _Basis:
    """The fit's own model, or one derived from the fits at the measured depths (no measured
    gains or levels then); with a traffic profile, the acceptance seen on it in place of the
    profile's where enough was seen (the profile's gains, measured at its own acceptance, then
    no longer bound N)."""
    if not where.derived:
        # Which N: spec against the threshold server not drafting (the off arm) where measured.
        basis = _Basis(
            stored.model, stored.quality.measured_gains(against="off"), stored.measured, []
        )
    else:
        cm, said = derived_model(store, model, host, host_explicit, seed, where)
        basis = _Basis(cm, {}, {}, [said])
    if traffic is not None:
        profile = traffic_store.load(store, traffic)
        basis.cm, said, basis.seen = observed_in_place(basis.cm, profile, traffic, seed)
        basis.reasons.append(said)
        if basis.seen:
            basis.gains = {}
    return basis


def _studied(
    store: Store,
    model: str,
    stored: StoredFit,
    basis: _Basis,
    goal: Objective,
    options: dict[str, Any],
    tune_n_max: bool,
    min_single_stream: float | None,
    seed: int,
) -> tuple[Recommendation, dict[str, Any]]:
    """The Optuna study over the model, the choice from it, as a recommendation (not stored
    here) and the details to store with it."""
    cm = basis.cm
    name = search.study_name(
        model, stored.inputs.get("host"), stored.inputs.get("build"), stored.id, options
    )
    result = _search(
        store, name, cm, goal, tune_n_max, min_single_stream, seed, model, stored.id, options
    )
    choice = choose(cm, result, basis.gains)
    choice.reasons[:0] = basis.reasons
    if stored.host_note:
        choice.reasons.append(Reason(ReasonCode.OTHER_HOST, stored.host_note))
    table = prediction_table(cm, choice.policy, basis.levels)
    rec = _recommendation(
        model, stored, choice, name, result, goal, table, tune_n_max, min_single_stream
    )
    return rec, {"search": result.to_dict(), "model_optimum": choice.model_optimum}


def _open_loop(
    store: Store,
    stored: StoredFit,
    question: OpenQuestion,
    blocked: str | None,
    measured_levels: dict[str, list[int]],
    reasons_first: list[Reason],
) -> Recommendation | Reason:
    """The open-loop answer, stored, where the open loop answers the question; else the reason
    the answer comes from closed levels."""
    cm = stored.model
    if not answers_open(cm, question) or blocked is not None:
        return closed_loop_reason(cm, question.objective, blocked)
    rec, details = open_recommendation(store, stored, question, [])
    # which acceptance it rests on (the traffic's observed, or the profile's) is said first
    rec.reasons[:0] = [r for r in reasons_first if r.code is ReasonCode.OBSERVED_ACCEPTANCE]
    rec.table = prediction_table(cm, rec.policy, measured_levels)
    recommendations.save(store, rec, details)
    return rec


def _open_blocked(
    derived: bool, tune_n_max: bool, min_single_stream: float | None, closed_loop: bool
) -> str | None:
    """The option the open loop does not answer with, where one was given."""
    for given, name in (
        (closed_loop, "--closed-loop"),
        (derived, "a context mix or an unmeasured depth"),
        (tune_n_max, "--tune-n-max"),
        (min_single_stream is not None, "--min-single-stream"),
    ):
        if given:
            return name
    return None


def _weighted_goal(
    store: Store,
    model: str,
    cm: CostModel,
    source: Any,
    traffic: str | None,
    objective: ObjectiveKind,
    slo_tpot_ms: float | None,
    rate: float | None,
    output_tokens: float | None,
) -> tuple[np.ndarray, Objective, list[Reason]]:
    """The objective's weights per level (the data's workload weights, or an observed traffic
    profile's), the objective itself, and the reasons that say how."""
    reasons: list[Reason] = []
    profile: TrafficProfile | None = None
    if traffic is not None:
        profile = traffic_store.load(store, traffic)
        source = {str(c): w for c, w in profile.weights(cm.n_parallel).items()}
    if traffic is not None and profile is not None and objective is ObjectiveKind.TPS:
        reasons.append(
            Reason(
                ReasonCode.TRAFFIC,
                f"weighted by traffic {traffic!r}: {profile.covered_s:.0f} s observed, mean "
                f"{profile.mean_generating():.2f} slots generating; busy-time shares "
                + ", ".join(f"{c}: {w:.2f}" for c, w in profile.weights(cm.n_parallel).items())
                + " (first order: occupancy as observed under the server's N then)",
            )
        )
    try:
        weights = search.objective_weights(cm.n_parallel, source)
    except ValueError as exc:
        what = f"traffic {traffic!r}" if traffic else f"workload weights of {model}"
        raise ConfigError(f"{what}: {exc}") from exc
    goal = (
        Objective.throughput(weights)
        if objective is ObjectiveKind.TPS
        else arrival_objective(objective, profile, traffic, slo_tpot_ms, rate, output_tokens)
    )
    if goal.kind is not ObjectiveKind.TPS:
        reasons.append(Reason(ReasonCode.OBJECTIVE, objective_reason(goal, traffic)))
    return weights, goal, reasons


def _study_options(
    where: Depths,
    traffic: str | None,
    tune_n_max: bool,
    min_single_stream: float | None,
    weights: np.ndarray,
    seed: int,
    goal: Objective,
) -> dict[str, Any]:
    """What the study is of, as its name and user attributes keep it."""
    options = {
        "context": {str(d): w for d, w in sorted(where.mix.items())} if where.derived else None,
        "traffic": traffic,
        "tune_n_max": tune_n_max,
        "min_single_stream": min_single_stream,
        "weights": [round(float(w), 12) for w in weights],
        "seed": seed,
        "version": VERSION,
    }
    if goal.kind is not ObjectiveKind.TPS:
        options |= goal.options()
    return options


def _search(
    store: Store,
    name: str,
    cm: CostModel,
    goal: Objective,
    tune_n_max: bool,
    min_single_stream: float | None,
    seed: int,
    model: str,
    fit_id: int,
    options: dict[str, Any],
) -> search.SearchResult:
    """The Optuna study over the model; one clear error where no setting meets a constraint."""
    try:
        result = search.run_study(
            store.url,
            name,
            cm,
            goal,
            tune_n_max=tune_n_max,
            min_single_stream=min_single_stream,
            seed=seed,
            user_attrs={"model": model, "fit_id": fit_id, **options},
        )
    except ValueError as exc:
        if min_single_stream is None:
            raise  # not the floor's: no setting to name
        best_single = max(
            float(cm.spec_tps([1], n)[0]) for n in (cm.n_values() if tune_n_max else [cm.n_max])
        )
        raise ConfigError(
            f"no setting reaches --min-single-stream {min_single_stream:g} tok/s "
            f"(the best the model predicts at 1 stream is {best_single:.1f})"
        ) from exc
    if goal.kind is ObjectiveKind.CAPACITY and result.best.value <= 0:
        raise ConfigError(
            f"no setting keeps p95 time per output token under {goal.slo_tpot_ms:g} ms, even "
            f"one stream alone (the fastest single stream the model predicts takes "
            f"{1000.0 / max(c.single_stream for c in result.candidates):.1f} ms per token): "
            "raise --slo-tpot-ms"
        )
    return result


def _recommendation(
    model: str,
    stored: StoredFit,
    choice: Choice,
    name: str,
    result: search.SearchResult,
    goal: Objective,
    table: list[TableRow],
    tune_n_max: bool,
    min_single_stream: float | None,
) -> Recommendation:
    return Recommendation(
        id=0,
        model=model,
        host=stored.inputs.get("host"),
        policy=choice.policy,
        fit_id=stored.id,
        objective=choice.objective,
        objective_interval=choice.objective_interval,
        tune_n_max=tune_n_max,
        min_single_stream=min_single_stream,
        host_note=stored.host_note,
        study_name=name,
        sampler=result.sampler,
        trials=result.trials,
        reasons=[*disturbed_reason(stored), *choice.reasons],
        measure_next=choice.measure_next,
        table=table,
        alternatives=choice.alternatives,
        objective_kind=goal.kind.value,
        objective_text=goal.describe(choice.objective),
        plain_advantage=choice.plain.advantage,
        drafting_pays=not choice.plain.plain_ahead,
    )


def disturbed_reason(fit: StoredFit) -> list[Reason]:
    """The reason an answer is not settled where the fit's data rest on rounds others disturbed
    (kept as measured after their tries: the machine or the server was never free): the
    levels, and what to do."""
    levels = fit.inputs.get("disturbed") or []
    if not levels:
        return []
    return [
        Reason(
            ReasonCode.DISTURBED,
            f"{len(levels)} level(s) rest on rounds measured while other programs competed for "
            f"the machine or others' requests shared the server ({', '.join(levels)}; the "
            "runs' warnings name them): measure again when the machine and server are quiet",
        )
    ]


def arrival_objective(
    kind: ObjectiveKind,
    profile: TrafficProfile | None,
    traffic: str | None,
    slo_tpot_ms: float | None,
    rate: float | None,
    output_tokens: float | None,
) -> Objective:
    """The tpot or capacity objective, its rate and output length from the options or the
    observed traffic; one clear error when something it needs is missing."""
    # rate and lengths were checked when the question was made (OpenQuestion)
    if kind is ObjectiveKind.CAPACITY and (slo_tpot_ms is None or slo_tpot_ms <= 0):
        raise ConfigError(
            "--objective capacity needs --slo-tpot-ms X above 0: the p95 time per output "
            "token (ms) the highest served arrival rate must keep"
        )
    length = output_tokens or (profile.mean_output_tokens if profile is not None else None)
    arrivals = rate or (profile.arrival_rate if profile is not None else None)
    source = (
        f"traffic {traffic!r} saw no request finish (observe sees them on /slots)"
        if traffic
        else "there is no --traffic"
    )
    if length is None:
        raise ConfigError(
            f"--objective {kind} needs a mean output length and {source}: pass "
            "--output-tokens, or --traffic NAME"
        )
    if kind is ObjectiveKind.TPOT and arrivals is None:
        raise ConfigError(
            f"--objective tpot needs an arrival rate and {source}: pass --rate (requests/s), "
            "or --traffic NAME"
        )
    return Objective(
        kind,
        rate=arrivals if kind is ObjectiveKind.TPOT else None,
        mean_output_tokens=float(length),
        slo_tpot_ms=slo_tpot_ms if kind is ObjectiveKind.CAPACITY else None,
    )


def objective_reason(goal: Objective, traffic: str | None) -> str:
    where = f" (from traffic {traffic!r})" if traffic else ""
    if goal.kind is ObjectiveKind.TPOT:
        return (
            f"objective: mean time per output token under Poisson arrivals at {goal.rate:.3g} "
            f"req/s, {goal.mean_output_tokens:.0f} output tokens on average{where}; each N is "
            "scored at the occupancy it would cause (a birth-death queue over generating slots)"
        )
    return (
        f"objective: the highest arrival rate whose p95 time per output token stays under "
        f"{goal.slo_tpot_ms:g} ms, {goal.mean_output_tokens:.0f} output tokens on average{where} "
        "(a birth-death queue over generating slots; p95 over tokens served)"
    )


@dataclass
class ModelStudy:
    """The cost model's study over the current fit, kept in memory (only the fit is stored)."""

    fit: StoredFit
    weights: np.ndarray
    result: search.SearchResult


def model_study(
    store: Store,
    model: str,
    host: str | None,
    *,
    host_explicit: bool = False,
    seed: int = 0,
    tune_n_max: bool = False,
    fit: StoredFit | None = None,
) -> ModelStudy:
    """Every N (and n_max, with tune_n_max) evaluated on the current fit (or the one given:
    a command fits its data once), for a decision made on the way (adaptive levels, live
    candidates) rather than one `recommend` stores."""
    fit = fit or current_fit(store, model, host, host_explicit=host_explicit, seed=seed)
    weights = search.objective_weights(fit.model.n_parallel, fit.weights)
    study = search.run_study(
        None, "in-memory", fit.model, weights, seed=seed, tune_n_max=tune_n_max
    )
    return ModelStudy(fit, weights, study)


def standing(
    store: Store,
    model: str,
    host: str | None,
    *,
    host_explicit: bool = False,
    like: Recommendation | None = None,
    seed: int = 0,
    fit: StoredFit | None = None,
) -> Recommendation:
    """The recommendation that stands for host now: the newest one stored for the fit of the
    current data (or the fit given: a command fits its data once), else a new one made with
    like's options (n_max tuning, single-stream floor).

    The data are host's own or, where host has none, the newest host's (the reasons say so);
    never a recommendation merely because it is the newest in the database.
    """
    fit = fit or current_fit(store, model, host, host_explicit=host_explicit, seed=seed)
    stored = recommendations.newest_for_fit(store, fit.id)
    if stored is not None:
        return stored
    made = recommend(
        store,
        model,
        host,
        fit_id=fit.id,
        host_explicit=host_explicit,
        tune_n_max=like.tune_n_max if like else False,
        min_single_stream=like.min_single_stream if like else None,
        seed=seed,
    )
    made.made_now = True
    return made
