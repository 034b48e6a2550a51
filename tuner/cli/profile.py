"""`tuner profile`: measure plain and speculative decode at each concurrency level, from a spec
(the tuner launches llama-server: tuner.decide.adaptive.profile_adaptively) or on a running
server as it is (attach mode, --url: tuner.measure.attach.attach), and show the run's table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tuner.cli.options import (
    ApiKeyOption,
    OverridesOption,
    ResumeOption,
    SkipPreflightOption,
    Switch,
    SwitchOption,
    duration_option,
    err,
    http_url,
    levels_option,
    load_spec_file,
    open_store,
    parsed_overrides,
    refuse,
    reports_errors,
    settings,
    terminate_as_interrupt,
    this_host,
)
from tuner.cli.progress import ProgressDisplay
from tuner.cli.runs import show_run
from tuner.errors import ConfigError

if TYPE_CHECKING:
    from tuner.storage.store import Store

SpecArgument = Annotated[Path | None, typer.Argument(metavar="SPEC", help="profile spec (TOML)")]
LevelsOption = Annotated[str | None, typer.Option(help="concurrency levels, e.g. 1,2,4,8")]
ModelNameOption = Annotated[str | None, typer.Option(help="store results under this model name")]
AttachUrlOption = Annotated[
    str | None,
    typer.Option(help="attach mode: measure this running server as it is configured"),
]
LabelOption = Annotated[str | None, typer.Option(help="attach mode: name of what is measured")]
BudgetOption = Annotated[
    str,
    typer.Option(
        help="time for levels the profile adds by itself where the decision is still open "
        "(e.g. 10m, 600s, 1h; 0 turns it off)"
    ),
]

ATTACHED = "attach mode (--url) measures the server once, as it is configured"


@reports_errors
def profile(
    ctx: typer.Context,
    spec_path: SpecArgument = None,
    resume: ResumeOption = False,
    levels: LevelsOption = None,
    model_name: ModelNameOption = None,
    url: AttachUrlOption = None,
    label: LabelOption = None,
    api_key: ApiKeyOption = None,
    budget: BudgetOption = "10m",
    overrides: OverridesOption = None,
    skip_preflight: SkipPreflightOption = False,
    switch: SwitchOption = Switch.AUTO,
) -> None:
    """Measure plain and speculative decode at each concurrency level, and store every sample.

    Each configuration is first launched once to answer one short request (drafting on), so a
    build that cannot run here fails within about a minute with the reason; then every level is
    measured and stored as it finishes (Ctrl-C keeps finished repeats; --resume continues).
    The configurations are interleaved (A B, then B A, ...; the one that ends a pass starts the
    next on the same launch) so a drift of the machine hits them alike. Then, within --budget,
    it measures the levels where the crossover is still undecided (the ones `recommend` would
    name under "measure next").

    With --url (attach mode) it measures a running server as it is configured, once."""
    extra = list(overrides or [])
    if (parsed := levels_option(levels)) is not None:
        extra.append(f"workload.concurrency={parsed}")
    if model_name:
        extra.append(f'model_name="{model_name}"')
    if url is not None:
        refuse(ctx, ATTACHED, "resume", "budget", "skip_preflight", "switch")
        if not label:
            raise ConfigError("--url needs --label: a name for the server being measured")
        store, run_id = _attach(http_url(url), label, model_name, api_key, spec_path, extra)
    else:
        refuse(ctx, "it goes with --url (attach mode)", "label", "api_key")
        if spec_path is None:
            raise typer.BadParameter(
                "give a SPEC file (or --url for attach mode)", param_hint="SPEC"
            )
        store, run_id = _profile(spec_path, extra, resume, budget, skip_preflight, switch)
    show_run(store, run_id)


def _attach(
    url: str,
    label: str,
    model_name: str | None,
    api_key: str | None,
    spec_path: Path | None,
    extra: list[str],
) -> tuple[Store, int]:
    from tuner.measure.attach import attach

    spec = load_spec_file(spec_path, extra, check_files=False) if spec_path else None
    store = open_store()
    with terminate_as_interrupt(), ProgressDisplay() as display:
        run_id = attach(
            store,
            url,
            label,
            model_name,
            spec,
            settings().log_dir,
            display,
            api_key=api_key,
            host_name=this_host(),
            overrides=None if spec_path else parsed_overrides(extra),
            state_dir=settings().state_dir,
        )
    return store, run_id


def _profile(
    spec_path: Path,
    extra: list[str],
    resume: bool,
    budget: str,
    skip_preflight: bool,
    switch: Switch,
) -> tuple[Store, int]:
    from tuner.decide.adaptive import profile_adaptively

    spec = load_spec_file(spec_path, extra)
    store = open_store()
    budget_s = duration_option(budget, "--budget")
    with terminate_as_interrupt(), ProgressDisplay() as display:
        adaptive = profile_adaptively(
            store,
            spec,
            settings().log_dir,
            display,
            resume=resume,
            host_name=this_host(),
            skip_preflight=skip_preflight,
            budget_s=budget_s,
            switch=switch.value,
        )
    err.print(adaptive.summary(), highlight=False)
    return store, adaptive.run_id
