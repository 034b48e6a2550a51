"""The tuner end to end over HTTP against twin servers, held against the twins' truth (issue 25).

Every tuner command here is the user's own, run as a subprocess (benchmarks/common.py) against
`tuner-twin-server`, which the tuner launches from the spec exactly as it launches llama-server
(profiles/twin/seed-twin.toml). Truths come from tuner.twin.truth, noise-free.

1. The seed's gfx1151 twin (profiles/twin/seed-gfx1151.toml): `tuner profile` then `tuner tune`
   into a fresh database, once with uniform workload weights and once with 70 % of the weight
   at one level (the other 30 % spread evenly). The level: one whose concentrated weights move
   the truth's best N away from the uniform one, if any does; otherwise the level that makes
   the uniform truth's runner-up cost most (the level where the uniform decision between best
   and runner-up is made). Each answer's regret against the truth's best under the same weights
   (target: 0 or within 0.3 %), the virtual seconds the tuner's measured rounds took on the
   twin's clock (each round: its longest request; warm-ups and launches not stored), and wall.
2. Open loop on the seed twin under the standing N from 1. (uniform): three Poisson rates whose
   mean generating slots come out near 1.5, 4 and 7 in open_loop_truth under that N (bisection
   on the truth). Per rate a twin server running the standing N serves the arrivals
   (tuner.measure.arrivals.poisson_schedule through LoadGenerator.run_arrivals, which puts them
   on the twin's clock) while `tuner observe` watches it; then `tuner recommend --traffic NAME`
   with --objective tpot and tps on part 1's database. Each answer against open_loop_truth's
   best N by that objective, with its regret (tpot target: within 2 %). `tuner observe` times
   its polls on the twin's own clock (its /slots carry it), so the rate it stores is the twin's
   whatever the speed.
3. A flapping world (profiles/twin/seed-flapping.toml: the seed box with a drafter that catches
   its context up on resume instead of re-evaluating every batch). open_loop_truth at rates where
   the generating count crosses the closed-loop best N often, beside the same world without the
   catch-up cost (what closed levels see); then `tuner profile` on it and `tuner recommend
   --objective tpot --rate R` against the truth's best by mean TPOT.

    .venv/bin/python benchmarks/twin_serve.py [--parts 1,2,3] [--speed 20] [--open-speed 8]
        [--window 600] [--workdir DIR] [--seed 0]

About 12 minutes on two busy cores (part 1: two profile + tune runs, 4 min; part 2: 600 virtual
seconds of arrivals per rate at speed 8, 4 min; part 3: a profile and the truths, 2 min).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from common import rate_for, tuner_cmd, tuner_env, tuner_run
from sqlalchemy import select

from tuner.measure.arrivals import poisson_schedule, summarize_open_loop
from tuner.measure.load import LoadGenerator, Workload
from tuner.policy import Policy
from tuner.storage.orm import Fit, Level, Run, Sample
from tuner.storage.store import Store
from tuner.storage.traffic_profiles import load as load_traffic
from tuner.twin import World, load_world, world_from_dict
from tuner.twin.truth import ClosedTruth, OpenLoopTruth, closed_truth, open_loop_truth

REPO = Path(__file__).resolve().parent.parent
TWIN = REPO / "profiles" / "twin"
SEED_SPEC = TWIN / "seed-twin.toml"
SEED_WORLD = TWIN / "seed-gfx1151.toml"
FLAP_WORLD = TWIN / "seed-flapping.toml"
PROMPT_TOKENS = 32  # the spec's and the truth's
OUTPUT_TOKENS = 128
CONCENTRATED = 0.7
TOLERANCE_TPS = 0.003  # part 1's target regret
TOLERANCE_TPOT = 0.02  # part 2's
GENERATING_TARGETS = (1.5, 4.0, 7.0)


# --- helpers ------------------------------------------------------------------------------------


def twin_binary(workdir: Path) -> Path:
    """The package's tuner-twin-server beside this interpreter, or a script that runs it."""
    beside = Path(sys.executable).with_name("tuner-twin-server")
    if beside.exists():
        return beside
    script = workdir / "tuner-twin-server"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tuner.twin.command "$@"\n')
    script.chmod(0o755)
    return script


def weights_text(weights: Mapping[int, float] | None) -> str:
    if weights is None:
        return "uniform"
    return ",".join(f"{c}={w:.3g}" for c, w in sorted(weights.items()))


