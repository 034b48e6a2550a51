"""`recommend`'s open-loop path: the offered traffic (drawn from a stored traffic profile, or
Poisson arrivals at --rate with the observed or the profile's lengths), the open-loop answer
(tuner.decide.openanswer) and the recommendation made of it, with what came from where.

It answers where the fit carries measured arrival costs (tuner.model.arrivals: prompt
processing by the target and the draft model at least); a fit without them is answered from
closed levels, as before, and says so (`closed_loop_reason`).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.decide.depths import measured_depths
from tuner.decide.observed import observed_in_place
from tuner.decide.openanswer import REPLICATES, OpenAnswer, open_answer
from tuner.errors import ConfigError
from tuner.model.costmodel import CostModel
from tuner.model.depth import attention_per_1k
from tuner.recommendation import ObjectiveKind, Reason, ReasonCode, Recommendation, TableRow
from tuner.storage import traffic_profiles as traffic_store
from tuner.storage import validations
from tuner.storage.fits import StoredFit, current_fit
from tuner.storage.probes import mean_output_tokens
from tuner.storage.store import Store
from tuner.traffic import Finished, TrafficProfile
from tuner.twin.fitted import Levels
from tuner.twin.serving import Offered, offered_drawn, offered_poisson

KINDS = (ObjectiveKind.TPOT, ObjectiveKind.TPS, ObjectiveKind.CAPACITY)  # the open loop's


@dataclass(frozen=True)
class OpenQuestion:
    """What `recommend` was asked about arrivals."""

    model: str
    host: str | None
    objective: ObjectiveKind
    host_explicit: bool = False
    traffic: str | None = None
    rate: float | None = None
    output_tokens: float | None = None
    prompt_tokens: float | None = None
    slo_tpot_ms: float | None = None
    seed: int = 0
    replicates: int = REPLICATES  # replicate worlds for the spread

    def __post_init__(self) -> None:
        """Checked when made: every figure given is one a server can have."""
        for option, value in (
            ("--rate", self.rate),
            ("--output-tokens", self.output_tokens),
            ("--prompt-tokens", self.prompt_tokens),
            ("--slo-tpot-ms", self.slo_tpot_ms),
        ):
            if value is not None and not value > 0:
                what = "an arrival rate must be above 0 requests/s" if option == "--rate" else ""
                raise ConfigError(f"{option} {value:g}: {what or 'must be above 0'}")
        if self.replicates < 0:
            raise ConfigError(f"replicates {self.replicates}: 0 or more")


def answers_open(model: CostModel, question: OpenQuestion) -> bool:
    """Whether the open loop answers this question on this fit: arrivals asked about (a traffic
    profile, a rate, the tpot objective), an objective it scores, measured prompt costs."""
    asked = question.traffic is not None or question.rate is not None
    asked = asked or question.objective is not ObjectiveKind.TPS
    measured = model.arrivals is not None and model.arrivals.measured
    return asked and question.objective in KINDS and measured


def closed_loop_reason(
    model: CostModel, objective: ObjectiveKind, blocked: str | None = None
) -> Reason:
    """Why an arrivals question was answered from closed levels (blocked: an option the open
    loop does not answer with)."""
    if blocked is not None:
        why = f"the open loop does not answer with {blocked}"
    elif objective not in KINDS:
        why = f"the open loop scores {' and '.join(k.value for k in KINDS)}, not {objective}"
    elif model.arrivals is None:
        why = "the fit has no arrival costs (no streamed time to first token stored)"
    else:
        why = "its prompt costs are " + "; ".join(model.arrivals.lines()[:2])
    return Reason(
        ReasonCode.CLOSED_LOOP,
        f"answered from closed levels (c streams started together): {why}; a profile with "
        "streamed rounds at two levels or more measures what arrivals cost",
    )


def _workload_of(store: Store, model: str, host: str | None) -> tuple[int, int]:
    """The profile's prompt and output tokens (what its closed levels sent)."""
    spec = validations.latest_profile_spec(store, model, host) or {}
    workload = spec.get("workload") or {}
    return int(workload.get("prompt_tokens") or 32), int(workload.get("max_tokens") or 128)


