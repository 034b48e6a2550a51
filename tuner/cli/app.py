"""The `tuner` commands: each parses its options, calls one library function, renders the result.

Shared options, settings and error handling are in options.py, rendering in render.py and the
progress display in progress.py. Errors from the library (tuner.errors) become one red line on
stderr and an exit code here, and nowhere else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tuner import __version__
from tuner.cli import render
from tuner.cli.check import check as check_command
from tuner.cli.options import (
    ApiKeyOption,
    ApplyWay,
    ContextOption,
    FitOption,
    HostOption,
    ModelOption,
    ObjectiveOption,
    OverridesOption,
    SeedOption,
    SkipPreflightOption,
    SloOption,
    State,
    Switch,
    SwitchOption,
    TableFormat,
    TableFormatOption,
    TrafficOption,
    duration_option,
    err,
    levels_option,
    load_spec_file,
    model_host,
    note,
    open_store,
    out,
    parsed_overrides,
    reports_errors,
    settings,
    terminate_as_interrupt,
    this_host,
)
from tuner.cli.progress import LogLines, ProgressDisplay
from tuner.cli.twin import twin_app
from tuner.errors import ConfigError
from tuner.recommendation import ObjectiveKind, OutputFormat

app = typer.Typer(
    help="Find the best --spec-draft-max-slots for llama-server by measuring it.\n\n"
    "Typical use: `tuner profile SPEC.toml`, then `tuner recommend --model NAME`.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="The bundled bench: patched llama-server and small test models.")
app.add_typer(bench_app, name="bench")
app.add_typer(twin_app, name="twin")
app.command("check")(check_command)


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
    variant: Annotated[
        str | None,
        typer.Option(
            help="build variant: portable (AVX2, no AVX-512/AMX) or baseline (SSE4.2); "
            "default: the safest this CPU runs, falling back on an illegal instruction"
        ),
    ] = None,
) -> None:
    """Build the patched llama-server and the bench models, prove them on this machine, and
    write the bench manifest (cached; a second run only proves again on another CPU)."""
    from tuner.bench import setup_bench

    current = settings()
    bench = setup_bench(
        current.cache_dir,
        current.bench_manifest_path,
        progress=lambda msg: err.print(f"[cyan]bench:[/] {msg}", highlight=False),
        jobs=jobs,
        variant=variant,
    )
    for name, path in bench.as_refs().items():
        out.print(f"{name:20} {path}", highlight=False)
    err.print(f"bench manifest: {current.bench_manifest_path}", highlight=False)


@bench_app.command("show")
@reports_errors
def bench_show() -> None:
    """Print where the bench's binaries and models are."""
    from tuner.bench import load_bench

    bench = load_bench(settings().bench_manifest_path)
    for name, path in bench.as_refs().items():
        out.print(f"{name:20} {path}", highlight=False)


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
    overrides: OverridesOption = None,
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
    skip_preflight: SkipPreflightOption = False,
    budget: Annotated[
        str,
        typer.Option(
            help="time for levels the profile adds by itself where the decision is still open "
            "(e.g. 10m, 600s, 1h; 0 turns it off)"
        ),
    ] = "10m",
    switch: SwitchOption = Switch.AUTO,
) -> None:
    """Measure plain and speculative decode at each concurrency level, and store every sample.

    Each configuration is first launched once to answer one short request (drafting on), so a
    build that cannot run here fails within about a minute with the reason; then every level is
    measured and stored as it finishes (Ctrl-C keeps finished repeats; --resume continues).
    The configurations are interleaved (A B, then B A, ...; the one that ends a pass starts the
    next on the same launch) so a drift of the machine hits them alike. Then, within --budget,
    it measures the levels where the crossover is still undecided (the ones `recommend` would
    name under "measure next")."""
    from tuner.decide.adaptive import profile_adaptively
    from tuner.measure.attach import attach

    current = settings()
    extra = list(overrides or [])
    if (parsed := levels_option(levels)) is not None:
        extra.append(f"workload.concurrency={parsed}")
    if model_name:
        extra.append(f'model_name="{model_name}"')
    if url is not None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--url {url!r}: must be an http:// or https:// URL")
        if not label:
            raise ConfigError("--url needs --label: a name for the server being measured")
        spec = load_spec_file(spec_path, extra, check_files=False) if spec_path else None
        store = open_store()
        with terminate_as_interrupt(), ProgressDisplay() as display:
            run_id = attach(
                store,
                url,
                label,
                model_name,
                spec,
                current.log_dir,
                display,
                api_key=api_key,
                host_name=this_host(),
                overrides=None if spec_path else parsed_overrides(extra),
            )
    else:
        if spec_path is None:
            raise typer.BadParameter(
                "give a SPEC file (or --url for attach mode)", param_hint="SPEC"
            )
        spec = load_spec_file(spec_path, extra)
        store = open_store()
        budget_s = duration_option(budget, "--budget")
        with terminate_as_interrupt(), ProgressDisplay() as display:
            adaptive = profile_adaptively(
                store,
                spec,
                current.log_dir,
                display,
                resume=resume,
                host_name=this_host(),
                skip_preflight=skip_preflight,
                budget_s=budget_s,
                switch=switch.value,
            )
        run_id = adaptive.run_id
        err.print(adaptive.summary(), highlight=False)
    _show(store, run_id)


