"""What a fit consumes: measured levels (a policy at a concurrency, with repeats) and kernel rows.

Built from the database by tuner.storage.fits; pure data, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tuner.model.arrivals import ProbeRecord, TtftRound
from tuner.policy import Policy


@dataclass(frozen=True)
class Repeat:
    """One repeat of one level: aggregate tok/s and, when measured, tokens per stream per step."""

    tokens_per_second: float
    accept_len: float | None = None
    step_ms: float | None = None
    drafts: float = 0.0
    accepted_per_position: tuple[float, ...] = ()
    pass_index: int | None = None  # the interleaved pass that measured it (None: not interleaved)
    pair: int = 0  # which of the pass's pairs at its cell (a live launch alternates spec and off)


@dataclass(frozen=True)
class LevelObs:
    """A measured (policy, concurrency) point with its repeats."""

    policy: Policy
    concurrency: int
    repeats: tuple[Repeat, ...]
    level_id: int | None = None
    run_id: int | None = None  # levels of one run measured side by side (paired)

    @property
    def tokens_per_second(self) -> float:
        return float(np.median([r.tokens_per_second for r in self.repeats]))


@dataclass(frozen=True)
class KernelObs:
    """A llama-batched-bench point: n_seq sequences x tokens_per_seq rows in step_ms."""

    n_seq: int
    tokens_per_seq: int
    step_ms: float


@dataclass(frozen=True)
class FitData:
    """Everything a fit consumes (built from the database by tuner.decide.advice)."""

    n_parallel: int
    n_max: int
    levels: tuple[LevelObs, ...]
    kernel: tuple[KernelObs, ...] = ()
    accept_rates: tuple[float, ...] | None = None  # given outright (imported tables)
    accept_len: float | None = None  # given outright (imported tables)
    # what arrivals cost (tuner.model.arrivals): the closed rounds' time to first token, and
    # the catch-up and join probes
    ttft_rounds: tuple[TtftRound, ...] = ()
    probes: tuple[ProbeRecord, ...] = ()

    def of(self, kind: Callable[[Policy], bool]) -> list[LevelObs]:
        """Levels whose policy is of a kind (Policy.is_plain, .is_always, .is_threshold), by c."""
        return sorted(
            (lv for lv in self.levels if kind(lv.policy) and lv.repeats),
            key=lambda lv: lv.concurrency,
        )

    @property
    def plain_measured(self) -> bool:
        """Whether plain (no draft model) was measured: a running server tuned live without a
        plain server beside it (`tune --url` without `--plain-url`) has no plain rows."""
        return bool(self.of(lambda p: p.is_plain))

    @property
    def plain(self) -> list[LevelObs]:
        """Plain's levels; where plain was not measured, the drafting server's off rows (the
        draft loaded, not drafting) stand in: the threshold question compares a drafting
        server with itself and needs nothing else, and whether to draft at all is then not
        answered (CostModel.plain_measured)."""
        return self.of(lambda p: p.is_plain) or self.off

    @property
    def always(self) -> list[LevelObs]:
        return self.of(lambda p: p.is_always)

    @property
    def thresholds(self) -> list[LevelObs]:
        return self.of(lambda p: p.is_threshold)

    @property
    def off(self) -> list[LevelObs]:
        """Threshold levels above their N: the threshold server with the draft loaded, not
        drafting (the profiler's off arm, threshold c-1 at c, or a validation's rows above N)."""
        return [lv for lv in self.thresholds if not lv.policy.drafts_at(lv.concurrency)]


class MeanLength(Protocol):
    """What a level's step time needs of the acceptance (tuner.model.acceptance.Acceptance,
    which is fitted from this module's data and so is not imported here)."""

    @property
    def source(self) -> str: ...

    @property
    def mean_length(self) -> float: ...


def level_step(level: LevelObs, acceptance: MeanLength | None, repeats: Sequence[Repeat]) -> float:
    """Effective step time (ms) of a level from (a resample of) its repeats: median over repeats.

    T = c * L / tok/s with L = 1 where the server does not draft at this level (plain, a threshold
    above its N), the repeat's own tokens per step for spec when every repeat of the level
    measured it, else the model's mean length (1 when acceptance is folded).
    """
    drafts = level.policy.drafts_at(level.concurrency)
    own = drafts and all(r.accept_len for r in level.repeats)
    values = []
    for r in repeats:
        if not drafts or acceptance is None or acceptance.source == "folded":
            length = 1.0
        elif own:
            length = float(r.accept_len or 0.0)
        else:
            length = acceptance.mean_length
        values.append(1000.0 * level.concurrency * length / r.tokens_per_second)
    return float(np.median(values))
