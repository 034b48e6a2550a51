"""The frozen set of twin worlds (issue 25): many worlds, written down before the method is tuned
on any of them, to grade its decisions against known truth (benchmarks/twin_regret.py).

`generate()` makes the set deterministically from `GENERATOR_SEED` (Python's string-seeded
`random.Random`, drawing only `random()`: the same floats on every platform and version), and
`write_set(folder)` writes one world TOML per world plus `manifest.toml`; the committed copy in
profiles/twin/frozen/ must equal what this makes, byte for byte (tests/test_twin_frozen.py).
Never adjust a world after seeing how the tuner does on it: change the generator's version and
make a new set instead.

How a world is made:

1. A plan spreads the factors evenly and pairs them at random: a step-cost regime ("cpu", scaled
   on profiles/twin/bench-smollm2-cpu.toml, or "gpu", on profiles/twin/seed-gfx1151.toml), a
   shape, -np (4..16), n_max (2..8), acceptance given as synth_len or as rates, a target
   crossover, traffic weights (uniform, or 70 % at one level and the rest spread evenly), noise
   (quiet, mid or vm; vm only on cpu worlds, whose step times are the VM's) and an attention
   cost (0, the bench's 11 or 40 ms per row per 1k tokens).
2. Shapes, all outside the cost model's smooth family but "smooth" (a knee, which is in it):
   "plateau" (rows_ms quantised in tiles: equal cost over a range of rows, then a step),
   "sawtooth" (slots_ms bumps at odd slot counts from 5 on, the bench's dips at 5 and 7
   streams), "zigzag" (a gain spec/plain that changes sign twice: cheap verify batches up to
   c1 streams, a steep stretch after them, and a per-step cost that appears from c2 generating
   slots on, which the drafting server amortises over more tokens).
3. The continuous parameters are drawn from the regime's ranges, then the part of rows_ms above
   its fixed cost is scaled (bisection) so that the expected gain of drafting over the drafting
   server that does not draft crosses zero half-way between the target c* and c* + 1 (c* = -np:
   the gain at -np is a drawn +2..12 %, spec wins everywhere); a zigzag world solves its three
   pieces in turn. A draw that misses its pattern, leaves a gain within 1 % of zero next to
   the crossover or a gain at one stream outside +4..160 % is drawn again.
4. Tags come from the expected steady-state throughput (`expected_tps`, the decode loop's mean
   step cost and mean accepted length at the closed levels the truth measures): the best N
   under the world's weights, whether it is a base level the profile measures (1, 2, 4, 8, 16
   up to -np, and -np: "inside") or not ("outside"), the sign of the gain at every level.
   The truth (tuner.twin.truth) is the judge; benchmarks/twin_regret.py checks the tags on it.

Pure apart from `write_set` and `load_manifest`.
"""

from __future__ import annotations

import itertools
import math
import random
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError
from tuner.policy import Policy
from tuner.twin.tables import Curve
from tuner.twin.world import World, load_world, synth_rates, world_to_toml

GENERATOR_SEED = 25
GENERATOR_VERSION = 1
WORLD_COUNT = 56
MANIFEST = "manifest.toml"

SHAPES = ("smooth", "plateau", "sawtooth", "zigzag")
N_PARALLEL = (4, 5, 6, 8, 10, 12, 16)
N_MAX = (2, 3, 4, 5, 6, 7, 8)
# target crossovers, spread in these proportions: at 1 stream, at a base level, off the base
# levels, above -np (spec wins everywhere)
TARGET_MIX = ("one", "base", "base", "off", "off", "off", "off", "top")
CONCENTRATED_SHARE = 0.7
PROMPT_TOKENS = 32
OUTPUT_TOKENS = 128
MIN_GAIN_NEAR_ZERO = 0.01  # no gain next to the crossover closer to zero than this
PLAIN_DROP = 0.9  # plain tok/s never below this share of its best at fewer streams
GAIN_AT_ONE = (0.04, 1.6)
ACCEPT_LEN = (1.5, 5.0)

# Noise between the presets: the vm preset's processes at about half their size.
MID_NOISE: dict[str, Any] = {
    "preset": "vm",
    "log_sd": 0.03,
    "add_sd_ms": 3.0,
    "spell_slowdown": 0.15,
    "step_sd": 0.02,
}


@dataclass(frozen=True)
class Regime:
    """Ranges of one step-cost regime, as shares of the fixed cost F = rows_ms(1)."""

    fixed_ms: tuple[float, float]
    knee_rows: tuple[int, int]
    slope_low: tuple[float, float]  # per row below the knee, / F
    slope_ratio: tuple[float, float]  # slope above the knee / below
    slots: tuple[float, float]  # slots_ms per generating slot, / F
    call: tuple[float, float]  # draft call at one slot, / F
    call_slope: tuple[float, float]  # per extra drafting slot, / call at one
    reeval: tuple[float, float]  # reeval_ms as a share of rows_ms
    prefill_ms: tuple[float, float]  # per prompt token
    slot_context: int


