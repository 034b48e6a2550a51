"""`tuner runs` and `tuner show`: the stored runs, newest first, and one run's measured table
(tuner.storage.queries)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from tuner.cli import render
from tuner.cli.options import open_store, out, reports_errors

if TYPE_CHECKING:
    from tuner.storage.store import Store


@reports_errors
def runs(
    model: Annotated[str | None, typer.Option(help="only runs of this model")] = None,
    limit: Annotated[int, typer.Option(help="how many, newest first")] = 50,
) -> None:
    """List runs, newest first."""
    from rich.table import Table

    from tuner.storage.queries import list_runs

    table = Table()
    for column in (
        "run",
        "kind",
        "status",
        "model",
        "host",
        "spec / label",
        "progress",
        "samples",
        "started",
    ):
        table.add_column(column)
    for r in list_runs(open_store(), model, limit):
        table.add_row(
            str(r.id),
            r.kind,
            r.status,
            r.model,
            r.host or "",
            r.label or r.spec_name,
            r.progress(),
            str(r.samples),
            r.started_at.strftime("%Y-%m-%d %H:%M"),
        )
    out.print(table)


@reports_errors
def show(
    run_id: Annotated[int, typer.Argument(metavar="RUN", help="run id (see `tuner runs`)")],
) -> None:
    """Print a run's measured table (concurrency x configuration)."""
    show_run(open_store(), run_id)


def show_run(store: Store, run_id: int) -> None:
    """A run's measured table, as `tuner show` prints it (profile and import end with it)."""
    from tuner.storage.queries import run_points

    summary, points = run_points(store, run_id)
    render.points(f"run {run_id}: {summary.model} ({summary.kind}, {summary.status})", points)
