"""`tuner watch --experiment`: N settled on the server's own traffic.

The cost model answers from closed levels measured on the profile's prompts; real traffic comes
and goes at random and accepts what its own content accepts. The experiment asks the server
itself: it serves the standing N most of the time and, in short windows, its contenders, then
moves N only where the paired figures show a contender ahead, by the rule `tune` settles N with
(tuner.decide.settle: one-sided 95 % bounds, the tolerance, ties to the smallest).

Schedule (`Experiment.plan_cycle`, randomised, seeded): cycles of k = ceil(1 / share) windows
of one length, one of them a contender's, at a random place that is neither the first nor the
last, so each contender window is flanked by the standing N and at most `share` of the time is
away from it; every other turn goes to the leader (the open comparison whose upper bound is
highest, if it could still move N), the others to the two sides of the answer in a shuffled
order. A turn serves the farthest value wanted on its side (`covering`): the standing N gives
one side of every count, and a window at the farthest value gives the other side at every
count between, for every comparison on that side at once. Contenders are the model's tie set,
the neighbours of it and of the answer, and always draft (`allowed`), those the traffic can
tell apart from the answer (it spends time at a count where one drafts and the other does
not). A window lasts as long as it takes to spend about `level_s` seconds at the counts its
comparison rests on (from the traffic's time shares so far), within [min_window_s,
max_window_s]: windows long enough for the concurrency they see, and short enough that cycles
keep coming where those counts are rare.

Figures (tuner.measure.windows): every window is kept by the number of slots generating, as
the threshold counts them. Two thresholds differ only at the counts between them, where one
drafts and the other does not; there the window's rate (tok/s with c generating: c over the
time per output token there) is the contender's or the standing N's, and the concurrency a
window happened to see weighs the counts without changing the rate at any. So the windows
give, per count, a drafting side and a not-drafting side: the gain g(c) that tune measures on
closed levels, here on the server's real requests, as the rates pooled over every cycle, with
the cycles as the blocks of a jackknife (`gains`). The two sides need not meet in one cycle: at
a rare count a contender window and its flanks seldom both see it, while the windows are
interleaved at random, so drift falls on both sides alike. A comparison sums its counts cycle
by cycle (one cycle's windows move all its counts together), with the degrees of freedom of the
cycles its sparsest side was seen in. A count needs each side seen in `min_blocks` cycles with
`min_tokens` tokens a block before a comparison rests on it. The objective is the traffic's
own: 1 / mean time per output token under its arrivals, each count weighted by the objective's
derivative by its rate there in the birth-death queue of tuner.model.queue (the time spent at it
and how much sooner a faster count empties the slots: the occupancy N causes), counts the
traffic hardly reaches weighing nothing (`weights`). settle.assess then decides; a move is
followed (its own contenders next), but not one back to a value it left: N changes at most once
between any two values within one experiment.

What it costs the users is reported as it ran (`Cost`): the share of time and of requests
served at a contender, and the time per output token in contender windows against the standing
N's windows. Windows it could not read (a restart, the server gone, the threshold changed under
it) count for nothing and are said; three in a row stop the experiment. A backlog of requests
waiting for a free slot that grew over six windows in a row to twice -np or more pauses the
contender windows: the standing N serves until fewer requests wait than there are slots (a
burst passed) and the experiment goes on; where that does not happen before the budget ends
(the server above its capacity: the arrivals outrun it whatever N, and the queue, not N,
decides who is served when) the experiment stops.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tuner.decide import settle
from tuner.decide.paired import LevelDiffs, t_quantile
from tuner.errors import ConfigError
from tuner.measure.windows import WindowBackend, WindowFigures
from tuner.model import queue
from tuner.recommendation import Recommendation

STOP_AFTER = 3  # windows in a row it could not use
# A comparison whose weighted time is mostly steps that also read a prompt is not told by the
# counts: a per-count rate there mixes two kinds of step, and drafting lengthens the read, which
# moves time from the counts above to this one (benchmarks/count_strata.py: on a saturated
# bursty twin world the pooled gain at 7 slots was +4.6 tok/s, decode-only -19.0, and the
# objective fell 3.6 %). A majority of the time is the line.
READING_LIMIT = 0.5
# windows in a row whose backlog grew, to twice -np requests waiting a slot or more: a burst
# that fills the server passes within a few windows, arrivals above its capacity do not
OVERLOADED_AFTER = 6
STOPPED = "stopped"
WASHOUT_S = 2.0  # after each switch (see ExperimentOptions.washout_s)
PLAIN_OUT_OF_REACH = (
    "plain (the server without its draft model) is out of the experiment's reach on one "
    "server: whether to draft at all rests on `tune --plain-url` (`tuner recommend` shows what "
    "it measured beside its answer)"
)


@dataclass(frozen=True)
class ExperimentOptions:
    """How the experiment runs (see the module docstring)."""

    share: float = 0.25  # most of the time away from the standing N
    budget_s: float = 1800.0  # the longest an experiment runs (the backend's clock)
    tolerance: float = settle.TOLERANCE
    min_window_s: float = 10.0
    # a cycle is `cycle` windows of one length, so a comparison at rare counts sets the pace
    # of every cycle: 40 s keeps cycles (the blocks the bounds count) coming where those
    # counts would ask for minutes (on the open-loop sets' slowest worlds, benchmarks/
    # watch_experiment.py --explain: 120 s gave four or five cycles in 25 minutes)
    max_window_s: float = 40.0
    level_s: float = 4.0  # seconds a window should spend at the counts its comparison rests on
    min_tokens: float = 30.0  # fewer tokens at a count in a window: no difference from it there
    min_share: float = 0.005  # counts with less of the busy time weigh nothing
    min_blocks: int = 2
    seed: int = 0
    # always draft (N=0, the server's default) a contender too, as in tune: the model's tie
    # set can be far from the best under bursts its Poisson queue does not see
    always: bool = True
    reach: int = 1  # neighbours: values this far from the tie set's and the answer
    max_moves: int = 4
    # seconds after every switch served at the new N but counted in no window: a switch's
    # transient (drafts in flight, a lazy drafter catching up) is not charged to the N
    # switched to (benchmarks/washout.py measures it)
    washout_s: float = WASHOUT_S

    def check(self) -> None:
        if not 0 < self.share <= 1 / 3:
            raise ConfigError(
                f"--experiment-share {self.share:g}: a share of the time in (0, 1/3] (each "
                "contender window is flanked by two of the standing N)"
            )
        if self.budget_s <= 0:
            raise ConfigError("--experiment-budget must be above 0")
        if not 0 < self.min_window_s <= self.max_window_s:
            raise ConfigError("experiment windows: 0 < min_window_s <= max_window_s")
        if not 0 < self.tolerance < 1:
            raise ConfigError(f"--tolerance {self.tolerance:g}: a share of the objective in (0, 1)")
        if self.washout_s < 0:
            raise ConfigError("experiment washout: 0 s or more")

    @property
    def cycle(self) -> int:
        return max(3, math.ceil(1.0 / self.share - 1e-9))


@dataclass(frozen=True)
class Planned:
    """A window of the plan: which N, whether it is a contender's, how long, in which cycle."""

    n: int
    contender: bool
    seconds: float
    cycle: int
    answer: int  # the standing N of its cycle


