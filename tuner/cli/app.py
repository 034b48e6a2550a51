"""The `tuner` command line: each command parses, calls one library function, renders the result.

Errors from the library (tuner.errors) become one red line on stderr and an exit code here, and
nowhere else.
"""

from __future__ import annotations

import contextlib
import functools
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

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
            err.print(
                f"[bold red]error:[/] {escape(str(exc))}",
                highlight=False,
                markup=True,
                soft_wrap=True,
            )
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
    from tuner.storage.engine import Store

    return Store(State.settings().db)


def _bench_refs() -> dict[str, Path]:
    from tuner.bench import load_bench

    return load_bench(State.settings().bench_manifest_path).as_refs()


def load_spec_file(path: Path, overrides: list[str] | None = None, check_files: bool = True):
    from tuner.measure.spec import load_spec, parse_override

    return load_spec(
        path, [parse_override(o) for o in overrides or []], _bench_refs, check_files=check_files
    )


def _parsed_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    from tuner.measure.spec import parse_override

    return [parse_override(o) for o in overrides]


def _levels_option(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: expected comma-separated integers, e.g. 1,2,4,8", param_hint="--levels"
        ) from None


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


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a fleet's scheduler, `kill`) stops a run like Ctrl-C does: the run is marked
    interrupted, its llama-server stopped, and completed repeats are kept for --resume."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
    skip_preflight: Annotated[
        bool,
        typer.Option(
            "--skip-preflight",
            help="do not first launch each configuration for one short request (the preflight "
            "makes a server that crashes on this machine fail in seconds, not minutes in)",
        ),
    ] = False,
) -> None:
    """Measure plain and speculative decode at each concurrency level, and store every sample.

    Each configuration is first launched once to answer one short request (drafting on), so a
    build that cannot run here fails within about a minute with the reason; then every level is
    measured and stored as it finishes (Ctrl-C keeps finished repeats; --resume continues)."""
    from tuner.measure import profiler

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
        with terminate_as_interrupt(), ProgressDisplay() as display:
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
                overrides=None if spec_path else _parsed_overrides(extra),
            )
    else:
        if spec_path is None:
            raise typer.BadParameter(
                "give a SPEC file (or --url for attach mode)", param_hint="SPEC"
            )
        spec = load_spec_file(spec_path, extra)
        store = open_store()
        with terminate_as_interrupt(), ProgressDisplay() as display:
            run_id = profiler.profile(
                store,
                spec,
                settings.log_dir,
                display,
                resume=resume,
                host_name=settings.host_name,
                skip_preflight=skip_preflight,
            )
    _show(store, run_id)


def _show(store, run_id: int) -> None:
    from tuner.storage.queries import run_points

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

    from tuner.storage.queries import list_runs

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


# --- fleet: hosts ---------------------------------------------------------------------------


@app.command()
@reports_errors
def hosts(
    model: Annotated[str | None, typer.Option(help="only hosts that measured this model")] = None,
) -> None:
    """List the hosts (boxes of a fleet) the database has results from, with their models."""
    import socket

    from rich.table import Table

    from tuner.storage.queries import list_hosts

    settings = State.settings()
    here = settings.host_name or socket.gethostname()
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


# --- import, fit, predict, recommend ----------------------------------------------------------


def _model_host(host: str | None) -> tuple[str, bool]:
    """The host to read results of (default: this machine) and whether the user named it."""
    from tuner.decide.recommend import this_host

    return (host, True) if host else (this_host(State.settings().host_name), False)


def _note(text: str | None) -> None:
    if text:
        err.print(f"[yellow]note:[/] {text}", highlight=False, soft_wrap=True)


@app.command("import")
@reports_errors
def import_cmd(
    path: Annotated[Path, typer.Argument(metavar="FILE", help="table to import (TOML)")],
) -> None:
    """Store a table measured elsewhere (tok/s per concurrency) as a run with source "imported".

    The format is documented in profiles/reference/README.md.
    """
    from tuner.storage.importer import import_table

    store = open_store()
    result = import_table(store, path)
    verb = "imported" if result.created else "already imported"
    err.print(
        f"{verb} {path} as run {result.run_id}: model {result.model}"
        + (f", host {result.host}" if result.host else "")
        + f", {result.levels} levels",
        highlight=False,
    )
    _show(store, result.run_id)


