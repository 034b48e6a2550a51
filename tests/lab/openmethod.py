"""The tuner's methods for open-loop traffic, run against a world of the open-loop set
(lab.openworlds) in-process and in virtual time: what benchmarks/openloop_regret.py grades.

A method sees what a user's tuner sees: the world as a server to measure (the in-process twin),
and its traffic only as `tuner observe` would record it (the twin's own traffic profile: time at
each number of generating slots, requests seen finishing with their lengths, arrival rate, mean
output length), never the world's design or the truth.

- `closed`: today's tuner: lab.method's "model" path (a relaunching profile of plain and always
  draft at 1, 2, 4, 8 ... -np, its adaptive levels, the cost model's standing answer), the
  traffic observed while the server runs that answer, then `recommend --traffic NAME
  --objective tpot --closed-loop`, the answer as it is today (plain where it says drafting
  does not pay);
- `naive`: one simple rule: lab.method's "naive" profile (plain and always draft at 1, 2, 4, 8
  streams, closed loop) and N = the last of those levels where always draft beat plain; plain
  where it beat plain at none. It ignores the traffic: what a user who ran one closed benchmark
  would set;
- `open`: the open-loop method (`open_answer`): the closed method's profile and observation
  (where that answer serves without the draft model, the traffic observed again on the
  drafting server at the standing threshold: a plain server's counters show no acceptance), a
  live profile beside it where the traffic weighs (its arrival probes, the off
  arm, a deep level for deep traffic), and `recommend --traffic NAME --objective tpot`
  answered in the open loop (tuner.decide.openadvice: every policy serving the observed
  traffic in a twin of the fit).

Each answer is a Policy: plain, always draft (N = 0) or a threshold N.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.method import HOST, naive_wins, profile_on_twin, run_method, traffic_depths, twin_spec
from lab.openworlds import Entry
from tuner.decide import advice
from tuner.policy import Policy
from tuner.recommendation import ObjectiveKind, Recommendation
from tuner.storage import traffic_profiles
from tuner.storage.store import Store
from tuner.traffic import SOURCE_SLOTS, Finished, ServerView, TrafficProfile
from tuner.twin.engine import Engine, Workload
from tuner.twin.production import CounterReader
from tuner.twin.world import World

METHODS = ("closed", "naive", "open")
TRAFFIC = "observed"  # the name the observed traffic profile is stored under


class MethodMissing(RuntimeError):
    """A method that is not built yet: the harness skips it."""


@dataclass
class OpenResult:
    """What a method answered on a world, and what it cost."""

    method: str
    answer: Policy
    seconds: float  # simulated seconds of measuring (profile, launches; observing not counted)
    details: dict[str, Any] = field(default_factory=dict)


def observe(world: World, policy: Policy, workload: Workload, seed: int) -> TrafficProfile:
    """The traffic profile `tuner observe` would record of a server of this world running
    `policy` while `workload` arrives (noise on, seeded: a server, not the truth): seconds at
    each number of generating slots (idle time at 0), every request seen finishing, with its
    arrival on the server's clock, its prompt and output lengths, and the server's acceptance
    counters read at polls where a request ended."""
    engine = Engine(world, policy, seed)
    for request, at in zip(workload.requests, workload.arrivals, strict=True):
        engine.submit(request, at=at)
    profile = TrafficProfile(world.n_parallel, source=SOURCE_SLOTS)
    profile.max_slots = policy.max_slots if policy.drafting else None
    last = 0.0
    reader = CounterReader(engine)
    while (step := engine.step()) is not None:
        if step.start > last:
            profile.add(0, step.start - last)
        profile.add(step.generating, step.duration)
        last = step.end
        for rid in step.finished:
            res = engine.result(rid)
            profile.add_finished(Finished(res.arrival, res.request.prompt_tokens, res.tokens))
        reader.after(profile, step.finished)
    return profile


def store_traffic(store: Store, world: World, profile: TrafficProfile, name: str = TRAFFIC) -> None:
    """The observed profile in the store, as `tuner observe` leaves it."""
    view = ServerView(f"http://twin/{world.name}", world.model_name, world.n_parallel, "slots")
    traffic_profiles.save(store, name, view, profile.to_dict(), "complete")


def answer_of(rec: Recommendation) -> Policy:
    """The policy a user runs on a recommendation: plain where drafting does not pay."""
    return Policy.plain() if not rec.drafting_pays else rec.policy


@dataclass
class OpenContext:
    """What the open-loop method is given: the closed method's profile in `store` (its standing
    answer `standing`), the traffic observed while the server ran that answer (stored as
    `traffic`), and the world as a server to measure further (lab.method's TwinBackend over
    `world`; its clock counts in `seconds`). Never the design or the truth."""

    world: World
    store: Store
    model: str
    host: str
    traffic: str
    observed: TrafficProfile
    standing: Recommendation
    seed: int
    folder: Path
    seconds: float  # simulated seconds the profile took
    entry: Entry  # the traffic, for observing it again (never its design or truth)
    measured_s: float = 0.0  # simulated seconds the method measured besides: add to it


def open_answer(ctx: OpenContext) -> Policy:
    """Issue 45's open-loop method: a live profile of the world beside the closed method's (the
    off arm at every level, the arrival probes, its adaptive levels where the observed traffic
    weighs, and a deep level where the traffic's context is far deeper than the profile's own:
    lab.method.traffic_depths), then `recommend --traffic NAME --objective tpot`, answered in
    the open loop (tuner.decide.openadvice); the profile's simulated seconds are counted."""
    if answer_of(ctx.standing).is_plain:
        # a server without its draft model shows no acceptance: the traffic is observed on the
        # drafting server at the standing threshold, whose counters show what it accepts
        seen = observe(ctx.world, ctx.standing.policy, ctx.entry.observed_workload(), ctx.seed)
        store_traffic(ctx.store, ctx.world, seen, ctx.traffic)
        ctx.observed = seen
    weights = {c: w for c, w in ctx.observed.weights(ctx.world.n_parallel).items() if w > 0}
    depths = traffic_depths(ctx.observed)
    # its own requests and noise (another seed): new draws, not the closed profile's again
    spec = twin_spec(ctx.world, weights or None, seed=ctx.seed + 1, context_tokens=depths)
    backend = profile_on_twin(ctx.world, ctx.store, spec, ctx.folder, "live", 600.0)
    ctx.measured_s += backend.elapsed
    rec = advice.recommend(
        ctx.store, ctx.model, ctx.host, traffic=ctx.traffic, objective=ObjectiveKind.TPOT,
        seed=ctx.seed,
    )  # fmt: skip
    return answer_of(rec)