def _show(store, run_id: int) -> None:
    from tuner.storage.queries import run_points

    summary, points = run_points(store, run_id)
    render.points(f"run {run_id}: {summary.model} ({summary.kind}, {summary.status})", points)


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


@app.command()
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


# --- import, fit, predict, recommend ----------------------------------------------------------


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


@app.command()
@reports_errors
def fit(
    model: ModelOption,
    host: HostOption = None,
    output: TableFormatOption = TableFormat.TABLE,
    seed: SeedOption = 0,
    context: ContextOption = None,
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
        typer.echo(json.dumps(data, default=str))
    else:
        render.fit(stored, by_depth, by_set)


@app.command()
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
    fit_id: FitOption = None,
    output: TableFormatOption = TableFormat.TABLE,
    context: ContextOption = None,
) -> None:
    """Print predicted aggregate tok/s per concurrency under --spec-draft-max-slots N."""
    from tuner.decide.advice import predict as predict_policy

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
        typer.echo(json.dumps(report.to_dict()))
    else:
        render.predict(model, report)


@app.command()
@reports_errors
def recommend(
    model: ModelOption,
    host: HostOption = None,
    output: Annotated[
        OutputFormat, typer.Option("--format", help="how to print the answer")
    ] = OutputFormat.ENV,
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
    fit_id: FitOption = None,
    seed: SeedOption = 0,
    context: Annotated[
        str | None,
        typer.Option(
            "--context",
            help="context depth in tokens per stream (4096), or a mix of depths and shares "
            "(0:0.5,8192:0.5); a depth not measured is interpolated between measured ones "
            "(printed, not stored); default the shallowest measured",
        ),
    ] = None,
    traffic: TrafficOption = None,
    objective: ObjectiveOption = ObjectiveKind.TPS,
    slo_tpot_ms: SloOption = None,
    rate: Annotated[
        float | None,
        typer.Option(help="tpot: arrival rate (requests/s) instead of the traffic's"),
    ] = None,
    output_tokens: Annotated[
        float | None,
        typer.Option(
            help="tpot, capacity: mean output tokens per request instead of the traffic's"
        ),
    ] = None,
) -> None:
    """Recommend --spec-draft-max-slots N: one line on stdout, e.g. for `>> server.env`.

    `eval "export $(tuner recommend --model M)"` sets it in a shell. The table and the reasons go
    to stderr (with --explain, to stdout after the line).

    Objectives: tps (served tok/s, weighted by the workload or --traffic), tpot (mean time per
    output token under random arrivals at the traffic's rate: each N at the occupancy it causes),
    capacity (the highest arrival rate whose p95 time per output token stays under --slo-tpot-ms).
    """
    from tuner.decide.advice import parse_context
    from tuner.decide.advice import recommend as make_recommendation

    name, explicit = model_host(host)
    rec = make_recommendation(
        open_store(),
        model,
        name,
        host_explicit=explicit,
        tune_n_max=tune_n_max,
        min_single_stream=min_single_stream,
        seed=seed,
        fit_id=fit_id,
        context=parse_context(context) if context is not None else None,
        traffic=traffic,
        objective=objective,
        slo_tpot_ms=slo_tpot_ms,
        rate=rate,
        output_tokens=output_tokens,
    )
    typer.echo(rec.render(output))
    if explain:
        render.recommendation(rec, out)
    elif not quiet:
        render.recommendation(rec, err)


