"""Bursty arrivals for the twin's open-loop workloads: seeded arrival times whose gaps vary more
than a Poisson process's (coefficient of variation above 1).

Two processes, each conditioned on its count as `tuner.measure.arrivals.poisson_offsets` is
(exactly round(rate x duration) arrivals, at least one, in [0, duration)), so the rate asked
for is the rate offered and two processes at one rate offer the same number of requests:

- `gamma_offsets`: a renewal process with gamma gaps of shape k = 1 / cv^2 (cv = 1 is Poisson).
  Conditioned on the count: count + 1 gaps drawn, their partial sums scaled so that the whole
  is the duration (a Dirichlet split; with cv = 1 these are uniform order statistics, exactly a
  conditioned Poisson process's). Bursts are short: neighbouring gaps are independent.
- `mmpp_offsets`: a two-state Markov-modulated Poisson process: a busy state whose rate is
  `peak` times the quiet state's, holding `busy_share` of the time, busy spells of mean
  `busy_s` seconds (exponential spells, quiet ones of mean busy_s x (1 - busy_share) /
  busy_share). Conditioned on the count, the arrivals are independent draws from the
  intensity's shape over the window (what a Poisson process with that intensity given its count
  is). Bursts last: a spell at peak rate fills the server for many requests in a row.

Everything is drawn from `random.Random` seeded by a string of the arguments (random() and
gammavariate/expovariate only): the same arguments give the same arrivals everywhere. Pure.
"""

from __future__ import annotations

import bisect
import itertools
import random


def _count(rate: float, duration_s: float) -> int:
    if rate <= 0:
        raise ValueError(f"arrival rate must be above 0, got {rate}")
    if duration_s <= 0:
        raise ValueError(f"arrival window must be above 0 s, got {duration_s}")
    return max(1, round(rate * duration_s))


def gamma_offsets(rate: float, duration_s: float, cv: float, seed: int) -> list[float]:
    """Arrival times of a gamma renewal process with gap coefficient of variation cv,
    conditioned on round(rate x duration) arrivals (see the module docstring)."""
    if cv <= 0:
        raise ValueError(f"the gaps' coefficient of variation must be above 0, got {cv}")
    count = _count(rate, duration_s)
    rng = random.Random(f"gamma:{seed}:{rate}:{duration_s}:{cv}")
    shape = 1.0 / (cv * cv)
    gaps = [rng.gammavariate(shape, 1.0) for _ in range(count + 1)]
    total = sum(gaps)
    times = list(itertools.accumulate(gaps[:count]))
    return [min(duration_s * t / total, duration_s * (1 - 1e-12)) for t in times]


def mmpp_offsets(
    rate: float,
    duration_s: float,
    seed: int,
    *,
    peak: float = 8.0,
    busy_share: float = 0.2,
    busy_s: float = 30.0,
) -> list[float]:
    """Arrival times of a two-state MMPP of mean rate `rate` (see the module docstring),
    conditioned on round(rate x duration) arrivals."""
    if peak < 1:
        raise ValueError(f"peak is the busy rate over the quiet one, 1 or more, got {peak}")
    if not 0 < busy_share < 1:
        raise ValueError(f"busy_share is a share of the time within (0, 1), got {busy_share}")
    if busy_s <= 0:
        raise ValueError(f"busy spells last more than 0 s, got {busy_s}")
    count = _count(rate, duration_s)
    rng = random.Random(f"mmpp:{seed}:{rate}:{duration_s}:{peak}:{busy_share}:{busy_s}")
    quiet_s = busy_s * (1.0 - busy_share) / busy_share
    # The spells: (start, end, relative intensity); the first state by the stationary shares.
    edges, weights = [0.0], []
    busy = rng.random() < busy_share
    t = 0.0
    while t < duration_s:
        t = min(duration_s, t + rng.expovariate(1.0 / (busy_s if busy else quiet_s)))
        edges.append(t)
        weights.append(peak if busy else 1.0)
        busy = not busy
    # The intensity's integral at each edge; arrivals are uniform on it, mapped back.
    spans = zip(weights, edges[:-1], edges[1:], strict=True)
    mass = [0.0, *itertools.accumulate(w * (b - a) for w, a, b in spans)]
    out = []
    for _ in range(count):
        u = rng.random() * mass[-1]
        i = min(bisect.bisect_right(mass, u) - 1, len(weights) - 1)
        out.append(min(edges[i] + (u - mass[i]) / weights[i], duration_s * (1 - 1e-12)))
    return sorted(out)


def gap_cv(offsets: list[float]) -> float:
    """The coefficient of variation of the gaps between sorted arrival times."""
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    if len(gaps) < 2:
        raise ValueError("the gaps' spread takes three arrivals or more")
    mean = sum(gaps) / len(gaps)
    var = sum((g - mean) ** 2 for g in gaps) / (len(gaps) - 1)
    return var**0.5 / mean