# cpu: the bench (F 32.5 ms, nearly flat to 8 rows then ~3 ms a row, slots 3.5 ms each, a draft
# call 5 ms + 1.1 a slot, re-evaluation ~0.1 %, prefill 2.2 ms a token); gpu: the seed's table
# (F 25.8 ms, ~9.5 ms a row, no per-slot cost, the MTP head 1.3 ms and steep by slots,
# re-evaluation 2 % of the forward, prefill cheap).
REGIMES = {
    "cpu": Regime(
        fixed_ms=(20.0, 45.0),
        knee_rows=(4, 12),
        slope_low=(0.005, 0.05),
        slope_ratio=(1.5, 6.0),
        slots=(0.04, 0.12),
        call=(0.08, 0.2),
        call_slope=(0.05, 0.4),
        reeval=(0.0, 0.01),
        prefill_ms=(1.5, 3.0),
        slot_context=4096,
    ),
    "gpu": Regime(
        fixed_ms=(12.0, 40.0),
        knee_rows=(8, 32),
        slope_low=(0.05, 0.4),
        slope_ratio=(1.0, 1.5),
        slots=(0.0, 0.03),
        call=(0.03, 0.12),
        call_slope=(0.2, 1.0),
        reeval=(0.01, 0.03),
        prefill_ms=(0.05, 0.3),
        slot_context=32768,
    ),
}


# -- the expected throughput a design is judged by ------------------------------------------


@dataclass(frozen=True)
class Costs:
    """A world's step costs as functions (milliseconds), for the expected-throughput model."""

    rows: Callable[[float], float]
    slots: Callable[[float], float]
    call: Callable[[float], float]
    reeval: Callable[[float], float]
    overhead: float
    depth_per_row: float  # attention per decode row at the window's mean context, ms
    n_max: int
    accept_len: float  # mean tokens per full-length draft, the target's own included

    def step_ms(self, streams: int, regime: str) -> float:
        """Mean step at `streams` generating slots: "plain" server, drafting server "off"
        (not drafting) or "spec" (every slot drafting n_max)."""
        c = streams
        rows = c * (self.n_max + 1) if regime == "spec" else c
        cost = self.rows(rows) + self.slots(c) + self.depth_per_row * rows
        if regime != "plain":
            cost += self.overhead + self.reeval(rows)
        if regime == "spec":
            cost += self.n_max * self.call(c)
        return cost

    def tps(self, streams: int, regime: str) -> float:
        tokens = streams * (self.accept_len if regime == "spec" else 1.0)
        return 1000.0 * tokens / self.step_ms(streams, regime)

    def gain(self, streams: int, against: str = "off") -> float:
        """Drafting over the drafting server not drafting ("off") or over plain."""
        return self.tps(streams, "spec") / self.tps(streams, against) - 1.0


def costs_of(world: World) -> Costs:
    """The expected-throughput model of a world (see `expected_tps`)."""
    kv = PROMPT_TOKENS + OUTPUT_TOKENS / 2
    return Costs(
        rows=Curve(world.step.rows_ms, 0),
        slots=Curve(world.step.slots_ms, 0),
        call=Curve(world.draft.call_ms, 0),
        reeval=Curve(world.draft.reeval_ms, 0),
        overhead=world.draft.overhead_ms,
        depth_per_row=world.depth.ms_per_row_per_1k * kv / 1000.0,
        n_max=world.n_max,
        accept_len=world.mean_accept_len(),
    )


def expected_tps(world: World, policy: Policy, streams: int) -> float:
    """Steady-state tok/s of a closed level with every stream generating: mean tokens per step
    over the mean step cost (what the truth measures, up to the last steps' shorter drafts and
    the ratio of means; noise off)."""
    costs = costs_of(world)
    if policy.is_plain:
        return costs.tps(streams, "plain")
    return costs.tps(streams, "spec" if policy.drafts_at(streams) else "off")


def sign_pattern(gains: Sequence[float]) -> str:
    """'+' where the gain is above zero, '-' elsewhere, level 1 first."""
    return "".join("+" if g > 0 else "-" for g in gains)


def sign_changes(gains: Sequence[float]) -> int:
    pattern = sign_pattern(gains)
    return sum(a != b for a, b in itertools.pairwise(pattern))


def best_n(values: Sequence[float]) -> int:
    """The N (1..n_parallel) whose objective is highest, given sum_c w_c (spec - off) at each c
    in `values`: N and N - 1 differ only at c = N. Equal values prefer the smaller N."""
    best, total, top = 1, values[0], values[0]
    for n in range(2, len(values) + 1):
        total += values[n - 1]
        if total > top + 1e-12:
            best, top = n, total
    return best


