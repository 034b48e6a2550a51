"""The open-loop answer: every policy scored under the traffic's arrivals, by serving it in the
server the fit describes.

Closed levels (c streams released together, measured while all c generate) never see what a
request costs beyond its decode steps: its prompt, evaluated in a step every generating slot
waits for (by the draft model too, on a drafting server), and a drafter's catch-up when a slot
drafts again after a stretch above the threshold. The fit carries those costs
(tuner.model.arrivals) beside its step costs; here

1. a twin world is made from the fit (tuner.twin.fitted: step costs, acceptance with its trend,
   prompt and catch-up costs) and every policy (plain, N = 0, N = 1..n_parallel) serves the
   offered traffic (tuner.twin.serving) in it, noise-free, with common random numbers;
2. the spread: REPLICATES more worlds, from bootstrap replicates of the fit and draws of the
   arrival costs within their intervals, serve the contenders (drafting policies within
   CONTENDER_SHARE of the best, and plain) the traffic's first REPLICATE_REQUESTS requests; a
   replicate's value is the point world's moved by how far the replicate differs from the
   point world on those requests (so the spread is the fit's, not that of a shorter sample);
3. the choice, as the closed-loop rule makes it (tuner.decide.choice): the best drafting policy
   by the point world, then the smallest N whose shortfall is within the replicates' spread of
   the paired difference; plain against it: plain shown ahead (its advantage's one-sided 95 %
   lower bound over the replicate worlds above 0) answers "serve without the draft model";
   plain predicted ahead but not shown is settled as a tie of N values is: plain where its
   worst case over the replicate worlds is less bad than the drafting policy's (the minimax
   rule of step 3), the question said to be unresolved either way. (Live, `tune --plain-url`
   keeps drafting until plain is shown ahead: there the rounds, not a fit, decide, and more
   rounds settle it.)

Objectives, higher is better as tuner.decide.objective scores them: tpot, 1000 / the mean time
per output token (ms); tps, tokens served per busy second; capacity, the highest arrival rate
(the offered traffic's first CAPACITY_REQUESTS sped up or slowed down) whose per-request p95
time per output token stays within the limit, on the point world alone (no spread: each
policy's rate takes a dozen runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tuner.decide.choice import least_bad_within
from tuner.decide.search import preference
from tuner.model.costmodel import CostModel
from tuner.policy import Policy
from tuner.recommendation import ObjectiveKind, Reason, ReasonCode
from tuner.twin.fitted import Levels, world_from_model
from tuner.twin.serving import Offered, Score, capacity, score_policies
from tuner.twin.world import World

REPLICATES = 6  # replicate worlds for the spread
REPLICATE_REQUESTS = 300  # the offered traffic's first requests, what each replicate serves
CONTENDER_SHARE = 0.03  # drafting policies within this share of the best get replicate runs
MAX_CONTENDERS = 4
CAPACITY_REQUESTS = 400


@dataclass
class OpenAnswer:
    """Every policy's score under the offered traffic and the choice made from them."""

    kind: ObjectiveKind
    values: dict[Policy, float]  # the point world's
    samples: dict[Policy, list[float]]  # the replicate worlds' (contenders and plain)
    policy: Policy  # the drafting policy chosen
    plain_advantage: tuple[float, float, float]  # plain - chosen: point, one-sided 95 % bounds
    runs: int  # simulated runs
    reasons: list[Reason] = field(default_factory=list)
    slo_tpot_ms: float | None = None  # capacity's limit
    overloaded: frozenset[Policy] = frozenset()  # the arrivals outrun them in the point world

    @property
    def plain_shown(self) -> bool:
        """Plain shown ahead: its advantage's lower bound over the replicate worlds above 0
        (the point world's alone where there are none); or the chosen policy overloaded where
        plain keeps up."""
        plain = Policy.plain()
        if self.policy in self.overloaded and plain not in self.overloaded:
            return True
        if plain in self.overloaded and self.policy not in self.overloaded:
            return False
        return self.plain_advantage[0] > 0 and self.plain_advantage[1] > 0

    def _plain_weighed(self) -> tuple[Policy, dict[Policy, float]] | None:
        """Plain predicted ahead but not shown: the tie rule of the N values between plain and
        the chosen policy (choice.least_bad_within, equal worst cases to the drafting policy),
        its pick and the worst shortfall of each one within the spread; None otherwise (or
        without replicates)."""
        plain = Policy.plain()
        if self.plain_advantage[0] <= 0 or not self.samples.get(plain) or self.plain_shown:
            return None
        chosen, _, worst = least_bad_within(
            self.values, self.samples, [plain, self.policy], lambda p: 1 if p == plain else 0
        )
        return chosen, worst

    @property
    def plain_worst(self) -> dict[Policy, float]:
        """Plain's and the chosen policy's worst shortfall over the point and replicate worlds
        where plain is weighed against it (only plain's where the chosen policy is not even
        within the spread of their difference); empty otherwise."""
        weighed = self._plain_weighed()
        return weighed[1] if weighed is not None else {}

    @property
    def plain_least_bad(self) -> bool:
        """Plain predicted ahead, not shown, and the tie rule picks it: its worst case over the
        replicate worlds less bad than the chosen drafting policy's, or the chosen policy not
        even within the spread of their difference (plain the least bad alone)."""
        weighed = self._plain_weighed()
        return weighed is not None and weighed[0] == Policy.plain()

    @property
    def plain_ahead(self) -> bool:
        """The answer is to serve without the draft model: plain shown ahead, or predicted
        ahead with the less bad worst case."""
        return self.plain_shown or self.plain_least_bad

    @property
    def objective(self) -> float:
        return self.values[self.policy]

    def interval(self) -> tuple[float, float]:
        """The chosen policy's objective over the replicate worlds (5th to 95th percentile)."""
        values = self.samples.get(self.policy) or [self.objective]
        return float(np.percentile(values, 5)), float(np.percentile(values, 95))

    def describe(self, value: float) -> str:
        if self.kind is ObjectiveKind.TPOT:
            return f"mean TPOT {1000.0 / value:.1f} ms" if value > 0 else "mean TPOT unbounded"
        if self.kind is ObjectiveKind.CAPACITY:
            return f"{value:.3g} req/s within p95 TPOT {self.slo_tpot_ms:g} ms"
        return f"{value:.1f} tok/s while busy"


