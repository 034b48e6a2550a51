"""`tuner observe` and `tuner watch`: a running server's traffic, learnt once
(tuner.measure.observe.observe) or continuously with its N kept current (the service:
tuner.decide.watch.watch)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tuner.cli import render
from tuner.cli.options import (
    ApiKeyOption,
    ApplyWay,
    HostOption,
    ModelOption,
    ObjectiveOption,
    SloOption,
    UrlOption,
    advanced,
    duration_option,
    http_url,
    model_host,
    open_store,
    out,
    reports_errors,
    settings,
    terminate_as_interrupt,
    this_host,
)
from tuner.cli.progress import LogLines, ProgressDisplay
from tuner.recommendation import ObjectiveKind

EnvFileOption = Annotated[
    Path,
    typer.Option(
        help="KEY=VALUE file the server reads (systemd EnvironmentFile): its "
        "LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS line is replaced atomically, other lines kept"
    ),
]
OnChangeOption = Annotated[
    str | None,
    typer.Option(
        help="shell command run after the env file changed, e.g. 'systemctl restart "
        "llama-server' (at most once per --every; nothing is restarted without it)"
    ),
]
ApplyOption = Annotated[
    ApplyWay,
    typer.Option(
        help="env: write the env file (a restart, e.g. --on-change, applies it); live: also "
        "set N on the running server through POST /props (needs the patched server started "
        "with --props, and --api-key where it has one), read it back, and re-read it every "
        "interval so a restarted server or a flag that overrides the env file is corrected"
    ),
]
EveryOption = Annotated[str, typer.Option(help="decide this often: 600, 600s, 10m or 1h")]
WindowOption = Annotated[
    str | None,
    typer.Option(help="rolling traffic profile: the last this long (default 3 x --every)"),
]
DriftOption = Annotated[
    float,
    advanced(
        "--drift",
        help="recommend again when the traffic's busy-time shares moved this far "
        "(total-variation distance, 0..1) from what the standing answer was made for",
    ),
]
MinBusyOption = Annotated[
    str,
    advanced(
        "--min-busy",
        help="decide nothing from a window with less busy time (any slot generating) than "
        "this: an idle spell keeps the standing answer",
    ),
]
StopAfterOption = Annotated[
    str | None,
    advanced("--duration", help="stop after this long (default: until SIGTERM)"),
]
ExperimentOption = Annotated[
    bool,
    typer.Option(
        "--experiment",
        help="settle each answer on the server's own traffic: in short windows the server runs "
        "the answer's contenders (the model's tie set and neighbours) instead, N moves only "
        "where a one-sided bound clears the tolerance, the cost to users is printed and "
        "stored, and N is given back on every way out (needs --apply live)",
    ),
]
ExperimentShareOption = Annotated[
    float,
    advanced(
        "--experiment-share",
        help="the most of the time an experiment serves a contender instead of the standing N",
    ),
]
ExperimentBudgetOption = Annotated[
    str,
    advanced("--experiment-budget", help="the longest one experiment runs: 30m, 1h"),
]
AcceptDriftOption = Annotated[
    float,
    advanced(
        "--accept-drift",
        help="recommend again when the acceptance observed moved beyond its interval and by "
        "this share from what the standing answer was made with",
    ),
]
MarginOption = Annotated[
    float,
    advanced(
        "--margin",
        help="a new answer replaces the standing N only when the model puts it ahead by more "
        "than this share of the objective (so N does not flap on a tie)",
    ),
]
DwellOption = Annotated[
    str,
    typer.Option(
        "--dwell",
        help="change N at most once in this long (0 turns it off): a new answer that clears "
        "--margin sooner waits, and is applied once the dwell has passed unless a later answer "
        "replaced it; only the collapse alarm's protective N does not wait",
    ),
]
MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        help="serve the watch's own state on this port at /metrics for Prometheus (the standing "
        "and applied N, generating slots, acceptance and its floor, decisions, experiments, "
        "errors); off by default; a port in use stops the watch before it starts",
    ),
]
MetricsHostOption = Annotated[
    str,
    advanced(
        "--metrics-host",
        help="the address --metrics-port listens on (loopback by default; 0.0.0.0 for all)",
    ),
]


@reports_errors
def observe(
    url: UrlOption,
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
    At the end the acceptance its counters showed by drafting slots is held against the floor of
    the model's fit: where it collapses, one line names the slots, the build and the answer.
    """
    from tuner.decide.alarm import observe_server
    from tuner.storage.traffic_profiles import TrafficSaver

    http_url(url)
    seconds = duration_option(duration, "--duration")
    store = open_store()
    saver = TrafficSaver(store, name)
    with terminate_as_interrupt(), ProgressDisplay() as display:
        seen = observe_server(
            url, seconds, saver, display, store, this_host(), api_key=api_key,
            state_dir=settings().state_dir,
        )  # fmt: skip
    render.traffic(saver.name or "", seen.view, seen.profile)
    for line in (seen.alarm, seen.note):
        if line:
            out.print(line, highlight=False, markup=False, soft_wrap=True)


