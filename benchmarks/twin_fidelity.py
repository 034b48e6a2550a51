"""Twin fidelity against the real bench, closed and open loop (issue 25, item 5).

A twin calibrated from a bench profile, held against bench measurements it never saw:

1. The profile: `tuner profile SPEC --budget 0` (plain, always draft and, on the live switch, the
   off arm at 1, 2, 4, 8 streams; no adaptive levels, so the closed levels below stay out of it)
   into a fresh database, or the newest completed profile run of `--db` (or `--run`). The
   "profile twin" is calibrated from that run by the code `tuner dev twin calibrate --run` runs
   (tuner.twin.from_run: plain and always-draft levels fitted, the threshold server's overhead
   over plain from the off arms). From
   it come the policy served open loop (the profile's recommended N, `recommend`'s standing
   answer after the profile, or `--policy N`) and the arrival rates (`--rates`, default: the
   rates at which this twin keeps about 1.5, 4 and 7 slots generating under the policy; the
   cost model's queue rates printed beside them).
2. The bench, in turns on the same launches (`measure_together`): a closed pass, then one open
   window at each rate, again, into a database of the benchmark's own.
   - A closed pass (tuner.measure.profiler.Profiler.run_pass), a round per policy per level: at
     the held-out levels (`--levels-closed`, default 3,5,6,7) plain, always draft and, on the
     live switch, the threshold that does not draft there (c-1); at the profile's levels plain
     and always draft again: the calibration levels, measured in the same drift of the machine
     as everything the twin is held against. A held-out level closes when every policy's 95 %
     t-interval of the mean tok/s (the tuner's estimand: aggregate tok/s while all c streams
     generate) is within `--target` of its mean, or at `--max-rounds` rounds; the calibration
     levels (with their off arms, which give the threshold server's overhead over plain) are
     measured while a held-out level is.
   - An open window: `--window` seconds of Poisson arrivals conditioned on their count (the
     arrivals `tuner validate --arrivals poisson` sends, tuner.measure.arrivals.poisson_offsets)
     served by the policy (tuner.measure.backend.ServerBackend.arrivals), the rates in turn
     (forward, then backward), each until the 95 % t-intervals of its throughput and mean time
     per output token are within `--target`, or `--max-rounds` windows. Per window: throughput
     (output tokens / span, summarize_open_loop) and mean TPOT over tokens (sum of generation
     times / sum of tokens after the first: the tpot objective's E[c] / E[tps]).
   The "same-drift twin" is then calibrated by the same code from the calibration levels of
   these passes (the mean of their rounds, the estimator the held-out figures are compared on;
   acceptance and time to first token from the same rounds; the profile's llama-batched-bench
   rows). It is never adjusted to a held-out figure. This is the twin that is judged: a profile
   measured minutes before the held-out figures is held against the machine's drift as much as
   against the twin (the last run without the turns saw plain at 7 streams move 25 % in six
   minutes, the profile at the slow end).
3. Closed levels held out: each twin's noise-free truth (tuner.twin.truth.closed_truth, the
   run's prompt and output lengths) against the bench's interval.
4. Open loop: each twin's figure is the mean of the same per-window figures over many seeded
   windows of the same length, rate, prompt and output lengths, noise-free, until its standard
   error is 0.5 % of it (a tenth of the bench interval it is held against).
5. The open-loop gap: per rate, against the closed-level tok/s at the mean generating slots m
   (interpolated between levels; the cost model's fit, the bench's measured levels and the twin's
   truth), what open loop delivered, on the bench and in the twin, split in two factors: the
   occupancy spread (the closed levels weighted by the time spent at each number of generating
   slots, idle included, against the closed level at their mean: what a concave curve loses to
   a spread) and the rest (what the server delivered against that mixture: prefill of arriving
   prompts batched into decode steps, slots joining and leaving mid-draft, client overhead). A
   closed level cannot see prompt rows (every prompt is evaluated before the window opens); the
   calibrated twins price them from their levels' time to first token (the slope of the levels'
   median TTFT over their c x P prompt rows: tuner.twin.from_run). A third twin prices them from
   the same-drift twin's step table instead (its rows_ms, which follows llama-batched-bench's
   rows beyond the plain levels): a cross-check of that price, not the judged prediction.

    .venv/bin/python benchmarks/twin_fidelity.py [--levels-closed 3,5,6,7] [--rates R1,R2,R3]
        [--policy N] [--window 60] [--max-rounds 20] [--target 0.06] [--quick] [--keep DIR]
        [--db URL [--run RUN]] [--seed 0] [--spec SPEC] [--stand-in WORLD]

On this 2-core VM a turn is a closed pass (about 3 s a round, 17 rounds with three held-out
levels) and three windows (the window and a few seconds of drain each): about 2.5 minutes with
30 s windows, so `--max-rounds 12` is at most about 30 minutes; the profile 2-3 min, the twins'
side 2-4 min.

`--quick` is a smoke run (one profile round per level and no llama-batched-bench rows, closed
levels 3 and 6, at most two rounds and two 10 s windows per cell; about 3 minutes): its
intervals do not meet the target and it says so. `--stand-in WORLD` measures a twin world
in-process (virtual time, a minute of wall) instead of the bench: the benchmark's own check, with
that world's noise-free truth beside every interval. `--spec profiles/twin/bench-twin.toml` runs
it over HTTP against `tuner-twin-server` instead of llama-server.
"""

from __future__ import annotations

import argparse
import math
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from common import rate_for, tuner, tuner_env
from lab.method import HOST, twin_spec
from scipy import stats

