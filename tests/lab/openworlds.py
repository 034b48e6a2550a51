"""The open-loop set of twin worlds (issue 45): servers that see requests arrive at random, with
prompts the target and the draft model must process, acceptance that moves with load and
content, graded on the mean time per output token (benchmarks/openloop_regret.py).

Written down before any method is tuned on it: `generate()` makes the set deterministically
from `GENERATOR_SEED` (string-seeded `random.Random`, `random()` draws only, as lab.frozen), and
`write_set(folder)` writes one world TOML per world and `manifest.toml` holding each world's
traffic; the committed copy in profiles/twin/openloop/ must equal what this makes, byte for byte
(tests/test_openloop_set.py). Never adjust a world after seeing how a method does on it: change
the generator's version and make a new set instead.

A world is a cost surface and its traffic:

1. Surfaces, each from an existing world, its tables scaled by a drawn 0.85-1.2: "apu" (profiles/
   twin/seed-gfx1151.toml: the seed's Ryzen AI Max+ 395 table, a MoE target with its MTP head,
   -np 8, n_max 3), "cpu" (profiles/twin/bench-smollm2-cpu.toml: the bench's 2-core VM, -np 8,
   n_max 6) and "gpu" (a dense target on a discrete GPU, the frozen set's gpu regime: a fixed
   12-20 ms step that batches nearly free to 16 rows, -np 16, n_max 4-6). Target prompt cost
   per token: apu 0.6-1.6 ms, cpu the bench's 2.2 +-20 %, gpu 0.05-0.15 ms.
2. The draft model's prompt cost (prefill.draft_ms_per_token), five levels: none (0-0.01 ms),
   low (0.05-0.2; on the gpu 0.01-0.03, a draft on the GPU), mid (0.3-0.8), high (1.0-1.6),
   dominant (2.5-5). On apu and gpu, mid and up is a draft model on the CPU: its calls 3-8 ms
   at one slot plus 0.3-1 ms a slot, and either no re-evaluation of target batches with a
   catch-up on resuming at its prompt rate (draft.catch_up_ms_per_token = draft_ms_per_token,
   reeval 0), or a re-evaluation of every batch at that rate a row. The apu takes every level
   (dominant twice as often); the cpu, whose draft shares the target's two cores, and the gpu,
   beside whose 15 ms steps a draft model on the CPU past the mid level leaves nothing to
   decide, the first three.
3. Acceptance: the surface's synth_len range; by the drafts verified together flat, mild (0.95-1
   at 4, 0.75-0.9 at 16) or steep (0.85-0.97 at 4, 0.15-0.5 at 16: llama.cpp issue 27117's fall
   on a gfx1151 APU); content one class, or mixed: "code" (its prompts hold "```", acceptance
   0.5-1.5 above the default) and "prose" (prompts hold "[prose]", 0.8-1.8 below), the traffic
   mixing them 20-80 % code (llama.cpp issue 23052: 1.35x on code, 0.91x on creative writing);
   unmarked prompts, such as a load generator's, get the default in between.
4. Traffic: prompt lengths lognormal (short: median 100-600 tokens, sigma 0.8; long: a quarter of
   the worlds, median 3000-10000 tokens on apu and gpu, 1000-1800 on cpu's 4096-token slots,
   sigma 0.4, with acceptance falling to 0.6-0.9 of itself by 16k tokens of context, 3k on cpu);
   output lengths lognormal, median 96-384 tokens, sigma 0.6; attention by context the
   surface's (apu 2-6 ms, cpu the bench's 11 +-20 %, gpu 0.3-1 ms per 1000 tokens: on the cpu
   per decode row, on apu and gpu nine tenths per slot, a memory-bound decode reading a
   slot's cache once for all its draft rows);
   arrivals poisson (half), gamma gaps of cv 2-3 (a quarter) or a two-state MMPP (busy spells at
   4-10 times the quiet rate, 15-30 % of the time, each as long as 10-40 mean gaps: a quarter);
   the rate a share of the world's capacity, spread over 10-90 %.
5. Capacity: requests per second the better of plain and always draft serves with a backlog of
   the traffic's own requests (every slot busy, noise off).

And three worlds of issue 45 itself ("issue-45-*"): the seed's APU with its draft model on the
CPU (prompts at 1.2 ms a token, calls of 4-11 ms, no re-evaluation, a catch-up on resuming at
1.2 ms a token), prompts of 250 tokens (median) and outputs of 256, Poisson arrivals at 30, 60
and 75 % of capacity: drafting wins at the first, plain at the other two, where drafting's prompt
and catch-up costs weigh more as more requests arrive.

Per world the manifest holds its file, model_name, seed (what a method runs with), the traffic
(arrivals, load, rate and capacity, prompt and output lengths, class mix, the truth's requests and
seed, the observation's requests and seed) and tags. Pure apart from `write_set` and
`load_manifest`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

from lab.frozen import Draw, manifest_head, manifest_rows, shuffled, spread, toml_value, write_files
from tuner.policy import Policy
from tuner.twin.engine import Request, Workload, arrival_offsets, request_seed, simulate
from tuner.twin.world import World, load_world, world_to_toml

GENERATOR_SEED = 45
GENERATOR_VERSION = 1
DRAWN = 33
MANIFEST = "manifest.toml"
TRUTH_REQUESTS = 2400  # requests of the truth's run (enough: see openloop_regret's resolution)
OBSERVED_REQUESTS = 400  # requests a method's observation of the traffic sees
CAPACITY_BACKLOG = 24  # requests per slot in the backlog that measures capacity

SURFACES = ("apu", "cpu", "gpu")
PREFILL_LEVELS = {
    "none": (0.0, 0.01),
    "low": (0.05, 0.2),
    "mid": (0.3, 0.8),
    "high": (1.0, 1.6),
    "dominant": (2.5, 5.0),
}
# the levels each surface's worlds are spread over (the module docstring says why)
SURFACE_LEVELS = {
    "apu": ("none", "low", "mid", "high", "dominant", "dominant"),
    "cpu": ("none", "low", "mid"),
    "gpu": ("none", "low", "mid"),
}
GPU_LOW = (0.01, 0.03)
LOADS = (0.1, 0.25, 0.4, 0.55, 0.7, 0.8, 0.9)
CODE_MARKER = "```"
PROSE_MARKER = "[prose]"
CLASSES = ("code", "prose")  # a mixed world's classes: acceptance above and below its default
ISSUE_LOADS = (0.3, 0.6, 0.75)

APU_ROWS = [(1.0, 25.839793), (2.0, 37.037037), (4.0, 59.259259), (8.0, 102.171137)]
APU_CALL = [(1.0, 1.320604), (2.0, 7.184151), (4.0, 10.825145), (8.0, 16.294053)]
CPU_ROWS = [
    (1.0, 32.49),
    (2.0, 43.54),
    (4.0, 45.82),
    (8.0, 47.06),
    (16.0, 72.0),
    (32.0, 122.0),
    (64.0, 222.0),
]
CPU_SLOTS = [(1.0, 3.5), (4.0, 14.0), (5.0, 22.0), (6.0, 21.0), (7.0, 30.0), (8.0, 28.0)]
CPU_CALL = [(1.0, 5.05), (2.0, 9.81), (4.0, 8.48), (8.0, 13.81)]


# -- the traffic -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Lengths:
    """A lognormal length distribution in tokens, clipped to [low, high]."""

    median: float
    sigma: float
    low: int
    high: int

    def draw(self, u: float) -> int:
        """The length at quantile u (0 < u < 1)."""
        z = NormalDist().inv_cdf(min(max(u, 1e-9), 1 - 1e-9))
        return int(min(self.high, max(self.low, round(self.median * math.exp(self.sigma * z)))))

    def as_dict(self) -> dict[str, Any]:
        return {"dist": "lognormal", **self.__dict__}


@dataclass(frozen=True)
class Traffic:
    """One world's offered load (see the module docstring)."""

    arrivals: str  # poisson | gamma | mmpp
    cv: float  # gamma: the gaps' coefficient of variation
    peak: float  # mmpp: busy rate over the quiet one
    busy_share: float  # mmpp: share of the time busy
    busy_s: float  # mmpp: mean busy spell
    load: float  # rate / capacity
    capacity: float  # requests/s (see `capacity`)
    prompt: Lengths
    output: Lengths
    classes: tuple[tuple[str, float], ...]  # (class name, share) of the requests; () one class

    @property
    def rate(self) -> float:
        return round(self.load * self.capacity, 6)

    def requests(self, count: int, seed: int) -> list[Request]:
        """`count` requests of this traffic: lengths and classes drawn from `seed`, request
        seeds as every workload's (tuner.twin.engine.request_seed)."""
        rng = random.Random(f"openloop-traffic:{seed}")
        out = []
        for i in range(count):
            prompt = self.prompt.draw(rng.random())
            output = self.output.draw(rng.random())
            u, content, edge = rng.random(), "", 0.0
            for name, share in self.classes:
                edge += share
                if u < edge:
                    content = name
                    break
            out.append(Request(prompt, output, request_seed(seed, i), 0, content))
        return out

    def workload(self, count: int, seed: int, rate: float | None = None) -> Workload:
        """`count` requests arriving at the rate (default the traffic's) by its process."""
        rate = rate or self.rate
        offsets = arrival_offsets(
            self.arrivals,
            rate,
            count / rate,
            seed,
            cv=self.cv,
            peak=self.peak,
            busy_share=self.busy_share,
            busy_s=self.busy_s,
        )
        requests = self.requests(len(offsets), seed)
        return Workload(tuple(requests), tuple(offsets))

    def as_dict(self) -> dict[str, Any]:
        process: dict[str, Any] = {"process": self.arrivals}
        if self.arrivals == "gamma":
            process["cv"] = self.cv
        if self.arrivals == "mmpp":
            process |= {"peak": self.peak, "busy_share": self.busy_share, "busy_s": self.busy_s}
        return {
            "arrivals": process,
            "load": self.load,
            "capacity": self.capacity,
            "rate": self.rate,
            "prompt": self.prompt.as_dict(),
            "output": self.output.as_dict(),
            "classes": {name: share for name, share in self.classes},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Traffic:
        arrivals = data["arrivals"]

        def lengths(d: dict[str, Any]) -> Lengths:
            return Lengths(float(d["median"]), float(d["sigma"]), int(d["low"]), int(d["high"]))

        return cls(
            arrivals=arrivals["process"],
            cv=float(arrivals.get("cv", 1.0)),
            peak=float(arrivals.get("peak", 1.0)),
            busy_share=float(arrivals.get("busy_share", 0.5)),
            busy_s=float(arrivals.get("busy_s", 1.0)),
            load=float(data["load"]),
            capacity=float(data["capacity"]),
            prompt=lengths(data["prompt"]),
            output=lengths(data["output"]),
            classes=tuple((k, float(v)) for k, v in (data.get("classes") or {}).items()),
        )


def capacities(
    world: World, traffic: Traffic, seed: int, candidates: Sequence[Policy]
) -> dict[Policy, float]:
    """Requests/s each policy serves with a backlog of the traffic's requests (CAPACITY_BACKLOG
    a slot, all there at the start, noise off): the requests finished by the time the backlog
    runs dry (the last -np still running) over that time."""
    count = CAPACITY_BACKLOG * world.n_parallel
    requests = traffic.requests(count, seed)
    work = Workload(tuple(requests), (0.0,) * count)
    out: dict[Policy, float] = {}
    for policy in candidates:
        result = simulate(world, policy, work, noise=False)
        ends = sorted(r.finished_at or 0.0 for r in result.requests)
        done = count - world.n_parallel
        out[policy] = done / ends[done - 1]
    return out


def capacity(world: World, traffic: Traffic, seed: int) -> float:
    """Requests/s the better of plain and always draft serves with a backlog of the traffic's
    requests (`capacities`): what version 1 sets its loads against."""
    return round(
        max(capacities(world, traffic, seed, (Policy.plain(), Policy.always())).values()), 6
    )


# -- the plan ----------------------------------------------------------------------------------


@dataclass
class Design:
    """The factors of one world, fixed before its continuous parameters are drawn."""

    index: int
    surface: str
    prefill: str  # a PREFILL_LEVELS key
    drafting: str  # flat | mild | steep: acceptance by the drafts verified together
    content: str  # one | mixed
    prompts: str  # short | long
    load: float
    arrivals: str  # poisson | gamma | mmpp
    resume: str  # catch-up | reeval: how a draft model on the CPU follows the target
    notes: list[str] = field(default_factory=list)


def plan(count: int = DRAWN, seed: int = GENERATOR_SEED) -> list[Design]:
    """Each factor spread evenly over the drawn worlds and paired at random; the draft prompt
    cost spread within each surface over its SURFACE_LEVELS."""
    rng = random.Random(f"openloop:{seed}:plan")
    surfaces = shuffled(rng, spread(SURFACES, count))
    levels = {s: shuffled(rng, spread(SURFACE_LEVELS[s], count)) for s in SURFACES}
    drafting = shuffled(rng, spread(("flat", "flat", "mild", "steep"), count))
    content = shuffled(rng, spread(("one", "mixed"), count))
    prompts = shuffled(rng, spread(("short", "short", "short", "long"), count))
    loads = shuffled(rng, spread(LOADS, count))
    arrivals = shuffled(rng, spread(("poisson", "poisson", "gamma", "mmpp"), count))
    resume = shuffled(rng, spread(("catch-up", "reeval"), count))
    return [
        Design(
            index=i,
            surface=surfaces[i],
            prefill=levels[surfaces[i]].pop(),
            drafting=drafting[i],
            content=content[i],
            prompts=prompts[i],
            load=loads[i],
            arrivals=arrivals[i],
            resume=resume[i],
        )
        for i in range(count)
    ]


# -- drawing one world --------------------------------------------------------------------------


def _r(value: float, digits: int = 4) -> float:
    return round(float(value), digits)


def _scaled(points: Sequence[tuple[float, float]], factor: float) -> list[tuple[float, float]]:
    return [(float(x), _r(y * factor)) for x, y in points]


def _surface(design: Design, draw: Draw) -> dict[str, Any]:
    """The surface's tables, shape and acceptance range (before the draft model's kind)."""
    rows_scale, call_scale = draw.uniform(0.85, 1.2), draw.uniform(0.85, 1.2)
    if design.surface == "apu":
        rows = _scaled(APU_ROWS, rows_scale)
        return {
            "n_parallel": 8,
            "n_max": 3,
            "slot_context": 32768,
            "rows": rows,
            "slots": [(1.0, 0.0)],
            "call": _scaled(APU_CALL, call_scale),
            "reeval": [(x, _r(0.02 * y)) for x, y in rows],
            "synth_len": _r(draw.uniform(2.6, 3.8), 2),
            "prefill": draw.uniform(0.6, 1.6),
            "depth_ms": draw.uniform(2.0, 6.0),
        }
    if design.surface == "cpu":
        rows = _scaled(CPU_ROWS, rows_scale)
        return {
            "n_parallel": 8,
            "n_max": 6,
            "slot_context": 4096,
            "rows": rows,
            "slots": _scaled(CPU_SLOTS, rows_scale),
            "call": _scaled(CPU_CALL, call_scale),
            "reeval": [(1.0, 0.05), (64.0, 2.5)],
            "synth_len": _r(draw.uniform(2.5, 4.5), 2),
            "prefill": 2.2 * draw.uniform(0.8, 1.2),
            "depth_ms": 11.0 * draw.uniform(0.8, 1.2),
        }
    fixed = draw.uniform(12.0, 20.0)
    n_max = draw.integer(4, 6)
    rows = [
        (1.0, _r(fixed)),
        (16.0, _r(fixed * draw.uniform(1.15, 1.3))),
        (64.0, _r(fixed * draw.uniform(2.0, 3.0))),
        (128.0, _r(fixed * draw.uniform(4.0, 6.0))),
    ]
    call_one = fixed * draw.uniform(0.06, 0.12)
    return {
        "n_parallel": 16,
        "n_max": n_max,
        "slot_context": 32768,
        "rows": rows,
        "slots": [(1.0, _r(0.1 * rows_scale)), (16.0, _r(1.6 * rows_scale))],
        "call": [(1.0, _r(call_one)), (16.0, _r(call_one * draw.uniform(1.5, 3.0)))],
        "reeval": [(x, _r(draw.uniform(0.02, 0.03) * y)) for x, y in rows],
        "synth_len": _r(draw.uniform(2.5, min(4.5, n_max + 0.8)), 2),
        "prefill": draw.uniform(0.05, 0.15),
        "depth_ms": draw.uniform(0.3, 1.0),
    }


def _draft(design: Design, surface: dict[str, Any], draw: Draw) -> dict[str, Any]:
    """[draft] and the draft model's prompt cost: the surface's own drafter, or one on the
    CPU (apu and gpu from the mid level up)."""
    low_on_gpu = design.surface == "gpu" and design.prefill == "low"
    per_token = draw.uniform(*(GPU_LOW if low_on_gpu else PREFILL_LEVELS[design.prefill]))
    draft: dict[str, Any] = {"call_ms": surface["call"], "reeval_ms": surface["reeval"]}
    on_cpu = design.surface != "cpu" and design.prefill in ("mid", "high", "dominant")
    if on_cpu:
        np_ = surface["n_parallel"]
        one = draw.uniform(3.0, 8.0)
        draft["call_ms"] = [(1.0, _r(one)), (float(np_), _r(one + draw.uniform(0.3, 1.0) * np_))]
        if design.resume == "catch-up":
            draft["reeval_ms"] = [(1.0, 0.0)]
            draft["catch_up_ms_per_token"] = _r(per_token)
        else:
            draft["reeval_ms"] = [(1.0, _r(per_token)), (64.0, _r(64 * per_token))]
        design.notes.append(f"draft model on the CPU ({design.resume})")
    return {"draft": draft, "draft_ms_per_token": _r(per_token)}


def _depth(design: Design, surface: dict[str, Any]) -> dict[str, float]:
    """Attention by context: on the cpu by row (the bench's); on apu and gpu nine tenths by slot
    (a memory-bound decode reads a slot's cache once for all the rows of its draft)."""
    ms = surface["depth_ms"]
    if design.surface == "cpu":
        return {"ms_per_row_per_1k": _r(ms)}
    return {"ms_per_row_per_1k": _r(0.1 * ms), "ms_per_slot_per_1k": _r(0.9 * ms)}


def _acceptance(design: Design, surface: dict[str, Any], draw: Draw) -> dict[str, Any]:
    n = surface["n_max"]
    base = surface["synth_len"]
    acc: dict[str, Any] = {"synth_len": base}
    if design.drafting == "mild":
        at4, at16 = draw.uniform(0.95, 1.0), draw.uniform(0.75, 0.9)
    elif design.drafting == "steep":
        at4, at16 = draw.uniform(0.85, 0.97), draw.uniform(0.15, 0.5)
    if design.drafting != "flat":
        acc["by_drafting"] = [(1.0, 1.0), (4.0, _r(at4)), (16.0, _r(at16)), (256.0, _r(at16))]
    if design.prompts == "long":
        context = surface["slot_context"]
        knee = 16384.0 if context > 4096 else 3072.0
        fall = _r(draw.uniform(0.6, 0.9))
        acc["by_depth"] = [(0.0, 1.0), (knee / 8, 1.0), (knee, fall), (knee * 8, fall)]
    if design.content == "mixed":
        code = _r(min(n + 0.95, base + draw.uniform(0.5, 1.5)), 2)
        prose = _r(max(1.2, base - draw.uniform(0.8, 1.8)), 2)
        acc["classes"] = [
            {"name": "code", "marker": CODE_MARKER, "synth_len": code},
            {"name": "prose", "marker": PROSE_MARKER, "synth_len": prose},
        ]
    return acc


def _traffic_shape(
    design: Design, surface: dict[str, Any], draw: Draw
) -> tuple[Lengths, Lengths, tuple[tuple[str, float], ...], dict[str, float]]:
    context = surface["slot_context"]
    if design.prompts == "long":
        median = draw.uniform(1000, 1800) if context <= 4096 else draw.uniform(3000, 10000)
        prompt = Lengths(_r(median, 0), 0.4, 256, context // 2)
    else:
        prompt = Lengths(_r(draw.uniform(100, 600), 0), 0.8, 8, context // 4)
    output = Lengths(_r(draw.uniform(96, 384), 0), 0.6, 8, min(2048, context // 4))
    classes: tuple[tuple[str, float], ...] = ()
    if design.content == "mixed":
        code = _r(draw.uniform(0.2, 0.8), 2)
        classes = (("code", code), ("prose", _r(1.0 - code, 2)))
    process: dict[str, float] = {"cv": 1.0, "peak": 1.0, "busy_share": 0.5, "busy_s": 1.0}
    if design.arrivals == "gamma":
        process["cv"] = _r(draw.uniform(2.0, 3.0), 2)
    if design.arrivals == "mmpp":
        process["peak"] = _r(draw.uniform(4.0, 10.0), 2)
        process["busy_share"] = _r(draw.uniform(0.15, 0.3), 2)
        # a busy spell's length in arrivals at the mean rate (seconds once the rate is known)
        process["busy_s"] = _r(draw.uniform(10.0, 40.0), 1)
    return prompt, output, classes, process


@dataclass(frozen=True)
class Entry:
    """One world of the set as the manifest lists it."""

    name: str
    file: str
    model_name: str
    seed: int  # the seed a method runs with on this world (its noise, its profile)
    truth_seed: int  # the truth's arrivals, lengths, classes and request seeds
    truth_requests: int
    observe_seed: int  # what a method's observation of the traffic sees
    observe_requests: int
    n_parallel: int
    n_max: int
    surface: str
    draft_prefill: str
    draft_ms_per_token: float
    accept_drafting: str
    content: str
    prompts: str
    traffic: Traffic
    tags: tuple[str, ...]
    drafter: str = ""  # version 2: the speculative type the world's drafter follows

    @property
    def rate(self) -> float:
        return self.traffic.rate

    def truth_workload(self) -> Workload:
        return self.traffic.workload(self.truth_requests, self.truth_seed)

    def observed_workload(self) -> Workload:
        return self.traffic.workload(self.observe_requests, self.observe_seed)


def _tags(design: Design, traffic: Traffic, extra: Sequence[str] = ()) -> tuple[str, ...]:
    load = "low" if traffic.load <= 0.3 else "mid" if traffic.load <= 0.6 else "high"
    bursty = "poisson" if traffic.arrivals == "poisson" else "bursty"
    return (
        f"surface-{design.surface}",
        f"draft-prefill-{design.prefill}",
        f"accept-drafting-{design.drafting}",
        f"content-{design.content}",
        f"prompts-{design.prompts}",
        f"load-{load}",
        f"arrivals-{bursty}",
        *extra,
    )


def _seed(key: str) -> int:
    return random.Random(f"openloop:{GENERATOR_SEED}:seed:{key}").getrandbits(31)


def make_world(design: Design, seed: int = GENERATOR_SEED) -> tuple[World, Entry]:
    """Draw one world of the plan and its manifest entry."""
    draw = Draw(f"openloop:{seed}:world:{design.index}")
    surface = _surface(design, draw)
    drafted = _draft(design, surface, draw)
    acceptance = _acceptance(design, surface, draw)
    name = f"openloop-{design.index:02d}"
    description = (
        f"open-loop set v{GENERATOR_VERSION} world {design.index}: {design.surface} surface, "
        f"draft prompt cost {design.prefill}, acceptance by drafts {design.drafting}, "
        f"content {design.content}, {design.prompts} prompts"
    )
    model_name = f"twin-openloop-{design.index:02d}-{design.surface}"
    world = world_of(design, surface, drafted, acceptance, name, model_name, description)
    prompt, output, classes, process = _traffic_shape(design, surface, draw)
    return world, _entry(world, design, prompt, output, classes, process, name)


def world_of(
    design: Design,
    surface: dict[str, Any],
    drafted: dict[str, Any],
    acceptance: dict[str, Any],
    name: str,
    model_name: str,
    description: str,
) -> World:
    """A drawn world from its surface, drafter and acceptance."""
    data = {
        "name": name,
        "model_name": model_name,
        "description": description,
        "n_parallel": surface["n_parallel"],
        "n_max": surface["n_max"],
        "slot_context": surface["slot_context"],
        "acceptance": acceptance,
        "step": {"rows_ms": surface["rows"], "slots_ms": surface["slots"]},
        "draft": drafted["draft"],
        "prefill": {
            "ms_per_token": _r(surface["prefill"]),
            "draft_ms_per_token": drafted["draft_ms_per_token"],
        },
        "depth": _depth(design, surface),
        "noise": {"preset": "quiet"},
    }
    return World.model_validate(data)


def _entry(
    world: World,
    design: Design,
    prompt: Lengths,
    output: Lengths,
    classes: tuple[tuple[str, float], ...],
    process: dict[str, float],
    name: str,
    extra_tags: Sequence[str] = (),
    *,
    seed_of: Callable[[str], int] | None = None,
    capacity_of: Callable[[World, Traffic], float] | None = None,
    drafter: str = "",
) -> Entry:
    """A world's manifest entry: its traffic at the design's load of a capacity (capacity_of;
    version 1's: the better of plain and always draft), its seeds (seed_of; version 1's)."""
    seed_of = seed_of or _seed
    shape = Traffic(
        design.arrivals, load=design.load, capacity=1.0, prompt=prompt, output=output,
        classes=classes, **process,
    )  # fmt: skip
    if capacity_of is None:
        cap = capacity(world, shape, seed_of(f"{world.model_name}:capacity"))
    else:
        cap = capacity_of(world, shape)
    if design.arrivals == "mmpp":
        process = process | {"busy_s": _r(process["busy_s"] / (design.load * cap), 1)}
    traffic = Traffic(
        design.arrivals, load=design.load, capacity=cap, prompt=prompt, output=output,
        classes=classes, **process,
    )  # fmt: skip
    return Entry(
        name=name,
        file=f"{name}.toml",
        model_name=world.model_name,
        seed=seed_of(f"{name}:method"),
        truth_seed=seed_of(f"{name}:truth"),
        truth_requests=TRUTH_REQUESTS,
        observe_seed=seed_of(f"{name}:observe"),
        observe_requests=OBSERVED_REQUESTS,
        n_parallel=world.n_parallel,
        n_max=world.n_max,
        surface=design.surface,
        draft_prefill=design.prefill,
        draft_ms_per_token=world.prefill.draft_ms_per_token,
        accept_drafting=design.drafting,
        content=design.content,
        prompts=design.prompts,
        traffic=traffic,
        tags=_tags(design, traffic, extra_tags),
        drafter=drafter,
    )


def issue_world(k: int, load: float) -> tuple[World, Entry]:
    """Issue 45's world (see the module docstring) at one load: the seed's APU, its draft model
    on the CPU at 1.2 ms a prompt token, catching up on resuming."""
    name = f"openloop-issue-{k}"
    data = {
        "name": name,
        "model_name": "twin-openloop-issue-45-apu-cpu-draft",
        "description": (
            "issue 45: the seed's APU (seed-gfx1151) with its draft model on the CPU: prompts at "
            "1.2 ms a token, calls 4-11 ms, no re-evaluation, catch-up on resuming"
        ),
        "n_parallel": 8,
        "n_max": 3,
        "slot_context": 32768,
        "acceptance": {"synth_len": 3.64},
        "step": {"rows_ms": APU_ROWS, "slots_ms": [(1.0, 0.0)]},
        "draft": {
            "call_ms": [(1.0, 4.0), (8.0, 11.0)],
            "reeval_ms": [(1.0, 0.0)],
            "catch_up_ms_per_token": 1.2,
        },
        "prefill": {"ms_per_token": 0.8, "draft_ms_per_token": 1.2},
        "noise": {"preset": "quiet"},
    }
    world = World.model_validate(data)
    design = Design(
        index=-1,
        surface="apu",
        prefill="high",
        drafting="flat",
        content="one",
        prompts="short",
        load=load,
        arrivals="poisson",
        resume="catch-up",
    )
    prompt = Lengths(250.0, 0.8, 8, 8192)
    output = Lengths(256.0, 0.6, 8, 2048)
    process = {"cv": 1.0, "peak": 1.0, "busy_share": 0.5, "busy_s": 1.0}
    return world, _entry(world, design, prompt, output, (), process, name, ("issue-45",))


def generate(count: int = DRAWN, seed: int = GENERATOR_SEED) -> list[tuple[World, Entry]]:
    """Every world of the set and its entry, deterministically: the drawn ones, then issue 45's."""
    worlds = [make_world(design, seed) for design in plan(count, seed)]
    return worlds + [issue_world(k, load) for k, load in enumerate(ISSUE_LOADS)]


# -- files ---------------------------------------------------------------------------------------

_HEADER = """\
# The open-loop set of twin worlds (issue 45), made by tests/lab/openworlds.py (generator version
# {version}, seed {seed}): `python benchmarks/make_openloop_worlds.py` writes it again byte for
# byte, and tests/test_openloop_set.py checks that it does. These worlds and this manifest were
# written and committed BEFORE any method was graded or tuned on them: before, only their truths
# ran (which placed issue 45's loads, and showed the gpu's low draft cost must be a GPU's), and
# a smoke test of the harness on two draft worlds; no world was changed after seeing a method's
# answer, and none ever is (a new set takes a new generator version).
# benchmarks/openloop_regret.py grades methods on it by the open-loop truth's mean time per
# output token.
#
# {count} worlds: {drawn} drawn (each factor spread evenly over them, paired at random) and 3 of
# issue 45 itself (the seed's APU with a draft model on the CPU, at 30, 60 and 75 % of
# capacity). The factors (tests/lab/openworlds.py's docstring has the ranges): cost surface (apu:
# the seed's gfx1151 table; cpu: the bench's VM; gpu: a dense target on a discrete GPU), the
# draft model's prompt cost per token (none, low, mid, high, dominant: ~0 to 5 ms; high and
# dominant on the apu only; mid and up a draft model on the CPU on apu and gpu), acceptance by
# the drafts verified together (flat, mild, steep as llama.cpp issue 27117), content (one class,
# or code and prose mixed in the traffic with acceptance of their own, as llama.cpp issue 23052;
# unmarked prompts such as a load generator's get the default), prompts short or long (at depth,
# acceptance falling with context), the load (10-90 % of capacity) and the arrival process
# (poisson, gamma gaps of cv 2-3, or a two-state MMPP).
#
# Per world: file, model_name, seed (what a method runs with), truth_seed and truth_requests (the
# truth's run: its arrivals, lengths, classes and request seeds), observe_seed and
# observe_requests (what a method's observation of the traffic sees: the same traffic, other
# draws), the design's factors and [world.traffic]: arrivals (process and parameters), load
# (rate / capacity), capacity (requests/s the better of plain and always draft serves with a
# backlog of these requests), rate (requests/s), prompt and output lengths (lognormal, median,
# sigma, clipped to [low, high] tokens), classes (share of the requests whose prompt marks each
# class; the rest unmarked). Tags: surface, draft-prefill, accept-drafting, content, prompts,
# load (low <= 30 %, mid <= 60 %, high), arrivals (poisson | bursty), issue-45.
"""


def render_set(
    worlds: Sequence[tuple[World, Entry]],
    seed: int = GENERATOR_SEED,
    *,
    version: int = GENERATOR_VERSION,
    header: str = _HEADER,
    generator: str = "tests/lab/openworlds.py",
    special: str = "issue-45",
) -> dict[str, str]:
    """File name -> text of every world file and the manifest (of version 1 by default; a later
    version gives its own header and generator)."""
    files: dict[str, str] = {}
    for world, entry in worlds:
        t = entry.traffic
        head = (
            f"# Open-loop twin world {world.name} ({generator} v{version}; "
            f"see {MANIFEST}). Do not edit:\n# the set is regenerated byte for byte. Traffic: "
            f"{t.arrivals} arrivals at {100 * t.load:.0f} % of capacity ({t.rate:.4g} "
            f"requests/s), tags {', '.join(entry.tags)}.\n\n"
        )
        files[entry.file] = head + world_to_toml(world)
    drawn = sum(special not in e.tags for _, e in worlds)
    said = header.format(version=version, seed=seed, count=len(worlds), drawn=drawn)
    lines = manifest_head(said, generator, version, seed, len(worlds))
    for _, entry in worlds:
        lines += ["", "[[world]]"]
        for key, value in entry.__dict__.items():
            if key != "traffic" and not (key == "drafter" and not value):
                lines.append(f"{key} = {toml_value(value)}")
        traffic = entry.traffic.as_dict()
        for table in ("arrivals", "prompt", "output", "classes"):
            inner = traffic.pop(table)
            traffic[table] = inner  # the sub-tables last
        lines += ["", "[world.traffic]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in traffic.items() if not isinstance(v, dict)]
        for key, value in traffic.items():
            if isinstance(value, dict):
                lines += ["", f"[world.traffic.{key}]"]
                lines += [f"{k} = {toml_value(v)}" for k, v in value.items()]
    files[MANIFEST] = "\n".join(lines) + "\n"
    return files


def write_set(folder: Path | str, seed: int = GENERATOR_SEED) -> list[Path]:
    """Generate the set and write it into `folder`; the paths written."""
    return write_files(folder, render_set(generate(DRAWN, seed), seed))


def load_manifest(folder: Path | str) -> list[Entry]:
    """The manifest's entries, in order."""
    entries = []
    names = set(Entry.__dataclass_fields__)
    for row in manifest_rows(folder, "open-loop set"):
        fields = {k: v for k, v in row.items() if k in names}
        fields["traffic"] = Traffic.from_dict(row["traffic"])
        fields["tags"] = tuple(fields["tags"])
        entries.append(Entry(**fields))
    return entries


def load_entry_world(folder: Path | str, entry: Entry) -> World:
    return load_world(Path(folder) / entry.file)


__all__ = [
    "CLASSES",
    "DRAWN",
    "GENERATOR_SEED",
    "GENERATOR_VERSION",
    "MANIFEST",
    "Design",
    "Entry",
    "Lengths",
    "Traffic",
    "capacity",
    "generate",
    "issue_world",
    "load_entry_world",
    "load_manifest",
    "make_world",
    "plan",
    "render_set",
    "write_set",
]