def _fit_table(summary: dict[str, Any]) -> None:
    from rich.table import Table

    quality, inputs, cross = summary["quality"], summary["inputs"], summary["crossover"]
    forms = quality["forms"]

    def loo(key: str) -> str:
        value = forms[key]["loo_rmse_pct"].get(forms[key]["chosen"])
        return f"leave-one-out {value:.1f}%" if value is not None else "no point to hold out"

    acc = quality["acceptance"]
    if acc["source"] == "folded":
        acceptance = "unknown (tok/s only): folded into the spec curve, n_max fixed"
    else:
        acceptance = (
            f"{acc['source']}: {acc['mean_length']:.2f} tokens per stream per step at n_max "
            f"{acc['n_max']}"
        )
    reused = " (reused: same data)" if summary["reused"] else ""
    out.print(
        f"fit {summary['fit_id']}{reused} of {inputs['model']} ({summary['version']}): host "
        f"{inputs.get('host') or '(none)'}, runs {', '.join(map(str, inputs['runs']))} "
        f"({', '.join(inputs['sources'])}), -np {inputs['n_parallel']}, n_max {inputs['n_max']}, "
        f"{inputs['kernel_rows']} kernel rows",
        highlight=False,
    )
    out.print(
        f"step cost: plain={forms['plain']['chosen']} ({loo('plain')}), "
        f"spec={forms['spec']['chosen']} ({loo('spec')}); acceptance {acceptance}",
        highlight=False,
    )
    unc = quality["uncertainty"]
    table = Table(
        title=f"fit quality ({100 * unc['interval']:.0f}% intervals, bootstrap over "
        f"{unc['method']}, {unc['replicates']} replicates)"
    )
    columns = ("config", "streams", "measured tok/s", "predicted", "interval", "residual")
    for column in (*columns, "step ms meas.", "step ms pred."):
        table.add_column(column, justify="right")
    for p in quality["points"]:
        table.add_row(
            p["config"],
            str(p["concurrency"]),
            f"{p['measured_tps']:.1f}",
            f"{p['predicted_tps']:.1f}",
            f"{p['lower']:.1f}-{p['upper']:.1f}",
            f"{p['residual_pct']:+.1f}%",
            f"{p['measured_step_ms']:.1f}",
            f"{p['predicted_step_ms']:.1f}",
        )
    for p in quality["threshold_check"]:
        table.add_row(
            f"max-slots-{p['max_slots']} (held out)",
            str(p["concurrency"]),
            f"{p['measured_tps']:.1f}",
            f"{p['predicted_tps']:.1f}",
            f"{p['lower']:.1f}-{p['upper']:.1f}",
            f"{p['error_pct']:+.1f}%",
            "",
            "",
        )
    out.print(table)
    worst = quality["worst_point"]
    out.print(
        f"worst residual: {quality['worst_residual_pct']:+.1f}% ({worst['config']} at "
        f"{worst['concurrency']} streams); rms {quality['rms_residual_pct']:.1f}%",
        highlight=False,
    )
    if quality.get("worst_threshold_error_pct") is not None:
        worst_threshold = quality["worst_threshold_error_pct"]
        out.print(
            f"threshold rows (not fitted): worst error {worst_threshold:+.1f}%", highlight=False
        )
    where = (
        f"{cross['streams']:.1f} streams [{cross['lower']:.1f}, {cross['upper']:.1f}]"
        if cross["streams"] is not None
        else "none inside 1..n_parallel"
    )
    lo, hi = cross["spec_wins_upto_interval"]
    out.print(
        f"crossover: {where}; spec ahead at 1..{cross['spec_wins_upto']} streams "
        f"(interval {lo}..{hi})",
        highlight=False,
    )


@app.command()
@reports_errors
def fit(
    model: Annotated[str, typer.Option("--model", help="model name (see `tuner runs`)")],
    host: Annotated[
        str | None, typer.Option(help="host whose results to fit (default: this machine)")
    ] = None,
    output: Annotated[str, typer.Option("--format", help="table or json")] = "table",
    seed: Annotated[int, typer.Option(help="bootstrap seed")] = 0,
) -> None:
    """Fit the cost model (step time + acceptance) to a model's results and store it."""
    from tuner.decide.recommend import fit_model, fit_summary
    from tuner.errors import ConfigError

    if output not in ("table", "json"):
        raise ConfigError(f"--format {output!r}: expected table or json")
    name, explicit = _model_host(host)
    stored = fit_model(open_store(), model, name, host_explicit=explicit, seed=seed)
    _note(stored.host_note)
    summary = fit_summary(stored)
    if output == "json":
        import json

        typer.echo(json.dumps(summary, default=str))
    else:
        _fit_table(summary)


