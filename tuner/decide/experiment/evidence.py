"""The windows' figures by number of slots generating: the time shares, the tok/s at each count
drafting and not, the arrivals, the objective's weights by count (the occupancy seen and the
queue's derivative), and the per-count gains with the cycles as a jackknife's blocks (see the
package's docstring)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tuner.decide.experiment.report import ExperimentOptions, ExperimentReport, drafts_at
from tuner.decide.paired import LevelDiffs
from tuner.measure.windows import WindowFigures
from tuner.model import queue


def inverse_tpot(tps: np.ndarray, rate: float, output_tokens: float) -> float | None:
    """1 / (mean time per output token, s) under Poisson arrivals: None where the queue would
    not empty."""
    occ = queue.occupancy(tps, rate, output_tokens)
    if occ.saturated:
        return None
    return 1000.0 / queue.mean_tpot_ms(tps, occ)


def pooled_gain(cells: list[tuple[float, float, float, float]]) -> float:
    """Pooled on rate less pooled off rate over (on tokens, on s, off tokens, off s) cells."""
    on_t, on_s, off_t, off_s = (sum(cell[i] for cell in cells) for i in range(4))
    return on_t / on_s - off_t / off_s


def sides(cells: list[tuple[float, float, float, float]]) -> tuple[int, int, float, float]:
    """Over (on tokens, on s, off tokens, off s) cells: the cells with tokens drafting and not
    drafting, and the tokens of each side."""
    return (
        sum(1 for cell in cells if cell[0] > 0),
        sum(1 for cell in cells if cell[2] > 0),
        sum(cell[0] for cell in cells),
        sum(cell[2] for cell in cells),
    )


class Evidence:
    """The figures of an experiment's windows so far (its report's, which grow as the windows
    are recorded), and what the traffic said before any: its time shares by count (idle
    included), arrival rate and mean output tokens."""

    def __init__(
        self,
        report: ExperimentReport,
        n_parallel: int,
        options: ExperimentOptions,
        prior: Mapping[int, float],
        rate: float | None,
        output_tokens: float | None,
    ) -> None:
        self.report, self.n_parallel, self.options = report, n_parallel, options
        self.prior = dict(prior)
        self.rate, self.output_tokens = rate, output_tokens

    def usable(self) -> list[WindowFigures]:
        return [f for _, f in self.report.windows if self.usable_figures(f)]

    @staticmethod
    def usable_figures(figures: WindowFigures) -> bool:
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
            if not self.usable_figures(f):
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

    def weights(self, standing: int) -> tuple[list[float], float]:
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
        tps = self._regime_rates(standing)
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
        if known is None or inverse_tpot(tps, *known) is None:
            return zeros
        out = []
        for c in range(self.n_parallel):
            h = 0.01 * tps[c]
            up, down = tps.copy(), tps.copy()
            up[c] += h
            down[c] -= h
            hi, lo = inverse_tpot(up, *known), inverse_tpot(down, *known)
            out.append((hi - lo) / (2 * h) if hi is not None and lo is not None else 0.0)
        return out

    def _regime_rates(self, standing: int) -> np.ndarray | None:
        """tok/s at counts 1..n_parallel under the standing N: its regime's measured rate, else
        the other regime's, else the nearest count's; None before any count was measured."""
        on, off = self.level_rates()
        n = self.n_parallel
        own = [(on if drafts_at(standing, c) else off)[c] for c in range(1, n + 1)]
        other = [(off if drafts_at(standing, c) else on)[c] for c in range(1, n + 1)]
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
            if not self.usable_figures(f):
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
        on_k, off_k, on_t, off_t = sides(cells)
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
            whole = pooled_gain(cells)
            if n == 1:  # no spread to tell: LevelDiffs gives it no standard error
                out[c] = LevelDiffs((whole,))
                continue
            on_t, on_s, off_t, off_s = (sum(cell[i] for cell in cells) for i in range(4))
            leave_one_out = [
                (on_t - a) / (on_s - b) - (off_t - x) / (off_s - y) for a, b, x, y in cells
            ]
            pseudo = [n * whole - (n - 1) * g for g in leave_one_out]
            centre = sum(pseudo) / n
            seen = min(sides(cells)[:2])
            out[c] = LevelDiffs(
                tuple(whole + v - centre for v in pseudo), blocks=ids, dof=float(seen - 1)
            )
        return out

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
