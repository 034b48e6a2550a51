"""The tuner's methods run against a twin world, in-process and in virtual time: what the twin
judges.

- `full`: today's whole method: a profile whose drafting policies share one launch switched
  live (always draft beside the threshold that does not draft at each level), its adaptive
  levels, the cost model's recommendation, then `tune` settling N on paired live rounds;
- `model`: the method before this one: a profile that relaunches per policy (plain and always
  draft), its adaptive levels, and the cost model's recommendation;
- `naive`: a 1/2/4/8 profile and the last of those levels where always-draft beat plain.

Each run gets its own database, its own noise seed and the world's traffic weights through the
spec, exactly as a user's spec carries them; nothing here knows the truth. The result carries
the answer, what it cost in simulated seconds, and the fit's 90 % intervals at the cells the
run never measured (what coverage is judged on).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.decide import advice, settle
from tuner.decide.adaptive import profile_adaptively
from tuner.decide.tune import DEFAULT_BUDGET_S, tune
from tuner.measure.spec import ProfileSpec
from tuner.policy import Policy
from tuner.storage.fits import current_fit
from tuner.storage.store import Store
from tuner.twin.inprocess import TwinBackend
from tuner.twin.world import World

METHODS = ("full", "model", "naive")
HOST = "twin"
DEFAULT_LEVELS = (1, 2, 4, 8)


def twin_spec(
    world: World,
    weights: Mapping[int, float] | None = None,
    *,
    levels: tuple[int, ...] | None = None,
    max_tokens: int = 128,
    seed: int = 0,
) -> ProfileSpec:
    """The profile spec a user of this world would write: its -np and n_max, base levels
    1, 2, 4, ... up to -np, the traffic weights."""
    np_ = world.n_parallel
    base = levels or tuple(c for c in (1, 2, 4, 8, 16) if c <= np_) + (
        (np_,) if np_ not in (1, 2, 4, 8, 16) else ()
    )
    return ProfileSpec.model_validate(
        {
            "name": f"twin-{world.name}",
            "model_name": world.model_name,
            "server": {
                "binary": "/twin/llama-server",
                "model": "/twin/world.toml",
                "n_parallel": np_,
                "ctx_size": world.slot_context * np_,
            },
            "speculative": {"args": [], "n_max": world.n_max},
            "workload": {
                "prompt_tokens": 32,
                "max_tokens": max_tokens,
                "concurrency": list(base),
                "seed": seed,
                "weights": dict(weights) if weights else None,
            },
            "kernel": {"enabled": False},
        }
    )


@dataclass
class MethodResult:
    """What a method answered on a world, and what it cost."""

    method: str
    answer: int  # N, n_parallel for always draft
    seconds: float  # simulated seconds of measuring, launches included
    status: str = ""  # tune's: settled | unresolved | moved
    tie: list[int] = field(default_factory=list)
    measured: set[int] = field(default_factory=set)  # concurrencies the run measured
    # (policy label, concurrency) -> (lower, point, upper) of the fit's 90 % interval, at the
    # cells no run measured
    held_out: dict[tuple[str, int], tuple[float, float, float]] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)


def run_method(
    world: World,
    method: str,
    *,
    weights: Mapping[int, float] | None = None,
    seed: int = 0,
    budget_s: float = DEFAULT_BUDGET_S,
    workdir: Path | None = None,
    max_tokens: int = 128,
    tolerance: float = settle.TOLERANCE,
) -> MethodResult:
    """Run one method on the world (see the module docstring). budget_s and tolerance are
    tune's (the full method's live step)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="tuner-twin-") as tmp:
            return run_method(
                world,
                method,
                weights=weights,
                seed=seed,
                budget_s=budget_s,
                workdir=Path(tmp),
                max_tokens=max_tokens,
                tolerance=tolerance,
            )
    folder = Path(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{folder / f'{method}-{seed}.db'}")
    try:
        return _run(world, method, store, folder, weights, seed, budget_s, max_tokens, tolerance)
    finally:
        store.dispose()


def _run(
    world: World,
    method: str,
    store: Store,
    folder: Path,
    weights: Mapping[int, float] | None,
    seed: int,
    budget_s: float,
    max_tokens: int,
    tolerance: float,
) -> MethodResult:
    np_ = world.n_parallel
    levels = tuple(c for c in DEFAULT_LEVELS if c <= np_) if method == "naive" else None
    spec = twin_spec(world, weights, levels=levels, max_tokens=max_tokens, seed=seed)
    switch = "live" if method == "full" else "relaunch"
    backend = TwinBackend(world, switch=switch, seed=seed)
    profile_adaptively(
        store,
        spec,
        folder,
        host_name=HOST,
        backend=backend,
        switch=switch,
        budget_s=0.0 if method == "naive" else 600.0,
        seed=seed,
    )
    fit = current_fit(store, world.model_name, HOST, seed=seed)
    measured = set(fit.measured.get("plain", [])) | set(fit.measured.get("spec", []))
    if method == "naive":
        answer = naive_rule(fit.model, fit.measured, store, world.model_name)
        result = MethodResult(method, answer, backend.elapsed, measured=measured)
    else:
        rec = advice.standing(store, world.model_name, HOST, seed=seed)
        result = MethodResult(method, rec.policy.effective(np_), backend.elapsed, measured=measured)
        if method == "full":
            report = tune(
                store,
                world.model_name,
                HOST,
                folder,
                backend=backend,
                budget_s=budget_s,
                tolerance=tolerance,
                seed=seed,
            )
            assert report.standing is not None and report.settled is not None
            result.answer = report.standing.policy.effective(np_)
            result.status = report.settled.status
            result.tie = list(report.settled.tie)
            result.details = report.as_dict()
            result.seconds = backend.elapsed
    result.held_out = held_out_intervals(fit.model, measured, np_)
    return result


def naive_rule(model: Any, measured: Mapping[str, list[int]], store: Store, name: str) -> int:
    """The last measured level where always-draft beat plain, on the measured medians (0
    levels: plain everywhere, answered as N=1, the least drafting a threshold does)."""
    wins = naive_wins(store, name)
    return max(wins) if wins else 1


def naive_wins(store: Store, name: str) -> list[int]:
    """The measured levels where always-draft beat plain, on the measured medians."""
    from tuner.storage.queries import model_points

    points = model_points(store, name, HOST)
    tps = {(p.config, p.concurrency): p.tokens_per_second for p in points if p.tokens_per_second}
    return [
        c
        for c in sorted({c for _, c in tps})
        if ("spec", c) in tps and ("plain", c) in tps and tps[("spec", c)] > tps[("plain", c)]
    ]


def held_out_intervals(
    model: Any, measured: set[int], n_parallel: int
) -> dict[tuple[str, int], tuple[float, float, float]]:
    """The fit's 90 % intervals for plain and always draft at the levels no run measured."""
    out = {}
    unmeasured = [c for c in range(1, n_parallel + 1) if c not in measured]
    if not unmeasured:
        return out
    for policy in (Policy.plain(), Policy.always()):
        pred = model.predict(policy, unmeasured)
        for i, c in enumerate(pred.concurrency):
            out[(policy.label, c)] = (pred.lower[i], pred.tokens_per_second[i], pred.upper[i])
    return out
