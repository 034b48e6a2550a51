"""The `tuner` command line: each command parses, calls one library function, renders the result.

Errors from the library (tuner.errors) become one red line on stderr and an exit code here, and
nowhere else.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from tuner import __version__
from tuner.errors import TunerError
from tuner.settings import Settings, get_settings

app = typer.Typer(
    help="Find the best --spec-draft-max-slots for llama-server by measuring it.\n\n"
    "Typical use: `tuner profile SPEC.toml`, then `tuner recommend --model NAME`.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="The bundled bench: patched llama-server and small test models.")
app.add_typer(bench_app, name="bench")

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])


class State:
    """Options shared by every command (set by the app callback)."""

    db: str | None = None

    @classmethod
    def settings(cls) -> Settings:
        settings = get_settings()
        if cls.db:
            settings.db = cls.db
        return settings


def reports_errors(func: F) -> F:
    """Turn a TunerError into one message on stderr and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TunerError as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


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


# --- bench ----------------------------------------------------------------------------------


@bench_app.command("setup")
@reports_errors
def bench_setup(
    jobs: Annotated[
        int | None, typer.Option("--jobs", "-j", help="build jobs (default: all cores)")
    ] = None,
) -> None:
    """Build the patched llama-server and the bench models (cached; a second run does nothing)."""
    from tuner.bench import setup_bench

    settings = State.settings()
    bench = setup_bench(
        settings.cache_dir,
        settings.bench_manifest_path,
        progress=lambda msg: err.print(f"[cyan]bench:[/] {msg}"),
        jobs=jobs,
    )
    for name, path in bench.as_refs().items():
        out.print(f"{name:20} {path}", highlight=False)
    err.print(f"bench manifest: {settings.bench_manifest_path}", highlight=False)


@bench_app.command("show")
@reports_errors
def bench_show() -> None:
    """Print where the bench's binaries and models are."""
    from tuner.bench import load_bench

    bench = load_bench(State.settings().bench_manifest_path)
    for name, path in bench.as_refs().items():
        out.print(f"{name:20} {path}", highlight=False)


# --- shared helpers -------------------------------------------------------------------------


def open_store():
    """The database named by --db / TUNER_DB / the default, migrated to the newest schema."""
    from tuner.store import Store

    return Store(State.settings().db)


def _bench_refs() -> dict[str, Path]:
    from tuner.bench import load_bench

    return load_bench(State.settings().bench_manifest_path).as_refs()


def load_spec_file(path: Path, overrides: list[str] | None = None, check_files: bool = True):
    from tuner.spec import load_spec, parse_override

    return load_spec(
        path, [parse_override(o) for o in overrides or []], _bench_refs, check_files=check_files
    )