def offered(
    store: Store, question: OpenQuestion, profile_lengths: tuple[int, int], base_rate: float
) -> Offered:
    """The traffic the policies serve: drawn from the stored profile's distribution
    (tuner.twin.serving.offered_drawn; at --rate, Poisson with its lengths), or Poisson at --rate
    with the profile's lengths; --prompt-tokens and
    --output-tokens replace the lengths either way. Capacity without a rate starts from
    base_rate (its answer speeds the arrivals up or slows them down)."""
    seed = question.seed
    if question.traffic is not None:
        profile = traffic_store.load(store, question.traffic)
        if len(profile.requests) < 2 and question.rate is None:
            raise ConfigError(
                f"traffic {question.traffic!r} saw {len(profile.requests)} request(s) finish: "
                "too few to draw its arrivals from; observe it longer, or give --rate"
            )
        arrivals = {r.arrival for r in profile.requests}
        if len(arrivals) < 2 and question.rate is None:
            # e.g. one burst of streams started together: gaps of 0 s are no rate
            raise ConfigError(
                f"traffic {question.traffic!r}: its {len(profile.requests)} finished requests "
                "all arrived at once, which gives no rate to draw arrivals at; observe it "
                "longer, or give --rate"
            )
        if not profile.requests:
            raise ConfigError(
                f"traffic {question.traffic!r} saw no request finish: no lengths to draw from"
            )
        if question.prompt_tokens is not None or question.output_tokens is not None:
            profile = _with_lengths(profile, question)
        if question.rate is None:
            return offered_drawn(profile, question.traffic, seed)
        pairs = [(r.prompt, r.output) for r in profile.requests]
        return offered_poisson(
            question.rate, pairs, f"as observed in traffic {question.traffic!r}", seed
        )
    rate = question.rate
    if rate is None and question.objective is ObjectiveKind.CAPACITY:
        rate = base_rate
    if rate is None:
        raise ConfigError(
            f"--objective {question.objective} under arrivals needs an arrival rate: pass "
            "--rate (requests/s), or --traffic NAME"
        )
    prompt, output = profile_lengths
    given = [
        name
        for name, value in (
            ("--prompt-tokens", question.prompt_tokens),
            ("--output-tokens", question.output_tokens),
        )
        if value is not None
    ]
    pair = (round(question.prompt_tokens or prompt), round(question.output_tokens or output))
    said = "of the profile's requests" + (f" ({' and '.join(given)} given)" if given else "")
    return offered_poisson(rate, [pair], said, seed)


def _with_lengths(profile: TrafficProfile, question: OpenQuestion) -> TrafficProfile:
    """The profile with its requests' lengths replaced where the question gives them."""
    requests = [
        Finished(
            r.arrival,
            round(question.prompt_tokens) if question.prompt_tokens is not None else r.prompt,
            round(question.output_tokens) if question.output_tokens is not None else r.output,
        )
        for r in profile.requests
    ]
    return dataclasses.replace(profile, requests=deque(requests, maxlen=profile.requests.maxlen))


def sources_reason(
    model: CostModel, served: Offered, answer: OpenAnswer, replicates: int, depth: str
) -> Reason:
    """What came from where: the traffic, the fit's step costs and acceptance, the arrival
    costs measured or assumed, and what the simulation leaves out."""
    assert model.arrivals is not None
    acc = model.acceptance
    acceptance = (
        model.trend.text()
        if model.trend is not None
        else f"acceptance {acc.source} ({acc.mean_length:.2f} tokens a step)"
    )
    off = "its own curve" if model.off is not None else "plain's with the measured overhead"
    join = model.arrivals.join
    left_out = f"a join's own cost beyond its prompt tokens ({join.text('ms')}; not simulated)"
    return Reason(
        ReasonCode.OPEN_LOOP,
        f"open loop: every policy served {served.source} in a twin of this server made from "
        f"the fit (step costs fitted from its closed levels, the threshold server not drafting "
        f"from {off}; {acceptance}; " + "; ".join(model.arrivals.lines()[:3]) + f"); "
        f"{replicates} replicate worlds (bootstrap replicates of the fit, arrival costs drawn "
        f"within their intervals) give the spread; {answer.runs} simulated runs; {depth}; "
        f"left out: {left_out}",
    )


