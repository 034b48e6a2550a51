"""Settling N on live measurements: which comparisons decide it, what to measure next, when to
stop. Pure: measurements in, a standing out; `tuner tune` runs it against a backend.

Over the drafting server's policies the workload-weighted objective is
V(N) = sum_{c <= N} w_c on(c) + sum_{c > N} w_c off(c), so for M > N
V(M) - V(N) = sum_{c = N+1..M} w_c g(c), with g(c) = on(c) - off(c) the gain of drafting at c on
the same server (measured as paired rounds on one launch). Always draft is N = n_parallel.
Elsewhere two policies are the same server, and their difference is zero by construction.

The answer's contenders are N-2, N-1, N+1, N+2, always draft and any larger value the answer held
before (a tie that moved it down keeps in view the values it left). Each contender's advantage over
the answer is a `Contrast` of the levels between them; its one-sided bound at 95 % settles it:
ahead (the answer moves to it), behind or within the tolerance (the answer holds), or
unresolved (measure more where the contrast's variance is). Values of N whose advantage over the
best is shown within +-tolerance both ways are a tie: at most three (the best and the smallest
values equivalent to it), the smallest chosen. So a
smaller contender that is only within the tolerance (at most that much ahead, but perhaps far
behind), or behind by what may be less than the tolerance, stays open until it is shown
equivalent (the tie rule then takes it) or more than the tolerance behind: else two runs on the
same server could stop at different ends of one tie. Where a larger contender is the best
estimate, that question is asked against it, the value the tie is measured from: asked against
the answer, a smaller value shown equivalent to the answer but not yet to the best fell out of
the tie unasked, and which values were contenders (N-2..N+2 of the answer of the moment)
decided the tie (from N=4, an N=3 shown equivalent to N=4 but not yet to the best estimate
N=6 falls out of a tie [4, 5, 6], where a path that reached N=3 first, N=6 no contender there,
keeps [3, 4, 5]). A
difference at the tolerance itself would take pairs without end to place: once its bounds are
within half the tolerance of it without a side, the smaller value is at the edge, named, and
the better one stands. When
the budget runs out first, the standing says which contenders are unresolved, with their bounds,
and names the levels to measure next.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.decide.paired import (
    AHEAD,
    BEHIND,
    UNRESOLVED,
    WITHIN,
    Contrast,
    LevelDiffs,
    equivalent,
    verdict,
)

TOLERANCE = 0.01  # of the answer's objective: a contender this close is not worth a change
CONFIDENCE = 0.95  # one-sided, per bound
MAX_TIE = 3
# A tie question placed this finely (its one-sided bounds within this share of the tolerance
# of its estimate) without a side sits at the tolerance itself: more pairs would only place
# it more finely, at a cost without end as the difference nears the tolerance. The better
# (larger) value stands, and the smaller is named as at the edge.
TIE_EDGE = 0.5
SETTLED, MOVED, OPEN = "settled", "moved", "unresolved"


def contenders(
    answer: int,
    n_parallel: int,
    kept: Sequence[int] = (),
    allowed: Collection[int] | None = None,
) -> list[int]:
    """N-2, N-1, N+1, N+2 and always draft (n_parallel), within 1..n_parallel, then the
    values in `kept` (larger answers a tie moved down from: see assess); only those in
    `allowed` where it is given (watch --experiment: the model's tie set and neighbours)."""
    near = [answer - 2, answer - 1, answer + 1, answer + 2, n_parallel, *sorted(kept)]
    out: list[int] = []
    for m in near:
        if allowed is not None and m not in allowed:
            continue
        if 1 <= m <= n_parallel and m != answer and m not in out:
            out.append(m)
    return out


def measured_best(
    gains: Mapping[int, LevelDiffs], weights: Sequence[float], n_parallel: int
) -> int | None:
    """The N the measured gains put first, by their point estimates: V(N) - V(1) is the sum of
    w_c g(c) over c = 2..N, so where every weighted level above one has paired gains, each N's
    value is known from the data alone, however far from the answer it lies (a gain that
    changes sign twice can put the best N where no N-2..N+2 of the model's answer reaches);
    the smaller N on a tie. None where a weighted level has no gains yet."""
    total, best, best_value = 0.0, 1, 0.0
    for c in range(2, n_parallel + 1):
        w = weights[c - 1] if c - 1 < len(weights) else 0.0
        if w > 0:
            diffs = gains.get(c)
            if diffs is None or diffs.n == 0:
                return None
            total += w * diffs.mean
        if total > best_value:
            best, best_value = c, total
    return best


def between(n: int, m: int) -> list[int]:
    """The levels where thresholds n and m differ: the one above the smaller drafts there."""
    lo, hi = sorted((n, m))
    return list(range(lo + 1, hi + 1))


def advantage(
    gains: Mapping[int, LevelDiffs], weights: Sequence[float], answer: int, contender: int
) -> Contrast:
    """V(contender) - V(answer) from the paired gains at the levels between them (weights[c-1]
    is level c's)."""
    sign = 1.0 if contender > answer else -1.0
    coef = {c: sign * weights[c - 1] for c in between(answer, contender)}
    return Contrast.of(gains, coef)


@dataclass
class Comparison:
    """One contender against the answer."""

    contender: int
    advantage: Contrast
    verdict: str
    levels: list[int]
    # a tie question: the N it is held against (the answer, or the best estimate where a larger
    # contender is); None for a comparison with the answer
    against: int | None = None

    def as_dict(self) -> dict[str, Any]:
        low, high = self.advantage.bounds(CONFIDENCE)
        out = {
            "contender": self.contender,
            "advantage": self.advantage.estimate,
            "se": self.advantage.se,
            "df": self.advantage.df,
            "lower": low,
            "upper": high,
            "verdict": self.verdict,
            "levels": self.levels,
        }
        if self.against is not None:
            out["against"] = self.against
        return out


@dataclass
class Standing:
    """Where the live comparisons leave the answer."""

    answer: int
    status: str  # settled | moved | unresolved
    comparisons: list[Comparison]
    tie: list[int] = field(default_factory=list)
    measure_next: list[int] = field(default_factory=list)  # levels, when unresolved
    tolerance: float = 0.0  # in objective units (tok/s)
    # when unresolved: the comparisons measured next (unresolved ones, and tie questions, each
    # against the N it is asked against, neither shown equivalent nor beyond it: tie_open)
    measuring: list[Comparison] = field(default_factory=list)
    # smaller contenders whose tie question was placed at the tolerance's edge (TIE_EDGE)
    edge: list[int] = field(default_factory=list)
    # every tie question of the standing, open or not, against the N it is asked against
    questions: list[Comparison] = field(default_factory=list)
    # when unresolved: the tie the data show so far (tie_set), the answer's until it settles
    provisional: list[int] = field(default_factory=list)

    @property
    def unresolved(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict == UNRESOLVED]

    @property
    def tie_questions(self) -> list[Comparison]:
        """The tie questions measured on (tie_open), not unresolved comparisons."""
        return [c for c in self.measuring if c.against is not None]

    def question(self, contender: int) -> Comparison | None:
        """The tie question asked for this contender, if one was."""
        return next((q for q in self.questions if q.contender == contender), None)

    @property
    def may_tie(self) -> list[int]:
        """The tie (where unresolved, the values shown equivalent to the best so far), with the
        smaller values whose tie question is still open or at the edge: the values the data
        do not yet keep apart at the tolerance. Two runs agree when each one's set holds the
        other's answer."""
        open_ties = [c.contender for c in self.tie_questions]
        return sorted({self.answer, *self.tie, *self.provisional, *open_ties, *self.edge})


def level_pairs(levels: Mapping[int, LevelDiffs]) -> dict[int, int]:
    return {c: d.n for c, d in levels.items()}


def assess(
    gains: Mapping[int, LevelDiffs],
    weights: Sequence[float],
    answer: int,
    n_parallel: int,
    objective: float,
    tolerance: float = TOLERANCE,
    confidence: float = CONFIDENCE,
    kept: Sequence[int] = (),
    allowed: Collection[int] | None = None,
) -> Standing:
    """The answer against its contenders on the gains measured so far (see the module
    docstring). objective: the answer's objective value, which the tolerance is a share of.
    kept: larger values the answer held before a tie moved it down, kept as contenders: a tie
    is measured from the best estimate among the contenders, and from N=2 moved to N=1 the
    N=4 it left is no N+-2, so each move could take the answer another tolerance down the
    slope with none of the values it left in view (N=4, N=2, N=1, each step within the
    tolerance of the last, the last not within it of the first); tune adds the N the
    measured gains put first (measured_best), which no N+-2 may reach.
    allowed: the only values that may be contenders (None: any)."""
    tol = tolerance * abs(objective)
    comparisons = []
    for m in contenders(answer, n_parallel, kept, allowed):
        adv = advantage(gains, weights, answer, m)
        comparisons.append(Comparison(m, adv, verdict(adv, tol, confidence), between(answer, m)))
    ahead = [c for c in comparisons if c.verdict == AHEAD]
    if ahead:
        best = max(ahead, key=lambda c: (c.advantage.estimate, -c.contender))
        return Standing(best.contender, MOVED, comparisons, tolerance=tol)
    questions = tie_questions(gains, weights, answer, comparisons, tol, confidence)
    edge = [q.contender for q in questions if at_edge(q, tol, confidence)]
    open_ = [c for c in comparisons if c.verdict == UNRESOLVED]
    open_ += [q for q in questions if tie_open(q, tol, confidence)]
    tie = tie_set(gains, weights, answer, comparisons, tol, confidence)
    if open_:
        wanted = next_levels(gains, weights, open_)
        return Standing(
            answer,
            OPEN,
            comparisons,
            measure_next=wanted,
            tolerance=tol,
            measuring=open_,
            edge=edge,
            questions=questions,
            provisional=tie,
        )
    if min(tie) != answer:
        # A smaller N is shown equivalent: it becomes the answer, and its own contenders
        # (further down) are compared next.
        return Standing(min(tie), MOVED, comparisons, tie=tie, tolerance=tol, questions=questions)
    return Standing(
        answer, SETTLED, comparisons, tie=tie, tolerance=tol, edge=edge, questions=questions
    )


def best_estimate(answer: int, comparisons: Sequence[Comparison]) -> int:
    """The value the estimates put first (the answer at 0), the smaller on a tie of estimates."""
    estimate = {answer: 0.0, **{c.contender: c.advantage.estimate for c in comparisons}}
    return max(estimate, key=lambda n: (estimate[n], -n))


def tie_questions(
    gains: Mapping[int, LevelDiffs],
    weights: Sequence[float],
    answer: int,
    comparisons: Sequence[Comparison],
    tol: float,
    confidence: float = CONFIDENCE,
) -> list[Comparison]:
    """A tie question for every smaller contender within the tolerance of the answer or behind
    it: its advantage over the best estimate where a larger contender is the best (the value
    the tie is measured from), else over the answer."""
    against = max(best_estimate(answer, comparisons), answer)
    out = []
    for c in comparisons:
        if c.contender > answer or c.verdict not in (WITHIN, BEHIND):
            continue
        adv = advantage(gains, weights, against, c.contender)
        levels = between(against, c.contender)
        out.append(Comparison(c.contender, adv, verdict(adv, tol, confidence), levels, against))
    return out


def tie_open(q: Comparison, tol: float, confidence: float = CONFIDENCE) -> bool:
    """A tie question (tie_questions) still open: neither shown equivalent nor shown more than
    the tolerance behind the value it is asked against. Settled
    on "behind" alone (the upper bound below zero), two runs on one server could stop at
    different ends of one tie: one that showed the smaller value equivalent first would choose
    it, one that showed it slightly behind first would keep the larger. At most one of
    "equivalent" and "more than the tolerance behind" is true (each wrongly shown at most 5 %
    of the time), so runs agree; a truth near the tolerance itself takes long to place: once
    placed within TIE_EDGE of the tolerance without a side it is at the edge (at_edge), no
    longer measured."""
    return _unplaced(q, tol, confidence) and not at_edge(q, tol, confidence)


def at_edge(q: Comparison, tol: float, confidence: float = CONFIDENCE) -> bool:
    """A tie question placed within TIE_EDGE of the tolerance without a side: neither
    equivalent nor more than the tolerance behind, and no longer measured."""
    if not _unplaced(q, tol, confidence):
        return False
    low, high = q.advantage.bounds(confidence)
    return (high - low) / 2 <= TIE_EDGE * tol


def _unplaced(q: Comparison, tol: float, confidence: float) -> bool:
    """Neither shown equivalent nor shown more than the tolerance behind."""
    if equivalent(q.advantage, tol, confidence):
        return False
    return q.advantage.bounds(confidence)[1] > -tol


def tie_set(
    gains: Mapping[int, LevelDiffs],
    weights: Sequence[float],
    answer: int,
    comparisons: Sequence[Comparison],
    tol: float,
    confidence: float = CONFIDENCE,
) -> list[int]:
    """The answer and the contenders shown equivalent to the best of them (both one-sided
    bounds of the difference within +-tol), at most MAX_TIE: the best and the smallest values
    equivalent to it, so that the answer (the tie's smallest) is the smallest value shown
    equivalent to the best whichever neighbours were contenders. Kept nearest the best
    instead, a flat stretch of four values gave [3, 4, 5] from N=3 and [4, 5, 6] from N=4."""
    best = best_estimate(answer, comparisons)
    members = [best]
    for n in sorted({answer, *(c.contender for c in comparisons)}):
        if n == best or len(members) >= MAX_TIE:
            continue
        if equivalent(advantage(gains, weights, best, n), tol, confidence):
            members.append(n)
    if answer not in members and best != answer:
        # The answer held against every contender, yet another is the estimate's best: the
        # answer is within the tolerance of it (its comparison said so), so both stand.
        members = [best, answer][:MAX_TIE]
    return sorted(members)


def next_levels(
    gains: Mapping[int, LevelDiffs], weights: Sequence[float], open_: Sequence[Comparison]
) -> list[int]:
    """The levels an unresolved comparison rests on, those with fewer than two pairs first,
    then by how much one more pair there would shrink the contrasts' variance."""

    def value(c: int) -> float:
        d = gains.get(c)
        if d is None or d.n < 2:
            return math.inf
        resting = sum(c in comp.levels for comp in open_)
        return resting * weights[c - 1] ** 2 * d.sd**2 * (1 / d.n - 1 / (d.n + 1))

    levels = sorted({c for comp in open_ for c in comp.levels})
    return sorted(levels, key=lambda c: -value(c))


def gains_from_rounds(
    rounds: Mapping[int, Mapping[str, Mapping[Any, float]]], keyed: bool = False
) -> dict[int, Any]:
    """Paired on - off differences per level from rounds keyed (level -> arm -> pair key ->
    tok/s), arm "on" or "off": one difference per pair key both arms measured; keyed: as
    {pair key: difference} per level instead of LevelDiffs."""
    out: dict[int, Any] = {}
    for c, arms in rounds.items():
        on, off = arms.get("on", {}), arms.get("off", {})
        keys = sorted(on.keys() & off.keys())
        diffs = {k: on[k] - off[k] for k in keys}
        out[c] = diffs if keyed else LevelDiffs(tuple(diffs.values()))
    return out


__all__ = [
    "AHEAD",
    "BEHIND",
    "MOVED",
    "OPEN",
    "SETTLED",
    "TIE_EDGE",
    "TOLERANCE",
    "UNRESOLVED",
    "WITHIN",
    "Comparison",
    "Standing",
    "advantage",
    "assess",
    "at_edge",
    "best_estimate",
    "between",
    "contenders",
    "gains_from_rounds",
    "next_levels",
    "tie_open",
    "tie_questions",
    "tie_set",
]