def concentrated(level: int, n_parallel: int) -> dict[int, float]:
    """CONCENTRATED of the weight at one level, the rest spread evenly over the others."""
    rest = (1.0 - CONCENTRATED) / (n_parallel - 1)
    return {c: (CONCENTRATED if c == level else rest) for c in range(1, n_parallel + 1)}


def policy_of(n: int, truth_n_max: int) -> Policy:
    return Policy.of_max_slots(n, truth_n_max)


def label(n: int) -> str:
    return f"N={n}"


@dataclass
class Timed:
    stdout: str
    wall_s: float


def timed(env: dict[str, str], *args: str) -> Timed:
    began = time.perf_counter()
    out = tuner_run(env, *args).stdout
    return Timed(out, time.perf_counter() - began)


def virtual_seconds(db: str) -> dict[str, tuple[int, float]]:
    """Per run kind: rounds measured and their virtual seconds on the twin's clock (a round lasts
    as long as its longest request: latency_ms runs on the twin's clock)."""
    store = Store(db)
    try:
        with store.session() as session:
            rows = session.execute(
                select(Run.kind, Level.id, Sample.repeat, Sample.latency_ms)
                .join(Level, Level.run_id == Run.id)
                .join(Sample, Sample.level_id == Level.id)
            ).all()
    finally:
        store.dispose()
    rounds: dict[tuple[str, int, int], float] = {}
    for kind, level_id, repeat, latency in rows:
        key = (kind, level_id, repeat)
        rounds[key] = max(rounds.get(key, 0.0), (latency or 0.0) / 1000.0)
    out: dict[str, tuple[int, float]] = {}
    for (kind, _, _), seconds in rounds.items():
        n, total = out.get(kind, (0, 0.0))
        out[kind] = (n + 1, total + seconds)
    return out


