"""The experiment itself (`Experiment`): its contenders, the verdicts on the evidence so far,
what an unresolved answer waits for, the windows of each cycle planned and run on a
WindowBackend, and N moved where a verdict says (see the package's docstring)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable, Collection, Mapping
from typing import Any

from tuner.decide import settle
from tuner.decide.experiment.evidence import Evidence, sides
from tuner.decide.experiment.report import (
    OVERLOADED_AFTER,
    PLAIN_OUT_OF_REACH,
    READING_LIMIT,
    STOP_AFTER,
    STOPPED,
    ExperimentOptions,
    ExperimentReport,
    Planned,
    as_set,
)
from tuner.decide.paired import t_quantile
from tuner.measure.windows import WindowBackend, WindowFigures


def _span(counts: list[int]) -> str:
    """Counts as ranges: 3-5, 8."""
    parts, start = [], counts[0]
    for a, b in zip(counts, [*counts[1:], None], strict=True):
        if b is None or b != a + 1:
            parts.append(f"{start}" if start == a else f"{start}-{a}")
            if b is not None:
                start = b
    return ", ".join(parts)


class Experiment:
    """One experiment from a standing N (see the module docstring). `tie`: the model's tie set
    (values of N the model cannot tell apart from the answer); contenders are it and the
    neighbours of it and of the answer."""

    def __init__(
        self,
        standing: int,
        n_parallel: int,
        options: ExperimentOptions,
        *,
        tie: Collection[int] = (),
        shares: Mapping[int, float] | None = None,
        rate: float | None = None,
        output_tokens: float | None = None,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        options.check()
        self.n_parallel = n_parallel
        self.options = options
        self.say = say
        self.answer = self._eff(standing)
        self.tie = {self._eff(n) for n in tie}
        self.rng = random.Random(f"experiment:{options.seed}")
        self.turns: list[bool] = []  # the sides of the answer in turn (above: True)
        self.lead_turn = False  # every other turn goes to the leader (next_contender)
        self.visited = {self.answer}
        self.unusable_run = 0
        self.overloaded = False
        self.current = self.answer
        self.report = ExperimentReport(self._out(self.answer), self._out(self.answer), n_parallel)
        self.evidence = Evidence(
            self.report, n_parallel, options, shares or {}, rate, output_tokens
        )

    def _eff(self, n: int) -> int:
        return self.n_parallel if n <= 0 or n >= self.n_parallel else n

    def allowed(self) -> set[int]:
        """The values that may be contenders now: the model's tie set, the answer, their
        neighbours, and larger answers it held before (settle's `kept`)."""
        allowed = set(self.tie) | {self.answer}
        for m in list(allowed):
            allowed |= {m + d for d in range(-self.options.reach, self.options.reach + 1)}
        if self.options.always:
            allowed.add(self.n_parallel)
        allowed |= {v for v in self.visited if v > self.answer}
        return {m for m in allowed if 1 <= m <= self.n_parallel}

    def contenders(self) -> list[int]:
        """The answer's contenders now, as the server takes them (0: always draft)."""
        above = [v for v in self.visited if v > self.answer]
        found = settle.contenders(self.answer, self.n_parallel, above, self.allowed())
        return [self._out(n) for n in found]

    def assess(self) -> settle.Standing:
        weights, objective = self.evidence.weights(self.answer)
        # a contender that differs from the answer only at counts the windows have not seen
        # enough of is not yet tested: no window tells it apart (the traffic would have to
        # reach those counts), and it is no evidence either way: the answer cannot be settled
        # while one is left
        above = [v for v in self.visited if v > self.answer]
        candidates = settle.contenders(self.answer, self.n_parallel, above, self.allowed())
        tested = {
            m for m in candidates if any(weights[c - 1] > 0 for c in settle.between(self.answer, m))
        }
        self.report.untested = [self._out(m) for m in candidates if m not in tested]
        reading = self.evidence.reading_shares()
        confounded = {m for m in tested if self._mostly_reading(m, weights, reading)}
        self.report.confounded = [self._out(m) for m in sorted(confounded)]
        standing = settle.assess(
            self.evidence.gains(),
            weights,
            self.answer,
            self.n_parallel,
            objective,
            self.options.tolerance,
            kept=above,
            allowed=tested - confounded,
        )
        if standing.status == settle.SETTLED and (self.report.untested or confounded):
            standing = dataclasses.replace(standing, status=settle.OPEN)
        self.report.standing = standing
        return standing

    def _mostly_reading(self, m: int, weights: list[float], reading: Mapping[int, float]) -> bool:
        """Whether the counts between the answer and m, weighed as the objective weighs them,
        spend more than READING_LIMIT of their time in steps that also read a prompt."""
        counts = settle.between(self.answer, m)
        total = sum(weights[c - 1] for c in counts)
        if total <= 0:
            return False
        share = sum(weights[c - 1] * reading.get(c, 0.0) for c in counts) / total
        return share > READING_LIMIT

    def waiting_for(self) -> str:
        """What an unresolved answer waits for: the counts its open and untested comparisons
        rest on that lack data (each side seen in min_blocks cycles, min_tokens tokens a block
        on each side), and how long the traffic takes to give them at what it showed so far
        (`wait_s`)."""
        standing = self.report.standing
        counts = set()
        for n in self.report.untested:
            counts |= set(settle.between(self.answer, self._eff(n)))
        if standing is not None:
            for comparison in standing.measuring:
                counts |= set(comparison.levels)
        blocks = self.evidence.blocks()
        missing = self._missing(counts, blocks)
        if not missing:
            return ""
        least = self.options.min_blocks
        need = least * self.options.min_tokens
        span = _span(sorted(missing))
        what = f"waits for data at {span} generating slots (each side in {least} cycles"
        what += f", {need:.0f} tokens)"
        seconds = self._wait(missing, len(blocks))
        if seconds is None:
            unseen = [c for c in missing if self.evidence.time_shares().get(c, 0.0) <= 0]
            return f"{what}; the traffic has not reached {_span(sorted(unseen))} yet"
        return f"{what}: about {seconds / 60.0:.0f} more minutes of this traffic"

    def _missing(
        self, counts: Collection[int], blocks: Mapping[int, Mapping[int, Any]]
    ) -> dict[int, tuple[int, float, int]]:
        """Per count lacking data in blocks (`blocks()`): (cycles missing on the sparser side,
        tokens missing there, the cycles that side was seen in)."""
        least = self.options.min_blocks
        need = least * self.options.min_tokens
        missing: dict[int, tuple[int, float, int]] = {}
        for c in counts:
            on_k, off_k, on_t, off_t = sides([cycle[c] for cycle in blocks.values() if c in cycle])
            cycles = max(least - on_k, least - off_k, 0)
            tokens = max(need - on_t, need - off_t, 0.0)
            if cycles or tokens:
                missing[c] = (cycles, tokens, min(on_k, off_k))
        return missing

    def wait_s(self, counts: Collection[int]) -> float | None:
        """Seconds more of this traffic until every one of counts has its data, at what the
        traffic showed so far (0 where they have it; None where it has not reached one of them
        yet): the drafting side of a count above the answer comes from contender windows only,
        which are `share` of the time and hold the count for its share of the time at its
        rate; the slowest count sets it. A missing cycle comes as often as cycles that saw the
        count's sparser side came so far (one in five cycles: five cycles a missing one; a
        rare count is seen in few of them), at the cycles' mean length; a cycle at least."""
        blocks = self.evidence.blocks()
        return self._wait(self._missing(counts, blocks), len(blocks))

    def _wait(self, missing: Mapping[int, tuple[int, float, int]], cycles_run: int) -> float | None:
        """wait_s of the counts missing data (`_missing`), over cycles_run cycles so far."""
        shares = self.evidence.time_shares()
        if any(shares.get(c, 0.0) <= 0 for c in missing):
            return None
        on, off = self.evidence.level_rates()
        spent = sum(f.seconds for f in self.evidence.usable())
        cycle_s = max(
            self.options.min_window_s * self.options.cycle,
            spent / cycles_run if cycles_run else 0.0,
        )
        seconds = 0.0
        for c, (cycles, tokens, seen) in missing.items():
            rates = [r for r in (on[c], off[c]) if r]
            rate = min(rates) if rates else 1.0
            every = cycles_run / seen if seen else 1.0
            seconds = max(
                seconds, tokens / (shares[c] * rate) / self.options.share, cycles * every * cycle_s
            )
        return seconds

    def minutes_to_tell(
        self, standing: settle.Standing, elapsed_s: float
    ) -> list[tuple[float, int, int]]:
        """How much more of this traffic the open comparisons with bounds need at the spread
        seen so far (the bounds narrow as one over the square root of the time): a verdict
        needs the upper bound down to the tolerance where the estimate is below it, else the
        lower bound up to zero. (minutes, contender, against), as the server takes them."""
        z = t_quantile(settle.CONFIDENCE, math.inf)
        needs = []
        for c in standing.measuring:
            e, se = c.advantage.estimate, c.advantage.se
            if not (math.isfinite(e) and math.isfinite(se)) or elapsed_s <= 0:
                continue
            distance = standing.tolerance - e if e <= standing.tolerance else e
            if distance <= 0:
                continue
            more = elapsed_s * max((z * se / distance) ** 2 - 1.0, 0.0) / 60.0
            against = c.against if c.against is not None else self.answer
            needs.append((more, self._out(c.contender), self._out(against)))
        return needs

    def minutes_to_wait(self, standing: settle.Standing) -> dict[int, float | None]:
        """Per contender of the answer with no bounds yet (untested, or its comparison not
        measured enough), as the server takes it: the minutes more of this traffic until its
        counts have their data (`wait_s`; None where the traffic has not reached them)."""
        waiting = {self._eff(n) for n in self.report.untested}
        waiting |= {
            c.contender
            for c in standing.measuring
            if c.against in (None, self.answer)
            and (math.isnan(c.advantage.estimate) or math.isinf(c.advantage.se))
        }
        out: dict[int, float | None] = {}
        for m in sorted(waiting - {self.answer}):
            seconds = self.wait_s(settle.between(self.answer, m))
            out[self._out(m)] = None if seconds is None else seconds / 60.0
        return out

    @staticmethod
    def _time_to_tell(found: list[tuple[float, int, int]]) -> str:
        """minutes_to_tell in words: the judge's own resolution, said beside the unresolved
        answer."""
        needs = sorted(((more, f"N={n} against N={m}") for more, n, m in found), reverse=True)
        if not needs:
            return ""
        listed = ", ".join(
            f"{name} {f'about {more:.0f}' if more >= 1 else 'under one'}"
            for more, name in needs[:3]
        )
        return (
            f"; at the spread seen so far the open comparisons need more minutes of this "
            f"traffic to tell their sides apart: {listed}"
        )

    # --- the schedule ------------------------------------------------------------------------

    def next_contender(self, standing: settle.Standing) -> int | None:
        """The next contender to serve: every other turn the leader (the open comparison with
        the answer whose upper bound is highest, where it clears the tolerance: the one most
        likely to move N, so its blocks come twice as often); the other turns go to the two
        sides of the answer in turn, shuffled, each turn to the farthest value wanted on its
        side (see `covering`: its window feeds every comparison on that side)."""
        self.lead_turn = not self.lead_turn
        leader = self._leader(standing) if self.lead_turn else None
        if leader is not None:
            return leader
        wanted = self._wanted(standing)
        if not wanted:
            return None
        sides = {m > self.answer for m in wanted}
        self.turns = [above for above in self.turns if above in sides]
        if not self.turns:
            self.turns = sorted(sides)
            self.rng.shuffle(self.turns)
        return self._farthest(wanted, self.turns.pop(0))

    def _wanted(self, standing: settle.Standing) -> set[int]:
        """The values the open comparisons need windows of (contenders, and the other side
        of a tie question), and the contenders not yet tested: a window at one of them feeds
        nothing until the traffic reaches the counts it differs at, and then, in a burst the
        standing N's windows see too, gives the side they lack."""
        wanted = {self._eff(n) for n in self.report.untested}
        for c in standing.measuring:
            wanted.add(c.contender)
            if c.against is not None and c.against != self.answer:
                wanted.add(c.against)
        wanted.discard(self.answer)
        return wanted

    def covering(self, contender: int, standing: settle.Standing) -> int:
        """The value served for a contender's turn: the farthest value wanted on its side of
        the answer. Gains are per count, pooled over every window whatever its N, and the
        standing N gives one side of every count (drafting up to it, not above), so only
        contender windows give the other: drafting above the answer, not drafting at or below
        it. The farthest value gives that side at every count between it and the answer, for
        every open comparison on its side at once, where the contender's own value gives it
        at its own counts only (a turn for N+1 would feed N+2 and always draft nothing)."""
        return self._farthest(self._wanted(standing) | {contender}, contender > self.answer)

    def _farthest(self, values: Collection[int], above: bool) -> int:
        """The value farthest from the answer on one side of it (above: True)."""
        side = [m for m in values if (m > self.answer) == above]
        return max(side) if above else min(side)

    def _leader(self, standing: settle.Standing) -> int | None:
        """The open comparison with the answer that could still move N (its upper bound above
        the tolerance) and whose upper bound is highest; None where none has bounds yet."""
        best: tuple[float, int] | None = None
        for c in standing.measuring:
            if c.against not in (None, self.answer) or c.contender == self.answer:
                continue
            if math.isnan(c.advantage.estimate) or math.isinf(c.advantage.se):
                continue
            high = c.advantage.bounds(settle.CONFIDENCE)[1]
            if high > standing.tolerance and (best is None or high > best[0]):
                best = (high, c.contender)
        return best[1] if best is not None else None

    def window_s(self, contender: int) -> float:
        """Long enough to spend about level_s seconds at the counts the comparison rests on."""
        opts = self.options
        shares = self.evidence.time_shares()
        at = sum(shares.get(c, 0.0) for c in settle.between(self.answer, contender))
        if at <= 0:
            return opts.max_window_s
        return min(opts.max_window_s, max(opts.min_window_s, opts.level_s / at))

    def plan_cycle(
        self, contender: int, index: int, left: float = math.inf, serve: int | None = None
    ) -> list[Planned]:
        """k windows of one length (the contender's comparison's: `window_s`), a window at
        `serve` (the contender where not given; see `covering`) at a random place inside
        (never first or last: flanked by the standing N), within the time left."""
        k = self.options.cycle
        place = self.rng.randint(1, k - 2)
        # a window ends with the step that crosses its end: a second to spare for them; and
        # the cycle switches twice, each followed by a washout
        spare = 1.0 + 2 * self.options.washout_s
        seconds = min(self.window_s(contender), max(left - spare, 0.0) / k)
        at = contender if serve is None else serve
        return [
            Planned(at if i == place else self.answer, i == place, seconds, index, self.answer)
            for i in range(k)
        ]

    # --- the run -----------------------------------------------------------------------------

    def record(self, planned: Planned, figures: WindowFigures) -> None:
        report = self.report
        report.windows.append((planned, figures))
        report.cost.add(planned, figures)
        if figures.problem is not None:
            self.unusable_run += 1
            self._note(
                f"window {len(report.windows)} (N={self._out(planned.n)}): {figures.problem}: "
                "it counts for nothing"
            )
        else:
            self.unusable_run = 0
        backlogs = [f.backlog for _, f in report.windows[-(OVERLOADED_AFTER + 1) :]]
        growing = len(backlogs) > OVERLOADED_AFTER and all(
            b > a for a, b in itertools.pairwise(backlogs)
        )
        if growing and backlogs[-1] >= 2 * self.n_parallel and not self.overloaded:
            self.overloaded = True
            self._note(
                f"requests waiting for a free slot grew window after window ({backlogs[0]} to "
                f"{backlogs[-1]}): the arrivals outrun the server whatever N, the queue decides "
                "who is served when"
            )

    def _note(self, text: str) -> None:
        self.report.notes.append(text)
        self.say(text)

    def run(self, backend: WindowBackend) -> ExperimentReport:
        """Windows until the standing settles, the budget runs out or windows cannot be used;
        the server is left at the answer."""
        report = self.report
        started = backend.elapsed
        backend.switch(self._out(self.answer))
        self.current = self.answer
        self._note(PLAIN_OUT_OF_REACH)
        standing = self.assess()
        cycles = 0
        while True:
            if standing.status == settle.MOVED:
                if not self._moved(standing):
                    break
                standing = self.assess()
                continue
            if standing.status == settle.SETTLED:
                report.status = settle.SETTLED
                break
            left = self.options.budget_s - (backend.elapsed - started)
            contender = self.next_contender(standing)
            cycle_s = self.options.min_window_s * self.options.cycle + 2 * self.options.washout_s
            if contender is None or left < cycle_s:
                report.status = settle.OPEN
                to_tell = self.minutes_to_tell(standing, backend.elapsed - started)
                answer = self._out(self.answer)
                report.to_tell = {n: more for more, n, m in to_tell if m == answer}
                report.to_wait = self.minutes_to_wait(standing)
                untested = ", ".join(f"N={n}" for n in report.untested)
                confounded = ", ".join(f"N={n}" for n in report.confounded)
                why = (
                    f"the experiment's {self.options.budget_s:.0f} s are spent"
                    if contender is not None
                    else "no comparison the traffic can tell is open"
                )
                self._note(
                    f"{why}: N={self._out(self.answer)} stands unresolved, "
                    f"{len(standing.measuring)} comparison(s) open"
                    + (f", {untested} not yet tested" if untested else "")
                    + (
                        f", {confounded} not told apart by the counts (most of their time is "
                        "steps that also read a prompt, where drafting lengthens the read: a "
                        "rate per count does not price it)"
                        if confounded
                        else ""
                    )
                    + (f"; it {self.waiting_for()}" if self.waiting_for() else "")
                    + self._time_to_tell(to_tell)
                )
                break
            serve = self.covering(contender, standing)
            plan = self.plan_cycle(contender, cycles, left, serve)
            standing = self._cycle(backend, plan, standing)
            cycles += 1
            # a burst passes: wait it out at the standing N; arrivals above capacity do not
            waited = self.overloaded and self.unusable_run < STOP_AFTER
            if waited and self._wait_out(backend, started, cycles):
                standing = self.assess()
                continue
            if self.unusable_run >= STOP_AFTER or self.overloaded:
                report.status = STOPPED
                why = (
                    "the server is above its capacity"
                    if self.overloaded
                    else f"{STOP_AFTER} windows in a row could not be used"
                )
                self._note(f"{why}: the experiment stops, N={self._out(self.answer)} stands")
                break
        if self.current != self.answer:
            backend.switch(self._out(self.answer))
        report.answer = self._out(self.answer)
        return report

    def _cycle(
        self, backend: WindowBackend, plan: list[Planned], standing: settle.Standing
    ) -> settle.Standing:
        """Serve a cycle's windows; then a new standing on the figures so far."""
        done: list[tuple[Planned, WindowFigures]] = []
        for planned in plan:
            self._switch(backend, planned)
            figures = backend.window(planned.seconds)
            self.record(planned, figures)
            done.append((planned, figures))
            if self.unusable_run >= STOP_AFTER or self.overloaded:
                return standing
        return self.assess()

    def _switch(self, backend: WindowBackend, planned: Planned) -> None:
        """The server to the planned window's N, followed by a washout where it changes."""
        if planned.n == self.current:
            return
        backend.switch(self._out(planned.n))
        self.current = planned.n
        if self.options.washout_s > 0:
            # served at the new N, counted in no window: the switch's transient
            self.report.cost.add(planned, backend.window(self.options.washout_s))
            self.report.washouts += 1

    def _wait_out(self, backend: WindowBackend, started: float, cycle: int) -> bool:
        """A backlog that grew window after window: contender windows pause and the standing N
        serves windows of its own until the requests waiting fall below -np (a burst passed:
        True) or the budget ends, or windows cannot be read (False: arrivals above capacity, or
        a server gone)."""
        self._note(
            f"contender windows pause: N={self._out(self.answer)} serves until the requests "
            "waiting for a slot fall below the slots"
        )
        seconds = self.options.min_window_s * self.options.cycle
        while True:
            left = self.options.budget_s - (backend.elapsed - started)
            if left < self.options.min_window_s:
                return False
            planned = Planned(self.answer, False, min(seconds, left), cycle, self.answer)
            self._switch(backend, planned)
            figures = backend.window(planned.seconds)
            self.record(planned, figures)
            if self.unusable_run >= STOP_AFTER:
                return False
            if figures.problem is None and figures.backlog < self.n_parallel:
                self.overloaded = False
                self._note(
                    f"{figures.backlog} request(s) waiting for a slot: the burst passed, "
                    "the experiment goes on"
                )
                return True

    def _moved(self, standing: settle.Standing) -> bool:
        """Follow a move (True), or stop (False) where it would go back to a value it left,
        which would change N twice in one decision (the traffic does not keep the two apart:
        the value it moved to stands), or where it keeps moving."""
        if standing.answer in self.visited:
            self.report.status = settle.OPEN
            self._note(
                f"the traffic would move N back from {self._out(self.answer)} to "
                f"{self._out(standing.answer)}: it does not keep them apart, so "
                f"N={self._out(self.answer)} stands"
            )
            return False
        back, self.answer = self.answer, standing.answer
        self.report.moves.append(self._out(self.answer))
        self.say(f"the server's traffic moves N from {self._out(back)} to {self._out(self.answer)}")
        self.visited.add(self.answer)
        if len(self.report.moves) >= self.options.max_moves:
            self.report.status = settle.MOVED
            self._note("N keeps moving: the experiment stops")
            return False
        return True

    def _out(self, n: int) -> int:
        return as_set(n, self.n_parallel)
