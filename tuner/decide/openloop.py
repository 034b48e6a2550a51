"""`tuner validate --arrivals poisson --rate R1,R2,...` (or `--arrivals trace --traffic NAME`):
the recommendation under open-loop load.

For each rate, every configuration validate checks (plain, always draft, the recommended N and
its neighbours) serves the same seeded Poisson arrivals for the window (the same request seeds
too), output lengths from the profile's workload, in the schedule's order
(tuner/measure/schedule.py: the rates are its places; with the live switch every drafting
configuration is one launch switched between rounds, plain its own launch). A trace
replays the requests `tuner observe` (or `watch`) saw arrive, at their observed offsets and with
their observed output lengths, the first --window of them. Per
configuration and rate it stores throughput, TTFT and time per output token at p50/p95/p99 and
the mean number of generating slots (tuner.measure.arrivals), in `tuner_openloop` with a run of
kind "openloop".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from tuner.decide import validate
from tuner.errors import ConfigError, LoadError
from tuner.measure.arrivals import (
    OpenLoopFigures,
    Schedule,
    poisson_schedule,
    summarize_open_loop,
    trace_schedule,
)
from tuner.measure.plan import Observer, ProgressEvent, quiet
from tuner.measure.schedule import plan_pass
from tuner.policy import Policy
from tuner.recommendation import Recommendation
from tuner.storage import traffic_profiles as traffic_store
from tuner.storage.orm import OpenLoopResult
from tuner.storage.store import Store

MIN_TRACE_REQUESTS = 5


@dataclass
class OpenLoopReport:
    """What an open-loop validation measured: per rate, per configuration, its figures."""

    run_id: int
    recommendation: Recommendation
    window_s: float
    results: dict[float, dict[str, OpenLoopFigures]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "recommended": self.recommendation.max_slots,
            "window_s": self.window_s,
            "results": {
                str(rate): {config: f.to_dict() for config, f in by_config.items()}
                for rate, by_config in self.results.items()
            },
        }


def open_loop_options(
    arrivals: str | None, rate: str | None, window_s: float, traffic: str | None = None
) -> tuple[list[float], float]:
    """--arrivals, --rate, --traffic and --window read and checked before anything starts: the
    rates (none for a trace) and the window."""
    if arrivals not in ("poisson", "trace"):
        raise ConfigError(
            f"--arrivals {arrivals!r}: poisson (random arrivals at each --rate) or trace "
            "(replay what `tuner observe` saw, --traffic NAME)"
        )
    if arrivals == "trace":
        if not traffic:
            raise ConfigError("--arrivals trace needs --traffic NAME (a `tuner observe` profile)")
        if rate:
            raise ConfigError("--arrivals trace replays the observed arrivals: drop --rate")
        check_options([1.0], window_s)
        return [], window_s
    if not rate:
        raise ConfigError("--arrivals poisson needs --rate, e.g. --rate 0.5,1,2")
    try:
        rates = [float(r) for r in rate.split(",")]
    except ValueError:
        raise ConfigError(f"--rate {rate!r}: expected requests per second, e.g. 0.5,1,2") from None
    check_options(rates, window_s)
    return rates, window_s


def check_options(rates: list[float], window_s: float) -> None:
    """Rates above 0 and a window above 0."""
    if not rates or any(r <= 0 for r in rates):
        raise ConfigError(f"--rate: every arrival rate must be above 0 (got {rates})")
    if window_s <= 0:
        raise ConfigError("--window must be above 0")


def schedules(
    store: Store, rates: list[float], window_s: float, seed: int, traffic: str | None
) -> list[Schedule]:
    """What each round sends: seeded Poisson arrivals per rate, or the observed trace."""
    if traffic is None:
        check_options(rates, window_s)
        return [poisson_schedule(rate, window_s, seed) for rate in rates]
    profile = traffic_store.load(store, traffic)
    trace = trace_schedule(profile.requests, window_s)
    if len(trace.offsets) < MIN_TRACE_REQUESTS:
        raise ConfigError(
            f"traffic {traffic!r} holds {len(trace.offsets)} requests seen arriving within "
            f"{window_s:.0f} s, too few to replay (at least {MIN_TRACE_REQUESTS}); observe "
            "longer, from /slots"
        )
    return [trace]


def validate_open_loop(
    store: Store,
    model: str,
    host: str,
    log_dir: Path,
    observer: Observer = quiet,
    *,
    rates: list[float],
    window_s: float = 60.0,
    seed: int = 0,
    overrides: list[tuple[str, Any]] | None = None,
    skip_preflight: bool = False,
    traffic: str | None = None,
    max_slots: int | None = None,
) -> OpenLoopReport:
    """Measure the standing recommendation (or max_slots where given) and its neighbours under
    Poisson arrivals (or the observed trace of traffic)."""
    rounds = schedules(store, rates, window_s, seed, traffic)
    rec = validate.checked(store, model, host, max_slots)
    stored_spec = validate.profile_spec_of(store, model, host)
    spec = validate.validation_spec(stored_spec, [1], rec.n_max, overrides, kind="openloop")
    policies = validate.candidates(rec.max_slots, spec.server.n_parallel)
    profiler = validate.open_live_run(
        store,
        spec,
        model,
        host,
        rec,
        "openloop",
        policies,
        log_dir,
        observer,
        skip_preflight=skip_preflight,
    )
    assert profiler.run_id is not None
    report = OpenLoopReport(profiler.run_id, rec, window_s)

    arms = {k: policies for k in range(len(rounds))}

    def body() -> None:
        assert profiler.backend is not None
        check = getattr(profiler.backend, "check_switch", None)
        if check is not None:
            profiler.recorder.set_way(check(policies))
        steps = plan_pass(arms, profiler.backend.launch_key, 0)
        observer(ProgressEvent("plan", total=len(steps)))
        for step in steps:
            schedule = rounds[step.cell]
            figures = _one(profiler, step.policy, schedule, step.cell, observer)
            report.results.setdefault(schedule.rate, {})[step.policy.config_name] = figures

    profiler.guarded(body)
    return report


def _one(
    profiler: Any,
    policy: Policy,
    schedule: Schedule,
    round_key: int,
    observer: Observer,
) -> OpenLoopFigures:
    rate = schedule.rate
    what = "Poisson arrivals" if schedule.source == "poisson" else "replayed arrivals"
    observer(
        ProgressEvent(
            "message",
            text=f"{policy.config_name}: {len(schedule.offsets)} {what} at {rate:.3g}/s",
        )
    )
    samples = profiler.backend.arrivals(
        policy, schedule.offsets, round_key, schedule.max_tokens, profiler.request_workload()
    ).samples
    figures = summarize_open_loop(samples, rate)
    if figures.failed:
        first = next(s.error for s in samples if not s.ok)
        raise LoadError(
            f"{figures.failed} of {figures.offered} requests failed under {policy.config_name} "
            f"at {rate:g}/s ({first})"
        )
    with profiler.store.session() as session:
        session.add(
            OpenLoopResult(
                run_id=profiler.run_id,
                config=policy.config_name,
                max_slots=policy.max_slots,
                rate=rate,
                figures=figures.to_dict(),
            )
        )
    observer(
        ProgressEvent(
            "message",
            text=f"  {policy.config_name} at {rate:.3g}/s: {figures.tokens_per_second:.1f} tok/s, "
            f"TPOT p95 {figures.tpot_ms[1]:.1f} ms, {figures.mean_generating:.2f} generating",
        )
    )
    return figures


def stored_results(store: Store, run_id: int) -> dict[float, dict[str, OpenLoopFigures]]:
    """An open-loop run's figures as stored."""
    out: dict[float, dict[str, OpenLoopFigures]] = {}
    with store.session() as session:
        for row in session.scalars(select(OpenLoopResult).where(OpenLoopResult.run_id == run_id)):
            out.setdefault(row.rate, {})[row.config] = OpenLoopFigures.from_dict(row.figures)
    return out
