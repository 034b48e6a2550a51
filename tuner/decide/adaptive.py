"""Adaptive profiling: after the base levels, measure where the decision is still open.

`tuner profile` measures its base levels (1, 2, 4, 8 by default), then asks the decision what it
rests on: the unmeasured levels whose gain interval straddles zero (the choice's "measure next").
It measures those levels (all configurations, interleaved, into the same run), refits, and asks
again, until the data decide N, no such level is left, or the budget (wall seconds for the added
levels) would be overrun by the next round. Every round says which levels it added and why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from tuner.decide.advice import model_study
from tuner.decide.choice import Choice, choose
from tuner.errors import NotFoundError, TunerError
from tuner.measure.backend import LIVE, Backend
from tuner.measure.plan import Observer, ProgressEvent, profile_policies, quiet
from tuner.measure.probes import probe_arrivals
from tuner.measure.profiler import Profiler
from tuner.measure.profiler import profile as profile_base
from tuner.measure.spec import ProfileSpec
from tuner.model.costmodel import Gain
from tuner.storage.orm import Run
from tuner.storage.store import Store

DEFAULT_BUDGET_S = 600.0


@dataclass(frozen=True)
class AddedLevel:
    """A level the profile measured by itself, and why."""

    concurrency: int
    why: str


@dataclass
class AdaptiveProfile:
    """What `tuner profile` did beyond its base levels."""

    run_id: int
    budget_s: float
    base_s: float
    added: list[AddedLevel] = field(default_factory=list)
    spent_s: float = 0.0
    outcome: str = "decided"  # decided | budget | off | one-level

    def summary(self) -> str:
        if self.outcome == "off":
            return "adaptive levels: off (--budget 0)"
        if self.outcome == "one-level":
            return (
                "adaptive levels: none: the adaptive step needs measurements at two or more "
                "concurrency levels to fit a model (profile more levels, e.g. --levels 1,2,4,8); "
                "what was measured is kept"
            )
        if not self.added and self.outcome == "decided":
            return "adaptive levels: none needed, the base levels decide N"
        added = "; ".join(f"{a.concurrency} streams ({a.why})" for a in self.added) or "none"
        end = {
            "decided": "the data now decide N",
            "budget": "stopped: the next round would overrun the budget; "
            "`tuner recommend` names what is still open",
        }[self.outcome]
        return (
            f"adaptive levels: {added}; {self.spent_s:.0f} s of the {self.budget_s:.0f} s "
            f"budget; {end}"
        )


@dataclass(frozen=True)
class Decision:
    """The choice the data make now, the model's gain per level it rests on, and the weight of
    each level 1..n_parallel in the objective (the workload's or the traffic's)."""

    choice: Choice
    gain: Gain
    weights: tuple[float, ...] = ()

    def why(self, c: int) -> str:
        point, lower, upper, _ = self.gain.at(c)
        weight = self.weights[c - 1] if 0 < c <= len(self.weights) else None
        return (
            f"unmeasured; the model puts spec at {100 * point:+.1f}% "
            f"[{100 * lower:+.1f}%, {100 * upper:+.1f}%] there"
            + (f"; weight {weight:.2f}" if weight is not None else "")
        )


def decision(store: Store, model: str, host: str, seed: int = 0) -> Decision:
    """What the data decide now (the model's study kept in memory, nothing stored but the fit)."""
    study = model_study(store, model, host, host_explicit=True, seed=seed)
    gains = study.fit.quality.measured_gains(against="off")
    choice = choose(study.fit.model, study.result, gains)
    weights = tuple(float(w) for w in study.weights)
    return Decision(choice, study.fit.model.gain(choice.policy.n_max, against="off"), weights)


HEAVY = 0.5  # a level weighing this share of the heaviest level is measured, decided or not


def where_to_measure(
    measure_next: list[int], weights: tuple[float, ...], tried: set[int], weighted: bool
) -> list[int]:
    """The levels the next round measures, heaviest first: those the choice rests on that carry
    weight (a level no traffic reaches cannot move the objective), and, where the workload or
    the traffic weighs the levels, every untried level weighing at least HEAVY of the heaviest
    (where the objective is, an open-loop answer needs its step costs measured, not
    interpolated)."""

    def weight(c: int) -> float:
        return weights[c - 1] if 0 < c <= len(weights) else 0.0

    todo = {c for c in measure_next if c not in tried and weight(c) > 0}
    if weighted and weights:
        top = max(weights)
        todo |= {
            c for c in range(1, len(weights) + 1) if c not in tried and weight(c) >= HEAVY * top
        }
    return sorted(todo, key=lambda c: (-weight(c), c))


def profile_adaptively(
    store: Store,
    spec: ProfileSpec,
    log_dir: Path,
    observer: Observer = quiet,
    *,
    resume: bool = False,
    host_name: str,
    skip_preflight: bool = False,
    budget_s: float = DEFAULT_BUDGET_S,
    seed: int = 0,
    switch: str = "auto",
    backend: Backend | None = None,
    plain: bool = True,
) -> AdaptiveProfile:
    """`tuner profile`: the base levels, then the levels the decision needs, within budget_s
    (on the backend's clock where one is given: the twin's virtual seconds)."""

    def clock() -> float:
        return backend.elapsed if backend is not None else time.monotonic()

    started = clock()
    run_id = profile_base(
        store,
        spec,
        log_dir,
        observer,
        resume=resume,
        host_name=host_name,
        skip_preflight=skip_preflight,
        switch=switch,
        backend=backend,
        plain=plain,
    )
    base_s = clock() - started
    probe(store, spec, log_dir, observer, run_id, switch, backend)
    report = AdaptiveProfile(run_id, budget_s, base_s)
    if len(set(spec.levels)) < 2:
        report.outcome = "one-level"
        return report
    if budget_s <= 0:
        report.outcome = "off"
        return report
    per_level = base_s / max(1, len(spec.levels))
    policies = profile_policies(spec, plain)
    tried: set[int] = set(spec.levels)
    weighted = bool(spec.workload.weights)
    while True:
        now = decision(store, spec.model_name, host_name, seed)
        todo = where_to_measure(now.choice.measure_next, now.weights, tried, weighted)
        if not todo:
            return report
        left = budget_s - report.spent_s
        affordable = int(left // per_level) if per_level > 0 else len(todo)
        if affordable < 1:
            report.outcome = "budget"
            said = f"{', '.join(map(str, todo))} streams would take about "
            said += f"{len(todo) * per_level:.0f} s, {left:.0f} s of the budget left: stopping"
            observer(ProgressEvent("message", text=f"adaptive: {said}"))
            return report
        todo = todo[:affordable]
        added = [AddedLevel(c, now.why(c)) for c in todo]
        for a in added:
            said = f"measuring {a.concurrency} streams ({a.why}); "
            said += f"budget {left:.0f} s of {budget_s:.0f} s left"
            observer(ProgressEvent("message", text=f"adaptive: {said}"))
        round_started = clock()
        profiler = Profiler(store, spec, log_dir, observer, switch=switch, backend=backend)
        profiler.reopen_run(run_id)
        profiler.execute(policies, kernel_level=False, levels=todo)
        report.spent_s += clock() - round_started
        report.added += added
        tried.update(todo)


def probe(
    store: Store,
    spec: ProfileSpec,
    log_dir: Path,
    observer: Observer,
    run_id: int,
    switch: str,
    backend: Backend | None,
) -> None:
    """The arrival probes (tuner.measure.probes) into the run, after its base levels; catch-up
    only where a threshold is switched live (the twin, or a run that switched live), so no
    extra launch is made for it. A probe that fails is said and left out: the profile stands.
    A spec with `[probes] enabled = false` runs none, and says so."""
    if not spec.probes.enabled:
        observer(ProgressEvent("message", text="arrival probes: off (probes.enabled = false)"))
        return
    with store.session() as session:
        run = session.get(Run, run_id)
        if run is None:
            raise NotFoundError(f"run {run_id} does not exist; `tuner runs` lists them")
        way = run.way
    profiler = Profiler(store, spec, log_dir, observer, switch=switch, backend=backend)
    assert profiler.backend is not None
    try:
        said = probe_arrivals(
            store,
            run_id,
            profiler.backend,
            profiler.request_workload(),
            spec.speculative.n_max,
            catch_up=way in (LIVE, "twin"),
            repeats=spec.probes.repeats,
        )
    except TunerError as exc:
        said = f"arrival probes failed, left out: {exc}"
    finally:
        profiler.backend.close()
    observer(ProgressEvent("message", text=said))