def _closed_profile(
    world: World, entry: Entry, folder: Path
) -> tuple[Store, Recommendation, TrafficProfile, float]:
    """lab.method's model path into folder, its standing answer, and the traffic observed while
    the server runs that answer (stored in the store)."""
    result = run_method(world, "model", seed=entry.seed, workdir=folder)
    store = Store(f"sqlite:///{folder / f'model-{entry.seed}.db'}")
    standing = advice.standing(store, world.model_name, HOST, seed=entry.seed)
    seen = observe(world, answer_of(standing), entry.observed_workload(), entry.seed)
    store_traffic(store, world, seen)
    return store, standing, seen, result.seconds


def run_open_method(
    world: World, entry: Entry, method: str, workdir: Path | None = None
) -> OpenResult:
    """One method on one world of the open-loop set (see the module docstring)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="tuner-openloop-") as tmp:
            return run_open_method(world, entry, method, Path(tmp))
    folder = Path(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    if method == "naive":
        result = run_method(world, "naive", seed=entry.seed, workdir=folder)
        store = Store(f"sqlite:///{folder / f'naive-{entry.seed}.db'}")
        try:
            wins = naive_wins(store, world.model_name)
        finally:
            store.dispose()
        answer = Policy.threshold(max(wins)) if wins else Policy.plain()
        return OpenResult(method, answer, result.seconds, {"wins": wins})
    store, standing, seen, seconds = _closed_profile(world, entry, folder)
    try:
        details = {
            "standing": answer_of(standing).label,
            "observed_rate": seen.arrival_rate,
            "observed_generating": seen.mean_generating(),
            "observed_output": seen.mean_output_tokens,
        }
        if method == "closed":
            rec = advice.recommend(
                store,
                world.model_name,
                HOST,
                traffic=TRAFFIC,
                objective=ObjectiveKind.TPOT,
                seed=entry.seed,
                closed_loop=True,  # today's answer: the birth-death queue over closed levels
            )
            return OpenResult(method, answer_of(rec), seconds, details)
        ctx = OpenContext(
            world, store, world.model_name, HOST, TRAFFIC, seen, standing, entry.seed, folder,
            seconds, entry,
        )  # fmt: skip
        answer = OPEN_METHOD(ctx)
        return OpenResult(method, answer, seconds + ctx.measured_s, details)
    finally:
        store.dispose()


OPEN_METHOD: Callable[[OpenContext], Policy] = open_answer
