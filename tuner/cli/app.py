"""The `tuner` command line: the root app, its options (--db, --version), and every command
registered in the order a user runs them.

Each command lives in a module of its own (or of its group) and parses its options, calls one
library function and renders the result: profile.py, tuning.py, recommend.py, report.py,
service.py (observe, watch), validation.py, runs.py (runs, show), bench.py, and dev.py (the
developer's commands: fit, predict, import, hosts, and twin.py's `tuner dev twin ...`). Shared
options, settings, the advanced options and error handling are in options.py, rendering in
render.py and the progress display in progress.py. Errors from the library (tuner.errors)
become one red line on stderr and an exit code here, and nowhere else.
"""

from __future__ import annotations

from typing import Annotated

import typer

from tuner import __version__
from tuner.cli import (
    bench,
    check,
    dev,
    profile,
    recommend,
    report,
    runs,
    service,
    tuning,
    validation,
)
from tuner.cli.options import Commands, State, out

HELP = """Find the best --spec-draft-max-slots N for llama-server by measuring it: \
how many generating slots may draft at once before drafting costs more than it gains. \
The tuner measures the server plain and drafting at a few concurrency levels, fits a cost model, \
settles N with paired live comparisons, and stores everything, so every later answer \
(recommend, report, watch) reads the database.

Typical use, in this order:

  tuner check --url URL           can this server be tuned, and how?
  tuner tune --url URL            measure that server and settle N
    or: tuner profile SPEC.toml   (the tuner launches llama-server itself)
        tuner tune --model NAME
  tuner recommend --model NAME    prints LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=N
  tuner report --model NAME       plot and summary
  tuner watch --model NAME --url URL --env-file FILE
                                  keeps N current as the traffic changes

Each command's --help lists the options most runs need; --help --advanced lists them all."""

# One line each in the list of commands (a docstring's first paragraph is longer).
SHORT = {
    "check": "What a running server can do for the tuner, and how to fix each gap.",
    "profile": "Measure plain and drafting at each concurrency level.",
    "tune": "Settle N live around the recommendation that stands.",
    "recommend": "Print LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=N (reasons on stderr).",
    "report": "Plot and summary of a model's results and its answer.",
    "observe": "Learn a running server's traffic.",
    "watch": "The service: keep a running server's N current.",
    "validate": "Measure the answer and its neighbours live: the regret.",
    "runs": "List runs, newest first.",
    "show": "Print a run's measured table.",
}

MORE = "Checks and stored runs"
SETUP = "Setup and development"

app = Commands(
    help=HELP,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        out.print(f"tuner {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            envvar="TUNER_DB",
            help="SQLAlchemy database URL (default: SQLite in the user data dir)",
            show_envvar=True,
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    State.db = db


# The user's path, in the order of use (Typer lists commands as they are registered).
for command in (
    check.check,
    profile.profile,
    tuning.tune,
    recommend.recommend,
    report.report,
    service.observe,
    service.watch,
):
    app.command(short_help=SHORT[command.__name__])(command)
for command in (validation.validate, runs.runs, runs.show):
    app.command(short_help=SHORT[command.__name__], rich_help_panel=MORE)(command)

app.add_typer(bench.bench_app, name="bench", rich_help_panel=SETUP)
app.add_typer(dev.dev_app, name="dev", rich_help_panel=SETUP)