@app.command()
@reports_errors
def predict(
    model: Annotated[str, typer.Option("--model", help="model name (see `tuner runs`)")],
    max_slots: Annotated[
        int, typer.Option("--max-slots", help="--spec-draft-max-slots N (0: always draft)")
    ],
    n_max: Annotated[
        int | None, typer.Option("--n-max", help="draft length (default: the profiled one)")
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="host whose results to use (default: this machine)")
    ] = None,
    fit_id: Annotated[int | None, typer.Option("--fit", help="use this stored fit")] = None,
    output: Annotated[str, typer.Option("--format", help="table or json")] = "table",
) -> None:
    """Print predicted aggregate tok/s per concurrency under --spec-draft-max-slots N."""
    from rich.table import Table

    from tuner.decide.recommend import predict as predict_policy
    from tuner.errors import ConfigError

    if output not in ("table", "json"):
        raise ConfigError(f"--format {output!r}: expected table or json")
    name, explicit = _model_host(host)
    report = predict_policy(
        open_store(),
        model,
        max_slots,
        n_max=n_max,
        host=name,
        host_explicit=explicit,
        fit_id=fit_id,
    )
    _note(report.fit.host_note)
    if output == "json":
        import json

        typer.echo(json.dumps(report.to_dict()))
        return
    pct = f"{100 * report.prediction.interval:.0f}%"
    measured = report.fit.measured
    table = Table(
        title=f"{model}: --spec-draft-max-slots {max_slots}, n_max {report.n_max} "
        f"(fit {report.fit.id}, {pct} intervals)"
    )
    for column in ("streams", "tok/s", "interval", "plain", "spec", "measured"):
        table.add_column(column, justify="right")
    pred, plain, spec = report.prediction, report.plain, report.spec
    for i, c in enumerate(pred.concurrency):
        seen = [k for k, levels in measured.items() if c in levels]
        table.add_row(
            str(c),
            f"{pred.tokens_per_second[i]:.1f}",
            f"{pred.lower[i]:.1f}-{pred.upper[i]:.1f}",
            f"{plain.tokens_per_second[i]:.1f}",
            f"{spec.tokens_per_second[i]:.1f}",
            ", ".join(seen),
        )
    out.print(table)


def _recommend_table(report) -> Any:
    from rich.table import Table

    table = Table(
        title=f"{report.model}: predicted tok/s, chosen = --spec-draft-max-slots "
        f"{report.max_slots}" + (f", n_max {report.n_max}" if report.tune_n_max else "")
    )
    for column in ("streams", "measured", "plain", "spec", "chosen", "vs plain", "vs spec"):
        table.add_column(column, justify="right")
    for row in report.table:
        table.add_row(
            str(row.concurrency),
            "yes" if row.measured else "",
            f"{row.plain:.1f}",
            f"{row.spec:.1f}",
            f"{row.chosen:.1f}",
            f"{100 * row.gain_vs_plain:+.1f}%",
            f"{100 * row.gain_vs_spec:+.1f}%",
        )
    return table


@app.command()
@reports_errors
def recommend(
    model: Annotated[str, typer.Option("--model", help="model name (see `tuner runs`)")],
    host: Annotated[
        str | None, typer.Option(help="host whose results to use (default: this machine)")
    ] = None,
    output: Annotated[
        str, typer.Option("--format", help="env | shell | json | systemd | args")
    ] = "env",
    explain: Annotated[
        bool, typer.Option("--explain", help="print the table and reasons on stdout too")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="nothing on stderr")] = False,
    tune_n_max: Annotated[
        bool, typer.Option("--tune-n-max", help="also search --spec-draft-n-max (1..profiled)")
    ] = False,
    min_single_stream: Annotated[
        float | None,
        typer.Option("--min-single-stream", help="floor on single-stream tok/s"),
    ] = None,
    fit_id: Annotated[int | None, typer.Option("--fit", help="use this stored fit")] = None,
    seed: Annotated[int, typer.Option(help="seed of the fit's bootstrap and the study")] = 0,
) -> None:
    """Recommend --spec-draft-max-slots N: one line on stdout, e.g. for `>> server.env`.

    `eval "export $(tuner recommend --model M)"` sets it in a shell. The table and the reasons go
    to stderr (with --explain, to stdout after the line).
    """
    from tuner.decide.recommend import FORMATS, explain_lines, render
    from tuner.decide.recommend import recommend as make_recommendation
    from tuner.errors import ConfigError

    if output not in FORMATS:
        raise ConfigError(f"--format {output!r}: expected one of {', '.join(FORMATS)}")
    name, explicit = _model_host(host)
    report = make_recommendation(
        open_store(),
        model,
        host=name,
        host_explicit=explicit,
        tune_n_max=tune_n_max,
        min_single_stream=min_single_stream,
        seed=seed,
        fit_id=fit_id,
    )
    typer.echo(render(report, output))
    if explain:
        out.print(_recommend_table(report))
        for line in explain_lines(report):
            out.print(line, highlight=False, markup=False)
    elif not quiet:
        err.print(_recommend_table(report))
        for line in explain_lines(report):
            err.print(line, highlight=False, markup=False)