def base_levels(n_parallel: int) -> list[int]:
    """The levels a profile measures first (lab.method.twin_spec): 1, 2, 4, 8, 16 up to
    -np, and -np."""
    levels = [c for c in (1, 2, 4, 8, 16) if c <= n_parallel]
    return levels if n_parallel in levels else [*levels, n_parallel]


# -- the manifest ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One world of the set as the manifest lists it."""

    name: str
    file: str
    model_name: str
    seed: int  # the seed a method runs with on this world
    weights: tuple[float, ...]  # traffic weights of levels 1..n_parallel
    concentrated_at: int  # the level holding 70 % of the time; 0 when uniform
    traffic: str  # uniform | concentrated
    noise_preset: str  # quiet | mid | vm
    noise: str  # quiet | noisy
    crossover: str  # inside | outside: the design's best N among the base levels or not
    shape: str
    regime: str
    n_parallel: int
    n_max: int
    accept_len: float
    depth_ms_per_row_per_1k: float
    base_levels: tuple[int, ...]
    best_n: int  # the design's best N under the weights (expected throughput)
    spec_wins_through: int  # last level where always draft beats plain (-np: everywhere)
    gain_signs: str  # always draft over plain, '+' / '-' per level from 1
    gain_at_one: float

    @property
    def tags(self) -> tuple[str, str, str]:
        return (f"crossover-{self.crossover}", self.noise, self.traffic)

    def weight_map(self) -> dict[int, float]:
        """The traffic weights as run_method and closed_truth take them."""
        return {c: w for c, w in enumerate(self.weights, start=1)}


@dataclass
class Design:
    """What the plan fixes for one world before its continuous parameters are drawn."""

    index: int
    regime: str
    shape: str
    n_parallel: int
    n_max: int
    target: str
    traffic: str
    noise_preset: str
    depth: float
    rates: bool  # acceptance as rates (else synth_len)
    notes: list[str] = field(default_factory=list)


def shuffled(rng: random.Random, items: list[Any]) -> list[Any]:
    # Fisher-Yates on random() alone: Random.shuffle's integer draws are not promised stable.
    out = list(items)
    for i in range(len(out) - 1, 0, -1):
        j = min(int(rng.random() * (i + 1)), i)
        out[i], out[j] = out[j], out[i]
    return out


def spread(values: Sequence[Any], count: int) -> list[Any]:
    return [values[i % len(values)] for i in range(count)]