def candidates(model: CostModel) -> list[Policy]:
    """plain, N = 0 and N = 1..n_parallel at the profiled n_max."""
    n = model.n_max
    return [Policy.plain(), Policy.always(n)] + [
        Policy.threshold(k, n) for k in range(1, model.n_parallel + 1)
    ]


def _worlds(model: CostModel, replicates: int, seed: int, levels: Levels) -> list[World]:
    """The replicate worlds: evenly spaced bootstrap replicates of the fit, arrival costs drawn."""
    assert model.arrivals is not None
    reps = model.replicate_models
    if not reps or replicates <= 0:
        return []
    rng = np.random.default_rng([seed, 4501])
    picks = np.linspace(0, len(reps) - 1, min(replicates, len(reps))).round().astype(int)
    return [world_from_model(reps[i], model.arrivals.draw(rng), levels) for i in picks]


def _contenders(
    values: dict[Policy, float],
    best: Policy,
    npar: int,
    n_max: int,
    eligible: list[Policy],
) -> list[Policy]:
    """Eligible drafting policies within CONTENDER_SHARE of the best (the smallest N first),
    the best first."""
    near = [
        p
        for p in eligible
        if p.drafting and values[p] >= values[best] * (1.0 - CONTENDER_SHARE) and p != best
    ]
    near.sort(key=lambda p: preference(p, npar, n_max))
    return [best, *near[: MAX_CONTENDERS - 1]]