# --- validate, report ---------------------------------------------------------------------------


@app.command()
@reports_errors
def observe(
    url: Annotated[str, typer.Option(help="the running llama-server, e.g. http://127.0.0.1:8080")],
    duration: Annotated[
        str, typer.Option(help="how long to observe: 600, 600s, 10m or 1h")
    ] = "10m",
    name: Annotated[
        str | None,
        typer.Option(help="traffic profile name (default host:port/model); again adds to it"),
    ] = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Learn a running server's traffic: how many slots generate, over time, and request lengths.

    Polls /slots (or /metrics where /slots is off) four times a second over one connection; never
    changes the server; keeps what it has when the server goes away and goes on when it is back.
    The profile is saved every 10 s; `tuner recommend --traffic NAME` weights the objective by it.
    """
    from tuner.measure.observe import observe as run_observe
    from tuner.storage.traffic_profiles import TrafficSaver

    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url {url!r}: must be an http:// or https:// URL")
    seconds = duration_option(duration, "--duration")
    saver = TrafficSaver(open_store(), name)
    with terminate_as_interrupt(), ProgressDisplay() as display:
        view, profile = run_observe(url, seconds, saver, display, api_key=api_key)
    render.traffic(saver.name or "", view, profile)


@app.command()
@reports_errors
def watch(
    model: ModelOption,
    url: Annotated[str, typer.Option(help="the running llama-server, e.g. http://127.0.0.1:8080")],
    env_file: Annotated[
        Path,
        typer.Option(
            help="KEY=VALUE file the server reads (systemd EnvironmentFile): its "
            "LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS line is replaced atomically, other lines kept"
        ),
    ],
    on_change: Annotated[
        str | None,
        typer.Option(
            help="shell command run after the env file changed, e.g. 'systemctl restart "
            "llama-server' (at most once per --every; nothing is restarted without it)"
        ),
    ] = None,
    apply: Annotated[
        ApplyWay,
        typer.Option(
            help="env: write the env file (a restart, e.g. --on-change, applies it); live: also "
            "set N on the running server through POST /props (needs the patched server started "
            "with --props, and --api-key where it has one), read it back, and re-read it every "
            "interval so a restarted server or a flag that overrides the env file is corrected"
        ),
    ] = ApplyWay.ENV,
    every: Annotated[str, typer.Option(help="decide this often: 600, 600s, 10m or 1h")] = "1h",
    window: Annotated[
        str | None,
        typer.Option(help="rolling traffic profile: the last this long (default 3 x --every)"),
    ] = None,
    drift: Annotated[
        float,
        typer.Option(
            help="recommend again when the traffic's busy-time shares moved this far "
            "(total-variation distance, 0..1) from what the standing answer was made for"
        ),
    ] = 0.1,
    min_busy: Annotated[
        str,
        typer.Option(
            help="decide nothing from a window with less busy time (any slot generating) than "
            "this: an idle spell keeps the standing answer"
        ),
    ] = "5s",
    name: Annotated[
        str | None, typer.Option(help="traffic profile name (default watch:host:port/model)")
    ] = None,
    host: HostOption = None,
    objective: ObjectiveOption = ObjectiveKind.TPS,
    slo_tpot_ms: SloOption = None,
    api_key: ApiKeyOption = None,
    duration: Annotated[
        str | None, typer.Option(help="stop after this long (default: until SIGTERM)")
    ] = None,
) -> None:
    """The service: observe a running server continuously and keep its N current.

    Polls /slots (or /metrics) like `tuner observe`, keeps the traffic of the last --window
    (saved every 10 s: a crash loses at most that), and at the end of every --every interval
    runs `tuner recommend --traffic` when the traffic drifted. A new answer is written to the env
    file atomically, set on the running server with --apply live, then --on-change runs once.
    SIGTERM stops it cleanly.
    """
    from tuner.decide.watch import WatchOptions
    from tuner.decide.watch import watch as run_watch

    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url {url!r}: must be an http:// or https:// URL")
    every_s = duration_option(every, "--every")
    name_of_host, explicit = model_host(host)
    options = WatchOptions(
        every_s=every_s,
        window_s=duration_option(window, "--window") if window else 3 * every_s,
        drift=drift,
        on_change=on_change,
        apply=apply.value,
        min_busy_s=duration_option(min_busy, "--min-busy"),
        recommend={
            "objective": objective,
            "slo_tpot_ms": slo_tpot_ms,
            "host_explicit": explicit,
        },
    )
    with terminate_as_interrupt():
        summary = run_watch(
            open_store(),
            model,
            name_of_host,
            url,
            env_file,
            options,
            LogLines(),
            name=name,
            api_key=api_key,
            duration_s=duration_option(duration, "--duration") if duration else None,
        )
    render.watch_summary(summary)


@app.command()
@reports_errors
def validate(
    model: Annotated[str, typer.Option(help="model name the recommendation is for")],
    resume: Annotated[
        bool,
        typer.Option("--resume", help="continue the last unfinished validation of this model"),
    ] = False,
    max_slots: Annotated[
        int | None,
        typer.Option(
            "--max-slots", min=0, help="validate this N instead of the stored recommendation"
        ),
    ] = None,
    overrides: OverridesOption = None,
    output: TableFormatOption = TableFormat.TABLE,
    skip_preflight: SkipPreflightOption = False,
    arrivals: Annotated[
        str | None,
        typer.Option(
            "--arrivals",
            help="poisson: open loop, requests arriving at random at each --rate instead of "
            "closed levels of streams that start together; trace: replay the arrivals and "
            "output lengths a `tuner observe` profile saw (--traffic NAME)",
        ),
    ] = None,
    rate: Annotated[
        str | None, typer.Option(help="open loop: arrival rates, requests per second, e.g. 0.5,1,2")
    ] = None,
    window: Annotated[
        str, typer.Option(help="open loop: arrivals per configuration and rate, e.g. 60s or 2m")
    ] = "60s",
    traffic: Annotated[
        str | None, typer.Option(help="--arrivals trace: the observed traffic profile to replay")
    ] = None,
    seed: SeedOption = 0,
) -> None:
    """Measure the recommended N, N-1, N+1, 0 (always draft) and plain live; report regret, and
    the recommendation that stands once these points are part of the fit.

    With --arrivals poisson --rate R1,R2: the same configurations under open-loop load (seeded
    Poisson arrivals, output lengths from the profile's workload): throughput, TTFT and time per
    output token at p50/p95/p99, mean generating slots, per rate. With --arrivals trace
    --traffic NAME: the arrivals and output lengths `tuner observe` saw, replayed.

    Needs a llama-server that knows --spec-draft-max-slots; reuses the server set-up of the
    model's newest profile. The new points are stored and feed the next `tuner fit`.
    """
    from tuner.decide.validate import validate as run_validation

    if arrivals is not None or rate is not None:
        from tuner.decide.openloop import open_loop_options, validate_open_loop

        rates, window_s = open_loop_options(
            arrivals, rate, duration_option(window, "--window"), traffic
        )
        with terminate_as_interrupt(), ProgressDisplay() as display:
            open_report = validate_open_loop(
                open_store(),
                model,
                this_host(),
                settings().log_dir,
                display,
                rates=rates,
                window_s=window_s,
                seed=seed,
                overrides=parsed_overrides(overrides),
                skip_preflight=skip_preflight,
                traffic=traffic if arrivals == "trace" else None,
                max_slots=max_slots,
            )
        if output is TableFormat.JSON:
            typer.echo(json.dumps(open_report.as_dict(), default=str))
        else:
            render.open_loop(open_report)
        return
    with terminate_as_interrupt(), ProgressDisplay() as display:
        report = run_validation(
            open_store(),
            model,
            this_host(),
            settings().log_dir,
            display,
            resume=resume,
            max_slots=max_slots,
            overrides=parsed_overrides(overrides),
            skip_preflight=skip_preflight,
        )
    if output is TableFormat.JSON:
        typer.echo(json.dumps(report.as_dict(), default=str))
    else:
        render.validation(report)


@app.command()
@reports_errors
def tune(
    model: Annotated[str, typer.Option(help="model name to tune")],
    budget: Annotated[
        str,
        typer.Option(
            help="measuring time before it stops with what is unresolved named, e.g. 10m, 300s "
            "(the larger questions first: contenders that could cost more than the tolerance, "
            "then plain with --plain-live, then tie questions)"
        ),
    ] = "10m",
    tie_budget: Annotated[
        str,
        typer.Option(
            help="measuring time after which tie questions (which only choose among values "
            "within the tolerance) are named in 'may tie', not measured on; 0 names them at once"
        ),
    ] = "3m",
    plain_budget: Annotated[
        str,
        typer.Option(
            help="with --plain-live: measuring time plain against the answer may take, all its "
            "passes together (two or three passes on a 2-core VM), also where a tie moves the "
            "answer; unresolved then, the model's verdict stands"
        ),
    ] = "90s",
    tolerance: Annotated[
        float,
        typer.Option(
            min=0.0001,
            max=0.5,
            help="share of the objective a contender may be ahead by and the answer still hold "
            "(also the tie margin)",
        ),
    ] = 0.01,
    switch: SwitchOption = Switch.AUTO,
    tune_n_max: Annotated[
        bool,
        typer.Option(
            "--tune-n-max",
            help="settle N at the draft length the model's study over (N, n_max) chooses",
        ),
    ] = False,
    resume: Annotated[
        bool, typer.Option("--resume", help="continue the last unfinished tuning of this model")
    ] = False,
    plain_live: Annotated[
        bool,
        typer.Option(
            "--plain-live",
            help="then settle whether to draft at all, before the tie questions: plain's launch "
            "held up beside the drafting launch (the target model in memory twice), the two in "
            "turn at every level",
        ),
    ] = False,
    overrides: OverridesOption = None,
    output: TableFormatOption = TableFormat.TABLE,
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

    with terminate_as_interrupt(), ProgressDisplay() as display:
        report = run_tune(
            open_store(),
            model,
            this_host(),
            settings().log_dir,
            display,
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


@app.command()
@reports_errors
def report(
    model: ModelOption,
    host: HostOption = None,
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

    Shows the recommendation that stands for the current fit; without one it makes (and stores)
    one.
    """
    from tuner.report.writer import write_report

    name, explicit = model_host(host)
    files = write_report(open_store(), model, out_dir, name, host_explicit=explicit)
    note(files.host_note)
    for path in files.paths:
        typer.echo(str(path))