def fit_weights(db: str) -> dict[str, float] | None:
    """The workload weights the newest fit was made with (None: uniform)."""
    store = Store(db)
    try:
        with store.session() as session:
            fit = session.scalars(select(Fit).order_by(Fit.id.desc())).first()
            return None if fit is None else fit.inputs.get("weights")
    finally:
        store.dispose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in head]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def shown(kept: list, title: str, head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A table as printed (table), kept for the run's results file."""
    from record import Table

    kept.append(Table(title, [str(h) for h in head], [list(r) for r in rows]))
    return table(head, rows)


def best_tpot(figures: Mapping[Policy, OpenLoopTruth]) -> Policy:
    """The truth's best drafting policy by mean TPOT (ties: the smaller N), as `tuner dev twin
    truth` picks it."""
    drafting = [p for p in figures if p.drafting]
    return min(drafting, key=lambda p: (figures[p].tpot_mean_ms, p.sort_key))


def best_throughput(figures: Mapping[Policy, OpenLoopTruth]) -> Policy:
    drafting = [p for p in figures if p.drafting]
    return min(drafting, key=lambda p: (-figures[p].tokens_per_second, p.sort_key))


def tpot_regret(figures: Mapping[Policy, OpenLoopTruth], chosen: Policy) -> float:
    best = figures[best_tpot(figures)].tpot_mean_ms
    return figures[chosen].tpot_mean_ms / best - 1.0


def rate_for_generating(
    world: World, policy: Policy, target: float, duration_s: float, seed: int
) -> float:
    """The Poisson rate at which open_loop_truth keeps `target` slots generating on average
    under policy (bisection; mean generating grows with the rate)."""

    def generating(rate: float) -> float:
        figures = open_loop_truth(
            world,
            rate,
            duration_s=duration_s,
            output_tokens=OUTPUT_TOKENS,
            prompt_tokens=PROMPT_TOKENS,
            seed=seed,
            candidates=[policy],
        )
        return figures[policy].mean_generating

    return rate_for(generating, target, 0.05, 12)


# --- part 1 -----------------------------------------------------------------------------------


@dataclass
class Tuned:
    weights: dict[int, float] | None
    db: str
    answer: int
    regret: float
    truth_best: Policy
    virtual: dict[str, tuple[int, float]]
    wall: dict[str, float]
    fit_weights: dict[str, float] | None
    tie: list[int]


def choose_level(truth: ClosedTruth) -> tuple[int, str, list[list[object]]]:
    """The level to concentrate on (see the module docstring) and why; the table behind it."""
    uniform = truth.best()
    runner = uniform.runner_up
    rows, moved = [], []
    for c in truth.concurrency:
        choice = truth.best(concentrated(c, truth.n_parallel))
        cost_runner = choice.regret(runner) if runner is not None else 0.0
        rows.append(
            [
                c,
                choice.best.label,
                f"{choice.value:.2f}",
                choice.runner_up.label if choice.runner_up else "-",
                f"{choice.margin_pct:.2f} %",
                f"{100 * choice.regret(uniform.best):.2f} %",
                f"{100 * cost_runner:.2f} %",
            ]
        )
        if choice.best != uniform.best:
            moved.append((choice.regret(uniform.best), c))
        rows[-1].append(cost_runner)
    if moved:
        level = max(moved)[1]
        why = f"70 % at {level} moves the best N off the uniform {uniform.best.label}"
    else:
        level = max(truth.concurrency, key=lambda c: rows[c - 1][-1])
        why = (
            f"no level moves the best N off {uniform.best.label} (it is best or tied at every "
            f"concurrency); 70 % at {level} makes the uniform runner-up "
            f"{runner.label if runner else '-'} cost most"
        )
    return level, why, [r[:-1] for r in rows]


def profile_and_tune(
    workdir: Path, name: str, binary: Path, speed: float, weights: dict[int, float] | None
) -> tuple[str, int, list[int], dict[str, float]]:
    folder = workdir / name
    folder.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{folder / 'tuner.db'}"
    env = tuner_env(db, folder / "cache")
    sets = [
        f"server.binary={binary}",
        f"server.model={SEED_WORLD}",
        f'server.args=["--kv-unified", "--speed", "{speed:g}"]',
    ]
    if weights is not None:
        inline = ", ".join(f"{c} = {w!r}" for c, w in sorted(weights.items()))
        sets.append(f"workload.weights={{{inline}}}")
    set_args = [x for s in sets for x in ("--set", s)]
    profiled = timed(env, "profile", str(SEED_SPEC), *set_args)
    tuned = timed(env, "tune", "--model", "twin-Qwen3.8-Flash-Next", "--format", "json")
    report = json.loads(tuned.stdout)
    return (
        db,
        int(report["standing"]),
        [int(n) for n in report.get("tie") or []],
        {"profile": profiled.wall_s, "tune": tuned.wall_s},
    )


def part1(workdir: Path, binary: Path, speed: float, kept: list) -> Tuned:
    print("\n== 1. the seed's gfx1151 twin over HTTP: profile + tune against the truth ==")
    world = load_world(SEED_WORLD)
    began = time.perf_counter()
    truth = closed_truth(world, output_tokens=OUTPUT_TOKENS, prompt_tokens=PROMPT_TOKENS)
    print(f"truth ({time.perf_counter() - began:.0f} s): closed levels of {OUTPUT_TOKENS} tokens")
    print(truth.table())
    level, why, rows = choose_level(truth)
    print("\n70 % of the weight at one level (30 % spread evenly over the others):")
    head = ["level", "best", "objective", "runner-up", "margin", "uniform best's regret"]
    title = "1. 70 % of the weight at one level (30 % spread evenly over the others)"
    print(shown(kept, title, [*head, "uniform runner-up's regret"], rows))
    print(f"chosen: {why}")
    results: list[Tuned] = []
    for name, weights in (("uniform", None), (f"at-{level}", concentrated(level, 8))):
        db, answer, tie, wall = profile_and_tune(workdir, name, binary, speed, weights)
        choice = truth.best(weights)
        results.append(
            Tuned(
                weights,
                db,
                answer,
                choice.regret(policy_of(answer, truth.n_max)),
                choice.best,
                virtual_seconds(db),
                wall,
                fit_weights(db),
                tie,
            )
        )
    rows = []
    for r in results:
        prof_n, prof_s = r.virtual.get("profile", (0, 0.0))
        tune_n, tune_s = r.virtual.get("tune", (0, 0.0))
        rows.append(
            [
                weights_text(r.weights),
                label(r.answer),
                "[" + ",".join(map(str, r.tie)) + "]",
                r.truth_best.label,
                f"{100 * r.regret:.2f} %",
                "yes" if r.regret <= TOLERANCE_TPS else "NO",
                f"{prof_s:.0f} s / {prof_n}",
                f"{tune_s:.0f} s / {tune_n}",
                f"{r.wall['profile']:.0f} + {r.wall['tune']:.0f} s",
                weights_text({int(k): v for k, v in r.fit_weights.items()})
                if r.fit_weights
                else "uniform",
            ]
        )
    print()
    head = ["weights", "tuned", "tie", "truth best", "regret", "<= 0.3 %"]
    head += ["profile virtual / rounds", "tune virtual / rounds", "wall", "fit's weights"]
    print(shown(kept, f"1. profile + tune over HTTP at speed {speed:g}", head, rows))
    print(
        f"(speed {speed:g}; virtual: measured rounds on the twin's clock, each its longest request)"
    )
    return results[0]


# --- part 2 -----------------------------------------------------------------------------------


class TwinServer:
    """`tuner-twin-server` started by hand with llama-server's command line."""

    def __init__(self, binary: Path, world: Path, n: int, speed: float, seed: int, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [str(binary), "-m", str(world), "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--parallel", "8", "--ctx-size", "32768"]
        command += ["--kv-unified", "--metrics", "--model-draft", "twin-mtp"]
        command += ["--spec-type", "draft-simple", "--spec-draft-max-slots", str(n)]
        command += ["--speed", f"{speed:g}", "--seed", str(seed)]
        self.log = log.open("w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"the twin server exited: see {log}")
            time.sleep(0.2)
        raise RuntimeError(f"the twin server did not come up: see {log}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


class Observer:
    """`tuner observe --url` as a user runs it, ended with SIGTERM (its Ctrl-C: it saves)."""

    def __init__(self, env: dict[str, str], url: str, name: str, folder: Path) -> None:
        self.err_path = folder / f"observe-{name}.err"
        self.out = (folder / f"observe-{name}.out").open("w")
        self.err = self.err_path.open("w")
        args = ["observe", "--url", url, "--duration", "1h", "--name", name]
        self.process = subprocess.Popen(tuner_cmd(*args), env=env, stdout=self.out, stderr=self.err)
        deadline = time.monotonic() + 120
        while "observing" not in self.err_path.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tuner observe did not start: {self.err_path.read_text()}")
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)
        self.out.close()
        self.err.close()
        if self.process.returncode != 0:
            raise RuntimeError(f"tuner observe failed: {self.err_path.read_text()[-2000:]}")


def recommend(env: dict[str, str], *args: str) -> int:
    out = tuner_run(
        env, "recommend", "--model", "twin-Qwen3.8-Flash-Next", *args, "--format", "json", "--quiet"
    ).stdout
    return int(json.loads(out)["max_slots"])


def part2(
    workdir: Path,
    binary: Path,
    standing: Tuned,
    speed: float,
    window: float,
    seed: int,
    kept: list,
) -> None:
    print("\n== 2. open loop on the seed twin: observe, then recommend --traffic ==")
    world = load_world(SEED_WORLD)
    n = standing.answer
    policy = policy_of(n, world.n_max)
    env = tuner_env(standing.db, workdir / "open-cache")
    folder = workdir / "open"
    folder.mkdir(exist_ok=True)
    rows, truth_rows = [], []
    for i, target in enumerate(GENERATING_TARGETS):
        rate = rate_for_generating(world, policy, target, 3600.0, seed)
        truth = open_loop_truth(
            world, rate, output_tokens=OUTPUT_TOKENS, prompt_tokens=PROMPT_TOKENS, seed=seed
        )
        for p, f in truth.items():
            truth_rows.append(
                [
                    f"{rate:.4f}",
                    p.label,
                    f"{f.tokens_per_second:.2f}",
                    f"{f.tpot_mean_ms:.2f}",
                    f"{f.tpot_ms[1]:.1f}",
                    f"{f.ttft_ms[1]:.0f}",
                    f"{f.mean_generating:.2f}",
                ]
            )
        name = f"seed-open-{i}"
        server = TwinServer(binary, SEED_WORLD, n, speed, seed + i, folder / f"twin-{i}.log")
        observer: Observer | None = None
        try:
            observer = Observer(env, server.url, name, folder)
            began = time.perf_counter()
            generator = LoadGenerator(
                server.url, Workload(prompt_tokens=PROMPT_TOKENS, max_tokens=OUTPUT_TOKENS)
            )
            schedule = poisson_schedule(rate, window, seed + i)
            _, samples = generator.run_arrivals(schedule.offsets, round_key=1000 + i)
            time.sleep(1.0)  # observe's last polls see the last request end
            observer.stop()
            wall = time.perf_counter() - began
        finally:
            if observer is not None and observer.process.poll() is None:
                observer.process.kill()  # only when something above failed
                observer.process.wait()
            server.stop()
        served = summarize_open_loop(samples, rate)
        arrivals = sorted(s.start for s in samples)
        realised = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0]) if len(arrivals) > 1 else 0.0
        store = Store(standing.db)
        try:
            seen = load_traffic(store, name)
        finally:
            store.dispose()
        observed_rate = seen.arrival_rate or 0.0
        tpot = recommend(env, "--traffic", name, "--objective", "tpot")
        tps = recommend(env, "--traffic", name, "--objective", "tps")
        best = best_tpot(truth)
        best_tps = best_throughput(truth)
        regret = tpot_regret(truth, policy_of(tpot, world.n_max))
        tps_answer = truth[policy_of(tps, world.n_max)].tokens_per_second
        tps_regret = 1.0 - tps_answer / truth[best_tps].tokens_per_second
        rows.append(
            [
                target,
                f"{rate:.4f}",
                f"{truth[policy].mean_generating:.2f}",
                f"{served.mean_generating:.2f}",
                f"{seen.mean_generating():.2f}",
                f"{realised:.3f}",
                f"{observed_rate:.3f}",
                f"{seen.mean_output_tokens or 0:.0f}",
                best.label,
                f"{label(tpot)} {100 * regret:+.2f} %"
                + ("" if regret <= TOLERANCE_TPOT else " (over 2 %)"),
                best_tps.label,
                f"{label(tps)} {100 * tps_regret:+.2f} % "
                f"(tpot {100 * tpot_regret(truth, policy_of(tps, world.n_max)):+.2f} %)",
                f"{wall:.0f} s",
            ]
        )
    print(f"standing N={n} (part 1, uniform); open_loop_truth: 3600 virtual s per rate; served:")
    print(f"{window:g} virtual s of arrivals per rate at --speed {speed:g}\n")
    print("open_loop_truth per policy (noise-free):")
    head = ["rate", "policy", "tok/s", "mean TPOT ms", "p95 TPOT", "p95 TTFT", "gen"]
    print(shown(kept, "2. open_loop_truth per policy (noise-free)", head, truth_rows))
    print()
    head = ["target gen", "rate", "truth gen", "served gen", "observed gen", "realised rate"]
    head += ["observed rate", "mean out", "truth best tpot"]
    head += ["tpot: N, regret"]
    head += ["truth best tps", "tps: N, tps regret", "wall"]
    title = f"2. open loop under N={n}: observe, then recommend --traffic"
    print(shown(kept, title, head, rows))


# --- part 3 -----------------------------------------------------------------------------------


def part3(workdir: Path, binary: Path, speed: float, seed: int, kept: list) -> None:
    print("\n== 3. flapping: a drafter that catches up on resume (seed-flapping) ==")
    world = load_world(FLAP_WORLD)
    data = world.model_dump()
    data["draft"]["catch_up_ms_per_token"] = 0.0
    data["name"] = world.name + "-no-catch-up"
    blind = world_from_dict(data)
    closed = closed_truth(world, output_tokens=OUTPUT_TOKENS, prompt_tokens=PROMPT_TOKENS)
    closed_best = closed.best()
    print(f"closed levels: best {closed_best.best.label} (catch-up never paid in a closed level)")
    n_closed = closed_best.best.max_slots or world.n_parallel
    # Rates that keep the closed-loop best N's generating count around it: crossing it often.
    targets = (n_closed - 0.5, n_closed + 1.0, world.n_parallel - 1.5)
    rates = [rate_for_generating(world, closed_best.best, t, 3600.0, seed) for t in targets]
    folder = workdir / "flapping"
    folder.mkdir(exist_ok=True)
    db = f"sqlite:///{folder / 'tuner.db'}"
    env = tuner_env(db, folder / "cache")
    model = world.model_name
    sets = [
        f"server.binary={binary}",
        f"server.model={FLAP_WORLD}",
        f'server.args=["--kv-unified", "--speed", "{speed:g}"]',
        f"model_name={model}",
        "name=seed-flapping-twin",
    ]
    profiled = timed(env, "profile", str(SEED_SPEC), *[x for s in sets for x in ("--set", s)])
    summary = []
    for rate in rates:
        truth = open_loop_truth(
            world, rate, output_tokens=OUTPUT_TOKENS, prompt_tokens=PROMPT_TOKENS, seed=seed
        )
        seen = open_loop_truth(
            blind, rate, output_tokens=OUTPUT_TOKENS, prompt_tokens=PROMPT_TOKENS, seed=seed
        )
        rows = []
        for p, f in truth.items():
            g = seen[p]
            rows.append(
                [
                    p.label,
                    f"{f.tokens_per_second:.2f}",
                    f"{g.tokens_per_second:.2f}",
                    f"{f.tpot_mean_ms:.2f}",
                    f"{g.tpot_mean_ms:.2f}",
                    f"{100 * (f.tpot_mean_ms / g.tpot_mean_ms - 1):+.1f} %",
                    f"{f.mean_generating:.2f}",
                ]
            )
        print(f"\nrate {rate:.4f}/s ({OUTPUT_TOKENS} tokens each), 3600 virtual s:")
        head = ["policy", "tok/s", "tok/s no catch-up", "mean TPOT ms", "no catch-up"]
        title = f"3. flapping at rate {rate:.4f}/s, 3600 virtual s"
        print(shown(kept, title, [*head, "flapping cost", "gen"], rows))
        best = best_tpot(truth)
        middle = [Policy.threshold(k, world.n_max) for k in range(2, world.n_parallel)]
        ends = (Policy.always(world.n_max), Policy.threshold(1, world.n_max))
        losers = [
            p.label
            for p in middle
            if all(truth[p].tpot_mean_ms > truth[e].tpot_mean_ms for e in ends)
        ]
        started = time.perf_counter()
        out = tuner_run(
            env,
            "recommend",
            "--model",
            model,
            "--objective",
            "tpot",
            "--rate",
            f"{rate:.5f}",
            "--output-tokens",
            str(OUTPUT_TOKENS),
            "--format",
            "json",
            "--quiet",
        ).stdout
        answer = int(json.loads(out)["max_slots"])
        summary.append(
            [
                f"{rate:.4f}",
                f"{truth[closed_best.best].mean_generating:.2f}",
                closed_best.best.label,
                best.label,
                best_tpot(seen).label,
                ",".join(losers) or "none",
                label(answer),
                f"{100 * tpot_regret(truth, policy_of(answer, world.n_max)):+.2f} %",
                f"{100 * tpot_regret(seen, policy_of(answer, world.n_max)):+.2f} %",
                f"{time.perf_counter() - started:.0f} s",
            ]
        )
    print()
    head = ["rate", "gen under closed best", "closed best", "open-loop best tpot"]
    head += ["best without catch-up", "N losing to both N=0 and N=1", "recommend tpot"]
    head += ["regret (mean TPOT)", "regret without catch-up", "wall"]
    print(shown(kept, "3. flapping: recommend --objective tpot --rate", head, summary))
    print(f"(profile of the flapping twin at speed {speed:g}: {profiled.wall_s:.0f} s wall)")


def main() -> int:
    from record import record_arguments, save_run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="1,2,3", help="which parts, e.g. 1,2")
    parser.add_argument("--speed", type=float, default=20.0, help="twin speed of profile/tune")
    parser.add_argument("--open-speed", type=float, default=8.0, help="twin speed of part 2")
    parser.add_argument("--window", type=float, default=600.0, help="part 2: virtual s per rate")
    parser.add_argument("--workdir", type=Path, default=None, help="keep databases and logs here")
    parser.add_argument("--seed", type=int, default=0)
    record_arguments(parser)
    args = parser.parse_args()
    parts = {int(p) for p in args.parts.split(",")}
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="twin-serve-"))
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(REPO)
    binary = twin_binary(workdir)
    began = time.perf_counter()
    print(f"twin_serve: workdir {workdir}, load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    standing: Tuned | None = None
    tables: list = []
    if parts & {1, 2}:
        standing = part1(workdir, binary, args.speed, tables)
    if 2 in parts and standing is not None:
        part2(workdir, binary, standing, args.open_speed, args.window, args.seed, tables)
    if 3 in parts:
        part3(workdir, binary, args.speed, args.seed, tables)
    wall = time.perf_counter() - began
    print(f"\ntotal {wall:.0f} s wall")
    summary = {"parts": sorted(parts), "speed": args.speed, "wall s": wall}
    if standing is not None:
        summary["part 1: tuned N (uniform)"] = standing.answer
        summary["part 1: regret % (target at most 0.3)"] = 100 * standing.regret
    save_run(__file__, args, summary, tables)
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
