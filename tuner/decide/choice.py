"""Where the threshold is decided: the rule that turns the search's evaluations into N.

1. The model's optimum, kept inside what the measurements show: spec measured ahead at c means
   N >= c, measured behind at c means N < c.
2. One-standard-error rule: among values of N within the model's uncertainty of that pick (the
   spread of the objective difference over the bootstrap replicates), the smaller N, saying so.
3. Why, in terms of levels, and which unmeasured levels the choice rests on while the data
   cannot decide their sign (measure next).
4. Draft at all? The chosen N against plain (no draft model loaded), see PlainVerdict: where
   plain is shown ahead, drafting does not pay for this traffic, and the answer says so first
   (N stays the least costly threshold for a server that keeps its draft).

Every reason carries a code (ReasonCode) beside its text, so programs and tests read the code.
Pure: reads only the cost model and the study's evaluations (tuner.decide.search).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.decide.objective import Objective
from tuner.decide.search import Evaluation, SearchResult, evaluate, preference
from tuner.model.costmodel import CostModel, Gain
from tuner.policy import Policy
from tuner.recommendation import Reason, ReasonCode


@dataclass
class Choice:
    """The chosen policy with the reasons, the levels worth measuring next, the alternatives."""

    policy: Policy  # at an explicit n_max
    objective: float
    objective_interval: tuple[float, float]
    model_optimum: int
    reasons: list[Reason]
    measure_next: list[int]
    alternatives: list[dict[str, Any]]
    plain: PlainVerdict  # draft at all?


def _bracket(gains: dict[int, float], n_parallel: int) -> tuple[int, int] | None:
    """(lo, hi): spec measured ahead up to lo and behind from hi; None when signs alternate."""
    levels = sorted(gains)
    ahead = [gains[c] > 0 for c in levels]
    if any(not a and b for a, b in itertools.pairwise(ahead)):
        return None
    lo = max((c for c, a in zip(levels, ahead, strict=True) if a), default=0)
    hi = min((c for c, a in zip(levels, ahead, strict=True) if not a), default=n_parallel + 1)
    return lo, hi


def _pct(value: float) -> str:
    return f"{100 * value:+.1f}%"


def _streams(c: int) -> str:
    return f"{c} stream" + ("" if c == 1 else "s")


def _level_gain(gain: Gain, gains_measured: dict[int, float], c: int) -> str:
    p, lo, hi, _ = gain.at(c)
    text = f"{_pct(p)} [{_pct(lo)}, {_pct(hi)}] at {c}"
    if c in gains_measured:
        text += f" (measured {_pct(gains_measured[c])})"
    return text


def choose(model: CostModel, result: SearchResult, gains_measured: dict[int, float]) -> Choice:
    """Apply the measurement bracket and the one-standard-error rule to the study's optimum.

    The study picks (N, n_max); every N at that n_max was evaluated by the study too, so the
    rules see the whole row.
    """
    npar = model.n_parallel
    best = result.best
    optimum = best.policy.max_slots
    assert optimum is not None  # the study searches drafting policies only
    unit = result.objective.unit if result.objective else "tok/s"
    n = best.policy.n_max or model.n_max
    values: dict[int, Evaluation] = {N: e for N, e in result.row(n).items() if e.feasible}
    eff = {N: e.policy.effective(npar) for N, e in values.items()}
    # 1. Keep to what the measurements show (they were taken at the profiled n_max).
    measured = gains_measured if n == model.n_max else {}
    allowed, bracket, reasons = _keep_to_measurements(values, eff, measured, model, best)
    pick = min(
        allowed, key=lambda N: (-values[N].value, preference(values[N].policy, npar, model.n_max))
    )
    if optimum not in allowed:
        reasons.append(
            Reason(
                ReasonCode.MEASUREMENTS_OVERRULE,
                f"the model's optimum N={optimum} contradicts the measurements "
                f"(spec measured ahead up to {_streams(bracket[0]) if bracket else '?'}); "
                f"keeping N={pick}, the best the measurements allow",
            )
        )
    chosen = _one_standard_error(values, eff, allowed, pick, unit, reasons)
    # 3. Why, in terms of levels.
    # Thresholds N and N+1 differ only at N+1, where one drafts and the other does not: the
    # gain that places N is spec against the threshold server not drafting (plain at 1 stream).
    gain = model.gain(n, against="off")
    reasons.insert(0, _level_reason(model, n, gain, gains_measured, eff[chosen]))
    if n != model.n_max:
        reasons.append(_n_max_reason(model, n))
    measure_next = _measure_next(gain, bracket, npar, gains_measured, eff[chosen], reasons)
    plain = _plain_verdict(model, result, values[chosen])
    said = plain.reason(values[chosen].value, unit)
    if said is not None:
        reasons.insert(0, said)
    samples = np.asarray(values[chosen].samples)
    if len(samples):
        obj_lo, obj_hi = model.bounds(samples[:, None])
        interval = (float(np.ravel(obj_lo)[0]), float(np.ravel(obj_hi)[0]))
    else:
        interval = (values[chosen].value, values[chosen].value)
    alternatives = [
        {
            "max_slots": N,
            "objective": values[N].value,
            "difference_from_chosen": values[chosen].value - values[N].value,
        }
        for N in sorted(values, key=eff.__getitem__)
    ]
    return Choice(
        values[chosen].policy,
        values[chosen].value,
        interval,
        optimum,
        reasons,
        measure_next,
        alternatives,
        plain,
    )


def _keep_to_measurements(
    values: dict[int, Evaluation],
    eff: dict[int, int],
    gains_measured: dict[int, float],
    model: CostModel,
    best: Evaluation,
) -> tuple[set[int], tuple[int, int] | None, list[Reason]]:
    """Rule 1: the values of N the measured gains (at the profiled n_max; {} at another)
    allow, their bracket, and the reason where they change sign more than once."""
    allowed = set(values)
    reasons: list[Reason] = []
    bracket = _bracket(gains_measured, model.n_parallel) if gains_measured else None
    if gains_measured and bracket is None:
        reasons.append(
            Reason(
                ReasonCode.NOISY_GAINS,
                "the measured gains change sign more than once ("
                + ", ".join(f"{c}: {_pct(g)}" for c, g in gains_measured.items())
                + "): noisy measurements? the model decides alone",
            )
        )
    if bracket is not None:
        lo, hi = bracket
        inside = {N for N in allowed if max(lo, 1) <= eff[N] <= max(hi - 1, 1)}
        if inside:
            allowed = inside
    return allowed, bracket, reasons


def _one_standard_error(
    values: dict[int, Evaluation],
    eff: dict[int, int],
    allowed: set[int],
    pick: int,
    unit: str,
    reasons: list[Reason],
) -> int:
    """Rule 2: the smallest N whose objective is within the model's uncertainty of the pick
    (its reason added to `reasons`), else the pick."""
    for N in sorted(allowed, key=eff.__getitem__):
        if eff[N] >= eff[pick]:
            break
        diff = np.asarray(values[pick].samples) - np.asarray(values[N].samples)
        point = values[pick].value - values[N].value
        sd = float(np.std(diff, ddof=1)) if len(diff) > 1 else 0.0
        if point <= sd:
            reasons.append(
                Reason(
                    ReasonCode.WITHIN_UNCERTAINTY,
                    f"N={N} and N={pick} are within the model's uncertainty of each other "
                    f"(objective {values[N].value:.4g} vs {values[pick].value:.4g} {unit}, "
                    f"difference {point:.3g} ± {sd:.3g}): preferring the smaller N",
                )
            )
            return N
    return pick


def least_bad_within(
    values: Mapping[Policy, float],
    samples: Mapping[Policy, Sequence[float]],
    ranked: Sequence[Policy],
    order: Callable[[Policy], int],
) -> tuple[Policy, list[Policy], dict[Policy, float]]:
    """Among the policies whose shortfall from the best (`ranked[0]`, by the point estimate) is
    within the spread of their paired difference over the replicates (the same spread rule 2
    reads), the one whose worst case over the replicates and the point estimate is least bad:
    its largest shortfall from the best of them in any one replicate, as a share; equal worst
    cases go to the smaller `order`. Returns it, the policies within, and each one's worst
    case. Higher values are better."""
    best = ranked[0]
    within = [best]
    for p in ranked[1:]:
        diff = np.asarray(samples[best]) - np.asarray(samples[p])
        sd = float(np.std(diff, ddof=1)) if len(diff) > 1 else 0.0
        if values[best] - values[p] <= sd:
            within.append(p)
    draws = min((len(samples[p]) for p in within), default=0)
    worlds = [dict(values)] + [{p: samples[p][r] for p in within} for r in range(draws)]
    worst: dict[Policy, float] = {}
    for p in within:
        shortfalls = []
        for w in worlds:
            top = max(w[q] for q in within)
            shortfalls.append((top - w[p]) / abs(top) if top else 0.0)
        worst[p] = max(shortfalls)
    chosen = min(within, key=lambda p: (worst[p], order(p)))
    return chosen, within, worst


def _level_reason(
    model: CostModel, n: int, gain: Gain, gains_measured: dict[int, float], chosen_eff: int
) -> Reason:
    """Why the chosen N, in terms of levels: plain everywhere, drafting everywhere, or where
    drafting stops paying."""
    npar = model.n_parallel
    if gain.point[0] < 0 and (not gains_measured or gains_measured.get(1, -1) < 0):
        return Reason(
            ReasonCode.PLAIN_EVERYWHERE,
            "plain beats spec even at 1 stream: N=1 drafts the least a threshold can; "
            "consider running without drafting",
        )
    if chosen_eff >= npar:
        return Reason(
            ReasonCode.SPEC_EVERYWHERE,
            f"drafting is ahead of not drafting at every level up to {_streams(npar)}: "
            "N=0 (no limit, the server's default)",
        )
    cross = model.crossover(n, against="off")
    where = (
        f"crossover near {cross.streams:.1f} streams [{cross.lower:.1f}, {cross.upper:.1f}]"
        if cross.streams is not None
        else "no crossover inside 1..n_parallel"
    )
    return Reason(
        ReasonCode.CROSSOVER,
        f"N={chosen_eff}: drafting up to {_streams(chosen_eff)}, not above; drafting vs "
        "the threshold server not drafting "
        f"{_level_gain(gain, gains_measured, chosen_eff)}, "
        f"{_level_gain(gain, gains_measured, chosen_eff + 1)}; {where}",
    )


def _n_max_reason(model: CostModel, n: int) -> Reason:
    """The draft length chosen was not the one measured: what its predictions rest on."""
    return Reason(
        ReasonCode.UNMEASURED_N_MAX,
        f"n_max {n} was not measured (the profile used {model.n_max}): its predictions "
        + (
            "take the verify cost from the kernel rows"
            if len(model.verify) > 1
            else "assume the step cost linear in the draft length (no kernel rows)"
        )
        + f" and acceptance {model.acceptance.source} per position",
    )


def _measure_next(
    gain: Gain,
    bracket: tuple[int, int] | None,
    npar: int,
    gains_measured: dict[int, float],
    chosen_eff: int,
    reasons: list[Reason],
) -> list[int]:
    """Rule 3's levels worth measuring: unmeasured levels the choice rests on, whose sign is
    uncertain; a reason for each unmeasured level and for what to measure next added to
    `reasons`."""
    levels = list(range(1, npar + 1))
    measure_next: list[int] = []
    if bracket is not None:
        lo, hi = bracket
        gap = [c for c in levels if lo < c < hi and c not in gains_measured]
    else:
        gap = [c for c in levels if c not in gains_measured and abs(c - chosen_eff - 0.5) <= 1]
    for c in gap:
        p, lo_c, hi_c, _ = gain.at(c)
        undecided = lo_c < 0 < hi_c
        if undecided:
            measure_next.append(c)
        reasons.append(
            Reason(
                ReasonCode.UNMEASURED_LEVEL,
                f"{_streams(c)} not measured: the model puts spec at {_pct(p)} "
                f"[{_pct(lo_c)}, {_pct(hi_c)}] there"
                + (" -- the data cannot decide it" if undecided else ""),
            )
        )
    if measure_next:
        # No command here: which one measures them depends on how the data were made
        # (Recommendation.measure_command names it beside the answer).
        reasons.append(
            Reason(
                ReasonCode.MEASURE_NEXT,
                f"measure {', '.join(_streams(c) for c in measure_next)} next, then recommend "
                "again",
            )
        )
    return measure_next


def _plain_verdict(model: CostModel, result: SearchResult, chosen: Evaluation) -> PlainVerdict:
    goal = result.objective if result.objective is not None else np.asarray(result.weights)
    return plain_verdict(model, goal, chosen)


@dataclass(frozen=True)
class PlainVerdict:
    """Draft at all? The chosen policy against plain (no draft model loaded).

    Shown ahead one of two ways: plain's objective above the chosen's at the one-sided 95 %
    bound over the bootstrap replicates (paired: each replicate scores both); or spec behind
    plain at that bound at every level the policy drafts at, since where a threshold server
    does not draft it runs the same target steps as plain with a draft model beside them, and
    is no faster. Plain and drafting are separate launches, so this is the one question that
    rests on rows measured across launches."""

    chosen: int  # the policy's N
    advantage: tuple[float, float, float] | None  # plain - chosen objective: point, low, high
    # where the policy drafts and spec is behind plain there: (c, point, low, high) per level,
    # empty unless spec is shown behind at every such level
    behind: tuple[tuple[int, float, float, float], ...] = ()
    measured: bool = True  # False: no plain server was measured (CostModel.plain_measured)
    # not measured: what is known instead, always draft against the drafting server not
    # drafting (the off arm) per level above one: (c, point, low, high) as shares
    off_gain: tuple[tuple[int, float, float, float], ...] = ()

    @property
    def plain_ahead(self) -> bool:
        return bool(self.behind) or (self.advantage is not None and self.advantage[1] > 0)

    def reason(self, objective: float, unit: str = "tok/s") -> Reason | None:
        """Plain shown ahead (drafting does not pay) or predicted ahead but not shown
        (unresolved); None where drafting is predicted ahead; where plain was not measured,
        that only the threshold was settled, and what is known."""
        if not self.measured:
            return self._unmeasured()
        figures = ""
        if self.advantage is not None:
            point, low, high = self.advantage
            share = point / objective if objective else float("nan")
            figures = (
                f"plain (no draft model) {'ahead of' if point > 0 else 'behind'} N={self.chosen} "
                f"by {abs(point):.3g} {unit} ({_pct(share)}; one-sided 95 % bounds "
                f"[{low:+.3g}, {high:+.3g}] {unit}, plain and drafting on separate launches)"
            )
        if self.plain_ahead:
            where = ""
            if self.behind:
                where = (
                    "spec is behind plain at every level N="
                    f"{self.chosen} drafts at ("
                    + ", ".join(
                        f"{_streams(c)}: {_pct(p)} [{_pct(lo)}, {_pct(hi)}]"
                        for c, p, lo, hi in self.behind
                    )
                    + "), and a threshold server not drafting is no faster than plain"
                )
            said = "; ".join(x for x in (where, figures) if x)
            return Reason(
                ReasonCode.PLAIN_AHEAD,
                f"drafting does not pay for this traffic: {said}; serve without the draft "
                f"model (N={self.chosen} is the least costly threshold for a server that keeps "
                "it)",
            )
        if self.advantage is None or self.advantage[0] <= 0:
            return None
        return Reason(
            ReasonCode.PLAIN_UNRESOLVED,
            f"whether to draft at all is unresolved: {figures}; a profile with more passes "
            "(`--set workload.min_repeats=4`) measures plain and drafting launches again",
        )

    def _unmeasured(self) -> Reason:
        known = ", ".join(
            f"{_streams(c)}: {_pct(p)} [{_pct(lo)}, {_pct(hi)}]" for c, p, lo, hi in self.off_gain
        )
        return Reason(
            ReasonCode.PLAIN_UNMEASURED,
            "only the threshold was settled: whether to draft at all needs plain (the same "
            "model without a draft model) measured beside it, and it was not (tune --url "
            "--plain-url URL2 measures a second server started without --model-draft)"
            + (
                f"; what is known: always draft against the drafting server not drafting, {known}"
                if known
                else ""
            ),
        )


def _off_gains(model: CostModel, policy: Policy) -> tuple[tuple[int, float, float, float], ...]:
    """Always draft against the drafting server not drafting, per level above one stream."""
    gain = model.gain(policy.n_max, against="off")
    return tuple((c, *gain.at(c)[:3]) for c in range(2, model.n_parallel + 1))


def plain_verdict(
    model: CostModel, goal: Objective | np.ndarray, chosen: Evaluation | Policy
) -> PlainVerdict:
    """The chosen policy against plain in the objective goal (see PlainVerdict)."""
    policy = chosen if isinstance(chosen, Policy) else chosen.policy
    n = policy.max_slots or 0
    if not model.plain_measured:
        return PlainVerdict(n, None, (), measured=False, off_gain=_off_gains(model, policy))
    advantage: tuple[float, float, float] | None = None
    if isinstance(goal, Objective) or len(goal):
        try:
            scored = evaluate(model, chosen, goal) if isinstance(chosen, Policy) else chosen
            plain = evaluate(model, Policy.plain(), goal)
        except (ValueError, ZeroDivisionError):
            plain = None  # an objective that cannot score a server without drafts
        if plain is not None:
            # both scored on the same replicates (the point estimate alone where none)
            diff = np.asarray(plain.samples) - np.asarray(scored.samples)
            low, high = (float(np.ravel(b)[0]) for b in model.bounds(diff[:, None]))
            advantage = (plain.value - scored.value, low, high)
    drafts_at = range(1, policy.effective(model.n_parallel) + 1)
    gain = model.gain(policy.n_max, against="plain")
    per_level = [(c, *gain.at(c)[:3]) for c in drafts_at]
    behind = tuple(per_level) if per_level and all(hi < 0 for *_, hi in per_level) else ()
    return PlainVerdict(n, advantage, behind)
