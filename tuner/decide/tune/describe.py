"""The words of `tuner tune`: what a sweep compares and asks, why the answer moved, and the
reasons the recommendation it stores gives (settled, open or still moving; whether to draft
at all as measured side by side)."""

from __future__ import annotations

from tuner.decide import settle
from tuner.decide.paired import AHEAD
from tuner.decide.tune.outcome import PlainLive, TuneReport
from tuner.recommendation import Reason, ReasonCode


def sweep_text(answer: int, standing: settle.Standing) -> str:
    """What a sweep compares: each contender still measured, and why where it is not a
    plain unresolved comparison (within the tolerance or slightly behind, measured on for the
    tie)."""
    names = [f"N={c.contender}" + question_text(answer, c) for c in standing.measuring]
    return f"N={answer} against " + ", ".join(names)


def question_text(answer: int, c: settle.Comparison) -> str:
    """What a comparison measured on is asking, where it is a tie question."""
    if c.against is None:
        return ""
    if c.against == answer:
        return " (equivalent?)"
    return f" (equivalent to N={c.against}, the best estimate?)"


def moved_text(answer: int, standing: settle.Standing, sweeps: int) -> str:
    if standing.tie and standing.answer in standing.tie:
        return (
            f"N={standing.answer} is equivalent to N={answer} within the tolerance: "
            f"the smaller is the answer now (tie {standing.tie})"
        )
    comp = next(c for c in standing.comparisons if c.contender == standing.answer)
    figures = comp.advantage.figures(confidence=settle.CONFIDENCE, df=False)
    return (
        f"N={standing.answer} is ahead of N={answer}: {figures} weighted after {sweeps} "
        "sweep(s): it is the answer now"
    )


def plain_live_reason(
    live: PlainLive, answer: int, model: tuple[float, float, float] | None = None
) -> Reason:
    """Whether to draft at all, as measured side by side; where that is unresolved, with the
    model's verdict (model: plain - answer, point and one-sided bounds) beside it."""
    figures = (
        f"plain (no draft model) against N={live.against}, measured side by side (plain's "
        f"launch beside the drafting launch, in turn at every level, {live.passes} passes), "
        f"weighted, one-sided 95 % bounds: "
        f"{live.advantage.figures(confidence=settle.CONFIDENCE)}: {live.verdict}"
    )
    if live.against != answer:
        figures += (
            f"; the tie questions asked after it moved the answer to N={answer}, not measured "
            "against plain in the budget left"
        )
    if live.verdict == AHEAD:
        return Reason(
            ReasonCode.PLAIN_AHEAD,
            f"drafting does not pay for this traffic: {figures}; serve without the draft model "
            f"(N={answer} is the least costly threshold for a server that keeps it)",
        )
    if live.verdict == settle.UNRESOLVED:
        if model is not None:
            point, m_low, m_high = model
            figures += (
                f"; the model, from the profile's separate launches: {point:+.2f} tok/s "
                f"[{m_low:+.2f}, {m_high:+.2f}]"
            )
        return Reason(
            ReasonCode.PLAIN_UNRESOLVED,
            f"whether to draft at all is unresolved side by side: {figures}; the answer "
            "before it stands; more plain passes (`--plain-budget`) narrow it, though a difference "
            "near the tolerance may need more than minutes",
        )
    return Reason(ReasonCode.LIVE_TRIALS, f"drafting pays: {figures}")


def bounds_text(c: settle.Comparison, answer: int | None = None) -> str:
    text = c.advantage.figures(confidence=settle.CONFIDENCE, df=False)
    if c.against is not None and c.against != answer:
        text += f" against N={c.against}, the best estimate"
    return text


def head_reason(standing: settle.Standing, answer: int, report: TuneReport) -> Reason:
    pairs = sum(d.n for d in report.gains.values())
    how = f"{report.sweeps} sweep(s), {pairs} pairs, {report.seconds:.0f} s, {report.way}"
    if standing.status == settle.SETTLED:
        edge = [standing.question(n) for n in standing.edge]
        return Reason(
            ReasonCode.SETTLED,
            f"N={answer}: every contender shown behind or within +-{standing.tolerance:.2f} "
            f"tok/s (one-sided 95 %) live ({how})"
            + "".join(
                f"; N={q.contender} sits at the tolerance's edge ({bounds_text(q, answer)}): "
                f"neither equivalent nor clearly beyond, so the better N={answer} stands"
                for q in edge
                if q is not None
            ),
        )
    if standing.status == settle.OPEN:
        parts = []
        if standing.unresolved:
            parts.append(
                "the data show neither a difference nor equivalence for "
                + ", ".join(f"N={c.contender}" for c in standing.unresolved)
            )
        parts += [
            f"N={c.contender} may tie with it: {bounds_text(c, answer)}, not yet shown within "
            f"+-{standing.tolerance:.2f} or beyond"
            for c in standing.tie_questions
        ]
        return Reason(
            ReasonCode.UNRESOLVED,
            f"N={answer} stands, but "
            + "; ".join(parts)
            + f" ({how}); measure next at "
            + ", ".join(f"{c} streams" for c in standing.measure_next),
        )
    return Reason(ReasonCode.LIVE_TRIALS, f"N={answer}: the answer kept moving ({how})")
