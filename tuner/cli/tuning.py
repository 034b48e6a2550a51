"""`tuner tune`: settle N live with paired comparisons around the recommendation that stands
(tuner.decide.tune.tune), and show every comparison; with --url, on a running server the tuner
did not start (tuner.decide.running.tune_running)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from tuner.cli import render
from tuner.cli.options import (
    ApiKeyOption,
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
    http_url,
    open_store,
    out,
    parsed_overrides,
    refuse,
    reports_errors,
    settings,
    terminate_as_interrupt,
    this_host,
)
from tuner.cli.progress import ProgressDisplay, measure_live
from tuner.jsonout import json_line

if TYPE_CHECKING:
    from tuner.recommendation import Recommendation

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
        "passes together (a comparison over levels of the same passes has the passes less one "
        "degrees of freedom: two passes are one), also where a tie moves the answer; "
        "unresolved then, the model's verdict stands",
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


TuneUrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="a running patched llama-server (started with --props and --metrics) to tune as "
        "it runs: no spec, no relaunch; its threshold is given back on every way out",
    ),
]
PlainUrlOption = Annotated[
    str | None,
    typer.Option(
        "--plain-url",
        help="with --url: a second running server of the same model without a draft model, "
        "so that whether to draft at all is settled too (side by side)",
    ),
]
WaitOption = Annotated[
    str,
    typer.Option(
        help="with --url: how long to wait for the server to be free of others' requests "
        "before giving up (e.g. 5m)"
    ),
]
ProfileBudgetOption = Annotated[
    str,
    advanced(
        "--profile-budget",
        help="with --url: measuring time for the levels the profile adds where the model is "
        "still undecided (0 turns it off)",
    ),
]


@reports_errors
def tune(
    ctx: typer.Context,
    model: Annotated[
        str | None,
        typer.Option(help="model name to tune (with --url: the name to store it under)"),
    ] = None,
    url: TuneUrlOption = None,
    api_key: ApiKeyOption = None,
    plain_url: PlainUrlOption = None,
    wait: WaitOption = "5m",
    budget: BudgetOption = "10m",
    tolerance: ToleranceOption = 0.01,
    plain_live: PlainLiveOption = False,
    resume: ResumeOption = False,
    output: TableFormatOption = TableFormat.TABLE,
    tie_budget: TieBudgetOption = "3m",
    plain_budget: PlainBudgetOption = "150s",
    switch: SwitchOption = Switch.AUTO,
    tune_n_max: TuneNMaxOption = False,
    overrides: OverridesOption = None,
    skip_preflight: SkipPreflightOption = False,
    seed: SeedOption = 0,
    profile_budget: ProfileBudgetOption = "5m",
) -> None:
    """Settle N live: compare the recommendation that stands with N-2, N-1, N+1, N+2 and always
    draft, only at the levels where each differs from it (on and off in turn on one drafting
    launch, same prompts and seeds), until each comparison's one-sided 95 % bound clears the
    tolerance or the budget is spent; the answer is stored as the recommendation that stands.

    Needs a llama-server that knows --spec-draft-max-slots; reuses the server set-up of the
    model's newest profile. Ctrl-C keeps finished rounds; --resume continues. Where the
    profile's acceptance collapses at some number of drafting slots (below the floor its fitted
    costs set), one line names the slots, the build and the N that protects the server.

    With --url URL: the server as it runs (`tuner check --url URL` says whether it can be):
    profiled live at 1, 2, 4, ... up to its slots, then settled the same way, everything stored
    under its model alias (or --model); its threshold is given back afterwards, also after an
    error, Ctrl-C or SIGTERM (after SIGKILL, by the next tuner run against the URL).
    """
    limits = {
        "budget_s": duration_option(budget, "--budget"),
        "tie_budget_s": duration_option(tie_budget, "--tie-budget"),
        "plain_budget_s": duration_option(plain_budget, "--plain-budget"),
        "tolerance": tolerance,
        "seed": seed,
    }
    if url is not None:
        refuse(
            ctx,
            "--url tunes the server as it runs (no launches, no spec; --plain-url measures plain)",
            "resume",
            "switch",
            "skip_preflight",
            "tune_n_max",
            "plain_live",
        )
        _tune_running(url, model, api_key, plain_url, wait, profile_budget, overrides, limits,
                      output)  # fmt: skip
        return
    refuse(ctx, "it goes with --url (a running server)", "api_key", "plain_url", "wait",
           "profile_budget")  # fmt: skip
    if model is None:
        raise typer.BadParameter("give --model NAME (a profiled model) or --url URL")
    from tuner.decide.tune import tune as run_tune

    report = measure_live(
        run_tune,
        model,
        switch=switch.value,
        tune_n_max=tune_n_max,
        resume=resume,
        overrides=parsed_overrides(overrides),
        skip_preflight=skip_preflight,
        plain_live=plain_live,
        **limits,
    )
    if output is TableFormat.JSON:
        typer.echo(json_line(report.as_dict()))
    else:
        render.tuning(report)
        _alarm(model, this_host(), report.standing)


def _tune_running(
    url: str,
    model: str | None,
    api_key: str | None,
    plain_url: str | None,
    wait: str,
    profile_budget: str,
    overrides: list[str] | None,
    limits: dict,
    output: TableFormat,
) -> None:
    """`tune --url`: the running server checked, held, profiled and settled."""
    from tuner.decide.running import RunningOptions, tune_running

    options = RunningOptions(
        url=http_url(url),
        api_key=api_key,
        model=model,
        plain_url=http_url(plain_url) if plain_url is not None else None,
        plain_api_key=api_key,
        wait_s=duration_option(wait, "--wait"),
        profile_budget_s=duration_option(profile_budget, "--profile-budget"),
        tune=limits,
        overrides=parsed_overrides(overrides),
    )
    current = settings()
    with terminate_as_interrupt(), ProgressDisplay() as display:
        report = tune_running(
            open_store(),
            options,
            host=this_host(),
            state_dir=current.state_dir,
            log_dir=current.log_dir,
            observer=display,
        )
    if output is TableFormat.JSON:
        typer.echo(json_line(render.running_dict(report)))
    else:
        render.running(report)
        if report.tune is not None:
            _alarm(report.server.model, this_host(), report.tune.standing)


def _alarm(model: str, host: str, standing: Recommendation | None) -> None:
    """After a tune: the profile's acceptance by drafting level against its fit's floor, one
    line where it collapses (tuner.decide.alarm)."""
    from tuner.decide.alarm import tune_alarm

    if standing is None:
        return
    line = tune_alarm(open_store(), model, host, standing.fit_id, standing.policy.max_slots)
    if line:
        out.print(line, highlight=False, markup=False, soft_wrap=True)