from tuner.bench import load_bench
from tuner.decide.adaptive import profile_adaptively
from tuner.decide.advice import standing
from tuner.measure.arrivals import poisson_offsets, summarize_open_loop
from tuner.measure.backend import Backend, ServerBackend
from tuner.measure.fingerprint import probe_host
from tuner.measure.load import RequestSample
from tuner.measure.plan import Observer, ProgressEvent
from tuner.measure.profiler import Profiler, gather_context
from tuner.measure.readings import generating_histogram
from tuner.measure.recorder import Context
from tuner.measure.spec import ProfileSpec, load_spec
from tuner.model import queue
from tuner.policy import Policy
from tuner.settings import Settings
from tuner.storage.fits import StoredFit, current_fit
from tuner.storage.queries import list_runs
from tuner.storage.store import Store
from tuner.twin.calibrate import Calibration
from tuner.twin.engine import Workload, simulate
from tuner.twin.from_run import RunData, calibrate_run, run_levels
from tuner.twin.inprocess import TwinBackend
from tuner.twin.tables import Curve
from tuner.twin.truth import ClosedTruth, closed_truth
from tuner.twin.world import World, load_world, world_to_toml

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "profiles" / "bench-smollm2-cpu.toml"
TARGETS = (1.5, 4.0, 7.0)  # mean generating slots the default rates aim at
JUDGE_SEED = 1000  # the fidelity rounds' workload seed: not the profile's
TWIN_REL_SE = 0.005  # the twin's open-loop figures: standard error at most this share
RATE_WINDOW_S = 300.0  # the rate search: windows this long ...
RATE_DRAWS = 8  # ... this many of them, the same draws at every rate tried


@dataclass(frozen=True)
class Work:
    """What every request of the profile sends: prompt and output lengths."""

    prompt_tokens: int
    output_tokens: int


# --- statistics --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """The mean of repeated measurements and its two-sided 95 % t-interval."""

    n: int
    mean: float
    half: float  # half-width; inf below two values

    @classmethod
    def of(cls, values: Sequence[float]) -> Interval:
        n = len(values)
        if n == 0:
            return cls(0, math.nan, math.inf)
        mean = statistics.fmean(values)
        if n < 2:
            return cls(n, mean, math.inf)
        sem = statistics.stdev(values) / math.sqrt(n)
        return cls(n, mean, float(stats.t.ppf(0.975, n - 1)) * sem)

    @property
    def rel(self) -> float:
        return self.half / abs(self.mean) if self.mean else math.inf

    def holds(self, value: float) -> bool:
        return self.mean - self.half <= value <= self.mean + self.half

    def text(self, digits: int = 1) -> str:
        if self.n < 2:
            return f"{self.mean:.{digits}f} [n={self.n}]"
        lo, hi = self.mean - self.half, self.mean + self.half
        return f"{self.mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def met(iv: Interval, target: float, least: int) -> bool:
    """Whether a cell may stop: enough values and the interval within target of the mean."""
    return iv.n >= least and iv.rel <= target


# --- open-loop figures of one window -----------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """One window of arrivals as served: the per-window figures both sides average."""

    tps: float  # output tokens of completed requests / span
    tpot_ms: float  # mean over tokens: sum of generation times / sum of tokens after the first
    generating: float  # time-averaged slots generating over the span
    ttft_ms: float  # mean time to first token (queueing for a slot and prefill)
    prompt_tokens: float  # mean prompt tokens the server evaluated a request (prompt_n)
    span_s: float
    tokens: int
    seconds_at: dict[int, float]  # seconds spent at each number of generating slots
    failed: int


def window_of(samples: Sequence[RequestSample], rate: float) -> Window:
    """The window's figures from its samples (the bench's or the twin's, on their own clock)."""
    figures = summarize_open_loop(list(samples), rate)
    good = [s for s in samples if s.ok and s.token_times]
    long = [s for s in good if len(s.token_times) >= 2]
    gen = sum(s.token_times[-1] - s.token_times[0] for s in long)
    steps = sum(len(s.token_times) - 1 for s in long)
    begin = min(s.start for s in samples)
    end = max((s.token_times[-1] for s in good), default=begin)
    hist = generating_histogram([(s.token_times[0], s.token_times[-1]) for s in good], begin, end)
    ttft = [s.ttft_ms for s in good if s.ttft_ms is not None]
    return Window(
        tps=figures.tokens_per_second,
        tpot_ms=1000.0 * gen / steps if steps else math.nan,
        generating=figures.mean_generating,
        ttft_ms=statistics.fmean(ttft) if ttft else math.nan,
        prompt_tokens=statistics.fmean(s.prompt_tokens for s in good) if good else math.nan,
        span_s=figures.span_s,
        tokens=sum(s.tokens for s in good),
        seconds_at=hist,
        failed=figures.failed,
    )


@dataclass(frozen=True)
class Pooled:
    """Windows pooled by time: what the gap's decomposition weighs (tokens and seconds summed)."""

    tps: float
    generating: float
    shares: dict[int, float]  # share of the span at each number of generating slots
    ttft_ms: float
    prompt_tokens: float

    @classmethod
    def of(cls, windows: Sequence[Window]) -> Pooled:
        span = sum(w.span_s for w in windows)
        seconds: dict[int, float] = {}
        for w in windows:
            for k, s in w.seconds_at.items():
                seconds[k] = seconds.get(k, 0.0) + s
        shares = {k: s / span for k, s in sorted(seconds.items())}
        return cls(
            tps=sum(w.tokens for w in windows) / span,
            generating=sum(k * s for k, s in shares.items()),
            shares=shares,
            ttft_ms=statistics.fmean(w.ttft_ms for w in windows),
            prompt_tokens=statistics.fmean(w.prompt_tokens for w in windows),
        )


# --- the twin's side ---------------------------------------------------------------------------


