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
    model = cm.with_acceptance(rates, draws, SOURCE)
    inferred = "" if observed.rates is not None else " (per-position rates inferred from the mean)"
    reason = _said(
        f"acceptance observed on traffic {name!r}, {seen}{inferred}, in place of the profile's "
        f"{own.expected(own.n_max):.2f} at every level the model drafts; the replicates draw "
        "it within its spread"
    )
    return model, reason, {"acceptance": [round(v, 6) for v in rates]}


def _seen(observed: ObservedAcceptance) -> str:
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
