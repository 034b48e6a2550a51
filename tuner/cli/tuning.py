"""`tuner tune`: settle N live with paired comparisons around the recommendation that stands
(tuner.decide.tune.tune), and show every comparison."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from tuner.cli import render
from tuner.cli.options import (
    OverridesOption,
    ResumeOption,
    SeedOption,
    SkipPreflightOption,
    Switch,
    SwitchOption,
    TableFormat,
    TableFormatOption,
    TuneNMaxOption,
    advanced,
    duration_option,
    parsed_overrides,
    reports_errors,
)
from tuner.cli.progress import measure_live

BudgetOption = Annotated[
    str,
    typer.Option(
        help="measuring time before it stops with what is unresolved named, e.g. 10m, 300s "
        "(the larger questions first: contenders that could cost more than the tolerance, "
        "then plain with --plain-live, then tie questions)"
    ),
]
TieBudgetOption = Annotated[
    str,
    advanced(
        "--tie-budget",
        help="measuring time after which tie questions (which only choose among values "
        "within the tolerance) are named in 'may tie', not measured on; 0 names them at once",
    ),
]
PlainBudgetOption = Annotated[
    str,
    advanced(
        "--plain-budget",
        help="with --plain-live: measuring time plain against the answer may take, all its "
        "passes together (two or three passes on a 2-core VM), also where a tie moves the "
        "answer; unresolved then, the model's verdict stands",
    ),
]
ToleranceOption = Annotated[
    float,
    typer.Option(
        min=0.0001,
        max=0.5,
        help="share of the objective a contender may be ahead by and the answer still hold "
        "(also the tie margin)",
    ),
]
PlainLiveOption = Annotated[
    bool,
    typer.Option(
        "--plain-live",
        help="then settle whether to draft at all, before the tie questions: plain's launch "
        "held up beside the drafting launch (the target model in memory twice), the two in "
        "turn at every level",
    ),
]


@reports_errors
def tune(
    model: Annotated[str, typer.Option(help="model name to tune")],
    budget: BudgetOption = "10m",
    tolerance: ToleranceOption = 0.01,
    plain_live: PlainLiveOption = False,
    resume: ResumeOption = False,
    output: TableFormatOption = TableFormat.TABLE,
    tie_budget: TieBudgetOption = "3m",
    plain_budget: PlainBudgetOption = "90s",
    switch: SwitchOption = Switch.AUTO,
    tune_n_max: TuneNMaxOption = False,
    overrides: OverridesOption = None,
    skip_preflight: SkipPreflightOption = False,
    seed: SeedOption = 0,
) -> None:
    """Settle N live: compare the recommendation that stands with N-2, N-1, N+1, N+2 and always
    draft, only at the levels where each differs from it (on and off in turn on one drafting
    launch, same prompts and seeds), until each comparison's one-sided 95 % bound clears the
    tolerance or the budget is spent; the answer is stored as the recommendation that stands.

    Needs a llama-server that knows --spec-draft-max-slots; reuses the server set-up of the
    model's newest profile. Ctrl-C keeps finished rounds; --resume continues.
    """
    from tuner.decide.tune import tune as run_tune

    report = measure_live(
        run_tune,
        model,
        budget_s=duration_option(budget, "--budget"),
        tie_budget_s=duration_option(tie_budget, "--tie-budget"),
        plain_budget_s=duration_option(plain_budget, "--plain-budget"),
        tolerance=tolerance,
        switch=switch.value,
        tune_n_max=tune_n_max,
        resume=resume,
        overrides=parsed_overrides(overrides),
        skip_preflight=skip_preflight,
        seed=seed,
        plain_live=plain_live,
    )
    if output is TableFormat.JSON:
        typer.echo(json.dumps(report.as_dict(), default=str))
    else:
        render.tuning(report)
