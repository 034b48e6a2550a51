"""A twin world's cost tables as the engine reads them: piecewise-linear curves of [x, ms]
points (tuner.twin.world validates the points) and their lookup lists in seconds, indexed by the
integer rows or slots of a step (tuner.twin.decode's inner loop)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class Curve:
    """A piecewise-linear table as a function: linear between points, flat below the first,
    along the last segment beyond the last (never below 0). Integer arguments up to `cache`
    are looked up in a list, which is what the engine's inner loop calls."""

    __slots__ = ("_cache", "_xs", "_ys")

    def __init__(self, points: Sequence[tuple[float, float]], cache: int = 256) -> None:
        self._xs = [float(x) for x, _ in points]
        self._ys = [float(y) for _, y in points]
        self._cache = [self._eval(float(x)) for x in range(cache + 1)]

    def _eval(self, x: float) -> float:
        xs, ys = self._xs, self._ys
        if x <= xs[0] or len(xs) == 1:
            return ys[0]
        for i in range(1, len(xs)):
            if x <= xs[i]:
                t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
                return ys[i - 1] + t * (ys[i] - ys[i - 1])
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return max(0.0, ys[-1] + slope * (x - xs[-1]))

    def __call__(self, x: float) -> float:
        if isinstance(x, int) and 0 <= x < len(self._cache):
            return self._cache[x]
        return self._eval(float(x))

    def points(self) -> list[tuple[float, float]]:
        """The table's points."""
        return list(zip(self._xs, self._ys, strict=True))

    def at_int(self) -> list[float]:
        """Values at 0, 1, 2, ... (the lookup list)."""
        return self._cache


@dataclass(frozen=True)
class CostTables:
    """A world's cost tables in seconds, looked up by integer rows or slots (the lists run to
    n_parallel x (n_max + 1)); the curves answer beyond."""

    rows: list[float]
    slots: list[float]
    call: list[float]
    reeval: list[float]
    rows_curve: Curve
    slots_curve: Curve
    reeval_curve: Curve

    def rows_s(self, rows: int) -> float:
        return self.rows[rows] if rows < len(self.rows) else self.rows_curve(rows) * 1e-3

    def slots_s(self, slots: int) -> float:
        return self.slots[slots] if slots < len(self.slots) else self.slots_curve(slots) * 1e-3

    def reeval_s(self, rows: int) -> float:
        return self.reeval[rows] if rows < len(self.reeval) else self.reeval_curve(rows) * 1e-3
