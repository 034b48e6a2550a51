"""What `tuner tune` did, as it hands it back: the TuneReport (where it started, the sweeps,
the standing it reached, the recommendation stored) and PlainLive (plain against the answer,
measured side by side)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tuner.decide import settle
from tuner.decide.paired import Contrast, LevelDiffs
from tuner.recommendation import Recommendation


@dataclass(frozen=True)
class PlainLive:
    """Plain against the answer, measured side by side: the weighted advantage of plain (tok/s),
    its verdict at the tolerance (ahead: drafting does not pay), the passes taken."""

    advantage: Contrast
    verdict: str
    passes: int
    against: int  # the N plain was measured against

    def as_dict(self) -> dict[str, Any]:
        low, high = self.advantage.bounds(settle.CONFIDENCE)

        def finite(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "estimate": finite(self.advantage.estimate),
            "low": finite(low),
            "high": finite(high),
            "df": finite(self.advantage.df),
            "verdict": self.verdict,
            "passes": self.passes,
            "against": self.against,
        }


@dataclass
class TuneReport:
    """What `tuner tune` did: where it started, the sweeps, the standing it reached, the
    recommendation stored."""

    run_id: int
    study_name: str
    started_from: Recommendation
    way: str = ""
    sweeps: int = 0
    seconds: float = 0.0
    standing: Recommendation | None = None
    settled: settle.Standing | None = None
    history: list[int] = field(default_factory=list)  # the answer after each assessment
    gains: dict[int, LevelDiffs] = field(default_factory=dict)
    plain: PlainLive | None = None  # plain_live: plain against the answer, side by side

    @property
    def changed(self) -> bool:
        return self.standing is not None and (
            self.standing.max_slots != self.started_from.max_slots
            or self.standing.n_max != self.started_from.n_max
        )

    def standing_text(self) -> str:
        """The answer tune leaves standing, in the words every other surface uses
        (Recommendation.headline), with how it came about."""
        if self.standing is None:
            return ""
        how = (
            f"changed from N={self.started_from.max_slots} by the live comparisons"
            if self.changed
            else "unchanged by the live comparisons"
        )
        text = f"answer: {self.standing.headline()}; {how}"
        unresolved = self.standing.unresolved_text()
        if unresolved is not None:
            text += f"; {unresolved.removeprefix('unresolved: ')}"
        return text

    def as_dict(self) -> dict[str, Any]:
        s = self.settled
        return {
            "run_id": self.run_id,
            "study_name": self.study_name,
            "way": self.way,
            "started_from": self.started_from.max_slots,
            "standing": self.standing.max_slots if self.standing else None,
            "standing_n_max": self.standing.n_max if self.standing else None,
            "changed": self.changed,
            "status": s.status if s else None,
            "tie": s.tie if s else [],
            "tie_so_far": s.provisional if s else [],  # unresolved: the tie the data show
            "may_tie": s.may_tie if s else [],
            "tolerance": s.tolerance if s else None,
            "comparisons": [c.as_dict() for c in s.comparisons] if s else [],
            "measure_next": s.measure_next if s else [],
            "sweeps": self.sweeps,
            "seconds": self.seconds,
            "history": self.history,
            "pairs": {c: d.n for c, d in sorted(self.gains.items())},
            # whether to draft at all: measured side by side (plain_live) where that resolved,
            # else the model on plain's launches against the answer
            "plain_live": self.plain.as_dict() if self.plain else None,
            "drafting_pays": self.standing.drafting_pays if self.standing else None,
            "answer_status": self.standing.status if self.standing else None,
            "plain_advantage": (
                list(self.standing.plain_advantage)
                if self.standing and self.standing.plain_advantage
                else None
            ),
        }
