"""`tuner dev ...`: the developer's commands, beside the user's path: fit the cost model (`fit`),
predict a policy (`predict`), import a table measured elsewhere (`import`), list the hosts of a
fleet's database (`hosts`), and the twin (`twin ...`, tuner.cli.twin)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tuner.cli import render
from tuner.cli.options import (
    Commands,
    ContextOption,
    FitOption,
    HostOption,
    ModelOption,
    SeedOption,
    TableFormat,
    TableFormatOption,
    err,
    model_host,
    note,
    open_store,
    out,
    reports_errors,
    this_host,
)
from tuner.cli.runs import show_run
from tuner.cli.twin import twin_app
from tuner.jsonout import json_line

dev_app = Commands(
    help="Developer commands: fit, predict, import, hosts, twin.\n\n"
    "The cost model (fit, predict), tables measured elsewhere (import), a fleet's hosts, and the "
    "twin (a simulated llama-server with known truth).",
    no_args_is_help=True,
)


@dev_app.command()
@reports_errors
def fit(
    model: ModelOption,
    host: HostOption = None,
    output: TableFormatOption = TableFormat.TABLE,
    context: ContextOption = None,
    seed: SeedOption = 0,
) -> None:
    """Fit the cost model (step time + acceptance) to a model's results and store it; with
    several context depths measured, also the crossover at each."""
    from tuner.storage.fits import acceptance_by_prompt_set, crossovers_by_depth, fit_model

    name, explicit = model_host(host)
    store = open_store()
    stored = fit_model(store, model, name, host_explicit=explicit, seed=seed, context=context)
    by_depth = crossovers_by_depth(store, model, name, host_explicit=explicit, seed=seed)
    by_set = acceptance_by_prompt_set(store, model)
    note(stored.host_note)
    if output is TableFormat.JSON:
        data = stored.as_dict()
        data["crossover_by_depth"] = {str(d): x.to_dict() for d, x in by_depth.items()}
        data["acceptance_by_prompt_set"] = by_set
        typer.echo(json_line(data))
    else:
        render.fit(stored, by_depth, by_set)


@dev_app.command()
@reports_errors
def predict(
    model: ModelOption,
    max_slots: Annotated[
        int, typer.Option("--max-slots", help="--spec-draft-max-slots N (0: always draft)")
    ],
    n_max: Annotated[
        int | None, typer.Option("--n-max", help="draft length (default: the profiled one)")
    ] = None,
    host: HostOption = None,
    output: TableFormatOption = TableFormat.TABLE,
    context: ContextOption = None,
    fit_id: FitOption = None,
) -> None:
    """Print predicted aggregate tok/s per concurrency under --spec-draft-max-slots N."""
    from tuner.decide.predict import predict as predict_policy

    name, explicit = model_host(host)
    report = predict_policy(
        open_store(),
        model,
        max_slots,
        name,
        n_max=n_max,
        host_explicit=explicit,
        fit_id=fit_id,
        context=context,
    )
    note(report.fit.host_note)
    if output is TableFormat.JSON:
        typer.echo(json_line(report.to_dict()))
    else:
        render.predict(model, report)


@dev_app.command("import")
@reports_errors
def import_table(
    path: Annotated[Path, typer.Argument(metavar="FILE", help="table to import (TOML)")],
) -> None:
    """Store a table measured elsewhere (tok/s per concurrency) as a run with source "imported".

    The format is documented in profiles/reference/README.md.
    """
    from tuner.storage.importer import import_table as store_table

    store = open_store()
    result = store_table(store, path)
    verb = "imported" if result.created else "already imported"
    err.print(
        f"{verb} {path} as run {result.run_id}: model {result.model}"
        + (f", host {result.host}" if result.host else "")
        + f", {result.levels} levels",
        highlight=False,
    )
    show_run(store, result.run_id)


@dev_app.command()
@reports_errors
def hosts(
    model: Annotated[str | None, typer.Option(help="only hosts that measured this model")] = None,
) -> None:
    """List the hosts (boxes of a fleet) the database has results from, with their models."""
    from rich.table import Table

    from tuner.storage.queries import list_hosts

    here = this_host()
    table = Table()
    for column in ("host", "cpu", "cores", "memory", "devices", "runs done/all", "models", "last"):
        table.add_column(column)
    known = list_hosts(open_store(), model)
    for h in known:
        memory = f"{h.memory_bytes / 2**30:.1f} GiB" if h.memory_bytes else ""
        table.add_row(
            h.name + (" (this host)" if h.name == here else ""),
            h.cpu_model or "",
            str(h.cpu_cores or ""),
            memory,
            ", ".join(h.devices) or "-",
            f"{h.completed_runs}/{h.runs}",
            ", ".join(h.models),
            h.last_run_at.strftime("%Y-%m-%d %H:%M") if h.last_run_at else "",
        )
    if not known:
        err.print("no hosts yet: `tuner profile SPEC` measures this one", highlight=False)
        return
    out.print(table)


dev_app.add_typer(twin_app, name="twin")