def _levels_option(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter("expected comma-separated integers, e.g. 1,2,4,8") from None


class ProgressDisplay:
    """Renders profiler events as a rich progress bar with configuration, level, repeat and ETA."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=err,
        )
        self.task = self.progress.add_task("starting", total=None)

    def __enter__(self) -> ProgressDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def __call__(self, event) -> None:
        if event.kind == "plan":
            self.progress.update(self.task, total=event.total)
        elif event.kind in ("server", "kernel", "message"):
            self.progress.console.print(f"[cyan]{event.text}[/]", highlight=False)
            self.progress.update(self.task, description=event.text[:40])
        elif event.kind == "repeat":
            f = event.figures
            tps = f"{f.tokens_per_second:.1f} tok/s" if f and f.tokens_per_second else "-"
            step = f"{f.step_ms:.1f} ms/step" if f and f.step_ms else ""
            self.progress.update(
                self.task,
                advance=event.advance,
                description=f"{event.config} c={event.concurrency} repeat {event.repeat + 1}",
            )
            self.progress.console.print(
                f"  {event.config:>12} c={event.concurrency:<3} repeat {event.repeat + 1}: "
                f"{tps} {step}",
                highlight=False,
            )
        elif event.kind == "level":
            self.progress.update(self.task, advance=event.advance)


def render_points(title: str, points) -> None:
    """The measured table: concurrency down, configuration across (tok/s, spread, ms/step)."""
    from rich.table import Table

    configs = list(dict.fromkeys(p.config for p in points))
    table = Table(title=title)
    table.add_column("streams", justify="right")
    for config in configs:
        table.add_column(f"{config}\ntok/s (±%)", justify="right")
        table.add_column(f"{config}\nms/step", justify="right")
    for c in sorted({p.concurrency for p in points}):
        row = [str(c)]
        for config in configs:
            p = next((p for p in points if p.config == config and p.concurrency == c), None)
            if p is None or p.tokens_per_second is None:
                status = p.status if p is not None else ""
                row += [status, ""]
                continue
            spread = (
                f" ±{100 * p.tokens_per_second_spread:.0f}" if p.tokens_per_second_spread else ""
            )
            row.append(f"{p.tokens_per_second:.1f}{spread}")
            row.append(f"{p.step_ms:.1f}" if p.step_ms else "")
        table.add_row(*row)
    out.print(table)


# --- profile, runs, show ----------------------------------------------------------------------


@app.command()
@reports_errors
def profile(
    spec_path: Annotated[
        Path | None, typer.Argument(metavar="SPEC", help="profile spec (TOML)")
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="continue the last unfinished run of this spec instead of starting over",
        ),
    ] = False,
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="override a spec value, e.g. --set workload.max_repeats=2",
        ),
    ] = None,
    levels: Annotated[str | None, typer.Option(help="concurrency levels, e.g. 1,2,4,8")] = None,
    url: Annotated[
        str | None,
        typer.Option(help="attach mode: measure this running server as it is configured"),
    ] = None,
    label: Annotated[str | None, typer.Option(help="attach mode: name of what is measured")] = None,
    model_name: Annotated[
        str | None, typer.Option(help="store results under this model name")
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="TUNER_API_KEY",
            show_envvar=True,
            help="attach mode: bearer token (never stored)",
        ),
    ] = None,
) -> None:
    """Measure plain and speculative decode at each concurrency level, and store every sample."""
    from tuner import profiler

    settings = State.settings()
    extra = list(overrides or [])
    if (parsed := _levels_option(levels)) is not None:
        extra.append(f"workload.concurrency={parsed}")
    if model_name:
        extra.append(f'model_name="{model_name}"')
    if url is not None:
        from tuner.errors import ConfigError

        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--url {url!r}: must be an http:// or https:// URL")
        if not label:
            raise ConfigError("--url needs --label: a name for the server being measured")
        spec = load_spec_file(spec_path, extra, check_files=False) if spec_path else None
        store = open_store()
        with ProgressDisplay() as display:
            run_id = profiler.attach(
                store,
                url,
                label,
                model_name,
                spec,
                settings.log_dir,
                display,
                api_key=api_key,
                host_name=settings.host_name,
            )
    else:
        if spec_path is None:
            raise typer.BadParameter("give a SPEC file (or --url for attach mode)")
        spec = load_spec_file(spec_path, extra)
        store = open_store()
        with ProgressDisplay() as display:
            run_id = profiler.profile(
                store, spec, settings.log_dir, display, resume=resume, host_name=settings.host_name
            )
    _show(store, run_id)


def _show(store, run_id: int) -> None:
    from tuner.results import run_points

    summary, points = run_points(store, run_id)
    render_points(f"run {run_id}: {summary.model} ({summary.kind}, {summary.status})", points)


@app.command()
@reports_errors
def runs(
    model: Annotated[str | None, typer.Option(help="only runs of this model")] = None,
    limit: Annotated[int, typer.Option(help="how many, newest first")] = 50,
) -> None:
    """List runs, newest first."""
    from rich.table import Table

    from tuner.results import list_runs

    table = Table()
    for column in (
        "run",
        "kind",
        "status",
        "model",
        "host",
        "spec / label",
        "levels",
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
            f"{r.levels_done}/{r.levels_total}",
            str(r.samples),
            r.started_at.strftime("%Y-%m-%d %H:%M"),
        )
    out.print(table)


@app.command()
@reports_errors
def show(
    run_id: Annotated[int, typer.Argument(metavar="RUN", help="run id (see `tuner runs`)")],
) -> None:
    """Print a run's measured table (concurrency x configuration)."""
    _show(open_store(), run_id)