# --- validate -------------------------------------------------------------------------------


def render_validation(report) -> None:
    """Measured (and predicted) tok/s per candidate N and level; best N, regret, model error."""
    from rich.table import Table

    names = sorted(report.measured, key=lambda n: (n != "plain", int(n[2:]) if n != "plain" else 0))
    table = Table(title=f"validation run {report.run_id}: {report.model}, "
                        f"recommended N={report.recommended}")
    table.add_column("streams", justify="right")
    table.add_column("weight", justify="right")
    for name in names:
        mark = " *" if name == f"N={report.recommended}" else ""
        table.add_column(f"{name}{mark}\nmeasured (model)", justify="right")
    for c in report.levels:
        row = [str(c), f"{report.weights[c]:.2f}"]
        for name in names:
            tps = report.measured[name].get(c)
            pred = report.predicted.get(name, {}).get(c)
            row.append("" if tps is None else f"{tps:.1f} ({pred:.1f})")
        table.add_row(*row)
    table.add_row("weighted", "", *(f"{report.weighted[n]:.1f}" if n in report.weighted else ""
                                    for n in names), style="bold")
    out.print(table)
    out.print(f"best measured: {report.best}; regret of N={report.recommended}: "
              f"{report.regret_text()}", highlight=False)
    if report.mean_abs_error_pct is not None:
        out.print(f"model error on these points: mean {report.mean_abs_error_pct:.1f} %, "
                  f"worst {report.worst_abs_error_pct:.1f} %", highlight=False)
    if report.standing is not None:
        out.print(report.standing_text(), highlight=False, markup=False)


@app.command()
@reports_errors
def validate(
    model: Annotated[str, typer.Option(help="model name the recommendation is for")],
    resume: Annotated[bool, typer.Option("--resume", help="continue the last unfinished "
                                         "validation of this model")] = False,
    max_slots: Annotated[int | None, typer.Option(
        "--max-slots", min=0, help="validate this N instead of the stored recommendation")] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", metavar="KEY=VALUE",
                         help="override a value of the profile's spec, e.g. "
                         "--set workload.max_repeats=2")] = None,
    output: Annotated[str, typer.Option("--format", help="table or json")] = "table",
    skip_preflight: Annotated[bool, typer.Option(
        "--skip-preflight", help="do not first launch each configuration for one short request"
    )] = False,
) -> None:
    """Measure the recommended N, N-1, N+1, 0 (always draft) and plain live; report regret.

    Needs a llama-server that knows --spec-draft-max-slots; reuses the server set-up of the
    model's newest profile. The new points are stored and feed the next `tuner fit`.
    """
    import json

    from tuner.decide import validate as validation

    settings = State.settings()
    with terminate_as_interrupt(), ProgressDisplay() as display:
        report = validation.validate(open_store(), model, settings.log_dir, display,
                                     resume=resume, host_name=settings.host_name,
                                     max_slots=max_slots,
                                     overrides=_parsed_overrides(overrides or []),
                                     skip_preflight=skip_preflight)
    if output == "json":
        typer.echo(json.dumps(report.as_dict(), default=str))
    else:
        render_validation(report)


# --- report ---------------------------------------------------------------------------------


@app.command()
@reports_errors
def report(
    model: Annotated[str, typer.Option("--model", help="model name (see `tuner runs`)")],
    host: Annotated[
        str | None, typer.Option(help="host whose results to use (default: this machine)")
    ] = None,
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out",
            help="folder for report.png, report.svg and summary.md (created; nothing is "
            "written outside it)",
        ),
    ] = Path("tuner-report"),
) -> None:
    """Plot tok/s against concurrency (measured, model, recommended policy, crossover) and
    write a Markdown summary (host, build, model, data, fit quality, recommendation, validation).

    Uses the stored recommendation of the current fit; without one it makes (and stores) one.
    """
    from tuner.report.report import write_report

    name, explicit = _model_host(host)
    files = write_report(open_store(), model, out_dir, name, host_explicit=explicit)
    _note(files.host_note)
    for path in files.paths:
        typer.echo(str(path))
