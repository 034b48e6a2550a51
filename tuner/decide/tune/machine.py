"""`tuner tune`'s decision loop as a state machine: the answer that stands, the answers it held,
its moves, whether it came back to one, the plain budget spent; and the steps between them
(assess the stored pairs, follow a move, stop, sweep; plain against the answer side by side).
The rules it follows are the package's (tuner/decide/tune/__init__.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tuner.decide import settle
from tuner.decide.paired import Contrast, verdict
from tuner.decide.tune.describe import moved_text, sweep_text
from tuner.decide.tune.gains import live_gains, plain_gains
from tuner.decide.tune.outcome import PlainLive, TuneReport
from tuner.decide.tune.sweeps import (
    SWEEP_PAIRS,
    model_objective,
    pair_seconds,
    sweep_arms,
    thin_first,
    within,
)
from tuner.measure.backend import LIVE_WAYS
from tuner.measure.plan import Observer, ProgressEvent
from tuner.measure.profiler import Profiler
from tuner.model.costmodel import CostModel
from tuner.policy import Policy, drafts_at
from tuner.storage.queries import paired_rounds
from tuner.storage.store import Store

MAX_MOVES = 16  # an answer that keeps moving is a sign of noise, not of a better N
# The marks that keep a counted round out of tune's pairs, in words (measure/profiler.py).
SET_ASIDE = {
    "drafted_off": "the threshold drafted where it must not",
    "apart": "the streams never generated together",
    "busy": "other programs used the machine",
    "foreign": "others' requests reached the server",
}
DONE, TIES_LEFT = "done", "ties left"  # how a run of threshold sweeps ends


@dataclass(frozen=True)
class Limits:
    """What tune may spend and how near is equivalent (see tune's arguments)."""

    budget_s: float
    tie_budget_s: float
    plain_budget_s: float
    tolerance: float
    plain_live: bool


@dataclass
class Tuning:
    """One tune between its steps: what it measures on and against, and the state the steps
    change (the answer and its model objective, the answers visited, the moves, whether it
    came back to an answer it left, the seconds plain took)."""

    store: Store
    model_name: str
    host: str
    observer: Observer
    profiler: Profiler
    report: TuneReport
    cm: CostModel
    weights: np.ndarray
    n_max: int
    workload: Any  # the workload the pairs are of, as stored with the runs
    limits: Limits
    answer: int
    started: float  # the backend's clock when measuring began
    objective: float = field(init=False)  # the answer's, on the cost model
    # What the tolerance is a share of, fixed for the whole tune (the starting answer's
    # objective): were it the answer's own, two values within the tolerance of each other
    # could each put the other ahead (the larger N's tolerance is wider), and the answer would
    # go back and forth between them.
    scale: float = field(init=False)
    w: list[float] = field(init=False)
    visited: set[int] = field(init=False)
    moves: int = 0
    returned: bool = False
    plain_spent: float = 0.0  # seconds of measuring plain took, every settle_plain together
    # how long a sweep's pairs took against the cost model's seconds for them (prompts,
    # requests, the machine): the next sweep is fitted into the budget at this pace
    pace: float = 1.0
    # sweeps that measured a level alone while it held fewer than two pairs (sweeps.thin_first)
    alone: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.objective = model_objective(self.cm, self.answer, self.n_max, self.weights)
        self.scale = self.objective
        self.w = [float(x) for x in self.weights]
        self.visited = {self.answer}

    @property
    def elapsed(self) -> float:
        assert self.profiler.backend is not None
        return self.profiler.backend.elapsed

    def say(self, text: str) -> None:
        self.observer(ProgressEvent("message", text=text))

    def run(self) -> None:
        # The contenders that could cost more than the tolerance first, then whether to draft
        # at all (plain against the best threshold found: against a worse one plain can sit
        # at the tolerance's edge), then the tie questions, which only choose among values
        # within the tolerance, with the tie budget: a lesser question never starves a greater.
        plain_live = self.limits.plain_live
        left = self.settle_thresholds(ties=False)
        if plain_live:
            self.settle_plain()
        if left == TIES_LEFT:
            self.settle_thresholds(ties=True)
        if (
            plain_live
            and self.report.plain is not None
            and self.report.plain.against != self.answer
        ):
            self.settle_plain()  # a tie moved the answer: plain against it, if the budget allows

    # --- the thresholds ---------------------------------------------------------------------

    def settle_thresholds(self, ties: bool) -> str:
        """Sweep until the standing settles, stops, or (ties false) only tie questions are
        left: DONE, or TIES_LEFT."""
        while True:
            standing = self.assess()
            spent = self.elapsed - self.started
            if standing.status == settle.MOVED:
                ended = self.move(standing)
                if ended is None:
                    continue
                return ended
            stop = self.stop(standing, ties, spent)
            if stop is not None:
                return stop
            self.sweep(standing)

    def assess(self) -> settle.Standing:
        """The standing of the answer on every stored pair, noted in the report."""
        report = self.report
        rounds = paired_rounds(
            self.store, self.model_name, self.host, self.profiler.depth, self.n_max, self.workload
        )
        gains = live_gains(rounds)
        above = [v for v in self.visited if v > self.answer]  # larger answers it held before
        # the N the data alone put first, however far from the answer (settle.measured_best)
        far = settle.measured_best(gains, self.w, self.cm.n_parallel)
        standing = settle.assess(
            gains,
            self.w,
            self.answer,
            self.cm.n_parallel,
            self.scale,
            self.limits.tolerance,
            kept=[*above, *([far] if far is not None else [])],
        )
        report.settled, report.gains = standing, gains
        report.history.append(standing.answer)
        return standing

    def move(self, standing: settle.Standing) -> str | None:
        """The answer moved: follow it (None), or DONE where it went back a second time or
        keeps moving."""
        self.moves += 1
        self.say(moved_text(self.answer, standing, self.report.sweeps))
        back = self.answer
        self.answer = standing.answer
        answer = self.answer
        self.objective = model_objective(self.cm, answer, self.n_max, self.weights)
        if answer in self.visited:
            # Back to an answer it left. The latest data, which hold every pair the earlier
            # step saw, overturn that step: follow them once. A second return is the data
            # going back and forth at the edge of the tolerance: the latest answer stands,
            # unresolved, the levels between the two to measure.
            if self.returned:
                # the comparisons the answer it stops at is read with are its own, not those of
                # the answer it left
                again = self.assess()
                self.report.settled = dataclasses.replace(
                    again,
                    answer=answer,
                    status=settle.OPEN,
                    measure_next=settle.between(back, answer),
                    measuring=[c for c in again.comparisons if c.contender == back],
                )
                self.say(
                    f"the answer went back to N={answer} a second time: the data do not keep "
                    f"N={back} and N={answer} apart; N={answer} stands, unresolved"
                )
                return DONE
            self.returned = True
        self.visited.add(answer)
        if self.moves < MAX_MOVES:
            return None
        self.say("the answer keeps moving: stopping")
        return DONE

    def stop(self, standing: settle.Standing, ties: bool, spent: float) -> str | None:
        """Whether the sweeps end here (DONE, TIES_LEFT) or go on (None)."""
        limits = self.limits
        if standing.status == settle.SETTLED:
            return DONE
        if not ties and not standing.unresolved:
            return TIES_LEFT
        if spent >= limits.budget_s:
            self.say(
                f"budget of {limits.budget_s:.0f} s spent with "
                f"{len(standing.measuring)} comparison(s) unresolved"
            )
            left = self.left_unmeasured(standing)
            if left is not None:
                self.say(left)
            return DONE
        if ties and not standing.unresolved and spent >= limits.tie_budget_s:
            self.say(
                f"{limits.tie_budget_s:.0f} s of measuring spent: the tie question(s) "
                f"left open ({sweep_text(self.answer, standing)}) are named, not measured on"
            )
            return DONE
        return None

    def left_unmeasured(self, standing: settle.Standing) -> str | None:
        """The levels an open comparison rests on that hold no pair yet, and why: no round
        there yet, or its rounds set aside (by what marked them); None where every one has."""
        missing = [c for c in standing.measure_next if self.report.gains.get(c) is None
                   or self.report.gains[c].n == 0]  # fmt: skip
        if not missing:
            return None
        parts = []
        for c in sorted(missing):
            cell = (self.profiler.depth, c)
            counted = self.profiler.repeats_by_cell(cell=cell)
            aside = self.profiler.repeats_by_cell(cell=cell, which="stalled")
            marks: dict[str, int] = {}
            for rounds in counted.values():
                for r in rounds:
                    for mark, words in SET_ASIDE.items():
                        if r.get(mark):
                            marks[words] = marks.get(words, 0) + 1
            for rounds in aside.values():
                for r in rounds:
                    why = str(r.get("stall") or "stalled")
                    marks[why] = marks.get(why, 0) + 1
            if marks:
                said = "; ".join(f"{n} round(s): {why}" for why, n in marks.items())
                parts.append(f"{c} streams, rounds set aside ({said})")
            else:
                parts.append(f"{c} streams, not reached before the budget ended")
        return "not measured yet, so the comparisons resting there stay open: " + ", ".join(parts)

    def sweep(self, standing: settle.Standing) -> None:
        """One sweep: on and off side by side at the levels unresolved comparisons rest on
        (those with fewer than two pairs alone, while there are any), as many of them as the
        budget left holds (in the order the standing wants them, at least one; a pass, once
        started, finishes the pairs it planned, so the plan is what keeps the budget: long
        rounds would otherwise run a whole sweep past it)."""
        profiler = self.profiler
        live = profiler.way in LIVE_WAYS
        # the levels without two pairs alone first (sweeps.thin_first): at 192 tokens a round,
        # the pairs at levels that held several already were a third of a sweep
        pairs = {c: self._pairs_at(c) for c in standing.measure_next}
        wanted, held = thin_first(standing.measure_next, pairs, self.alone)
        arms = sweep_arms(wanted, profiler.depth, self.n_max, live)
        model_s = pair_seconds(self.cm, arms, profiler.spec.workload.max_tokens)
        left = self.started + self.limits.budget_s - self.elapsed
        taken = within(wanted, {c: s * self.pace for c, s in model_s.items()}, left)
        arms = {cell: policies for cell, policies in arms.items() if cell[1] in taken}
        later = [c for c in wanted if c not in taken]
        self.say(
            f"sweep {self.report.sweeps + 1}: {sweep_text(self.answer, standing)}; "
            f"on and off in turn at {', '.join(str(c) for c in sorted(taken))} streams"
            + (
                f" ({', '.join(str(c) for c in later)} left for a later sweep: the "
                f"{max(left, 0.0):.0f} s left of the budget hold about "
                f"{sum(model_s[c] for c in taken) * self.pace:.0f} s of pairs)"
                if later
                else ""
            )
            + (
                f"; {', '.join(str(c) for c in sorted(held))} already hold two pairs or more, "
                "measured again once every level does"
                if held
                else ""
            )
        )
        if held:
            for c in taken:
                self.alone[c] = self.alone.get(c, 0) + 1
        profiler.deadline = self.started + self.limits.budget_s
        began = self.elapsed
        profiler.run_pass(arms, pairs=SWEEP_PAIRS)
        planned = sum(model_s[c] for c in taken)
        if planned > 0 and self.elapsed > began:
            self.pace = (self.elapsed - began) / planned
        self.report.sweeps += 1

    def _pairs_at(self, c: int) -> int:
        """The blocks of paired rounds stored at level c (what its difference's interval
        rests on)."""
        gains = self.report.gains.get(c)
        return 0 if gains is None else gains.n

    # --- plain against the answer -------------------------------------------------------------

    def settle_plain(self) -> None:
        began = self.elapsed
        try:
            self.measure_plain(began)
        finally:
            self.plain_spent += self.elapsed - began

    def measure_plain(self, began: float) -> None:
        """Plain and the answer in turn at every level the traffic weighs until their weighted
        difference resolves or a budget ends."""
        # a verdict against an earlier answer stands until one against this answer resolves
        earlier = self.report.plain
        policy = Policy.of_max_slots(self.answer, self.n_max)
        w = self.w
        coef = {c: w[c - 1] for c in range(1, self.cm.n_parallel + 1) if w[c - 1] > 0}
        cells = [(self.profiler.depth, c) for c in coef]
        pool = self.drafting_pool()
        while True:
            said = self.plain_standing(policy, coef, pool, earlier)
            if said.verdict != settle.UNRESOLVED:
                return
            if self.plain_out_of_budget(began, said.passes):
                return
            self.say(
                f"plain against N={self.answer}: pass {said.passes + 1}, side by side at every "
                "level the traffic weighs"
            )
            self.profiler.deadline = self.started + self.limits.budget_s
            self.profiler.run_pass({cell: [Policy.plain(), policy] for cell in cells}, pairs=1)

    def drafting_pool(self) -> list[Any]:
        """The sweeps' drafting rounds at this n_max: more seeds for the mean acceptance."""
        rounds = paired_rounds(
            self.store, self.model_name, self.host, self.profiler.depth, self.n_max, self.workload
        )
        return [r for (_, config, c), reps in rounds.items() if drafts_at(config, c) for r in reps]

    def plain_standing(
        self,
        policy: Policy,
        coef: dict[int, float],
        pool: list[Any],
        earlier: PlainLive | None,
    ) -> PlainLive:
        """Plain against the answer on the pairs so far, noted in the report where it says
        more than the verdict there."""
        profiler = self.profiler
        levels = plain_gains(profiler.repeats_by_cell(), profiler.level_name(policy), pool)
        advantage = Contrast.of(levels, coef)
        passes = min((levels[c].n if c in levels else 0 for c in coef), default=0)
        tolerance = self.limits.tolerance * self.scale
        said = PlainLive(advantage, verdict(advantage, tolerance), passes, self.answer)
        # an unresolved verdict against an earlier answer gives way only to one with passes of
        # its own against this answer
        if (
            said.verdict != settle.UNRESOLVED
            or earlier is None
            or (earlier.verdict == settle.UNRESOLVED and said.passes > 0)
        ):
            self.report.plain = said
        return said

    def plain_out_of_budget(self, began: float, passes: int) -> bool:
        """Whether the budget or the plain budget is spent, said where it is."""
        now = self.elapsed
        # one plain budget for every answer plain is measured against: a tie that moves the
        # answer gets what the first answer left of it, not a budget of its own
        over = now - self.started >= self.limits.budget_s
        if not over and not self.plain_spent + now - began >= self.limits.plain_budget_s:
            return False
        kept = self.report.plain
        stands = (
            f"the verdict against N={kept.against} stands"
            if kept is not None and kept.verdict != settle.UNRESOLVED
            else "the model's verdict stands"
        )
        self.say(
            f"{'budget' if over else 'plain budget'} spent with plain against N={self.answer} "
            f"unresolved after {passes} pass(es): {stands}"
        )
        return True