@dataclass
class TwinOpen:
    """The twin's noise-free open-loop figures at one rate: means over seeded windows."""

    windows: list[Window] = field(default_factory=list)

    def mean(self, what: Callable[[Window], float]) -> float:
        return statistics.fmean(what(w) for w in self.windows)

    def rel_se(self, what: Callable[[Window], float]) -> float:
        values = [what(w) for w in self.windows]
        if len(values) < 2:
            return math.inf
        return statistics.stdev(values) / math.sqrt(len(values)) / abs(statistics.fmean(values))

    @property
    def pooled(self) -> Pooled:
        return Pooled.of(self.windows)


def twin_window(
    world: World, policy: Policy, rate: float, window_s: float, work: Work, draw: int
) -> Window:
    """One seeded window of Poisson arrivals (conditioned on their count) on a fresh twin."""
    offsets = poisson_offsets(rate, window_s, draw)
    load = Workload.open_loop(offsets, work.output_tokens, work.prompt_tokens, seed=draw)
    result = simulate(world, policy, load, seed=draw, noise=False)
    return window_of(result.samples(), rate)


def twin_open(
    world: World,
    policy: Policy,
    rate: float,
    window_s: float,
    work: Work,
    rel_se: float = TWIN_REL_SE,
    least: int = 32,
    most: int = 4000,
) -> TwinOpen:
    """Windows of the bench's length, seeded apart from the bench's draws, until the standard
    error of the mean throughput and mean TPOT is rel_se of them (or `most` windows)."""
    out = TwinOpen()
    draw = 500_000
    while len(out.windows) < most:
        for _ in range(16):
            out.windows.append(twin_window(world, policy, rate, window_s, work, draw))
            draw += 1
        if len(out.windows) >= least and all(
            out.rel_se(f) <= rel_se for f in (lambda w: w.tps, lambda w: w.tpot_ms)
        ):
            break
    return out


def twin_rate_for(world: World, policy: Policy, target: float, work: Work) -> float:
    """The Poisson rate at which the twin keeps `target` slots generating on average under the
    policy (bisection over long windows, the same draws at every rate tried)."""

    def generating(rate: float) -> float:
        windows = [
            twin_window(world, policy, rate, RATE_WINDOW_S, work, 900_000 + d)
            for d in range(RATE_DRAWS)
        ]
        return Pooled.of(windows).generating

    return rate_for(generating, target, 0.1, 14)


def with_prefill_priced(cal: Calibration, prompt_tokens: int) -> tuple[World, float]:
    """The calibrated world with prompt rows priced from its own step table: the mean over
    c = 1..n_parallel of (rows_ms(c + P) - rows_ms(c)) / P, P the prompt length (what P prompt
    rows add to a decode step of c rows); the draft's share as its re-evaluation's. Only for the
    cross-check: the calibrated twin prices prefill from the profile's time to first token."""
    world = cal.world
    rows = Curve(world.step.rows_ms)
    np_ = world.n_parallel
    per_token = statistics.fmean(
        (rows(float(c + prompt_tokens)) - rows(float(c))) / prompt_tokens for c in range(1, np_ + 1)
    )
    data = world.model_dump()
    data["name"] = world.name + "-prefill"
    data["prefill"] = {
        "ms_per_token": per_token,
        "draft_ms_per_token": cal.reeval_share * per_token,
    }
    return World.model_validate(data), per_token


# --- the bench's side --------------------------------------------------------------------------


Closed = dict[tuple[Policy, int], list[float]]  # (policy, c) -> tok/s per round


def open_rates(windows: list[list[Window]], target: float, least: int, most: int) -> list[int]:
    """The rates whose throughput and mean TPOT do not meet the target yet (nor the cap)."""
    return [
        k
        for k, ws in enumerate(windows)
        if len(ws) < most
        and not (
            met(Interval.of([w.tps for w in ws]), target, least)
            and met(Interval.of([w.tpot_ms for w in ws]), target, least)
        )
    ]


@dataclass
class Measured:
    """What the bench served: closed rounds (calibration and held-out levels), open windows."""

    closed: Closed
    windows: list[list[Window]]
    profiler: Profiler
    seconds: float