def plan(count: int = WORLD_COUNT, seed: int = GENERATOR_SEED) -> list[Design]:
    """The factors of every world: each spread evenly over the set, paired at random."""
    rng = random.Random(f"twin-frozen:{seed}:plan")
    half = count // 2
    regimes = shuffled(rng, ["cpu"] * half + ["gpu"] * (count - half))
    shapes = shuffled(rng, spread(SHAPES, count))
    nps = shuffled(rng, spread(N_PARALLEL, count))
    nmaxes = shuffled(rng, spread(N_MAX, count))
    targets = shuffled(rng, spread(TARGET_MIX, count))
    traffic = shuffled(rng, spread(("uniform", "concentrated"), count))
    depths = shuffled(rng, [11.0] * 4 + [40.0] * 4 + [0.0] * (count - 8))
    rates = shuffled(rng, spread((False, False, False, True), count))
    # vm noise only where step times are the VM's own (cpu); the rest quiet or mid, half noisy
    cpu_count = regimes.count("cpu")
    vm = round(0.55 * cpu_count)
    mid_cpu = (cpu_count - vm) // 2
    cpu_noise = shuffled(
        rng, ["vm"] * vm + ["mid"] * mid_cpu + ["quiet"] * (cpu_count - vm - mid_cpu)
    )
    gpu_count = count - cpu_count
    mid_gpu = max(0, count // 2 - vm - mid_cpu)
    gpu_noise = shuffled(rng, ["mid"] * mid_gpu + ["quiet"] * (gpu_count - mid_gpu))
    designs = []
    for i in range(count):
        noise = cpu_noise.pop() if regimes[i] == "cpu" else gpu_noise.pop()
        designs.append(
            Design(
                index=i,
                regime=regimes[i],
                shape=shapes[i],
                n_parallel=nps[i],
                n_max=nmaxes[i],
                target=targets[i],
                traffic=traffic[i],
                noise_preset=noise,
                depth=depths[i],
                rates=rates[i],
            )
        )
    return designs


# -- drawing one world ------------------------------------------------------------------------


class Draw:
    """Uniform draws from one seeded stream, random() only."""

    def __init__(self, key: str) -> None:
        self._rng = random.Random(key)

    def uniform(self, lo: float, hi: float) -> float:
        return lo + (hi - lo) * self._rng.random()

    def log_uniform(self, lo: float, hi: float) -> float:
        return (
            math.exp(self.uniform(math.log(lo), math.log(hi))) if lo > 0 else self.uniform(lo, hi)
        )

    def integer(self, lo: int, hi: int) -> int:
        """lo..hi inclusive."""
        return min(lo + int(self._rng.random() * (hi - lo + 1)), hi)

    def choice(self, items: Sequence[Any]) -> Any:
        return items[self.integer(0, len(items) - 1)]


def _r(value: float, digits: int = 4) -> float:
    return round(float(value), digits)


def _knee(fixed: float, knee: float, low: float, high: float) -> Callable[[float], float]:
    def f(rows: float) -> float:
        below = min(rows, knee) - 1.0
        return fixed + low * below + high * max(0.0, rows - knee)

    return f


def _table(f: Callable[[float], float], xs: Sequence[float]) -> list[tuple[float, float]]:
    return [(float(x), _r(f(x))) for x in xs]


def _bisect(
    f: Callable[[float], float], lo: float = 1e-3, hi: float = 1e3, steps: int = 60
) -> float | None:
    """x in [lo, hi] (log scale) where a decreasing f crosses 0; None when it does not."""
    if f(lo) < 0 or f(hi) > 0:
        return None
    a, b = math.log(lo), math.log(hi)
    for _ in range(steps):
        mid = 0.5 * (a + b)
        if f(math.exp(mid)) > 0:
            a = mid
        else:
            b = mid
    return math.exp(0.5 * (a + b))


@dataclass
class _Parts:
    """A world's tables while it is being drawn (milliseconds)."""

    fixed: float
    rows: Callable[[float], float]  # the shape before scaling; rows(1) may exceed fixed
    knots: list[float]
    slots: list[tuple[float, float]]
    call: list[tuple[float, float]]
    reeval_share: float
    accept: dict[str, Any]
    accept_len: float

    def rows_table(self, scale: float) -> list[tuple[float, float]]:
        return _table(lambda x: self.fixed + scale * (self.rows(x) - self.fixed), self.knots)


def _world(design: Design, parts: _Parts, scale: float, prefill: float) -> World:
    i = design.index
    rows = parts.rows_table(scale)
    reeval = [(x, _r(parts.reeval_share * y)) for x, y in rows]
    noise: dict[str, Any] = (
        dict(MID_NOISE) if design.noise_preset == "mid" else {"preset": design.noise_preset}
    )
    data = {
        "name": f"frozen-{i:02d}",
        "model_name": f"twin-frozen-{i:02d}-{design.regime}-{design.shape}",
        "description": (
            f"frozen set v{GENERATOR_VERSION} world {i}: {design.regime} regime, {design.shape}, "
            f"-np {design.n_parallel}, n_max {design.n_max}, target crossover {design.target}"
        ),
        "n_parallel": design.n_parallel,
        "n_max": design.n_max,
        "slot_context": REGIMES[design.regime].slot_context,
        "acceptance": parts.accept,
        "step": {"rows_ms": rows, "slots_ms": parts.slots},
        "draft": {"call_ms": parts.call, "reeval_ms": reeval},
        "prefill": {"ms_per_token": _r(prefill), "draft_ms_per_token": _r(0.05 * prefill)},
        "depth": {"ms_per_row_per_1k": design.depth},
        "noise": noise,
    }
    return World.model_validate(data)


def _acceptance(design: Design, draw: Draw) -> tuple[dict[str, Any], float]:
    n = design.n_max
    hi = min(ACCEPT_LEN[1], n + 0.85)
    if not design.rates:
        length = _r(draw.uniform(ACCEPT_LEN[0], hi), 2)
        return {"synth_len": length}, 1.0 + sum(synth_rates(length, n))
    # rates: a first position accepted with p1, then each next one less likely by `decay`
    for _ in range(100):
        p1, decay = draw.uniform(0.45, 0.97), draw.uniform(0.7, 1.0)
        rates, a, p = [], 1.0, p1
        for _ in range(n):
            a *= min(p, 1.0)
            rates.append(_r(a))
            p *= decay
        length = 1.0 + sum(rates)
        if ACCEPT_LEN[0] <= length <= hi:
            return {"rates": rates}, length
    raise ConfigError(f"frozen world {design.index}: no acceptance rates fit 1.5..{hi:g}")


def _parts(design: Design, draw: Draw) -> tuple[_Parts, float]:
    """Draw the tables of one attempt (rows before scaling) and the prefill cost."""
    reg = REGIMES[design.regime]
    n, np_ = design.n_max, design.n_parallel
    fixed = draw.uniform(*reg.fixed_ms)
    knee = float(draw.integer(*reg.knee_rows))
    low = fixed * draw.log_uniform(*reg.slope_low)
    high = low * draw.uniform(*reg.slope_ratio)
    rows_max = float(np_ * (n + 1))
    base = _knee(fixed, knee, low, high)
    knots = sorted({1.0, min(knee, rows_max), rows_max, rows_max + n + 1})
    rows: Callable[[float], float] = base
    per_slot = fixed * draw.uniform(*reg.slots)
    slots = [(1.0, _r(per_slot)), (float(np_), _r(per_slot * np_))]
    if design.shape == "plateau":
        tiles = draw.integer(4, 10)
        tile = max(2, math.ceil(rows_max / tiles))

        def stairs(x: float, tile: int = tile) -> float:
            return base(tile * math.ceil(x / tile))

        rows = stairs
        edges = [float(k * tile) for k in range(1, math.ceil(rows_max / tile) + 2)]
        knots = sorted({1.0, *edges, *(e + 1 for e in edges[:-1])})
    elif design.shape == "sawtooth":
        bump = draw.uniform(0.15, 0.4)
        first = 5 if np_ >= 6 else 3
        slots = [
            (float(g), _r(per_slot * g * (1 + (bump if g >= first and g % 2 else 0.0))))
            for g in range(1, np_ + 1)
        ]
    call_one = fixed * draw.uniform(*reg.call)
    call_step = call_one * draw.uniform(*reg.call_slope)
    call = [(1.0, _r(call_one)), (float(np_), _r(call_one + call_step * (np_ - 1)))]
    accept, length = _acceptance(design, draw)
    parts = _Parts(
        fixed=fixed,
        rows=rows,
        knots=knots,
        slots=slots,
        call=call,
        reeval_share=draw.uniform(*reg.reeval),
        accept=accept,
        accept_len=length,
    )
    return parts, draw.uniform(*reg.prefill_ms)


def _costs(design: Design, parts: _Parts, scale: float) -> Costs:
    rows = Curve(parts.rows_table(scale), 0)
    return Costs(
        rows=rows,
        slots=Curve(parts.slots, 0),
        call=Curve(parts.call, 0),
        reeval=lambda x: parts.reeval_share * rows(x),
        overhead=0.0,
        depth_per_row=design.depth * (PROMPT_TOKENS + OUTPUT_TOKENS / 2) / 1000.0,
        n_max=design.n_max,
        accept_len=parts.accept_len,
    )


def _target_level(design: Design, draw: Draw) -> int:
    np_ = design.n_parallel
    base = base_levels(np_)
    if design.target == "one":
        return 1
    if design.target == "top":
        return np_
    if design.target == "base":
        inner = [c for c in base if 1 < c < np_]
        return draw.choice(inner)
    return draw.choice([c for c in range(2, np_) if c not in base])


def _solve_single(design: Design, parts: _Parts, c_star: int, draw: Draw) -> float | None:
    np_ = design.n_parallel
    if c_star >= np_:
        lift = draw.uniform(0.02, 0.12)
        return _bisect(lambda s: _costs(design, parts, s).gain(np_) - lift)
    return _bisect(
        lambda s: _costs(design, parts, s).gain(c_star) + _costs(design, parts, s).gain(c_star + 1)
    )


def _draw_zigzag(design: Design, draw: Draw) -> tuple[_Parts, float, float, str] | None:
    """A gain that changes sign twice: rows_ms cheap up to the verify batch of c1 streams, a
    step up over the next stream's verify rows, then a plateau with a slight tilt. Drafting
    wins up to c1, loses at c1 + 1 (its batch pays the step), and wins again from c2: on the
    plateau a drafting step costs about the same however many stream verify, while the plain
    step keeps growing by rows and slots. Three pieces solved in turn: the slope below (the
    gain at c1), the step (at c1 + 1), the tilt (at c2); where even a flat plateau leaves c2
    losing, a per-step cost from c2 generating slots on closes the gap (the drafting server
    amortises it over more tokens)."""
    np_, n = design.n_parallel, design.n_max
    c1_choices = {
        "one": [1],
        "base": [c for c in base_levels(np_) if 1 < c <= np_ - 2] or [1],
        "off": [c for c in range(2, np_ - 1) if c not in base_levels(np_)] or [1],
        "top": list(range(1, np_ - 1)),
    }[design.target]
    c1 = draw.choice(c1_choices)
    c2 = draw.integer(c1 + 2, np_)
    parts, prefill = _parts(design, draw)
    fixed = parts.fixed
    r1, r2 = float(c1 * (n + 1)), float((c1 + 1) * (n + 1))
    rows_max = float(np_ * (n + 1))
    per_slot = parts.slots[-1][1] / np_
    lift = (draw.uniform(0.03, 0.3), draw.uniform(0.03, 0.15), draw.uniform(0.02, 0.1))

    def build(low: float, step: float, tilt: float, jump: float) -> _Parts:
        def shape(x: float) -> float:
            below = fixed + low * (min(x, r1) - 1.0)
            if x <= r1:
                return below
            if x <= r2:
                return below + step * (x - r1) / (r2 - r1)
            return below + step + tilt * (x - r2)

        slots = [(1.0, _r(per_slot))]
        if jump > 0:
            if c2 > 2:
                slots.append((float(c2 - 1), _r(per_slot * (c2 - 1))))
            slots.append((float(c2), _r(per_slot * c2 + jump)))
        if np_ > len(slots) or jump == 0:
            slots.append((float(np_), _r(per_slot * np_ + jump)))
        return _Parts(
            fixed=fixed,
            rows=shape,
            knots=sorted({1.0, r1, r2, rows_max, rows_max + n + 1}),
            slots=sorted(dict(slots).items()),
            call=parts.call,
            reeval_share=parts.reeval_share,
            accept=parts.accept,
            accept_len=parts.accept_len,
        )

    def gain(built: _Parts, c: int) -> float:
        return _costs(design, built, 1.0).gain(c)

    low = _bisect(lambda x: gain(build(x, 0.0, x, 0.0), c1) - lift[0], 1e-4, 1e3)
    if low is None:
        return None
    step = _bisect(lambda x: gain(build(low, x, 0.0, 0.0), c1 + 1) + lift[1], 1e-3, 1e5)
    if step is None:
        return None
    tilt = _bisect(lambda x: gain(build(low, step, x, 0.0), c2) - lift[2], 1e-5, 1e3)
    if tilt is not None:
        return build(low, step, tilt, 0.0), 1.0, prefill, f"c1 {c1}, c2 {c2}"
    jump = _bisect(lambda x: lift[2] - gain(build(low, step, 1e-5, x), c2), 1e-3, 1e5)
    if jump is None:
        return None
    return build(low, step, 1e-5, jump), 1.0, prefill, f"c1 {c1}, c2 {c2}"


def _weights(design: Design, draw: Draw) -> tuple[tuple[float, ...], int]:
    np_ = design.n_parallel
    if design.traffic == "uniform":
        return tuple(_r(1.0 / np_, 6) for _ in range(np_)), 0
    at = draw.integer(1, np_)
    rest = (1.0 - CONCENTRATED_SHARE) / (np_ - 1)
    return tuple(_r(CONCENTRATED_SHARE if c == at else rest, 6) for c in range(1, np_ + 1)), at


def _acceptable(design: Design, world: World, c_star: int | None, note: str) -> bool:
    costs = costs_of(world)
    np_ = design.n_parallel
    off = [costs.gain(c) for c in range(1, np_ + 1)]
    plain = [costs.gain(c, "plain") for c in range(1, np_ + 1)]
    if not GAIN_AT_ONE[0] <= plain[0] <= GAIN_AT_ONE[1]:
        return False
    # plain throughput may level off with streams but not collapse
    plain_tps = [costs.tps(c, "plain") for c in range(1, np_ + 1)]
    if any(t < PLAIN_DROP * max(plain_tps[: c + 1]) for c, t in enumerate(plain_tps)):
        return False
    if design.shape == "zigzag":
        c1, c2 = (int(part.split()[1]) for part in note.split(", "))
        want = "+" * c1 + "-" * (c2 - c1 - 1) + "+" * (np_ - c2 + 1)
        near = [off[c1 - 1], off[c1], off[c2 - 2], off[c2 - 1]]
        return (
            sign_pattern(off) == want
            and sign_pattern(plain) == want
            and min(abs(g) for g in near) >= MIN_GAIN_NEAR_ZERO
        )
    assert c_star is not None
    if c_star >= np_:
        return all(g > MIN_GAIN_NEAR_ZERO for g in off) and all(g > 0 for g in plain)
    if not all(g > 0 for g in off[:c_star]) or off[c_star] >= 0:
        return False
    if min(abs(off[c_star - 1]), abs(off[c_star])) < MIN_GAIN_NEAR_ZERO:
        return False
    # the smooth shape crosses once; plateaus and saw-teeth may cross again later
    return design.shape != "smooth" or all(g < 0 for g in off[c_star:])


def make_world(design: Design, seed: int = GENERATOR_SEED) -> tuple[World, Entry]:
    """Draw one world of the plan (see the module docstring), and its manifest entry."""
    for attempt in range(400):
        draw = Draw(f"twin-frozen:{seed}:world:{design.index}:{attempt}")
        note = ""
        c_star: int | None = None
        if design.shape == "zigzag":
            drawn = _draw_zigzag(design, draw)
            if drawn is None:
                continue
            parts, scale, prefill, note = drawn
        else:
            parts, prefill = _parts(design, draw)
            c_star = _target_level(design, draw)
            solved = _solve_single(design, parts, c_star, draw)
            if solved is None:
                continue
            scale = solved
        world = _world(design, parts, scale, prefill)
        if not _acceptable(design, world, c_star, note):
            continue
        weights, at = _weights(design, draw)
        return world, _entry(design, world, weights, at, seed)
    raise ConfigError(f"frozen world {design.index}: no draw met its design ({design})")


def _entry(design: Design, world: World, weights: tuple[float, ...], at: int, seed: int) -> Entry:
    np_ = design.n_parallel
    costs = costs_of(world)
    off = [costs.gain(c) for c in range(1, np_ + 1)]
    plain = [costs.gain(c, "plain") for c in range(1, np_ + 1)]
    diffs = [
        w * (costs.tps(c, "spec") - costs.tps(c, "off")) for c, w in enumerate(weights, start=1)
    ]
    best = best_n(diffs)
    wins = [c for c, g in enumerate(plain, start=1) if g > 0]
    levels = base_levels(np_)
    return Entry(
        name=world.name,
        file=f"{world.name}.toml",
        model_name=world.model_name,
        seed=_world_seed(seed, design.index),
        weights=weights,
        concentrated_at=at,
        traffic=design.traffic,
        noise_preset=design.noise_preset,
        noise="quiet" if design.noise_preset == "quiet" else "noisy",
        crossover="inside" if best in levels else "outside",
        shape=design.shape,
        regime=design.regime,
        n_parallel=np_,
        n_max=design.n_max,
        accept_len=_r(world.mean_accept_len(), 4),
        depth_ms_per_row_per_1k=design.depth,
        base_levels=tuple(levels),
        best_n=best,
        spec_wins_through=_last_run(wins),
        gain_signs=sign_pattern(plain),
        gain_at_one=_r(off[0], 4),
    )


def _last_run(wins: list[int]) -> int:
    """The last level of the first run of winning levels from 1 (0: none)."""
    last = 0
    for c in wins:
        if c != last + 1:
            break
        last = c
    return last


def _world_seed(seed: int, index: int) -> int:
    return random.Random(f"twin-frozen:{seed}:seed:{index}").getrandbits(31)


def generate(count: int = WORLD_COUNT, seed: int = GENERATOR_SEED) -> list[tuple[World, Entry]]:
    """Every world of the set and its manifest entry, deterministically."""
    return [make_world(design, seed) for design in plan(count, seed)]


# -- files ------------------------------------------------------------------------------------

_HEADER = """\
# The frozen set of twin worlds (issue 25), made by tests/lab/frozen.py (generator version
# {version}, seed {seed}): `python benchmarks/make_frozen_worlds.py` writes it again byte for byte,
# and tests/test_twin_frozen.py checks that it does. Written down before any method was tuned on it;
# a world is never adjusted after seeing how the tuner does on it (a new set takes a new generator
# version). benchmarks/twin_regret.py grades the tuner's methods on it.
#
# How it was made ({count} worlds): a plan spreads each factor evenly over the set and pairs the
# factors at random:
# - step-cost regime, half each: cpu (ranges around profiles/twin/bench-smollm2-cpu.toml: a
#   fixed 20-45 ms, flat-ish rows to a knee, slots 4-12 % of the fixed cost each, a draft call
#   8-20 %) or gpu (around profiles/twin/seed-gfx1151.toml: 12-40 ms, 5-40 % a row, little per
#   slot, a draft call 3-12 % and steep by slots, re-evaluation 1-3 %);
# - shape, a quarter each: smooth (a knee: the cost model's own family), plateau (rows_ms in
#   tiles: flat, then a step), sawtooth (slots_ms bumps at odd slot counts from 5, the bench's
#   dips at 5 and 7 streams) or zigzag (a gain that changes sign twice);
# - -np 4, 5, 6, 8, 10, 12, 16 and n_max 2..8, each equally often;
# - acceptance as synth_len (3 in 4) or as rates (1 in 4), mean accepted length 1.5..5;
# - target crossover at 1 stream (1 in 8), at a base level (1 in 4), off them (1 in 2) or
#   above -np (1 in 8);
# - traffic uniform or concentrated (70 % of the time at one level, the rest spread evenly),
#   half each;
# - noise quiet (the preset), mid (vm at about half size) or vm (this VM's; cpu worlds only),
#   half quiet;
# - attention 0, 11 (the bench's) or 40 ms per decode row per 1k context tokens (4 worlds each
#   for the last two).
# Each world's continuous parameters are drawn from its regime's ranges and the rows cost above
# its fixed part is scaled so the expected gain crosses zero at the target (the
# tests/lab/frozen.py docstring has the rules); every world has its own model_name and seed.
#
# Per world: file, model_name, seed (what a method runs with), weights (levels 1..-np),
# concentrated_at (0: uniform), noise_preset, and the tags: crossover (inside: the design's best
# N under the weights is a level the profile measures first, 1, 2, 4, 8, 16 up to -np, and -np;
# outside: it is not), noise (quiet | noisy), traffic (uniform | concentrated). Design figures
# from the expected steady-state throughput (not the truth; twin_regret.py checks them there):
# best_n, spec_wins_through (the last level of the first run where always draft beats plain;
# -np: everywhere), gain_signs (always draft over plain per level), gain_at_one (drafting over
# the drafting server not drafting, at one stream).
"""


def render_set(worlds: Sequence[tuple[World, Entry]], seed: int = GENERATOR_SEED) -> dict[str, str]:
    """File name -> text of every world file and the manifest."""
    files: dict[str, str] = {}
    for world, entry in worlds:
        head = (
            f"# Frozen twin world {world.name} (tests/lab/frozen.py v{GENERATOR_VERSION}; see "
            f"{MANIFEST}). Do not edit:\n# the set is regenerated byte for byte. Design: "
            f"{entry.regime} regime, {entry.shape}, crossover {entry.crossover} (best N "
            f"{entry.best_n}),\n# gain signs {entry.gain_signs}, mean accepted length "
            f"{entry.accept_len:g}, noise {entry.noise_preset}, traffic {entry.traffic}.\n\n"
        )
        files[entry.file] = head + world_to_toml(world)
    header = _HEADER.format(version=GENERATOR_VERSION, seed=seed, count=len(worlds))
    lines = manifest_head(header, "tests/lab/frozen.py", GENERATOR_VERSION, seed, len(worlds))
    for _, entry in worlds:
        lines += ["", "[[world]]"]
        for key, value in entry.__dict__.items():
            lines.append(f"{key} = {toml_value(value)}")
        lines.append(f"tags = {toml_value(list(entry.tags))}")
    files[MANIFEST] = "\n".join(lines) + "\n"
    return files


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def write_set(
    folder: Path | str, count: int = WORLD_COUNT, seed: int = GENERATOR_SEED
) -> list[Path]:
    """Generate the set and write it into `folder`; the paths written."""
    return write_files(folder, render_set(generate(count, seed), seed))


def load_manifest(folder: Path | str) -> list[Entry]:
    """The manifest's entries, in order."""
    entries = []
    names = set(Entry.__dataclass_fields__)
    for row in manifest_rows(folder, "frozen set"):
        fields = {k: v for k, v in row.items() if k in names}
        for key in ("weights", "base_levels"):
            fields[key] = tuple(fields[key])
        entries.append(Entry(**fields))
    return entries


# -- what a set of worlds shares (this one and lab.openworlds') ---------------------------------


def write_files(folder: Path | str, files: dict[str, str]) -> list[Path]:
    """Every file of a set (name -> text) written into folder; the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = folder / name
        path.write_text(text)
        written.append(path)
    return written


def differences(files: dict[str, str], folder: Path | str) -> list[str]:
    """How the committed copy in folder differs from what the generator makes (name -> text):
    one line a file that differs or is missing, and a line a world file it did not make."""
    folder = Path(folder)
    out = [
        f"differs from the generator: {folder / name}"
        for name, text in files.items()
        if not (folder / name).exists() or (folder / name).read_text() != text
    ]
    if folder.exists():
        out += [
            f"not made by the generator: {p}"
            for p in sorted(folder.glob("*.toml"))
            if p.name not in files
        ]
    return out


def manifest_head(header: str, generator: str, version: int, seed: int, count: int) -> list[str]:
    """A manifest's first lines: its comment header, then what made it."""
    return [
        header,
        f"generator = {toml_value(generator)}",
        f"version = {version}",
        f"seed = {seed}",
        f"count = {count}",
    ]


def manifest_rows(folder: Path | str, what: str) -> list[dict[str, Any]]:
    """The [[world]] tables of a set's manifest; a missing or broken one is a ConfigError."""
    path = Path(folder) / MANIFEST
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"{what} manifest not found: {path}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return list(data.get("world", []))


def load_entry_world(folder: Path | str, entry: Entry) -> World:
    return load_world(Path(folder) / entry.file)


def select(entries: Sequence[Entry], names: str | None) -> list[Entry]:
    """Entries named in a comma list (names, or indices into the set; a-b ranges); all when
    None."""
    if not names:
        return list(entries)
    by_name = {e.name: e for e in entries}
    out: list[Entry] = []
    for part in names.split(","):
        part = part.strip()
        if not part:
            continue
        if part in by_name:
            out.append(by_name[part])
        elif "-" in part and all(p.isdigit() for p in part.split("-", 1)):
            lo, hi = (int(p) for p in part.split("-", 1))
            out += [entries[i] for i in range(lo, hi + 1) if i < len(entries)]
        elif part.isdigit() and int(part) < len(entries):
            out.append(entries[int(part)])
        else:
            raise ConfigError(f"no world {part!r} in the set")
    seen: set[str] = set()
    return [e for e in out if not (e.name in seen or seen.add(e.name))]


__all__ = [
    "GENERATOR_SEED",
    "GENERATOR_VERSION",
    "MANIFEST",
    "WORLD_COUNT",
    "Costs",
    "Design",
    "Draw",
    "Entry",
    "base_levels",
    "best_n",
    "costs_of",
    "differences",
    "expected_tps",
    "generate",
    "load_entry_world",
    "load_manifest",
    "make_world",
    "manifest_head",
    "manifest_rows",
    "plan",
    "render_set",
    "select",
    "shuffled",
    "sign_changes",
    "sign_pattern",
    "spread",
    "toml_value",
    "write_files",
    "write_set",
]
