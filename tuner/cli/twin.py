"""`tuner dev twin ...`: the twin's commands (registered in tuner.cli.dev). Each parses its options,
calls one library function and renders the result; errors from the library become one line
and an exit code (tuner.cli.options.reports_errors).

- `serve WORLD`: the twin as a llama-server on a port (tuner.twin.server);
- `truth WORLD`: the world's noise-free truth (tuner.twin.truth_table.truth_report);
- `calibrate --table FILE | --run RUN --out WORLD.toml`: a world fitted to an imported table
  (tuner.twin.calibrate) or a stored profile run (tuner.twin.from_run).
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from tuner.cli.options import (
    Commands,
    TableFormat,
    TableFormatOption,
    err,
    open_store,
    out,
    reports_errors,
)
from tuner.errors import ConfigError, ServerError

if TYPE_CHECKING:
    from tuner.twin.calibrate import Calibration
    from tuner.twin.truth_table import TruthReport

twin_app = Commands(
    help="The twin: a simulated llama-server with known truth (serve it, read its truth, "
    "calibrate one).",
    no_args_is_help=True,
)


class Noise(StrEnum):
    OFF = "off"
    QUIET = "quiet"
    VM = "vm"


WorldArgument = Annotated[Path, typer.Argument(metavar="WORLD", help="a twin world (TOML)")]


def _world(path: Path):
    from tuner.twin.world import load_world

    try:
        return load_world(path)
    except ConfigError as exc:  # one line, however many problems
        raise ConfigError("; ".join(str(exc).splitlines())) from exc


# --- serve ------------------------------------------------------------------------------------


@twin_app.command("serve")
@reports_errors
def serve(
    world: WorldArgument,
    port: Annotated[int, typer.Option(min=0, max=65535, help="port (0: any free one)")] = 8080,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    speed: Annotated[
        float, typer.Option(help="virtual time runs this many times faster than the wall")
    ] = 1.0,
    seed: Annotated[
        int | None, typer.Option(help="seed of the noise and of unseeded requests")
    ] = None,
    plain: Annotated[
        bool, typer.Option("--plain", help="the plain server (no draft model)")
    ] = False,
    max_slots: Annotated[
        int,
        typer.Option(
            "--spec-draft-max-slots",
            "--max-slots",
            min=0,
            envvar="LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS",
            help="the threshold it starts with, as llama-server takes it (0: no limit)",
        ),
    ] = 0,
    n_max: Annotated[
        int | None, typer.Option(min=1, help="--spec-draft-n-max (default: the world's)")
    ] = None,
    parallel: Annotated[
        int | None, typer.Option(min=1, help="slots (default: the world's n_parallel)")
    ] = None,
    metrics: Annotated[bool, typer.Option("--metrics", help="expose /metrics")] = False,
    props: Annotated[
        bool, typer.Option("--props", help="allow POST /props (the live threshold)")
    ] = False,
    slots: Annotated[bool, typer.Option("--slots/--no-slots", help="expose /slots")] = True,
    noise: Annotated[Noise | None, typer.Option(help="noise preset over the world's")] = None,
) -> None:
    """Serve a world as llama-server would (until Ctrl-C): the same endpoints, its threshold
    switched live through POST /props with --props. The tuner launches it itself through a
    spec whose server.binary is `tuner-twin-server` (profiles/twin/bench-twin.toml)."""
    from tuner.twin.cmdline import ServerArgs
    from tuner.twin.command import serve as serve_world

    args = ServerArgs(
        model=world,
        host=host,
        port=port,
        parallel=parallel,
        model_draft=None if plain else "twin",
        # the pinned build drafts only with a speculative type: --model-draft alone never drafts
        spec_type=None if plain else "draft-simple",
        max_slots=max_slots,
        n_max=n_max,
        seed=seed,
        metrics=metrics,
        props=props,
        slots=slots,
        speed=speed,
        noise=noise.value if noise else None,
    )
    if not speed > 0:
        raise ConfigError(f"--speed must be above 0, not {speed:g}")
    try:
        serve_world(args, log=lambda text: err.print(text, highlight=False, soft_wrap=True))
    except OSError as exc:
        raise ServerError(f"cannot listen on {host}:{port}: {exc}") from exc


# --- truth ------------------------------------------------------------------------------------


def parse_weights(text: str) -> dict[int, float]:
    """`1=0.5,8=0.5` as {1: 0.5, 8: 0.5}."""
    weights: dict[int, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        try:
            if not sep:
                raise ValueError
            weights[int(key)] = float(value)
        except ValueError:
            raise ConfigError(
                f"--weights {text!r}: expected CONCURRENCY=WEIGHT pairs, e.g. 1=0.5,8=0.5"
            ) from None
    return weights


@twin_app.command("truth")
@reports_errors
def truth(
    world: WorldArgument,
    weights: Annotated[
        str | None,
        typer.Option(help="objective weights by concurrency, e.g. 1=0.5,8=0.5 (default uniform)"),
    ] = None,
    traffic: Annotated[
        str | None,
        typer.Option(help="weights from this observed traffic profile (`tuner observe`)"),
    ] = None,
    rate: Annotated[
        float | None, typer.Option(help="also Poisson arrivals at this rate (requests/s)")
    ] = None,
    output_tokens: Annotated[int, typer.Option(min=2, help="tokens per request")] = 128,
    prompt_tokens: Annotated[int, typer.Option(min=1, help="prompt tokens per request")] = 32,
    duration: Annotated[
        float, typer.Option(help="open loop: virtual seconds of arrivals")
    ] = 3600.0,
    rel_se: Annotated[
        float, typer.Option(help="closed levels: repeat until each mean's error is this small")
    ] = 0.002,
    fmt: TableFormatOption = TableFormat.TABLE,
) -> None:
    """The world's noise-free truth: tok/s of every N at every concurrency, the weighted
    objective per N, the best N and its margin; with --rate the open-loop figures per N."""
    from tuner.twin.truth_table import truth_report

    model = _world(world)
    if weights is not None and traffic is not None:
        raise ConfigError("give --weights or --traffic, not both")
    chosen = parse_weights(weights) if weights is not None else None
    if traffic is not None:
        from tuner.storage.traffic_profiles import load

        chosen = load(open_store(), traffic).weights(model.n_parallel)
    report = truth_report(
        model,
        weights=chosen,
        rate=rate,
        output_tokens=output_tokens,
        prompt_tokens=prompt_tokens,
        rel_se=rel_se,
        duration_s=duration,
    )
    if fmt == TableFormat.JSON:
        out.print_json(json.dumps(report.to_dict()))
        return
    _render_truth(report)


def _render_truth(report: TruthReport) -> None:
    closed = report.closed
    levels = closed.concurrency
    table = Table(
        title=f"{report.world.name}: tok/s, noise-free ({closed.output_tokens} tokens a stream)"
    )
    table.add_column("policy", no_wrap=True)
    for c in levels:
        table.add_column(str(c), justify="right")
    table.add_column("objective", justify="right")
    for policy in closed.policies:
        row = [f"{closed.tps(policy, c):.2f}" for c in levels]
        table.add_row(policy.label, *row, f"{report.objective[policy]:.2f}")
    out.print(table)
    shares = ", ".join(f"{c}: {w:.2f}" for c, w in report.weights.items())
    out.print(f"weights: {shares}", highlight=False)
    choice = report.choice
    margin = (
        f"{choice.margin:+.2f} tok/s ({choice.margin_pct:+.2f} %, se {choice.margin_se:.2f}) "
        f"over {choice.runner_up.label}"
        if choice.runner_up is not None
        else "no other N differs"
    )
    out.print(f"best: {choice.best.label} at {choice.value:.2f} tok/s, {margin}", highlight=False)
    if len(choice.ties) > 1:
        out.print(
            f"within two standard errors: {', '.join(p.label for p in choice.ties)}",
            highlight=False,
        )
    if report.open_loop is None:
        return
    ol = report.open_loop
    table = Table(title=f"open loop: Poisson arrivals at {ol.rate:g}/s for {ol.duration_s:g} s")
    for column in ("policy", "tok/s", "TPOT mean ms", "TPOT p95 ms", "generating"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for policy, f in ol.figures.items():
        table.add_row(
            policy.label,
            f"{f.tokens_per_second:.2f}",
            f"{f.tpot_mean_ms:.2f}",
            f"{f.tpot_ms[1]:.2f}",
            f"{f.mean_generating:.2f}",
        )
    out.print(table)
    out.print(
        f"best by throughput: {ol.best_tps.label}; by mean time per token: {ol.best_tpot.label}",
        highlight=False,
    )


# --- calibrate --------------------------------------------------------------------------------


@twin_app.command("calibrate")
@reports_errors
def calibrate(
    out_path: Annotated[Path, typer.Option("--out", help="the world file to write (TOML)")],
    table: Annotated[
        Path | None, typer.Option(help="an imported table (`tuner dev import`'s TOML format)")
    ] = None,
    run: Annotated[int | None, typer.Option(help="a stored profile run (`tuner runs`)")] = None,
    name: Annotated[str | None, typer.Option(help="the world's name")] = None,
    noise: Annotated[Noise, typer.Option(help="the world's noise preset")] = Noise.QUIET,
    reeval_share: Annotated[
        float | None,
        typer.Option(
            help="the draft's re-evaluation of a batch, as a share of the target's forward "
            "(what a threshold server pays over plain); default: --table 0.02, --run measured "
            "from its threshold levels where it has any, else 0.02"
        ),
    ] = None,
    synth_len: Annotated[
        float | None, typer.Option(help="--table: acceptance length when the table has none")
    ] = None,
    rel_se: Annotated[
        float, typer.Option(help="solve each level until its mean's error is this small")
    ] = 0.002,
) -> None:
    """A world fitted to measurements: plain and always-draft levels fitted, threshold levels
    held out (printed beside the world's prediction)."""
    if (table is None) == (run is None):
        raise ConfigError("give exactly one of --table FILE and --run RUN")
    if synth_len is not None and table is None:
        raise ConfigError("--synth-len goes with --table (a run's acceptance is measured)")
    if table is not None:
        from tuner.twin.calibrate import calibrate_table

        result = calibrate_table(
            table,
            name=name,
            synth_len=synth_len,
            reeval_share=0.02 if reeval_share is None else reeval_share,
            noise=noise.value,
            rel_se=rel_se,
        )
    else:
        assert run is not None
        from tuner.twin.from_run import calibrate_run, run_levels

        data = run_levels(open_store(), run)
        result = calibrate_run(
            data, name=name, reeval_share=reeval_share, noise=noise.value, rel_se=rel_se
        )
    _write_world(result, out_path)


def _write_world(result: Calibration, path: Path) -> None:
    from tuner.twin.world import world_to_toml

    try:
        path.write_text(world_to_toml(result.world))
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc}") from exc
    out.print(result.report(), highlight=False)
    err.print(f"world written to {path} (model_name {result.world.model_name})", highlight=False)
