"""`tuner validate`: measure the recommended N and its neighbours live and report the regret,
in closed levels (tuner.decide.validate.validate) or under open-loop arrivals
(tuner.decide.openloop.validate_open_loop)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tuner.cli import render
from tuner.cli.options import (
    OverridesOption,
    ResumeOption,
    SeedOption,
    SkipPreflightOption,
    TableFormat,
    TableFormatOption,
    duration_option,
    parsed_overrides,
    refuse,
    reports_errors,
)
from tuner.cli.progress import measure_live
from tuner.jsonout import json_line

if TYPE_CHECKING:
    from tuner.decide.openloop import OpenLoopReport

MaxSlotsOption = Annotated[
    int | None,
    typer.Option("--max-slots", min=0, help="validate this N instead of the stored recommendation"),
]
ArrivalsOption = Annotated[
    str | None,
    typer.Option(
        "--arrivals",
        help="poisson: open loop, requests arriving at random at each --rate instead of "
        "closed levels of streams that start together; trace: replay the arrivals and "
        "output lengths a `tuner observe` profile saw (--traffic NAME)",
    ),
]
RatesOption = Annotated[
    str | None, typer.Option(help="open loop: arrival rates, requests per second, e.g. 0.5,1,2")
]
WindowOption = Annotated[
    str, typer.Option(help="open loop: arrivals per configuration and rate, e.g. 60s or 2m")
]
ReplayOption = Annotated[
    str | None, typer.Option(help="--arrivals trace: the observed traffic profile to replay")
]


@reports_errors
def validate(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="model name the recommendation is for")],
    resume: ResumeOption = False,
    max_slots: MaxSlotsOption = None,
    output: TableFormatOption = TableFormat.TABLE,
    arrivals: ArrivalsOption = None,
    rate: RatesOption = None,
    window: WindowOption = "60s",
    traffic: ReplayOption = None,
    overrides: OverridesOption = None,
    skip_preflight: SkipPreflightOption = False,
    seed: SeedOption = 0,
) -> None:
    """Measure the recommended N, N-1, N+1, 0 (always draft) and plain live; report regret, and
    the recommendation that stands once these points are part of the fit.

    With --arrivals poisson --rate R1,R2: the same configurations under open-loop load (seeded
    Poisson arrivals, output lengths from the profile's workload): throughput, TTFT and time per
    output token at p50/p95/p99, mean generating slots, per rate. With --arrivals trace
    --traffic NAME: the arrivals and output lengths `tuner observe` saw, replayed.

    Needs a llama-server that knows --spec-draft-max-slots; reuses the server set-up of the
    model's newest profile. The new points are stored and feed the next `tuner dev fit`.
    """
    if arrivals is not None or rate is not None:
        refuse(ctx, "an open-loop validation (--arrivals) starts over each time", "resume")
        open_report = _open_loop(
            model, arrivals, rate, window, traffic, max_slots, overrides, skip_preflight, seed
        )
        _emit(output, open_report, render.open_loop)
        return
    refuse(ctx, "it goes with --arrivals (open loop)", "window", "traffic")
    from tuner.decide.validate import validate as run_validation

    report = measure_live(
        run_validation,
        model,
        resume=resume,
        max_slots=max_slots,
        overrides=parsed_overrides(overrides),
        skip_preflight=skip_preflight,
    )
    _emit(output, report, render.validation)


def _emit(output: TableFormat, report: Any, table: Callable[[Any], None]) -> None:
    """The report as JSON (--format json) or as tables."""
    if output is TableFormat.JSON:
        typer.echo(json_line(report.as_dict()))
    else:
        table(report)


def _open_loop(
    model: str,
    arrivals: str | None,
    rate: str | None,
    window: str,
    traffic: str | None,
    max_slots: int | None,
    overrides: list[str] | None,
    skip_preflight: bool,
    seed: int,
) -> OpenLoopReport:
    from tuner.decide.openloop import open_loop_options, validate_open_loop

    rates, window_s = open_loop_options(
        arrivals, rate, duration_option(window, "--window"), traffic
    )
    return measure_live(
        validate_open_loop,
        model,
        rates=rates,
        window_s=window_s,
        seed=seed,
        overrides=parsed_overrides(overrides),
        skip_preflight=skip_preflight,
        traffic=traffic if arrivals == "trace" else None,
        max_slots=max_slots,
    )
