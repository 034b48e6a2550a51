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

The package: `report` (the options, the windows planned, the cost, the report), `evidence`
(the windows' figures by count: time shares, rates, the objective's weights, the per-count
gains), `schedule` (the Experiment: contenders, verdicts, what it waits for, the windows planned
and run).
"""

from __future__ import annotations

from tuner.decide.experiment.evidence import Evidence
from tuner.decide.experiment.report import (
    PLAIN_OUT_OF_REACH,
    STOPPED,
    WASHOUT_S,
    Cost,
    ExperimentOptions,
    ExperimentReport,
    Planned,
    drafts_at,
    model_tie,
)
from tuner.decide.experiment.schedule import Experiment

__all__ = [
    "PLAIN_OUT_OF_REACH",
    "STOPPED",
    "WASHOUT_S",
    "Cost",
    "Evidence",
    "Experiment",
    "ExperimentOptions",
    "ExperimentReport",
    "Planned",
    "drafts_at",
    "model_tie",
]
