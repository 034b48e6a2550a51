"""`tuner report`: the plot and Markdown summary of a model's results and the recommendation
that stands (tuner.report.writer.write_report)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.options import HostOption, ModelOption, model_host, note, open_store, reports_errors

OutDirOption = Annotated[
    Path,
    typer.Option(
        "--out",
        help="folder for report.png, report.svg and summary.md (created; nothing is "
        "written outside it)",
    ),
]


@reports_errors
def report(
    model: ModelOption,
    host: HostOption = None,
    out_dir: OutDirOption = Path("tuner-report"),
) -> None:
    """Plot tok/s against concurrency (measured, model, recommended policy, crossover) and
    write a Markdown summary (host, build, model, data, fit quality, recommendation, validation).

    Shows the recommendation that stands for the current fit; without one it makes (and stores)
    one.
    """
    from tuner.report.writer import write_report

    name, explicit = model_host(host)
    files = write_report(open_store(), model, out_dir, name, host_explicit=explicit)
    note(files.host_note)
    for path in files.paths:
        typer.echo(str(path))