def open_answer(
    model: CostModel,
    offered: Offered,
    kind: ObjectiveKind = ObjectiveKind.TPOT,
    *,
    seed: int = 0,
    replicates: int = REPLICATES,
    levels: Levels = Levels(),
    slo_tpot_ms: float | None = None,
) -> OpenAnswer:
    """Score every policy under the offered traffic and choose (see the module docstring).
    levels: where the model's closed levels were measured (the fitted worlds are matched with
    them) and what depth costs; slo_tpot_ms: capacity's limit."""
    if model.arrivals is None:
        raise ValueError("the fit has no arrival costs: the open-loop answer needs them")
    point_world = world_from_model(model, model.arrivals.point(), levels)
    if kind is ObjectiveKind.CAPACITY:
        if slo_tpot_ms is None or slo_tpot_ms <= 0:
            raise ValueError("the capacity objective needs a time-per-token limit above 0")
        return _capacity_answer(model, point_world, offered, slo_tpot_ms)
    scores, runs = score_policies(point_world, offered.workload, candidates(model))
    values = {p: s.value(kind) for p, s in scores.items()}
    overloaded = frozenset(p for p, s in scores.items() if s.overloaded)
    npar, n_max = model.n_parallel, model.n_max
    drafting = [p for p in values if p.drafting]
    # a policy the arrivals outrun ranks behind every one that keeps up, whatever its speed
    keeping = [p for p in drafting if p not in overloaded] or drafting
    best = min(keeping, key=lambda p: (-values[p], preference(p, npar, n_max)))
    contenders = _contenders(values, best, npar, n_max, keeping)
    samples: dict[Policy, list[float]] = {p: [] for p in [*contenders, Policy.plain()]}
    head = offered.head(REPLICATE_REQUESTS)
    worlds = _worlds(model, replicates, seed, levels)
    if worlds:
        # each replicate world serves the first requests; its values are taken as the point
        # world's on all of them moved by how far it differs from the point world on the first
        base, n = score_policies(point_world, head, list(samples))
        runs += n
    for world in worlds:
        got, n = score_policies(world, head, list(samples))
        runs += n
        for p, s in got.items():
            samples[p].append(values[p] + s.value(kind) - base[p].value(kind))
    chosen, reasons = _least_bad(values, samples, contenders, npar)
    advantage = _plain_advantage(values, samples, chosen)
    answer = OpenAnswer(kind, values, samples, chosen, advantage, runs, reasons)
    answer.overloaded = overloaded
    answer.reasons[:0] = [_plain_reason(answer)]
    if overloaded:
        answer.reasons.append(_overload_reason(answer, scores, offered.rate))
    return answer


def _capacity_answer(
    model: CostModel, world: World, offered: Offered, slo_tpot_ms: float
) -> OpenAnswer:
    """Capacity on the point world: each policy's highest rate within the limit (see the module
    docstring); the best drafting policy, the smaller N on a tie; plain against it."""
    head = offered.head(CAPACITY_REQUESTS)
    values: dict[Policy, float] = {}
    runs = 0
    for p in candidates(model):
        if p.is_threshold and (p.max_slots or 0) >= model.n_parallel:
            values[p] = values[Policy.always(model.n_max)]  # N = n_parallel is N = 0's server
            continue
        factor, n = capacity(world, head, p, slo_tpot_ms)
        values[p] = factor * offered.rate
        runs += n
    npar, n_max = model.n_parallel, model.n_max
    best = min(
        (p for p in values if p.drafting), key=lambda p: (-values[p], preference(p, npar, n_max))
    )
    point = values[Policy.plain()] - values[best]
    answer = OpenAnswer(
        ObjectiveKind.CAPACITY, values, {}, best, (point, point, point), runs, [], slo_tpot_ms
    )
    answer.reasons = [_plain_reason(answer)]
    return answer