@dataclass
class Cost:
    """What the experiment cost the users while it ran."""

    seconds: float = 0.0
    away_s: float = 0.0  # at a contender
    requests: int = 0
    requests_away: int = 0
    slot_s: list[float] = field(default_factory=lambda: [0.0, 0.0])  # standing, contender
    tokens: list[float] = field(default_factory=lambda: [0.0, 0.0])

    def add(self, planned: Planned, figures: WindowFigures) -> None:
        arm = 1 if planned.contender else 0
        self.seconds += figures.seconds
        self.requests += figures.finished
        if planned.contender:
            self.away_s += figures.seconds
            self.requests_away += figures.finished
        self.slot_s[arm] += figures.slot_seconds
        self.tokens[arm] += figures.tokens

    def tpot_ms(self, contender: bool) -> float | None:
        arm = 1 if contender else 0
        return 1000.0 * self.slot_s[arm] / self.tokens[arm] if self.tokens[arm] else None

    @property
    def tpot_ratio(self) -> float | None:
        """Contender windows' time per output token over the standing N's, less 1."""
        away, home = self.tpot_ms(True), self.tpot_ms(False)
        return away / home - 1.0 if away is not None and home else None

    def text(self) -> str:
        time_share = self.away_s / self.seconds if self.seconds else 0.0
        req_share = self.requests_away / self.requests if self.requests else 0.0
        away, home, ratio = self.tpot_ms(True), self.tpot_ms(False), self.tpot_ratio
        tpot = (
            f"; their time per output token {away:.1f} ms against {home:.1f} ms at the standing "
            f"N ({ratio:+.1%})"
            if away is not None and home is not None and ratio is not None
            else ""
        )
        return (
            f"cost to users: {time_share:.0%} of {self.seconds:.0f} s at a contender, "
            f"{self.requests_away} of {self.requests} requests ({req_share:.0%}) served there"
            + tpot
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "away_s": self.away_s,
            "requests": self.requests,
            "requests_away": self.requests_away,
            "tpot_standing_ms": self.tpot_ms(False),
            "tpot_contender_ms": self.tpot_ms(True),
            "tpot_ratio": self.tpot_ratio,
        }


