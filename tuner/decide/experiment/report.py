"""What an experiment runs with and what it reports: its options, the windows it plans, what it
costs the users, the report (verdicts, windows, cost) stored with the watch's traffic; the
model's tie it starts from, and the threshold's rule on counts (`drafts_at`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tuner.decide import settle
from tuner.errors import ConfigError
from tuner.measure.windows import WindowFigures
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
            n, m = as_set(c.contender, self.n_parallel), as_set(against, self.n_parallel)
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


def as_set(n: int, n_parallel: int) -> int:
    """N as the server takes it: always draft (n_parallel) is 0."""
    return 0 if n >= n_parallel else n


def drafts_at(n: int, c: int) -> bool:
    """Whether threshold n (already effective: 1..n_parallel) starts drafts with c generating."""
    return c <= n