def _least_bad(
    values: dict[Policy, float],
    samples: dict[Policy, list[float]],
    contenders: list[Policy],
    npar: int,
) -> tuple[Policy, list[Reason]]:
    """Among the contenders within the replicates' spread of the best, the one whose worst case
    over the replicate worlds is least bad (tuner.decide.choice.least_bad_within; equal ones:
    the smaller N), and the reason where it is not the best."""
    chosen, within, worst = least_bad_within(
        values, samples, contenders, lambda p: p.effective(npar)
    )
    if len(within) < 2:
        return chosen, []
    tied = ", ".join(f"{p.label} (worst {100 * worst[p]:.2g} % short)" for p in within)
    text = (
        f"{tied} are within the spread of the replicate worlds: {chosen.label}, whose worst case "
        "over them is least bad"
    )
    return chosen, [Reason(ReasonCode.WITHIN_UNCERTAINTY, text)]


def _plain_advantage(
    values: dict[Policy, float], samples: dict[Policy, list[float]], chosen: Policy
) -> tuple[float, float, float]:
    """plain - chosen: the point world's, and the replicates' 5th and 95th percentiles."""
    plain = Policy.plain()
    point = values[plain] - values[chosen]
    diff = np.asarray(samples[plain]) - np.asarray(samples[chosen])
    if len(diff) == 0:
        return point, point, point
    return point, float(np.percentile(diff, 5)), float(np.percentile(diff, 95))


def _overload_reason(answer: OpenAnswer, scores: dict[Policy, Score], rate: float) -> Reason:
    """Which policies the offered arrivals outrun in the point world (their backlog would grow
    without bound): ranked behind every policy that keeps up."""
    over = sorted(answer.overloaded, key=lambda p: p.sort_key)
    each = ", ".join(f"{p.label} ({scores[p].capacity_rps:.3g} req/s)" for p in over)
    return Reason(
        ReasonCode.OPEN_LOOP,
        f"the offered {rate:.3g} req/s outrun {each} in the twin of this server (capacity with "
        "every slot busy): their queues would grow without bound, so they rank behind every "
        "policy that keeps up",
    )


def _plain_reason(answer: OpenAnswer) -> Reason:
    """Draft at all, in the open loop: plain against the chosen policy."""
    point, low, high = answer.plain_advantage
    base = answer.objective

    def pct(x: float) -> float:
        return 100 * x / base if base else 0.0

    plain_value = answer.values[Policy.plain()]
    spread = (
        f"one-sided 95 % bounds [{pct(low):+.1f}, {pct(high):+.1f}] % over the replicate worlds"
        if answer.samples
        else "the point world alone, no spread"
    )
    figures = (
        f"plain {answer.describe(plain_value)} against {answer.policy.label}'s "
        f"{answer.describe(answer.objective)} ({pct(point):+.1f} % for plain; {spread})"
    )
    plain = Policy.plain()
    if plain in answer.overloaded and answer.policy not in answer.overloaded:
        return Reason(
            ReasonCode.DRAFTING_PAYS,
            f"drafting pays for this traffic: without the draft model the arrivals outrun the "
            f"server; {figures}",
        )
    if answer.plain_least_bad:
        worst = answer.plain_worst
        weighed = (
            f"its worst case over the replicate worlds is {100 * worst[plain]:.2g} % short "
            f"against {100 * worst[answer.policy]:.2g} % for {answer.policy.label}"
            if answer.policy in worst
            else f"it is ahead of {answer.policy.label} by more than the replicate worlds "
            "spread their difference"
        )
        return Reason(
            ReasonCode.PLAIN_UNRESOLVED,
            f"whether to draft at all is unresolved for this traffic: plain predicted ahead, "
            f"not shown: {figures}; {weighed}, so the least bad is to serve without the draft "
            "model",
        )
    if answer.plain_ahead:
        why = (
            f"with it ({answer.policy.label}) the arrivals outrun the server; "
            if answer.policy in answer.overloaded
            else ""
        )
        return Reason(
            ReasonCode.PLAIN_AHEAD,
            f"drafting does not pay for this traffic: {why}{figures}; serve without the draft "
            "model",
        )
    if point > 0:
        return Reason(
            ReasonCode.PLAIN_UNRESOLVED,
            f"whether to draft at all is unresolved for this traffic: plain predicted ahead, "
            f"not shown: {figures}",
        )
    return Reason(ReasonCode.DRAFTING_PAYS, f"drafting pays for this traffic: {figures}")