@dataclass
class ExperimentReport:
    """What an experiment did and found: the N it started from and the one it leaves, how it
    ended (settled, unresolved: the budget ran out, stopped: windows it could not use), the
    last standing with every verdict and its bounds, the windows, the cost."""

    start: int
    answer: int
    n_parallel: int
    status: str = settle.OPEN
    standing: settle.Standing | None = None
    windows: list[tuple[Planned, WindowFigures]] = field(default_factory=list)
    moves: list[int] = field(default_factory=list)
    cost: Cost = field(default_factory=Cost)
    notes: list[str] = field(default_factory=list)
    # contenders the traffic has not yet told apart from the answer: they differ from it only
    # at counts the windows have not seen enough of (absence of data is no evidence)
    untested: list[int] = field(default_factory=list)
    # contenders whose counts are mostly steps that also read a prompt: the counts cannot tell
    # them from the answer (READING_LIMIT), and the answer cannot be settled against them
    confounded: list[int] = field(default_factory=list)
    washouts: int = 0  # switches followed by a washout counted in no window
    # an unresolved answer's open comparisons with bounds, by contender (as the server takes
    # it): the minutes more of this traffic each needs at the spread seen (the judge's
    # resolution), where the budget ran out
    to_tell: dict[int, float] = field(default_factory=dict)
    # its contenders without bounds (the data at their counts lacking): the minutes more of
    # this traffic until their counts have it (None: the traffic has not reached one yet)
    to_wait: dict[int, float | None] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.answer != self.start

    def verdicts(self) -> list[str]:
        """One line per comparison of the last standing: verdict and one-sided bounds. A tie
        question asked against the answer itself is its comparison again: said once."""
        if self.standing is None:
            return []
        out: list[str] = []
        for c in self.standing.comparisons + self.standing.questions:
            against = c.against if c.against is not None else self.standing.answer
            n, m = _as_set(c.contender, self.n_parallel), _as_set(against, self.n_parallel)
            head = f"N={n} against N={m}"
            if math.isnan(c.advantage.estimate) or math.isinf(c.advantage.se):
                levels = ", ".join(map(str, c.levels))
                line = f"{head}: not measured enough yet at {levels} generating, {c.verdict}"
            else:
                low, high = c.advantage.bounds(settle.CONFIDENCE)
                line = (
                    f"{head}: {c.advantage.estimate:+.3f} [{low:+.3f}, {high:+.3f}] (the "
                    f"objective's units, tolerance {self.standing.tolerance:.3f}; 95 % one-sided "
                    f"each), {c.verdict}"
                )
            if line not in out:
                out.append(line)
        return out

    def as_dict(self) -> dict[str, Any]:
        standing = self.standing
        return {
            "start": self.start,
            "answer": self.answer,
            "status": self.status,
            "moves": self.moves,
            "tolerance": standing.tolerance if standing else None,
            "tie": standing.tie if standing else [],
            "comparisons": [c.as_dict() for c in standing.comparisons] if standing else [],
            "questions": [c.as_dict() for c in standing.questions] if standing else [],
            "cost": self.cost.as_dict(),
            "notes": self.notes,
            "untested": self.untested,
            "confounded": self.confounded,
            "washouts": self.washouts,
            "minutes_to_tell": {str(n): m for n, m in self.to_tell.items()},
            "minutes_to_wait": {str(n): m for n, m in self.to_wait.items()},
            # a window it could not read is kept as what it was meant to be and why not,
            # none of its figures
            "windows": [
                {"n": f.n, "seconds": f.seconds, "problem": f.problem}
                | ({} if f.problem else f.to_dict())
                | {"contender": p.contender, "cycle": p.cycle, "answer": p.answer}
                for p, f in self.windows
            ],
        }