def measure_together(
    f: Fidelity,
    held: list[int],
    calib: list[int],
    rates: list[float],
    backend: Backend,
) -> Measured:
    """Closed passes and open windows taking turns on the same launches, so that every figure
    the twin is held against, and the calibration levels it is fitted to, are measured in the
    same drift of the machine.

    A closed pass (Profiler.run_pass): plain on its launch; always draft and, on the live
    switch, the off arm (c-1) on the drafting launch, at the held-out levels and at the
    calibration levels (the profile's). After each pass one window at each open
    rate (forward, then backward). A held-out level closes when each of its policies meets the
    target or the cap; the calibration levels are measured as long as a held-out level is.
    A rate closes when its throughput and mean TPOT meet the target or the cap. Window w at rate
    k: arrivals drawn from (seed, k, w), request seeds from its own round key."""
    setup, args, say = f.setup, f.args, f.say
    profiler = Profiler(setup.fidelity, setup.spec, f.work / "logs", progress(say), backend=backend)
    context = (
        Context(setup.spec.model_name, None, None, probe_host(None, setup.host))
        if setup.stand_in
        else gather_context(setup.spec, None)
    )
    profiler.create_run(context, kind="sweep")
    policies = [Policy.plain(), Policy.always(f.n_max)]
    # The switch is checked first (as Profiler.execute does): the off arm joins the drafting
    # launch only where the live switch works.
    check = getattr(backend, "check_switch", None)
    if check is not None:
        profiler.recorder.set_way(check(policies))
    depth = profiler.depth
    arms = profiler.arms(policies, [(depth, c) for c in sorted({*held, *calib})])
    open_cells = {cell: list(ps) for cell, ps in sorted(arms.items())}
    workload = profiler.request_workload()
    closed: Closed = {}
    windows: list[list[Window]] = [[] for _ in rates]
    began = time.monotonic()
    turn = 0
    while True:
        if not any(c in held for _, c in open_cells):
            open_cells = {}  # calibration levels only beside held-out ones
        rates_open = open_rates(windows, args.target, f.least, f.most)
        if not open_cells and not rates_open:
            break
        if open_cells:
            p = profiler.run_pass(open_cells)
            reps = {
                (config, c): rs
                for (config, d, c), rs in profiler.repeats_by_cell().items()
                if d == depth
            }
            for (_, c), ps in list(open_cells.items()):
                rounds = []
                for policy in ps:
                    rows = reps.get((profiler.level_name(policy), c), [])
                    rounds.append(len(rows))  # the cap counts rounds, with a figure or not
                    closed[(policy, c)] = [
                        float(r["tokens_per_second"]) for r in rows if r.get("tokens_per_second")
                    ]
                ivs = [Interval.of(closed[(policy, c)]) for policy in ps]
                if min(rounds) >= f.most or (
                    c in held and all(met(iv, args.target, f.least) for iv in ivs)
                ):
                    del open_cells[(depth, c)]
            say(
                f"  closed pass {p}: {time.monotonic() - began:.0f} s; held-out levels open: "
                + (",".join(str(c) for _, c in open_cells if c in held) or "none")
            )
        for k in rates_open if turn % 2 == 0 else rates_open[::-1]:
            w = len(windows[k])
            offsets = poisson_offsets(rates[k], f.window_s, args.seed * 100_000 + k * 1000 + w)
            key = 50_000 + k * 1000 + w
            served = backend.arrivals(f.policy, offsets, key, None, workload)
            got = window_of(served.samples, rates[k])
            if got.failed:
                first = next(s.error for s in served.samples if not s.ok)
                raise SystemExit(f"{got.failed} requests failed at {rates[k]:g}/s: {first}")
            windows[k].append(got)
            say(
                f"  {time.monotonic() - began:6.0f} s  rate {rates[k]:.4f}/s window {w + 1}: "
                f"{got.tps:.1f} tok/s, mean TPOT {got.tpot_ms:.1f} ms, "
                f"{got.generating:.2f} generating"
            )
        turn += 1
    profiler.close_open_levels()
    return Measured(closed, windows, profiler, time.monotonic() - began)


def same_drift_data(f: Fidelity, measured: Measured, profile: RunData, calib: list[int]) -> RunData:
    """The calibration levels as measured beside the held-out ones: the fidelity run's plain,
    always-draft and off-arm levels at the profile's concurrencies, each at the mean of its
    rounds (the estimator the held-out figures are compared on), with the profile's
    llama-batched-bench rows (a kernel table, not a level)."""
    run = run_levels(f.setup.fidelity, measured.profiler.run_id)
    keep = []
    for lv in run.levels:
        c = lv.concurrency
        off = lv.policy.is_threshold and not lv.policy.drafts_at(c)
        if c not in calib or not (lv.policy.is_plain or lv.policy.is_always or off):
            continue
        p = Policy.plain() if lv.policy.is_plain else lv.policy.with_n_max(f.n_max)
        values = measured.closed.get((p, lv.concurrency))
        mean = statistics.fmean(values) if values else lv.tokens_per_second
        keep.append(replace(lv, tokens_per_second=mean))
    return replace(run, levels=tuple(keep), kernel=profile.kernel)


# --- curves for the gap ------------------------------------------------------------------------


def curve_at(curve: Mapping[int, float], m: float) -> float:
    """A closed-level curve (c -> tok/s, 0 at 0) at a mean number of generating slots, linear
    between levels."""
    xs = sorted(curve)
    return float(np.interp(m, xs, [curve[c] for c in xs]))


def mixture(curve: Mapping[int, float], shares: Mapping[int, float]) -> float:
    """The closed levels weighted by the time spent at each number of generating slots."""
    top = max(curve)
    return sum(share * curve[min(k, top)] for k, share in shares.items())


def policy_curve(
    values: Callable[[Policy, int], float | None], policy: Policy, np_: int, n_max: int
) -> tuple[dict[int, float], list[int], list[int]]:
    """tok/s under the policy at c = 0..np_: always draft where it drafts, the threshold that
    does not draft there (c-1) above. Where that level has no off arm, plain stands in; where
    nothing was measured at c, the neighbours are interpolated (both lists of levels returned)."""
    known, plain_for_off, missing = {0: 0.0}, [], []
    for c in range(1, np_ + 1):
        if policy.drafts_at(c):
            v = values(Policy.always(n_max), c)
        else:
            v = values(Policy.threshold(c - 1, n_max), c)
            if v is None and values(Policy.plain(), c) is not None:
                v = values(Policy.plain(), c)
                plain_for_off.append(c)
        if v is None:
            missing.append(c)
        else:
            known[c] = v
    xs = sorted(known)
    curve = {c: float(np.interp(c, xs, [known[x] for x in xs])) for c in range(np_ + 1)}
    return curve, plain_for_off, missing


# --- printing ----------------------------------------------------------------------------------


def progress(say: Callable[[str], None]) -> Observer:
    """The profiler's and the server backend's events as one line each: launches, the live
    switch's check, every round's tok/s (a long run shows where it is)."""

    def observe(event: ProgressEvent) -> None:
        if event.kind == "repeat" and event.figures is not None:
            tps = event.figures.tokens_per_second
            say(f"    {event.config} at {event.concurrency}: {tps or 0:.1f} tok/s")
        elif event.kind in ("message", "server") and event.text:
            say(f"    {event.text}")

    return observe


