"""Version 2 of the open-loop set of twin worlds (issue 50): every drafter one the pinned build
has, and loads set against the capacity of every policy compared.

Written down before any method is graded on it, as version 1 (lab.openworlds) was: `generate()`
makes the set deterministically from GENERATOR_SEED and `write_set(folder)` writes it into
profiles/twin/openloop2/ (benchmarks/make_openloop2_worlds.py), which must equal
what this makes byte for byte (tests/test_openloop_set.py). Version 1 stays as it was, and is
graded beside this one.

What changed from version 1, and why:

1. Drafters as llama.cpp 11434 runs them (tuner.twin.drafters; world `draft.kind`), no mixture:
   - "mtp" (apu): the seed's MTP head, eager: its calls the surface's, its pass over every
     batch 2-5 % of the target's rows, its prompt pass 1.5-4 % of the target's a token;
   - "draft-gpu" (gpu): a small draft model beside the target, eager: calls the surface's,
     every batch 3-8 % of the target's rows, its prompt at the low level (0.01-0.03 ms a token);
   - "draft-cpu": a draft model on the CPU, eager (draft-simple): its prompt at admission at
     the draft prompt level (apu: mid, high, dominant; gpu: mid; the cpu surface, whose draft
     shares the target's two cores: none, low, mid), calls 3-8 ms at one slot plus 0.3-1 ms a
     slot (the cpu surface: the bench's), and every batch's rows decoded again at 30-60 % of a
     call over as many rows (process() computes the last row's logits alone, a draft call every
     row's); nothing to catch up (version 1 charged a catch-up on resuming beside the prompt at
     admission, which no build does);
   - "ngram" (every surface): lazy: no model, a lookup of 0.05-0.2 ms a slot on the CPU, its
     tables caught up at 0.0005 ms a token when a slot drafts; acceptance a synth_len of
     1.6-2.6 (code 0.8-1.5 above, prose 0.3-0.6 below), not falling with the drafts verified
     together (no batched draft model).
2. Loads against the capacity of the policies compared: the rate is a share (10-90 %) of the
   weakest of plain, always draft and the threshold server that stops drafting from two
   generating slots (every other N lies between the last two when every slot is busy), each
   serving a backlog of the world's own requests; version 1 set it against the better of plain
   and always draft, where any other policy could be overloaded.
3. The gpu surface at -np 16 or 32 (a data-centre GPU's occupancy tail).

The other factors (acceptance by drafts and content, prompts, arrivals) are version 1's ranges.
Three worlds of issue 50 itself ("openloop2-issue-*"): issue 45's world, the seed's APU with a
draft model on the CPU at 1.2 ms a prompt token, now an eager drafter (its rows each step at
45 % of a call, no catch-up), at 30, 60 and 75 % of the weakest policy's capacity.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from lab.frozen import Draw, shuffled, spread, write_files
from lab.openworlds import (
    APU_ROWS,
    CODE_MARKER,
    GPU_LOW,
    LOADS,
    PREFILL_LEVELS,
    PROSE_MARKER,
    Design,
    Entry,
    Lengths,
    Traffic,
    _acceptance,
    _entry,
    _r,
    _surface,
    _traffic_shape,
    capacities,
    render_set,
    world_of,
)
from tuner.policy import Policy
from tuner.twin.world import World

GENERATOR_SEED = 50
GENERATOR_VERSION = 2
DRAWN = 33
ISSUE_LOADS = (0.3, 0.6, 0.75)
PREFIX = "openloop2"
SPECIAL = "issue-50"
TRUTH_REQUESTS = 2400
OBSERVED_REQUESTS = 400

DRAFTERS = {
    "apu": ("mtp", "mtp", "draft-cpu", "draft-cpu", "ngram"),
    "cpu": ("draft-cpu", "draft-cpu", "ngram"),
    "gpu": ("draft-gpu", "draft-gpu", "draft-cpu", "ngram"),
}
CPU_DRAFT_LEVELS = {
    "apu": ("mid", "high", "dominant"),
    "cpu": ("none", "low", "mid"),
    "gpu": ("mid",),
}
NGRAM_CATCH_UP = 0.0005  # ms a token: a hash insert on the CPU


def compared(world: World) -> list[Policy]:
    """The policies whose weakest capacity sets the load (see the module docstring)."""
    return [Policy.plain(), Policy.always(world.n_max), Policy.threshold(1, world.n_max)]


def plan(count: int = DRAWN, seed: int = GENERATOR_SEED) -> list[tuple[Design, str, int]]:
    """Each design (version 1's factors), its drafter and -np: every factor spread evenly over
    the worlds and paired at random; drafters spread within each surface, the draft prompt level
    within each surface's CPU drafts, -np within the gpu worlds."""
    rng = random.Random(f"openloop:{seed}:v2:plan")
    surfaces = shuffled(rng, spread(("apu", "cpu", "gpu"), count))
    drafters = {s: shuffled(rng, spread(DRAFTERS[s], count)) for s in DRAFTERS}
    levels = {s: shuffled(rng, spread(CPU_DRAFT_LEVELS[s], count)) for s in CPU_DRAFT_LEVELS}
    slots = shuffled(rng, spread((16, 32), count))
    drafting = shuffled(rng, spread(("flat", "flat", "mild", "steep"), count))
    content = shuffled(rng, spread(("one", "mixed"), count))
    prompts = shuffled(rng, spread(("short", "short", "short", "long"), count))
    loads = shuffled(rng, spread(LOADS, count))
    arrivals = shuffled(rng, spread(("poisson", "poisson", "gamma", "mmpp"), count))
    out = []
    for i in range(count):
        surface = surfaces[i]
        drafter = drafters[surface].pop()
        level = levels[surface].pop() if drafter == "draft-cpu" else "none"
        if drafter in ("mtp", "draft-gpu"):
            level = "low"
        design = Design(
            index=i,
            surface=surface,
            prefill=level,
            drafting="flat" if drafter == "ngram" else drafting[i],
            content=content[i],
            prompts=prompts[i],
            load=loads[i],
            arrivals=arrivals[i],
            resume="",
        )
        out.append((design, drafter, slots[i] if surface == "gpu" else 8))
    return out


def _draft(design: Design, drafter: str, surface: dict[str, Any], draw: Draw) -> dict[str, Any]:
    """[draft] and the draft model's prompt cost a token for one drafter (module docstring)."""
    np_ = surface["n_parallel"]
    if drafter == "ngram":
        one = draw.uniform(0.05, 0.2)
        draft = {
            "kind": "lazy",
            "call_ms": [(1.0, _r(one)), (float(np_), _r(one * np_))],
            "catch_up_ms_per_token": NGRAM_CATCH_UP,
        }
        return {"draft": draft, "draft_ms_per_token": 0.0}
    rows = surface["rows"]
    if drafter == "mtp":
        share, per_token = draw.uniform(0.02, 0.05), surface["prefill"] * draw.uniform(0.015, 0.04)
        draft = {"call_ms": surface["call"], "reeval_ms": [(x, _r(share * y)) for x, y in rows]}
    elif drafter == "draft-gpu":
        share, per_token = draw.uniform(0.03, 0.08), draw.uniform(*GPU_LOW)
        draft = {"call_ms": surface["call"], "reeval_ms": [(x, _r(share * y)) for x, y in rows]}
    else:  # a draft model on the CPU
        per_token = draw.uniform(*PREFILL_LEVELS[design.prefill])
        share = draw.uniform(0.3, 0.6)
        if design.surface == "cpu":
            calls = surface["call"]
        else:
            one = draw.uniform(3.0, 8.0)
            calls = [(1.0, _r(one)), (float(np_), _r(one + draw.uniform(0.3, 1.0) * np_))]
        draft = {"call_ms": calls, "reeval_ms": [(x, _r(share * y)) for x, y in calls]}
    return {"draft": {"kind": "eager", **draft}, "draft_ms_per_token": _r(per_token)}


def _ngram_acceptance(acceptance: dict[str, Any], n_max: int, draw: Draw) -> dict[str, Any]:
    """An n-gram drafter's acceptance: lower than a model's, code well above prose."""
    base = _r(draw.uniform(1.6, 2.6), 2)
    out = {**acceptance, "synth_len": base}
    if "classes" in acceptance:
        code = _r(min(n_max + 0.95, base + draw.uniform(0.8, 1.5)), 2)
        prose = _r(max(1.05, base - draw.uniform(0.3, 0.6)), 2)
        out["classes"] = [
            {"name": "code", "marker": CODE_MARKER, "synth_len": code},
            {"name": "prose", "marker": PROSE_MARKER, "synth_len": prose},
        ]
    return out


def make_world(
    design: Design, drafter: str, n_parallel: int, seed: int = GENERATOR_SEED
) -> tuple[World, Entry]:
    """Draw one world of the plan and its manifest entry."""
    draw = Draw(f"openloop:{seed}:v2:world:{design.index}")
    surface = _surface(design, draw) | {"n_parallel": n_parallel}
    drafted = _draft(design, drafter, surface, draw)
    acceptance = _acceptance(design, surface, draw)
    if drafter == "ngram":
        acceptance = _ngram_acceptance(acceptance, surface["n_max"], draw)
    name = f"{PREFIX}-{design.index:02d}"
    description = (
        f"open-loop set v{GENERATOR_VERSION} world {design.index}: {design.surface} surface, "
        f"{drafter} drafter, draft prompt cost {design.prefill}, acceptance by drafts "
        f"{design.drafting}, content {design.content}, {design.prompts} prompts"
    )
    model_name = f"twin-{PREFIX}-{design.index:02d}-{design.surface}"
    world = world_of(design, surface, drafted, acceptance, name, model_name, description)
    prompt, output, classes, process = _traffic_shape(design, surface, draw)
    return world, entry_of(world, design, drafter, prompt, output, classes, process, name)


def _seed(key: str) -> int:
    return random.Random(f"openloop:{GENERATOR_SEED}:v2:seed:{key}").getrandbits(31)


def entry_of(
    world: World,
    design: Design,
    drafter: str,
    prompt: Lengths,
    output: Lengths,
    classes: tuple[tuple[str, float], ...],
    process: dict[str, float],
    name: str,
    extra_tags: tuple[str, ...] = (),
) -> Entry:
    """The world's entry (version 1's, lab.openworlds._entry): its rate a share of the weakest
    compared policy's capacity, its seeds version 2's."""

    def weakest(w: World, shape: Traffic) -> float:
        got = capacities(w, shape, _seed(f"{name}:capacity"), compared(w))
        return round(min(got.values()), 6)

    tags = (f"drafter-{drafter}", *extra_tags)
    return _entry(
        world, design, prompt, output, classes, process, name, tags,
        seed_of=_seed, capacity_of=weakest, drafter=drafter,
    )  # fmt: skip


def issue_world(k: int, load: float) -> tuple[World, Entry]:
    """Issue 50's world at one load (the module docstring)."""
    name = f"{PREFIX}-issue-{k}"
    calls = [(1.0, 4.0), (8.0, 11.0)]
    data = {
        "name": name,
        "model_name": f"twin-{PREFIX}-issue-50-apu-cpu-draft",
        "description": (
            "issue 50: the seed's APU (seed-gfx1151) with a draft model on the CPU as llama.cpp "
            "11434's draft-simple runs it: prompts at 1.2 ms a token at admission, calls 4-11 ms, "
            "every batch's rows at 45 % of a call, nothing to catch up"
        ),
        "n_parallel": 8,
        "n_max": 3,
        "slot_context": 32768,
        "acceptance": {"synth_len": 3.64},
        "step": {"rows_ms": APU_ROWS, "slots_ms": [(1.0, 0.0)]},
        "draft": {
            "kind": "eager",
            "call_ms": calls,
            "reeval_ms": [(x, _r(0.45 * y)) for x, y in calls],
        },
        "prefill": {"ms_per_token": 0.8, "draft_ms_per_token": 1.2},
        "noise": {"preset": "quiet"},
    }
    world = World.model_validate(data)
    design = Design(
        index=-1, surface="apu", prefill="high", drafting="flat", content="one",
        prompts="short", load=load, arrivals="poisson", resume="",
    )  # fmt: skip
    prompt = Lengths(250.0, 0.8, 8, 8192)
    output = Lengths(256.0, 0.6, 8, 2048)
    process = {"cv": 1.0, "peak": 1.0, "busy_share": 0.5, "busy_s": 1.0}
    entry = entry_of(world, design, "draft-cpu", prompt, output, (), process, name, (SPECIAL,))
    return world, entry


def generate(count: int = DRAWN, seed: int = GENERATOR_SEED) -> list[tuple[World, Entry]]:
    """Every world of the set and its entry: the drawn ones, then issue 50's."""
    worlds = [make_world(d, drafter, np_, seed) for d, drafter, np_ in plan(count, seed)]
    return worlds + [issue_world(k, load) for k, load in enumerate(ISSUE_LOADS)]


HEADER = """\
# Version {version} of the open-loop set of twin worlds (issue 50), made by
# tests/lab/openworlds2.py (seed {seed}): `python benchmarks/make_openloop2_worlds.py`
# writes it again byte for byte, and tests/test_openloop_set.py checks that it does. These worlds
# and this manifest were written and committed BEFORE any method was graded on them; no world is
# changed after seeing a method's answer (a new set takes a new generator version). Version 1
# (profiles/twin/openloop/) stays as it was and is graded beside it.
#
# {count} worlds: {drawn} drawn and 3 of issue 50 (the seed's APU with a draft model on the CPU
# as llama.cpp 11434 runs it, at 30, 60 and 75 % of the weakest policy's capacity). What changed
# from version 1 (tests/lab/openworlds2.py's docstring has the ranges): every drafter is one the
# pinned build has (draft.kind eager: draft-simple on the GPU or the CPU, an MTP head; lazy: an
# n-gram drafter), none charging another's terms; the load is a share of the weakest of plain,
# always draft and the threshold server that stops drafting from two generating slots, each
# serving a backlog of the world's own requests (capacity below); the gpu surface at -np 16 or
# 32. The manifest's fields are version 1's, plus `drafter` (the speculative type) and the tag
# drafter-*.
"""


def render(worlds: list[tuple[World, Entry]], seed: int = GENERATOR_SEED) -> dict[str, str]:
    """File name -> text of every world file and the manifest."""
    return render_set(
        worlds, seed, version=GENERATOR_VERSION, header=HEADER,
        generator="tests/lab/openworlds2.py", special=SPECIAL,
    )  # fmt: skip


def write_set(folder: Path | str, seed: int = GENERATOR_SEED) -> list[Path]:
    """Generate the set and write it into `folder`; the paths written."""
    return write_files(folder, render(generate(DRAWN, seed), seed))