def model_tie(rec: Recommendation, tolerance: float = settle.TOLERANCE) -> list[int]:
    """The values of N the model cannot tell from its answer: those its study puts within the
    tolerance of the answer's objective, and a live tie where `tune` stored one."""
    values = rec.scored()
    chosen = rec.max_slots
    top = values.get(chosen, rec.objective)
    tie = set(rec.tie) | {chosen}
    if top:
        tie |= {n for n, v in values.items() if top - v <= tolerance * abs(top)}
    return sorted(tie)


def _inverse_tpot(tps: np.ndarray, rate: float, output_tokens: float) -> float | None:
    """1 / (mean time per output token, s) under Poisson arrivals: None where the queue would
    not empty."""
    occ = queue.occupancy(tps, rate, output_tokens)
    if occ.saturated:
        return None
    return 1000.0 / queue.mean_tpot_ms(tps, occ)


def _as_set(n: int, n_parallel: int) -> int:
    """N as the server takes it: always draft (n_parallel) is 0."""
    return 0 if n >= n_parallel else n


def _pooled_gain(cells: list[tuple[float, float, float, float]]) -> float:
    """Pooled on rate less pooled off rate over (on tokens, on s, off tokens, off s) cells."""
    on_t, on_s, off_t, off_s = (sum(cell[i] for cell in cells) for i in range(4))
    return on_t / on_s - off_t / off_s


def _sides(cells: list[tuple[float, float, float, float]]) -> tuple[int, int, float, float]:
    """Over (on tokens, on s, off tokens, off s) cells: the cells with tokens drafting and not
    drafting, and the tokens of each side."""
    return (
        sum(1 for cell in cells if cell[0] > 0),
        sum(1 for cell in cells if cell[2] > 0),
        sum(cell[0] for cell in cells),
        sum(cell[2] for cell in cells),
    )


def _span(counts: list[int]) -> str:
    """Counts as ranges: 3-5, 8."""
    parts, start = [], counts[0]
    for a, b in zip(counts, [*counts[1:], None], strict=True):
        if b is None or b != a + 1:
            parts.append(f"{start}" if start == a else f"{start}-{a}")
            if b is not None:
                start = b
    return ", ".join(parts)


