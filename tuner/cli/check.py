"""`tuner check --url URL`: one screen of what a running llama-server can do for the tuner, and
the exact llama-server flag or key that fixes each gap (tuner.measure.doctor.check).

One line a finding (`ok`, `info`, `warn`, `skip`, `fail`), never wrapped, so a log or a pipe
keeps each whole; exit status 0 only when `tune --url` can run against the server, 1 otherwise.
Nothing on the server is left changed: the live switch check sets the threshold it found back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from tuner.cli.options import (
    ApiKeyOption,
    err,
    open_store,
    out,
    reports_errors,
    settings,
    this_host,
)
from tuner.errors import ConfigError, InterruptedRun

if TYPE_CHECKING:
    from tuner.measure.doctor import CheckReport
    from tuner.measure.plan import ProgressEvent

STYLE = {"ok": "green", "info": "cyan", "warn": "yellow", "skip": "dim", "fail": "bold red"}


@reports_errors
def check(
    url: Annotated[str, typer.Option(help="the running llama-server, e.g. http://127.0.0.1:8080")],
    api_key: ApiKeyOption = None,
) -> None:
    """What this llama-server can do for the tuner, and the llama-server flag that fixes each
    gap: the patch's --spec-draft-max-slots, --props and the live switch (tried, then set back),
    --metrics, --slots, the API key, -np, the draft model, the build; and its acceptance since
    it started against the floor its model's fit sets (where drafting cannot pay at any
    number of drafting slots: one line naming the build and the answer, plain). Exit status 0
    only when `tuner tune --url` can run against it."""
    from tuner.decide.alarm import check_server

    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url {url!r}: must be an http:// or https:// URL")
    try:
        report = check_server(
            url, open_store, this_host(), api_key, _progress, settings().state_dir
        )
    except KeyboardInterrupt:
        raise InterruptedRun("tuner check interrupted") from None
    render(report)
    raise typer.Exit(0 if report.can_tune else 1)


def _progress(event: ProgressEvent) -> None:
    if event.text:
        err.print(f"[dim]{escape(event.text)}[/]", highlight=False, soft_wrap=True)


def render(report: CheckReport) -> None:
    """The report, a line a finding, and the verdict."""
    out.print(f"tuner check {escape(report.url)}", highlight=False, soft_wrap=True)
    width = max(len(f.name) for f in report.findings)
    for f in report.findings:
        fix = f"  [bold]fix:[/] {escape(f.fix)}" if f.fix and f.status != "ok" else ""
        status = f"[{STYLE[f.status]}]{f.status:<4}[/]"
        out.print(
            f"{status}  {escape(f.name):<{width}}  {escape(f.seen)}{fix}",
            highlight=False,
            soft_wrap=True,
        )
    if report.can_tune:
        out.print("[green]tune --url can run against this server[/]", highlight=False)
        return
    failed = ", ".join(f.name for f in report.failures)
    out.print(
        f"[bold red]tune --url cannot run here yet[/]: fix {escape(failed)}",
        highlight=False,
        soft_wrap=True,
    )
