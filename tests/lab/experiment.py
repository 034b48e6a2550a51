"""`tuner watch --experiment` over twin worlds, in-process and in virtual time: what it is graded
on (benchmarks/watch_experiment.py, tests/test_experiment.py).

- `arrival_rate`: the Poisson rate at which a world keeps a chosen share of its slots
  generating on average under always draft, from the expected steady-state throughput of its
  closed levels (lab.frozen.expected_tps) and the birth-death queue (tuner.model.queue);
- `open_loop_best`: the truth: every N's mean time per output token under the same arrivals,
  noise-free (tuner.twin.truth.open_loop_truth: Poisson, or the bursts' workload);
- `profiled`, `model_start`: what watch stands on when the experiment begins: a profile of the
  world in-process (lab.method's spec, the live switch), the world serving the arrivals at
  always draft (the server's default) for `observe_s` while observe's view of them fills a
  traffic profile, and `recommend --traffic` on it: the standing N and the model's tie set;
- `run_experiment`: the experiment from a standing N on the world serving those arrivals
  (its own noise and seed, going on from the observation where there was one), and what it
  cost; nothing here knows the truth.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab.frozen import expected_tps
from lab.method import HOST, twin_spec
from tuner.decide import advice
from tuner.decide.adaptive import profile_adaptively
from tuner.decide.experiment import Experiment, ExperimentOptions, ExperimentReport, model_tie
from tuner.decide.objective import ObjectiveKind
from tuner.decide.watch import MIN_BUSY_S
from tuner.model import queue
from tuner.policy import Policy
from tuner.recommendation import Recommendation
from tuner.storage import traffic_profiles
from tuner.storage.store import Store
from tuner.traffic import ServerView, TrafficProfile
from tuner.twin.engine import Workload
from tuner.twin.inprocess import TwinBackend
from tuner.twin.production import ServedTraffic, arrivals
from tuner.twin.truth import open_loop_truth
from tuner.twin.world import World

OUTPUT_TOKENS = 128
TRAFFIC = ("poisson", "bursty")
PROCESS = {"poisson": "poisson", "bursty": "mmpp"}  # tuner.twin.bursts: spells at 8x the rate


def arrivals_of(traffic: str, rate: float, seed: int) -> Iterator[float]:
    """The arrival times of a traffic kind: Poisson, or bursts (the twin's two-state MMPP)."""
    if traffic not in TRAFFIC:
        raise ValueError(f"unknown traffic {traffic!r}; known: {', '.join(TRAFFIC)}")
    return arrivals(PROCESS[traffic], rate, seed)


def arrival_rate(world: World, load: float) -> float:
    """The Poisson rate that keeps load x n_parallel slots generating on average under always
    draft (expected steady-state throughput, the queue of tuner.model.queue)."""
    tps = np.array(
        [expected_tps(world, Policy.always(), c) for c in range(1, world.n_parallel + 1)]
    )
    return queue.rate_for_mean_generating(tps, OUTPUT_TOKENS, load * world.n_parallel)


def open_loop_best(
    world: World, traffic: str, rate: float, duration_s: float = 3600.0, seed: int = 10_000
) -> dict[int, float]:
    """Every N's (1..n_parallel, n_parallel: always draft) mean time per output token, ms,
    noise-free, all under the same arrivals (another seed than the experiment's)."""
    candidates = [Policy.threshold(n, world.n_max) for n in range(1, world.n_parallel + 1)]
    workload = None
    if traffic != "poisson":
        process = PROCESS[traffic]
        workload = Workload.bursty(rate, duration_s, OUTPUT_TOKENS, seed=seed, process=process)
    truth = open_loop_truth(
        world, rate, duration_s=duration_s, seed=seed, candidates=candidates, workload=workload
    )
    return {p.max_slots or world.n_parallel: t.tpot_mean_ms for p, t in truth.items()}


@dataclass
class Graded:
    """One experiment against the truth."""

    report: ExperimentReport
    regret: float  # the answer's mean TPOT over the best's, less 1
    best: int
    minutes: float  # simulated minutes of traffic the experiment served

    @property
    def changes(self) -> int:
        return len(self.report.moves)


@dataclass
class ModelStart:
    """What watch stands on when its experiment begins (see `model_start`)."""

    standing: int
    tie: list[int]
    recommendation: Recommendation
    traffic: TrafficProfile
    served: ServedTraffic  # the world going on serving the arrivals


def profiled(world: World, folder: Path, *, seed: int = 0, box: World | None = None) -> str:
    """The world (or `box`: the same server measured with another acceptance) profiled
    in-process as lab.method's spec has it, the live switch, into a database of its own; its
    URL."""
    folder.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{folder / f'watch-{seed}.db'}"
    store = Store(url)
    try:
        measured = box or world
        profile_adaptively(
            store,
            twin_spec(measured, seed=seed),
            folder,
            host_name=HOST,
            backend=TwinBackend(measured, switch="live", seed=seed),
            switch="live",
            budget_s=600.0,
            seed=seed,
        )
    finally:
        store.dispose()
    return url


def model_start(
    world: World,
    traffic: str | ServedTraffic,
    rate: float,
    db: str,
    *,
    seed: int = 0,
    observe_s: float = 300.0,
    objective: ObjectiveKind = ObjectiveKind.TPOT,
) -> ModelStart:
    """Observe the arrivals (a traffic kind at the rate, or a server already serving its own)
    at always draft and recommend for them on the profile in `db` (see `profiled` and the
    module docstring)."""
    served = (
        traffic
        if isinstance(traffic, ServedTraffic)
        else ServedTraffic(world, arrivals_of(traffic, rate, seed), 0, seed=seed)
    )
    served.switch(0)
    seen = TrafficProfile(world.n_parallel)
    served.window(observe_s, seen)
    # as watch waits for busy time before it decides (--min-busy), a quiet spell is waited out
    while seen.covered_s - seen.seconds.get(0, 0.0) < MIN_BUSY_S and seen.covered_s < 3 * observe_s:
        served.window(observe_s / 5, seen)
    store = Store(db)
    try:
        view = ServerView("http://twin", world.model_name, world.n_parallel, "slots", True)
        name = "watch"
        traffic_profiles.save(store, name, view, seen.to_dict(), "watching")
        rec = advice.recommend(
            store, world.model_name, HOST, traffic=name, objective=objective, seed=seed
        )
    finally:
        store.dispose()
    return ModelStart(rec.max_slots, model_tie(rec), rec, seen, served)


def run_experiment(
    world: World,
    traffic: str,
    rate: float,
    start: int,
    *,
    seed: int = 0,
    tie: Collection[int] = (),
    options: ExperimentOptions | None = None,
    say: Callable[[str], None] = lambda _: None,
    served: ServedTraffic | None = None,
    output_tokens: float = OUTPUT_TOKENS,
) -> tuple[ExperimentReport, float]:
    """The experiment from N=start on the world serving the traffic (going on from `served`
    where given); its report and the simulated seconds it took. It knows the rate and mean
    output length, as watch's rolling traffic profile tells them."""
    if served is None:
        served = ServedTraffic(world, arrivals_of(traffic, rate, seed), start, seed=seed)
    began = served.elapsed
    experiment = Experiment(
        start,
        world.n_parallel,
        options or ExperimentOptions(seed=seed),
        tie=tie,
        rate=rate,
        output_tokens=output_tokens,
        say=say,
    )
    report = experiment.run(served)
    return report, served.elapsed - began


def grade(report: ExperimentReport, truth: dict[int, float], seconds: float) -> Graded:
    n_parallel = max(truth)
    best = min(truth, key=lambda n: (truth[n], n))
    answer = report.answer or n_parallel
    return Graded(report, truth[answer] / truth[best] - 1.0, best, seconds / 60.0)