def drafts_at(n: int, c: int) -> bool:
    """Whether threshold n (already effective: 1..n_parallel) starts drafts with c generating."""
    return c <= n


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
        self.prior = dict(shares or {})  # time shares by count, idle included, before any window
        self.rate, self.output_tokens = rate, output_tokens  # the traffic's, before any window
        self.rng = random.Random(f"experiment:{options.seed}")
        self.turns: list[bool] = []  # the sides of the answer in turn (above: True)
        self.lead_turn = False  # every other turn goes to the leader (next_contender)
        self.visited = {self.answer}
        self.unusable_run = 0
        self.overloaded = False
        self.current = self.answer
        self.report = ExperimentReport(self._out(self.answer), self._out(self.answer), n_parallel)

    def _eff(self, n: int) -> int:
        return self.n_parallel if n <= 0 or n >= self.n_parallel else n

    # --- the figures so far ------------------------------------------------------------------

    def usable(self) -> list[WindowFigures]:
        return [f for _, f in self.report.windows if self._usable(f)]

    @staticmethod
    def _usable(figures: WindowFigures) -> bool:
        return figures.problem is None

    def time_shares(self) -> dict[int, float]:
        """Share of all the time (idle included) at each count: the windows', else the prior."""
        seconds: dict[int, float] = {}
        for f in self.usable():
            for c, (s, _) in f.levels.items():
                seconds[c] = seconds.get(c, 0.0) + s
        total = sum(seconds.values())
        if total > 0:
            return {c: s / total for c, s in seconds.items()}
        if self.prior:
            return dict(self.prior)
        # nothing known of the traffic yet: every count alike
        return {c: 1.0 / self.n_parallel for c in range(1, self.n_parallel + 1)}

    def shares_weights(self) -> list[float]:
        """w_c for c = 1..n_parallel: share of the busy time (the occupancy as seen): the
        objective's weights where the arrivals are not known. Counts below min_share each weigh
        nothing where together they are below it too; a tail of many rare counts (a 32-slot
        server spending 8 % of its time above 17, none of those counts 0.5 %) keeps its weight,
        and a comparison resting on it waits for data there."""
        shares = self.time_shares()
        busy = sum(v for c, v in shares.items() if c > 0)
        n = self.n_parallel
        out = [shares.get(c, 0.0) / busy if busy > 0 else 0.0 for c in range(1, n + 1)]
        least = self.options.min_share
        if sum(w for w in out if w < least) >= least:
            return out
        return [w if w >= least else 0.0 for w in out]

    def level_rates(self) -> tuple[list[float | None], list[float | None]]:
        """tok/s at each count (index c, 0 unused), drafting (on) and not (off), pooled over
        every usable window by whether its N drafts there."""
        n = self.n_parallel
        sums = {on: [[0.0, 0.0] for _ in range(n + 1)] for on in (True, False)}
        for planned, f in self.report.windows:
            if not self._usable(f):
                continue
            for c, (s, t) in f.levels.items():
                if 1 <= c <= n:
                    cell = sums[drafts_at(planned.n, c)][c]
                    cell[0] += s
                    cell[1] += t

        def rates(on: bool) -> list[float | None]:
            least = self.options.min_tokens
            return [t / s if t >= least and s > 0 else None for s, t in sums[on]]

        return rates(True), rates(False)

    def arrivals(self) -> tuple[float, float] | None:
        """Arrival rate and mean output tokens: the windows' own where they saw enough
        requests, else what the traffic said before."""
        windows = self.usable()
        seconds = sum(f.seconds for f in windows)
        finished = sum(f.finished for f in windows)
        if finished >= 20 and seconds > 0:
            # below capacity (a saturated window counts for nothing) requests finish as fast
            # as they arrive
            return finished / seconds, sum(f.tokens for f in windows) / finished
        if self.rate and self.output_tokens:
            return self.rate, self.output_tokens
        return None

    def weights(self) -> tuple[list[float], float]:
        """The objective's weights per count and its value. The objective is 1 / the time per
        output token (tokens per second per generating slot, higher better) as the windows
        saw it: sum_c p_c tok/s(c) / sum_c p_c c over the busy-time shares p_c. A count's
        weight is the objective's derivative by its rate there, the larger of two: at the
        occupancy seen (p_c / sum_k p_k k), and in the birth-death queue of tuner.model.queue
        at the traffic's arrival rate over the rates measured under the standing N, where a
        faster count also empties the slots sooner (the occupancy N causes). The queue takes
        the arrivals as Poisson: bursts put far more time at the top counts than it says, and
        the occupancy seen is the floor that keeps them weighed. Counts the traffic spends
        less than min_share of its busy time at weigh nothing. Before any rate is measured:
        the shares and the rate they weigh (tok/s over the busy time)."""
        shares = self.shares_weights()
        tps = self._regime_rates()
        if tps is None:
            return shares, self.objective(shares)
        counts = np.arange(1, self.n_parallel + 1, dtype=float)
        p = np.asarray(shares, dtype=float)
        mean_c = float(p @ counts)
        if mean_c <= 0:
            return shares, self.objective(shares)
        base = float(p @ tps) / mean_c
        direct = p / mean_c
        queued = self._queue_derivatives(tps)
        weights = [
            max(float(d), q) if s > 0 else 0.0
            for d, q, s in zip(direct, queued, shares, strict=True)
        ]
        return weights, base

    def _queue_derivatives(self, tps: np.ndarray) -> list[float]:
        """d (1 / TPOT) / d tok/s(c) in the Poisson queue at the traffic's arrivals; zeros
        where the arrivals are not known or the queue would not empty."""
        known = self.arrivals()
        zeros = [0.0] * self.n_parallel
        if known is None or _inverse_tpot(tps, *known) is None:
            return zeros
        out = []
        for c in range(self.n_parallel):
            h = 0.01 * tps[c]
            up, down = tps.copy(), tps.copy()
            up[c] += h
            down[c] -= h
            hi, lo = _inverse_tpot(up, *known), _inverse_tpot(down, *known)
            out.append((hi - lo) / (2 * h) if hi is not None and lo is not None else 0.0)
        return out

    def _regime_rates(self) -> np.ndarray | None:
        """tok/s at counts 1..n_parallel under the standing N: its regime's measured rate, else
        the other regime's, else the nearest count's; None before any count was measured."""
        on, off = self.level_rates()
        n = self.n_parallel
        own = [(on if drafts_at(self.answer, c) else off)[c] for c in range(1, n + 1)]
        other = [(off if drafts_at(self.answer, c) else on)[c] for c in range(1, n + 1)]
        values = [a if a is not None else b for a, b in zip(own, other, strict=True)]
        known = [i for i, v in enumerate(values) if v is not None]
        if not known:
            return None
        filled = [
            v if v is not None else values[min(known, key=lambda k: abs(k - i))]
            for i, v in enumerate(values)
        ]
        return np.array(filled, dtype=float)

    def objective(self, weights: list[float]) -> float:
        """sum_c w_c tok/s(c), the rates pooled over every usable window."""
        seconds = [0.0] * (self.n_parallel + 1)
        tokens = [0.0] * (self.n_parallel + 1)
        for f in self.usable():
            for c, (s, t) in f.levels.items():
                if 1 <= c <= self.n_parallel:
                    seconds[c] += s
                    tokens[c] += t
        return sum(
            w * tokens[c] / seconds[c]
            for c, w in enumerate(weights, start=1)
            if w > 0 and seconds[c] > 0
        )

    def blocks(self) -> dict[int, dict[int, tuple[float, float, float, float]]]:
        """Per cycle, per count: (on tokens, on seconds, off tokens, off seconds) over the
        cycle's usable windows, each window's time at a count on the side its N puts it
        (drafting there or not)."""
        out: dict[int, dict[int, list[float]]] = {}
        for planned, f in self.report.windows:
            if not self._usable(f):
                continue
            cycle = out.setdefault(planned.cycle, {})
            for c, (s, t) in f.levels.items():
                if 1 <= c <= self.n_parallel and s > 0:
                    cell = cycle.setdefault(c, [0.0, 0.0, 0.0, 0.0])
                    i = 0 if drafts_at(planned.n, c) else 2
                    cell[i] += t
                    cell[i + 1] += s
        return {
            k: {c: (v[0], v[1], v[2], v[3]) for c, v in cycle.items()} for k, cycle in out.items()
        }

    def _measured(self, cells: list[tuple[float, float, float, float]]) -> bool:
        """A count's gain needs each side seen in min_blocks cycles, with min_tokens tokens a
        block on each side in all."""
        on_k, off_k, on_t, off_t = _sides(cells)
        least = self.options.min_blocks
        need = least * self.options.min_tokens
        return min(on_k, off_k) >= least and min(on_t, off_t) >= need

    def gains(self) -> dict[int, LevelDiffs]:
        """on - off per count: the rates pooled over every cycle (tokens over seconds, on and
        off apart), with the jackknife's pseudo-values over the cycles about it (their spread
        its standard error, keyed by cycle so that a comparison sums them cycle by cycle).

        The sides need not meet in one cycle: at a rare count a contender window and its
        flanks seldom both see it, while every window at the standing N adds to the side it
        serves and a contender window that reached the count adds to the other; the windows
        of a cycle are interleaved at random, so drift in the traffic falls on both sides
        alike. Degrees of freedom: the cycles the sparser side was seen in, less one.

        The estimate is the difference of pooled rates, not the mean of each window's
        difference: a window's rate where slots draft is biased upward when the window saw
        little of the count, because a stretch at a count ends when a request ends, and a
        request ends sooner after steps that accepted many tokens, so short stretches are the
        lucky ones (the mean of ratios over stopping times; a twin world whose gain at three
        slots is nil showed +7 to +11 tok/s on 50 from single windows of 1-4 s there).
        Pooling shrinks that with the time seen."""
        blocks = self.blocks()
        ids = tuple(sorted(blocks))
        n = len(ids)
        zero = (0.0, 0.0, 0.0, 0.0)
        counts = {c for cycle in blocks.values() for c in cycle}
        out = {}
        for c in sorted(counts):
            cells = [blocks[k].get(c, zero) for k in ids]
            if not self._measured(cells):
                out[c] = LevelDiffs(())
                continue
            whole = _pooled_gain(cells)
            if n == 1:  # no spread to tell: LevelDiffs gives it no standard error
                out[c] = LevelDiffs((whole,))
                continue
            on_t, on_s, off_t, off_s = (sum(cell[i] for cell in cells) for i in range(4))
            leave_one_out = [
                (on_t - a) / (on_s - b) - (off_t - x) / (off_s - y) for a, b, x, y in cells
            ]
            pseudo = [n * whole - (n - 1) * g for g in leave_one_out]
            centre = sum(pseudo) / n
            seen = min(_sides(cells)[:2])
            out[c] = LevelDiffs(
                tuple(whole + v - centre for v in pseudo), blocks=ids, dof=float(seen - 1)
            )
        return out

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
        weights, objective = self.weights()
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
        reading = self.reading_shares()
        confounded = {m for m in tested if self._mostly_reading(m, weights, reading)}
        self.report.confounded = [self._out(m) for m in sorted(confounded)]
        standing = settle.assess(
            self.gains(),
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

    def reading_shares(self) -> dict[int, float]:
        """Per count, the share of its time (every usable window) in steps during which a slot
        read its prompt beside the generating ones."""
        seconds: dict[int, float] = {}
        reading: dict[int, float] = {}
        for f in self.usable():
            for c, (s, _) in f.levels.items():
                seconds[c] = seconds.get(c, 0.0) + s
            for c, s in f.reading.items():
                reading[c] = reading.get(c, 0.0) + s
        return {c: reading.get(c, 0.0) / s for c, s in seconds.items() if s > 0}

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
        blocks = self.blocks()
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
            unseen = [c for c in missing if self.time_shares().get(c, 0.0) <= 0]
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
            on_k, off_k, on_t, off_t = _sides([cycle[c] for cycle in blocks.values() if c in cycle])
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
        blocks = self.blocks()
        return self._wait(self._missing(counts, blocks), len(blocks))

    def _wait(self, missing: Mapping[int, tuple[int, float, int]], cycles_run: int) -> float | None:
        """wait_s of the counts missing data (`_missing`), over cycles_run cycles so far."""
        shares = self.time_shares()
        if any(shares.get(c, 0.0) <= 0 for c in missing):
            return None
        on, off = self.level_rates()
        spent = sum(f.seconds for f in self.usable())
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
        shares = self.time_shares()
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
        return _as_set(n, self.n_parallel)