def depth_levels(
    store: Store, stored: StoredFit, question: OpenQuestion, served: Offered
) -> tuple[StoredFit, Levels, str]:
    """The fit the open loop runs on, where its levels were measured and what depth costs: with
    levels at two depths or more, the fit whose levels' context is nearest the traffic's and
    attention per row from the plain steps at the two depths nearest it; else the fit given,
    attention beyond its levels' context assumed free. And a line that says which."""
    prompt, output = _workload_of(store, question.model, question.host)
    requests = served.workload.requests
    context = float(np.mean([r.prompt_tokens + r.max_tokens / 2 for r in requests]))
    depths = measured_depths(store, question.model, question.host, question.host_explicit)

    def held(depth: int) -> float:  # a level's mean context while it generates
        return max(depth, prompt) + output / 2

    if len(depths) < 2:
        depth = stored.inputs.get("context_tokens", 0) or 0
        said = (
            f"context: levels at one depth ({held(depth):.0f} tokens held on average), the "
            f"traffic's {context:.0f}; attention beyond the levels' context assumed free"
        )
        return stored, Levels(prompt, output, depth), said
    fits = {
        d: current_fit(
            store,
            question.model,
            question.host,
            host_explicit=question.host_explicit,
            seed=question.seed,
            context=d,
        )
        for d in depths
    }
    nearest = sorted(depths, key=lambda d: abs(held(d) - context))
    chosen = nearest[0]
    if question.traffic is not None:
        # the acceptance seen on the traffic stands in for this depth's profile as for the fit's
        profile = traffic_store.load(store, question.traffic)
        model = observed_in_place(fits[chosen].model, profile, question.traffic, question.seed)[0]
        fits[chosen] = dataclasses.replace(fits[chosen], model=model)
    # a deep level's outputs were shortened (equal time): its rounds' own length
    output = round(mean_output_tokens(store, fits[chosen].inputs.get("levels") or []) or output)
    lo, hi = sorted(nearest[:2])
    row, slot = attention_per_1k(fits[lo].model, fits[hi].model, max(lo, prompt), max(hi, prompt))
    said = (
        f"context: the traffic's {context:.0f} tokens on average; the levels at depth {chosen} "
        f"({held(chosen):.0f} held on average) of those at {', '.join(map(str, depths))}; "
        f"attention {row:.3g} ms a decode row and {slot:.3g} ms a generating slot per 1000 "
        f"tokens, from the plain and drafting steps at depths {lo} and {hi}"
    )
    return fits[chosen], Levels(prompt, output, chosen, row, slot), said


def open_recommendation(
    store: Store, stored: StoredFit, question: OpenQuestion, table: list[TableRow]
) -> tuple[Recommendation, dict[str, Any]]:
    """The open-loop answer as a recommendation (not stored here), and its details to store."""
    if question.objective is ObjectiveKind.CAPACITY and not (question.slo_tpot_ms or 0) > 0:
        raise ConfigError(
            "--objective capacity needs --slo-tpot-ms X above 0: the p95 time per output "
            "token (ms) the highest served arrival rate must keep"
        )
    lengths = _workload_of(store, question.model, question.host)
    top = stored.model.plain_tps([stored.model.n_parallel])[0]
    # capacity's starting pace: half what plain serves at -np, in requests of these lengths
    base = float(top) / (question.output_tokens or lengths[1]) / 2
    served = offered(store, question, lengths, base)
    stored, levels, depth_said = depth_levels(store, stored, question, served)
    answer = open_answer(
        stored.model,
        served,
        question.objective,
        seed=question.seed,
        replicates=question.replicates,
        levels=levels,
        slo_tpot_ms=question.slo_tpot_ms,
    )
    sources = sources_reason(stored.model, served, answer, question.replicates, depth_said)
    rec = _as_recommendation(stored, question, answer, [answer.reasons[0], sources])
    rec.table = table
    details = {
        "open_loop": {
            "offered": served.source,
            "rate": served.rate,
            "depth": levels.depth,
            "depth_ms_per_row_per_1k": levels.depth_ms_per_row_per_1k,
            "depth_ms_per_slot_per_1k": levels.depth_ms_per_slot_per_1k,
            "values": {p.label: v for p, v in answer.values.items()},
            "samples": {p.label: v for p, v in answer.samples.items()},
        }
    }
    return rec, details


def _as_recommendation(
    stored: StoredFit, question: OpenQuestion, answer: OpenAnswer, first: list[Reason]
) -> Recommendation:
    """The answer in the recommendation's terms: first these reasons, then the answer's own."""
    return Recommendation(
        id=0,
        model=question.model,
        host=stored.inputs.get("host"),
        policy=answer.policy,
        fit_id=stored.id,
        objective=answer.objective,
        objective_interval=answer.interval(),
        host_note=stored.host_note,
        study_name=f"open-loop:fit{stored.id}",
        sampler="twin simulation",
        trials=answer.runs,
        reasons=[*first, *answer.reasons[1:]],
        alternatives=[
            {"policy": p.label, "objective": v, "difference_from_chosen": answer.objective - v}
            for p, v in sorted(answer.values.items(), key=lambda kv: kv[0].sort_key)
        ],
        objective_kind=question.objective.value,
        objective_text=answer.describe(answer.objective),
        plain_advantage=answer.plain_advantage,
        drafting_pays=not answer.plain_ahead,
    )