def table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def beside(iv: Interval, truth: float, digits: int) -> str:
    """A stand-in's truth and whether the interval measured on it covers it."""
    return f"{truth:.{digits}f} ({'in' if iv.holds(truth) else 'OUT'})"


def verdict(iv: Interval, twin: float, target: float) -> str:
    inside = "yes" if iv.holds(twin) else "NO"
    return inside + ("" if iv.rel <= target else " (wide)")


# --- the run -----------------------------------------------------------------------------------


@dataclass
class Setup:
    """Where the measurements come from: the bench (or a stand-in twin), its profile run."""

    spec: ProfileSpec
    store: Store
    run_id: int
    model: str
    host: str
    fidelity: Store  # the benchmark's own rounds: never pooled with the profile
    backend: Callable[[int, Observer], Backend]  # a fresh one for the fidelity rounds (seeded)
    stand_in: World | None = None


def bench_setup(args: argparse.Namespace, work: Path, say: Callable[[str], None]) -> Setup:
    refs = load_bench(Settings().bench_manifest_path).as_refs
    spec = load_spec(Path(args.spec), [], refs)
    db = args.db or f"sqlite:///{work / 'tuner.db'}"
    if not args.db:
        # quick: one round a level and no llama-batched-bench rows (the step table beyond the
        # plain levels then follows its last segment, and so does the prefill priced from it)
        sets = ["workload.min_repeats=1", "workload.max_repeats=1", "kernel.enabled=false"]
        quick = [x for s in sets for x in ("--set", s)] if args.quick else []
        started = time.monotonic()
        tuner(tuner_env(db, work / "cache"), "profile", str(args.spec), "--budget", "0", *quick)
        took = time.monotonic() - started
        say(f"profile (tuner profile --budget 0 {' '.join(quick)}): {took:.0f} s")
    store = Store(db)
    run_id = args.run
    if run_id is None:
        done = [
            r
            for r in list_runs(store, spec.model_name, 200)
            if r.kind == "profile" and r.status == "completed"
        ]
        if not done:
            raise SystemExit(f"no completed profile run of {spec.model_name} in {db}")
        run_id = done[0].id
    fidelity_spec = load_spec(Path(args.spec), [("workload.seed", JUDGE_SEED + args.seed)], refs)

    def backend(seed: int, observer: Observer) -> Backend:
        return ServerBackend(fidelity_spec, work / "logs", observer, switch="auto")

    return Setup(
        spec=fidelity_spec,
        store=store,
        run_id=run_id,
        model=spec.model_name,
        host=socket.gethostname(),
        fidelity=Store(f"sqlite:///{work / 'fidelity.db'}"),
        backend=backend,
    )


def stand_in_setup(args: argparse.Namespace, work: Path, say: Callable[[str], None]) -> Setup:
    """A twin world measured in-process in the bench's place (its own noise), profiled as
    `tuner profile --budget 0` profiles (tuner.decide.adaptive over the twin's backend)."""
    world = load_world(args.stand_in)
    spec = twin_spec(world, levels=(1, 2, 4, 8), max_tokens=64, seed=0)
    if args.quick:
        spec = spec.model_copy(
            update={
                "workload": spec.workload.model_copy(update={"min_repeats": 1, "max_repeats": 1})
            }
        )
    store = Store(args.db or f"sqlite:///{work / 'tuner.db'}")
    run_id = args.run
    if run_id is None:
        twin = TwinBackend(world, switch="live", seed=args.seed)
        run_id = profile_adaptively(
            store, spec, work / "logs", host_name=HOST, backend=twin, budget_s=0.0, switch="live"
        ).run_id
        say(f"stand-in profile: {twin.elapsed:.0f} virtual s")
    judge = spec.model_copy(
        update={"workload": spec.workload.model_copy(update={"seed": JUDGE_SEED + args.seed})}
    )

    def backend(seed: int, observer: Observer) -> Backend:
        return TwinBackend(world, switch="live", seed=seed)

    return Setup(
        spec=judge,
        store=store,
        run_id=run_id,
        model=world.model_name,
        host=HOST,
        fidelity=Store(f"sqlite:///{work / 'fidelity.db'}"),
        backend=backend,
        stand_in=world,
    )