@reports_errors
def watch(
    model: ModelOption,
    url: UrlOption,
    env_file: EnvFileOption,
    on_change: OnChangeOption = None,
    apply: ApplyOption = ApplyWay.ENV,
    every: EveryOption = "1h",
    window: WindowOption = None,
    name: Annotated[
        str | None, typer.Option(help="traffic profile name (default watch:host:port/model)")
    ] = None,
    host: HostOption = None,
    objective: ObjectiveOption = ObjectiveKind.TPS,
    slo_tpot_ms: SloOption = None,
    api_key: ApiKeyOption = None,
    drift: DriftOption = 0.1,
    min_busy: MinBusyOption = "5s",
    duration: StopAfterOption = None,
    experiment: ExperimentOption = False,
    experiment_share: ExperimentShareOption = 0.25,
    experiment_budget: ExperimentBudgetOption = "30m",
    accept_drift: AcceptDriftOption = 0.1,
    margin: MarginOption = 0.01,
    dwell: DwellOption = "5m",
    metrics_port: MetricsPortOption = None,
    metrics_host: MetricsHostOption = "127.0.0.1",
) -> None:
    """The service: observe a running server continuously and keep its N current.

    Polls /slots (or /metrics) like `tuner observe`, keeps the traffic of the last --window
    (saved every 10 s: a crash loses at most that), and at the end of every --every interval
    recommends again for that traffic (as `recommend --traffic` does) when it drifted. A new
    answer is written to the env
    file atomically, set on the running server with --apply live, then --on-change runs once.
    The acceptance the server's own counters show re-decides too when it drifts. With
    --experiment each answer is then settled on the server's own traffic. N changes at most
    once per --dwell. Where the acceptance the counters show by drafting slots collapses below
    the floor the fitted costs set, one line names the slots, the build and the protective N,
    which is applied. --metrics-port serves the watch's state for Prometheus. SIGTERM stops it
    cleanly (N given back where an experiment had switched it).
    """
    from tuner.decide.experiment import ExperimentOptions
    from tuner.decide.watch import WatchOptions
    from tuner.decide.watch import watch as run_watch

    http_url(url)
    every_s = duration_option(every, "--every")
    name_of_host, explicit = model_host(host)
    options = WatchOptions(
        every_s=every_s,
        window_s=duration_option(window, "--window") if window else 3 * every_s,
        drift=drift,
        on_change=on_change,
        apply=apply.value,
        min_busy_s=duration_option(min_busy, "--min-busy"),
        accept_drift=accept_drift,
        margin=margin,
        dwell_s=duration_option(dwell, "--dwell"),
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        experiment=ExperimentOptions(
            share=experiment_share,
            budget_s=duration_option(experiment_budget, "--experiment-budget"),
        )
        if experiment
        else None,
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
            state_dir=settings().state_dir,
        )
    render.watch_summary(summary)
