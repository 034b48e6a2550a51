"""Acceptance observed on the server's own traffic, in place of the profile's: what `recommend
--traffic NAME` asks of the traffic profile before it searches.

The profile measured acceptance on its own prompts (or a synthetic --spec-synth-len); what the
server's users send may accept more or less. Where the traffic profile holds enough of the
server's own counters (tuner.model.acceptance.ObservedAcceptance.enough: at least MIN_DRAFTS
drafts over MIN_READINGS readings, the 90 % interval of the mean accepted length within
MAX_HALF_WIDTH of it), its per-position rates replace the profile's at every level the model
drafts, the fitted step times unchanged, and each bootstrap replicate draws its rates from the
observed estimate's spread, so the answer's interval carries it. Otherwise the profile's
acceptance stands, and the reason says why: nothing drafted while observed (every step above
N, or no draft model), no counters, too few, or a server that drafts fewer positions than the
profile's n_max.
"""

from __future__ import annotations

from typing import Any

from tuner.model.acceptance import ObservedAcceptance, observed_acceptance
from tuner.model.costmodel import CostModel
from tuner.recommendation import Reason, ReasonCode
from tuner.traffic import TrafficProfile

SOURCE = "observed"


def observed_in_place(
    cm: CostModel, profile: TrafficProfile, name: str, seed: int = 0
) -> tuple[CostModel, Reason, dict[str, Any] | None]:
    """The model with the traffic's observed acceptance where it is enough (see the module
    docstring), the reason that says which acceptance the answer rests on, and what the study
    is of (None: the profile's acceptance, nothing to add)."""
    observed = observed_acceptance(profile.acceptance)
    own = cm.acceptance
    theirs = f"the profile's ({own.expected(own.n_max):.2f} tokens a drafting step) stands"
    if not own.supports_other_n or own.rates is None:
        return cm, _said(f"the fit has no acceptance of its own to replace: {theirs}"), None
    if observed is None:
        why = (
            "no draft was made while it was observed (every step had more slots generating "
            "than N, or the server has no draft model)"
            if profile.acceptance.readings
            else "it holds no acceptance counters (observed without /metrics)"
        )
        if profile.acceptance.dropped:
            why += f"; {profile.acceptance.dropped} interval(s) left out after a restart"
        return cm, _said(f"traffic {name!r}: {why}: {theirs}"), None
    seen = _seen(observed)
    short = observed.enough()
    if short is not None:
        return (
            cm,
            _said(
                f"acceptance observed on traffic {name!r}, {seen}, is not enough "
                f"({short}): {theirs}"
            ),
            None,
        )
    rates = observed.rates_at(cm.n_max)
    if rates is None:
        positions = len(observed.rates or ())
        return (
            cm,
            _said(
                f"acceptance observed on traffic {name!r} covers draft positions 1..{positions}, "
                f"the fit drafts {cm.n_max}: {theirs}"
            ),
            None,
        )
    draws = observed.draws(len(cm.replicates), cm.n_max, seed)
    factor, where = _to_reference(cm, profile)
    rates = _scaled(rates, factor)
    draws = [_scaled(d, factor) for d in draws]
    model = cm.with_acceptance(rates, draws, SOURCE)
    inferred = "" if observed.rates is not None else " (per-position rates inferred from the mean)"
    reason = _said(
        f"acceptance observed on traffic {name!r}, {seen}{inferred}, in place of the profile's "
        f"{own.expected(own.n_max):.2f} at every level the model drafts{where}; the replicates "
        "draw it within its spread"
    )
    return model, reason, {"acceptance": [round(v, 6) for v in rates]}


def drafting_mix(profile: TrafficProfile, n_parallel: int) -> dict[int, float] | None:
    """The drafts behind the observed counters by the slots drafting together: a step with c
    generating drafts c times where the threshold the server ran (profile.max_slots) lets it
    (c <= N; every c at N = 0), the time at c standing for its steps; None where that threshold
    is unknown or nothing was observed where it drafts."""
    if profile.max_slots is None:
        return None
    top = n_parallel if profile.max_slots <= 0 else profile.max_slots
    weights = {c: s * c for c, s in profile.seconds.items() if 1 <= c <= top and s > 0}
    total = sum(weights.values())
    return {c: w / total for c, w in sorted(weights.items())} if total > 0 else None


def _to_reference(cm: CostModel, profile: TrafficProfile) -> tuple[float, str]:
    """Where acceptance falls with the slots drafting together (the fit's trend), what the
    counters saw is the traffic's acceptance at the drafting slots it was seen at, not at the
    trend's reference: the factor that takes it there (the trend's value at its reference over
    its drafts-weighted value over the observed mix), and what was done, in words. The trend
    then moves it level by level as it moves the profile's."""
    trend = cm.trend
    if trend is None or not trend.moving:
        return 1.0, ""
    mix = drafting_mix(profile, cm.n_parallel)
    if mix is None:
        return 1.0, (
            " (taken at the trend's reference: the threshold the traffic was served at, and so "
            "the slots its drafts were made with, is unknown)"
        )
    seen_at = sum(share * float(trend.accepted_at(c)) for c, share in mix.items())
    if seen_at <= 0:
        return 1.0, ""
    slots = sum(share * c for c, share in mix.items())
    return trend.accepted / seen_at, (
        f", moved from the {slots:.1f} slots drafting together it was seen at to the trend's "
        f"reference {trend.reference:.1f} (x{trend.accepted / seen_at:.3f}), the trend moving it "
        "by level from there"
    )


def _scaled(rates: tuple[float, ...] | list[float], factor: float) -> tuple[float, ...]:
    """Per-position rates scaled by a factor, each within [0, 1] and not rising with position."""
    out, top = [], 1.0
    for r in rates:
        top = min(top, max(0.0, min(1.0, r * factor)))
        out.append(top)
    return tuple(out)


def _seen(observed: ObservedAcceptance) -> str:
    if observed.readings < 2:  # an interval needs two readings at least
        return (
            f"{observed.mean_length:.2f} tokens a drafting step (no interval from "
            f"{observed.drafts:.0f} drafts in one reading)"
        )
    lo, hi = observed.interval()
    return (
        f"{observed.mean_length:.2f} tokens a drafting step [{lo:.2f}, {hi:.2f}] (90 %, "
        f"{observed.drafts:.0f} drafts in {observed.readings} readings)"
    )


def _said(text: str) -> Reason:
    return Reason(ReasonCode.OBSERVED_ACCEPTANCE, text)


def acceptance_line(profile: TrafficProfile) -> str:
    """What a traffic profile holds of the server's acceptance, in one line (observe's end)."""
    counts = profile.acceptance
    observed = observed_acceptance(counts)
    dropped = f"; {counts.dropped} interval(s) left out after a restart" if counts.dropped else ""
    if observed is None:
        if not counts.readings:
            return "acceptance: no draft counters were read (no /metrics, or no drafting server)"
        return (
            f"acceptance: no draft was made in {counts.readings} readings ({counts.tokens:.0f} "
            "tokens generated): every step had more slots generating than N, or the server has "
            f"no draft model; recommend keeps the profile's{dropped}"
        )
    short = observed.enough()
    use = (
        "`recommend --traffic` uses it in place of the profile's"
        if short is None
        else f"not enough to stand in for the profile's ({short})"
    )
    return f"acceptance observed: {_seen(observed)}; {use}{dropped}"