@dataclass
class Fidelity:
    """What the parts share: the options, where measurements come from, the calibrated twin."""

    args: argparse.Namespace
    setup: Setup
    work: Path
    cal: Calibration
    load: Work
    policy: Policy
    window_s: float
    most: int  # rounds or windows per cell at most
    least: int  # ... and at least, before the target may stop a cell
    twin_rel_se: float
    say: Callable[[str], None]
    tables: list = field(default_factory=list)  # the printed tables, for the results file
    summary: dict = field(default_factory=dict)  # ... and the headline figures

    def shown(self, title: str, head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
        """A table as printed (table), kept for the run's results file."""
        from record import Table

        self.tables.append(Table(title, list(head), [list(r) for r in rows]))
        return table(head, rows)

    @property
    def np_(self) -> int:
        return self.cal.world.n_parallel

    @property
    def n_max(self) -> int:
        return self.cal.world.n_max

    def twin_open(self, world: World, rate: float) -> TwinOpen:
        """A world's noise-free open-loop figures at a rate, in windows like the bench's."""
        return twin_open(world, self.policy, rate, self.window_s, self.load, self.twin_rel_se)

    def truth_of(self, world: World) -> ClosedTruth:
        """A world's noise-free closed levels, c = 1..n_parallel, with the run's lengths."""
        return closed_truth(
            world,
            output_tokens=self.load.output_tokens,
            prompt_tokens=self.load.prompt_tokens,
            concurrency=list(range(1, self.np_ + 1)),
        )

    def stand_in_truth(self) -> ClosedTruth | None:
        """The stand-in world's own closed truth (what its measurements should cover)."""
        if self.setup.stand_in is None:
            return None
        return self.truth_of(self.setup.stand_in)


def calibrated(
    args: argparse.Namespace, setup: Setup, work: Path, say: Callable[[str], None]
) -> tuple[RunData, Calibration, StoredFit, Policy, Work]:
    """Part 1: the twin from the profile run (tuner.twin.from_run, as `tuner dev twin calibrate
    --run` calibrates), the policy, the fit."""
    data = run_levels(setup.store, setup.run_id)
    started = time.monotonic()
    cal = calibrate_run(data)
    (work / "twin-world.toml").write_text(world_to_toml(cal.world))
    say(
        f"\n== 1. the twin, calibrated from run {setup.run_id} ({time.monotonic() - started:.0f} s)"
    )
    say(cal.report())
    fit = current_fit(setup.store, setup.model, setup.host)
    if args.policy is not None:
        policy, why = Policy.of_max_slots(args.policy, data.n_max), "given (--policy)"
    else:
        rec = standing(setup.store, setup.model, setup.host, fit=fit)
        policy, why = rec.policy.with_n_max(data.n_max), "the profile's recommendation"
    load = Work(data.prompt_tokens, data.output_tokens)
    say(
        f"policy served open loop: {policy.label} ({why}); {load.prompt_tokens} prompt and "
        f"{load.output_tokens} output tokens a request"
    )
    return data, cal, fit, policy, load


@dataclass(frozen=True)
class Twin:
    """One calibrated twin the bench is held against: its closed truth and open-loop figures."""

    name: str
    truth: ClosedTruth
    open: list[TwinOpen]
    reeval_share: float  # the threshold server's overhead over plain, of the target's forward


def closed_part(f: Fidelity, measured: Measured, held: list[int], twins: list[Twin]) -> None:
    """Part 3: the held-out closed levels, bench against each twin (the first is judged)."""
    args, closed = f.args, measured.closed
    f.say(f"\n== 3. closed levels not in the profile: {held} (target +-{100 * args.target:.0f} %)")
    known = f.stand_in_truth()
    rows, inside = [], dict.fromkeys((t.name for t in twins), 0)
    cells = [(p, c) for (p, c) in closed if c in held]
    for p, c in sorted(cells, key=lambda pc: (pc[1], pc[0].sort_key)):
        iv = Interval.of(closed[(p, c)])
        row: list[object] = [p.label, c, iv.n, iv.text(), f"+-{100 * iv.rel:.1f} %"]
        for k, t in enumerate(twins):
            twin = t.truth.tps(p, c)
            inside[t.name] += iv.holds(twin)
            row += [f"{twin:.1f} ({pct(twin / iv.mean - 1)})"]
            if k == 0:
                row.append(verdict(iv, twin, args.target))
        if known is not None:
            row.append(beside(iv, known.tps(p, c), 1))
        rows.append(row)
    head = ["policy", "streams", "rounds", "bench tok/s mean [95 % CI]", "half-width"]
    head += [f"{twins[0].name} (error)", "inside"] + [f"{t.name} (error)" for t in twins[1:]]
    head += ["stand-in truth"] if known is not None else []
    f.say(f.shown(f"3. closed levels not in the profile: {held}", head, rows))
    way = getattr(measured.profiler.backend, "way", "?")
    f.summary["closed: inside the bench's interval"] = ", ".join(
        f"{t.name} {inside[t.name]}/{len(rows)}" for t in twins
    )
    f.say(
        f"measured by {way}; inside the bench's interval: "
        + ", ".join(f"{t.name} {inside[t.name]}/{len(rows)}" for t in twins)
        + ". N=c-1 at c: the threshold that does not draft there (the twins' rests on the "
        "threshold server's overhead over plain, "
        + ", ".join(f"{t.name} {100 * t.reeval_share:.1f} %" for t in twins)
        + ", from the off arms at the calibration levels)"
    )


OPEN_FIGURES: tuple[tuple[str, Callable[[Window], float], int, bool], ...] = (
    # name, value, digits, judged (the requirement's two figures)
    ("tok/s", lambda w: w.tps, 1, True),
    ("mean TPOT ms", lambda w: w.tpot_ms, 2, True),
    ("mean generating", lambda w: w.generating, 2, False),
)


def open_part(f: Fidelity, measured: Measured, rates: list[float], twins: list[Twin]) -> None:
    """Part 4: open loop at the rates, bench against each twin (the first is judged)."""
    args, bench = f.args, measured.windows
    f.say(
        f"\n== 4. open loop under {f.policy.label}: {f.window_s:g} s windows of Poisson arrivals "
        f"conditioned on their count (target +-{100 * args.target:.0f} %)"
    )
    known = None
    if f.setup.stand_in is not None:
        known = [f.twin_open(f.setup.stand_in, r) for r in rates]
    rows, inside, judged_cells = [], dict.fromkeys((t.name for t in twins), 0), 0
    for k, rate in enumerate(rates):
        for name, what, digits, judged in OPEN_FIGURES:
            iv = Interval.of([what(w) for w in bench[k]])
            judged_cells += judged
            row: list[object] = [f"{rate:.4f}", name, iv.n, iv.text(digits)]
            row.append(f"+-{100 * iv.rel:.1f} %")
            for j, t in enumerate(twins):
                twin = t.open[k].mean(what)
                inside[t.name] += judged and iv.holds(twin)
                row.append(f"{twin:.{digits}f} ({pct(twin / iv.mean - 1)})")
                if j == 0:
                    row.append(verdict(iv, twin, args.target) if judged else "-")
            if known is not None:
                row.append(beside(iv, known[k].mean(what), digits))
            rows.append(row)
    head = ["rate /s", "figure", "windows", "bench mean [95 % CI]", "half-width"]
    head += [f"{twins[0].name} (error)", "inside"] + [f"{t.name} (error)" for t in twins[1:]]
    head += ["stand-in truth"] if known is not None else []
    f.say(f.shown(f"4. open loop under {f.policy.label}", head, rows))
    f.summary["open: throughput and mean TPOT inside the bench's interval"] = ", ".join(
        f"{t.name} {inside[t.name]}/{judged_cells}" for t in twins
    )
    f.say(
        "throughput and mean TPOT inside the bench's interval: "
        + ", ".join(f"{t.name} {inside[t.name]}/{judged_cells}" for t in twins)
        + f". Twins: the mean of {min(len(o.windows) for t in twins for o in t.open)} or more "
        "seeded windows a rate, noise-free"
    )


def gap_part(
    f: Fidelity,
    data: RunData,
    fit_tps: np.ndarray,
    measured: Measured,
    rates: list[float],
    twin: Twin,
    priced: Twin,
    per_token_ms: float,
) -> None:
    """Part 5: the open-loop gap, on the bench and in the twin, in two factors."""
    np_, n_max, policy = f.np_, f.n_max, f.policy
    closed, bench = measured.closed, measured.windows
    f.say(f"\n== 5. the open-loop gap under {policy.label}")
    profiled: dict[tuple[Policy, int], float] = {}
    for lv in data.levels:
        p = Policy.plain() if lv.policy.is_plain else lv.policy.with_n_max(n_max)
        profiled[(p, lv.concurrency)] = lv.tokens_per_second  # the level's median, as fitted

    def bench_value(p: Policy, c: int) -> float | None:
        if closed.get((p, c)):
            return statistics.fmean(closed[(p, c)])
        return profiled.get((p, c))

    bench_curve, assumed, missing = policy_curve(bench_value, policy, np_, n_max)
    twin_curve, _, _ = policy_curve(lambda p, c: twin.truth.tps(p, c), policy, np_, n_max)
    fit_curve = {0: 0.0, **{c: float(fit_tps[c - 1]) for c in range(1, np_ + 1)}}
    for name, curve in (("bench", bench_curve), ("twin", twin_curve), ("fit", fit_curve)):
        values = ", ".join(f"{curve[c]:.1f}" for c in range(1, np_ + 1))
        f.say(f"closed tok/s under {policy.label}, c = 1..{np_}, {name}: {values}")
    if assumed:
        f.say(f"(bench: no off-arm level at {assumed}: plain stands in for the threshold there)")
    if missing:
        f.say(f"(bench: nothing measured at {missing}: interpolated between its neighbours)")
    rows = []
    for k, rate in enumerate(rates):
        sides = (
            ("bench", Pooled.of(bench[k]), bench_curve),
            ("twin", twin.open[k].pooled, twin_curve),
            ("twin, prefill priced", priced.open[k].pooled, twin_curve),
        )
        for side, pooled, curve in sides:
            m = pooled.generating
            at_m, by_fit = curve_at(curve, m), curve_at(fit_curve, m)
            mixed = mixture(curve, pooled.shares)
            # the rest as time a request: what the span held beyond the mixture's pace
            rest_ms = 1000.0 * f.load.output_tokens * (1.0 / pooled.tps - 1.0 / mixed)
            rows.append(
                [
                    f"{rate:.4f}",
                    side,
                    f"{m:.2f}",
                    f"{100 * pooled.shares.get(np_, 0.0):.0f} %",
                    f"{by_fit:.1f}",
                    f"{at_m:.1f}",
                    f"{mixed:.1f}",
                    f"{pooled.tps:.1f}",
                    pct(pooled.tps / by_fit - 1),
                    pct(pooled.tps / at_m - 1),
                    pct(mixed / at_m - 1),
                    pct(pooled.tps / mixed - 1),
                    f"{rest_ms:.0f}",
                    f"{pooled.ttft_ms:.0f}",
                ]
            )
    head = ["rate /s", "side", "m (mean gen)", f"time at {np_}", "fit at m", "closed at m"]
    head += ["closed mixture", "open tok/s", "gap vs fit", "gap vs closed", "occupancy spread"]
    head += ["rest", "rest ms/request", "mean TTFT ms"]
    f.say(f.shown(f"5. the open-loop gap under {policy.label}", head, rows))
    prefill_ms = per_token_ms * f.load.prompt_tokens
    evaluated = statistics.fmean(Pooled.of(ws).prompt_tokens for ws in bench)
    f.say(
        "closed at m: the side's own closed levels (bench: measured here, or the profile's "
        "medians at its levels; twin: its truth) interpolated at m; closed mixture: the same "
        "levels weighted by the time at each number of generating slots, idle included;\n"
        "gap vs closed = open / closed at m - 1 = (1 + occupancy spread) x (1 + rest) - 1.\n"
        f"Prefill priced from the same-drift twin's step table: {per_token_ms:.2f} ms a prompt "
        f"token, {prefill_ms:.0f} ms a request of {f.load.prompt_tokens} tokens (the bench "
        f"evaluated {evaluated:.1f} a request): at the rates "
        "above "
        + ", ".join(f"{100 * r * prefill_ms / 1000:.0f} %" for r in rates)
        + " of the time. The calibrated twins price it from the time to first token of their "
        "levels (tuner.twin.from_run)."
    )


def main() -> int:
    from record import record_arguments, save_run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(SPEC), help="the bench's profile spec")
    parser.add_argument("--levels-closed", help="closed levels not in the profile (3,5,6,7)")
    parser.add_argument("--rates", help="arrival rates, requests/s (default: from the twin)")
    parser.add_argument(
        "--policy", type=int, help="N served open loop, 0: always draft (default: recommended)"
    )
    parser.add_argument("--window", type=float, help="seconds of arrivals a window (60)")
    parser.add_argument("--max-rounds", type=int, help="rounds or windows per cell at most (20)")
    parser.add_argument("--target", type=float, default=0.06, help="95 %% half-width / mean")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny caps and windows")
    parser.add_argument("--keep", type=Path, help="keep databases and logs here")
    parser.add_argument("--db", help="a database holding the bench's profile (else profiled)")
    parser.add_argument("--run", type=int, help="the profile run in --db (default: newest)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fidelity rounds")
    parser.add_argument("--stand-in", type=Path, help="measure this twin world, not the bench")
    record_arguments(parser)
    args = parser.parse_args()
    if args.run is not None and args.db is None:
        parser.error("--run names a run of --db")
    quick = args.quick
    work = args.keep or Path(tempfile.mkdtemp(prefix="tuner-twin-fidelity-"))
    work.mkdir(parents=True, exist_ok=True)

    def say(text: str) -> None:
        print(text, flush=True)

    began = time.monotonic()
    setup = (stand_in_setup if args.stand_in else bench_setup)(args, work, say)
    where = f"stand-in twin {setup.stand_in.name}" if setup.stand_in else "the bench"
    say(f"twin_fidelity: {where}, profile run {setup.run_id}, files in {work}")
    if quick:
        say("QUICK: a smoke run; its caps are too small for the target: its figures do not meet it")
    data, cal, fit, policy, load = calibrated(args, setup, work, say)
    np_ = data.n_parallel
    f = Fidelity(
        args=args,
        setup=setup,
        work=work,
        cal=cal,
        load=load,
        policy=policy,
        window_s=args.window or (10.0 if quick else 60.0),
        most=args.max_rounds or (2 if quick else 20),
        least=2 if quick else 3,
        twin_rel_se=0.01 if quick else TWIN_REL_SE,
        say=say,
    )
    profiled = {lv.concurrency for lv in data.levels}
    asked = [int(c) for c in (args.levels_closed or ("3,6" if quick else "3,5,6,7")).split(",")]
    levels = [c for c in asked if c not in profiled and 1 <= c <= np_]
    if levels != asked:
        say(
            f"closed levels left out (in the profile, or outside 1..{np_}): "
            f"{sorted(set(asked) - set(levels))}"
        )

    # The twin's predictions first: they are cheap, and the rates come from them.
    started = time.monotonic()
    if args.rates:
        rates, rate_why = [float(r) for r in args.rates.split(",")], "given (--rates)"
    else:
        rates = [twin_rate_for(cal.world, policy, m, load) for m in TARGETS]
        rate_why = "the twin's for " + ", ".join(f"{m:g}" for m in TARGETS) + " generating"
    fit_tps = np.asarray(fit.model.policy_tps(np.arange(1, np_ + 1), policy), dtype=float)
    fit_rates = [queue.rate_for_mean_generating(fit_tps, load.output_tokens, m) for m in TARGETS]
    profile_twin = Twin(
        "profile twin",
        f.truth_of(cal.world),
        [f.twin_open(cal.world, r) for r in rates],
        cal.reeval_share,
    )
    say(
        f"rates {', '.join(f'{r:.4f}' for r in rates)} /s ({rate_why}); the cost model's queue "
        f"(tuner.model.queue) puts {', '.join(f'{m:g}' for m in TARGETS)} generating at "
        f"{', '.join(f'{r:.4f}' for r in fit_rates)} /s; twin predictions "
        f"{time.monotonic() - started:.0f} s"
    )

    calib = sorted(profiled)
    say(
        f"\n== 2. the bench: closed passes (held-out levels {levels}; calibration levels {calib}, "
        f"plain, always draft and the off arm) and open windows at each rate, taking turns"
    )
    backend = setup.backend(args.seed + 1, progress(say))
    try:
        measured = measure_together(f, levels, calib, rates, backend)
    finally:
        backend.close()
    started = time.monotonic()
    same = calibrate_run(same_drift_data(f, measured, data, calib))
    (work / "twin-world-same-drift.toml").write_text(world_to_toml(same.world))
    say(
        "\nthe same-drift twin: calibrated (tuner.twin.from_run, as `twin calibrate --run`) "
        f"from the calibration levels {calib} measured in the passes above, at the mean of "
        "their rounds; the profile's llama-batched-bench rows; judged below"
    )
    say(same.report())
    same_twin = Twin(
        "same-drift twin",
        f.truth_of(same.world),
        [f.twin_open(same.world, r) for r in rates],
        same.reeval_share,
    )
    priced_world, per_token_ms = with_prefill_priced(same, load.prompt_tokens)
    priced = Twin(
        "same-drift twin, prefill from its step table",
        f.truth_of(priced_world),
        [f.twin_open(priced_world, r) for r in rates],
        same.reeval_share,
    )
    say(f"twin predictions: {time.monotonic() - started:.0f} s")
    closed_part(f, measured, levels, [same_twin, profile_twin])
    open_part(f, measured, rates, [same_twin, profile_twin, priced])
    gap_part(f, data, fit_tps, measured, rates, same_twin, priced, per_token_ms)
    say(
        f"\nwall: {time.monotonic() - began:.0f} s (bench {measured.seconds:.0f} s); "
        f"files in {work}"
    )
    if quick:
        say("QUICK run: intervals of at most two rounds or windows; the target is not met.")
    summary = {
        "measured": where,
        "quick (a smoke run: the target is not met)": quick,
        "policy served open loop": policy.label,
        "rates /s": rates,
        "target (95 % half-width / mean)": args.target,
        **f.summary,
        "wall s": time.monotonic() - began,
    }
    save_run(__file__, args, summary, f.tables)
    setup.store.dispose()
    setup.fidelity.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
