"""Where drafting collapses: acceptance by drafting slots held against the floor a drafting server
must clear to pay there, the floor solved from the fitted costs.

At c drafting slots a drafting step costs T_spec(c) and gives each slot L(c) tokens; not drafting,
the same c slots get one token a step of the reference's cost: plain at one slot (no threshold
stops a lone stream's drafts, so only a server without its draft model protects it), the
threshold server not drafting ("off") from two slots on, the comparison that places N
(tuner.model.costmodel: spec_tps against reference_tps). Drafting at c pays while

    c L(c) / T_spec(c) > ref_tps(c),   i.e.   L(c) > ref_tps(c) T_spec(c) / c.

The model's tokens a step are L = rho (1 + m), m the accepted draft tokens a draft (what the
server's counters and the profile's per-position counts give: accepted / drafts) and rho the
realisation ratio (steps without a draft: a request's first and last tokens; at most 1, and 1
where acceptance moves with the drafting slots: `realisation`), so the floor on m is

    m*(c) = ref_tps(c) T_spec(c) / (c rho) - 1,

at the draft length the server runs. Each bootstrap replicate of the fit gives its own floor;
acceptance collapses at c where its one-sided 95 % upper bound lies below the replicates' 5th
percentile of the floor (both one-sided: drafting shown not to pay there, not merely predicted
not to), and the first such c is where it collapses. The answer that protects the server is a
threshold below it (N = c - 1: no new drafts while more than c - 1 slots generate), or plain
where it collapses at one slot already.

Pure numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tuner.model.acceptance import observed_acceptance
from tuner.model.costmodel import CostModel
from tuner.traffic import AcceptanceCounts

FLOOR_QUANTILE = 0.05  # the floor's one-sided 95 % lower bound over the fit's replicates


@dataclass(frozen=True)
class Floor:
    """The accepted draft tokens a draft that drafting at `slots` must clear to pay."""

    slots: int
    accepted: float  # the fit's point
    lower: float  # the replicates' 5th percentile (the point without replicates)
    against: str  # "plain" (one slot) or "off" (the threshold server not drafting)


@dataclass(frozen=True)
class Seen:
    """Acceptance seen at a number of drafting slots: accepted draft tokens a draft, with its
    one-sided 95 % upper bound where the readings give one."""

    slots: int
    accepted: float
    upper: float | None = None
    drafts: float = 0.0

    @property
    def high(self) -> float:
        return self.accepted if self.upper is None else self.upper


def realisation(model: CostModel, n: int | None = None) -> float | None:
    """rho: the model's tokens a drafting step over 1 + accepted a draft, at most 1 (a step
    verifies at most one draft a slot); 1 where acceptance moves with the drafting slots, since
    the pooled tokens a step (weighted by streams) and the pooled rates (weighted by drafts) then
    mix the levels unlike each other. None where the fit folds acceptance into its spec curve: it
    knows no acceptance to set a floor on."""
    acceptance = model.acceptance
    if acceptance.rates is None or acceptance.source == "folded":
        return None
    if model.trend is not None and model.trend.moving:
        return 1.0
    n = acceptance.n_max if n is None else n
    accepted = float(sum(acceptance.rates[:n]))
    return min(1.0, float(acceptance.length(n)) / (1.0 + accepted))


def _floor_values(model: CostModel, slots: np.ndarray, n: int | None) -> np.ndarray | None:
    rho = realisation(model, n)
    if rho is None or rho <= 0:
        return None
    ref = model.reference_tps(slots, "off")
    step = model.spec_step(slots, n)
    floor: np.ndarray = ref * step / (1000.0 * slots * rho) - 1.0
    return floor


def floors(model: CostModel, n: int | None = None) -> dict[int, Floor]:
    """The floor at every drafting count 1..n_parallel (see the module docstring), at draft
    length n (default the profiled n_max); empty where the fit knows no acceptance."""
    slots = np.arange(1, model.n_parallel + 1, dtype=float)
    point = _floor_values(model, slots, n)
    if point is None:
        return {}
    reps = [v for m in model.replicate_models if (v := _floor_values(m, slots, n)) is not None]
    lower = np.quantile(np.array(reps), FLOOR_QUANTILE, axis=0) if len(reps) >= 10 else point
    return {
        int(c): Floor(
            int(c),
            float(point[i]),
            float(min(lower[i], point[i])),
            "plain" if c == 1 else "off",
        )
        for i, c in enumerate(slots)
    }


@dataclass(frozen=True)
class Collapse:
    """Acceptance below the floor at `slots` drafting slots (the first count where it is), and
    the answer that protects the server."""

    slots: int
    seen: Seen
    floor: Floor
    source: str  # where the acceptance was read: "the profile", "the server's counters"
    build: str  # the server's build, as its fingerprint or version line names it
    standing: int | None = None  # the N the server runs (0: always draft; None: not known)
    paying: int | None = None  # the most drafting slots below the collapse seen paying

    @property
    def protective(self) -> int | None:
        """N below the collapse: the most drafting slots seen paying below it (the counts
        between were not seen), else one below it; None: plain (it collapses at one slot)."""
        if self.slots < 2:
            return None
        return self.paying if self.paying is not None else self.slots - 1

    @property
    def protected(self) -> bool:
        """Whether the standing N already keeps drafts below the collapse."""
        return self.standing is not None and 0 < self.standing < self.slots

    def answer(self) -> str:
        if self.protective is None:
            return (
                "plain (restart it without its draft model; until then N=1 drafts least, "
                "only while one slot generates)"
            )
        n = self.protective
        between = f"{n + 1}" if n + 1 == self.slots - 1 else f"{n + 1} to {self.slots - 1}"
        unseen = f"; {between} drafting slots not seen paying" if n < self.slots - 1 else ""
        slots = "slot generates" if n == 1 else "slots generate"
        return f"N={n} (no new drafts while more than {n} {slots}{unseen})"

    def line(self) -> str:
        """One line: where it collapses, on which build, and what protects the server."""
        seen, floor = self.seen, self.floor
        bound = f" (95 % upper bound {seen.upper:.3f})" if seen.upper is not None else ""
        against = "plain" if floor.against == "plain" else "not drafting"
        slots = "slot" if self.slots == 1 else "slots"
        head = (
            f"acceptance collapses at {self.slots} drafting {slots} on build {self.build}: "
            f"{seen.accepted:.3f} accepted tokens a draft{bound} by {self.source}, below the "
            f"{floor.lower:.2f} drafting needs there to pay against {against} (the fitted "
            "costs' floor)"
        )
        if self.protected:
            return f"{head}; the standing N={self.standing} already keeps drafts below it"
        return f"{head}; protect the server with {self.answer()}"


def find_collapse(
    seen: Mapping[int, Seen],
    floor: Mapping[int, Floor],
    source: str,
    build: str,
    standing: int | None = None,
) -> Collapse | None:
    """The first drafting count whose acceptance (its upper bound) is below its floor's lower
    bound, with the most drafting slots below it seen paying (acceptance at or above the
    floor's point); None where none is."""
    paying: int | None = None
    for slots in sorted(seen):
        at, limit = seen[slots], floor.get(slots)
        if limit is None or slots < 1:
            continue
        if at.high < limit.lower:
            return Collapse(slots, at, limit, source, build, standing, paying)
        if at.accepted >= limit.accepted:
            paying = slots
    return None


MIN_DRAFTS = 30  # fewer drafts than this at a count say nothing about it


def seen_in_profile(per_level: Mapping[int, float], upper: Mapping[int, float]) -> dict[int, Seen]:
    """A profile's acceptance by drafting level (tuner.model.trend's per-level values)."""
    return {int(c): Seen(int(c), float(v), upper.get(c)) for c, v in per_level.items()}


def seen_in_counts(
    by_drafting: Mapping[int, AcceptanceCounts], min_drafts: float = MIN_DRAFTS
) -> dict[int, Seen]:
    """The server's counters by drafting slots (TrafficProfile.by_drafting): each count's
    accepted tokens a draft, its upper bound from the readings' spread (two readings or more),
    where at least min_drafts drafts were seen there."""
    out: dict[int, Seen] = {}
    for slots, counts in by_drafting.items():
        est = observed_acceptance(counts)
        if est is None or est.drafts < min_drafts:
            continue
        upper = est.interval(0.90)[1] - 1.0 if est.readings >= 2 else None
        out[int(slots)] = Seen(int(slots), est.mean_accepted, upper, est.drafts)
    return out
