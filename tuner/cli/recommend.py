"""`tuner recommend`: the answer, --spec-draft-max-slots N, as one line on stdout, with the
predicted table and the reasons on stderr (tuner.decide.advice.recommend)."""

from __future__ import annotations

from typing import Annotated

import typer

from tuner.cli import render
from tuner.cli.options import (
    FitOption,
    HostOption,
    ModelOption,
    ObjectiveOption,
    SeedOption,
    SloOption,
    TrafficOption,
    TuneNMaxOption,
    advanced,
    err,
    model_host,
    open_store,
    out,
    reports_errors,
)
from tuner.recommendation import ObjectiveKind, OutputFormat

FormatOption = Annotated[OutputFormat, typer.Option("--format", help="how to print the answer")]
ExplainOption = Annotated[
    bool, typer.Option("--explain", help="print the table and reasons on stdout too")
]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="nothing on stderr")]
MinSingleStreamOption = Annotated[
    float | None, typer.Option("--min-single-stream", help="floor on single-stream tok/s")
]
ContextMixOption = Annotated[
    str | None,
    typer.Option(
        "--context",
        help="context depth in tokens per stream (4096), or a mix of depths and shares "
        "(0:0.5,8192:0.5); a depth not measured is interpolated between measured ones "
        "(printed, not stored); default the shallowest measured",
    ),
]
RateOption = Annotated[
    float | None,
    advanced("--rate", help="tpot: arrival rate (requests/s) instead of the traffic's"),
]
OutputTokensOption = Annotated[
    float | None,
    advanced(
        "--output-tokens",
        help="tpot, capacity: mean output tokens per request instead of the traffic's",
    ),
]
PromptTokensOption = Annotated[
    float | None,
    advanced(
        "--prompt-tokens",
        help="open loop: prompt tokens per request instead of the traffic's (or the profile's)",
    ),
]
ClosedLoopOption = Annotated[
    bool,
    advanced(
        "--closed-loop",
        help="answer arrivals from closed levels (the birth-death queue, busy-time weights) even "
        "where the fit has measured arrival costs",
    ),
]


@reports_errors
def recommend(
    model: ModelOption,
    host: HostOption = None,
    output: FormatOption = OutputFormat.ENV,
    explain: ExplainOption = False,
    quiet: QuietOption = False,
    traffic: TrafficOption = None,
    objective: ObjectiveOption = ObjectiveKind.TPS,
    slo_tpot_ms: SloOption = None,
    context: ContextMixOption = None,
    min_single_stream: MinSingleStreamOption = None,
    rate: RateOption = None,
    output_tokens: OutputTokensOption = None,
    prompt_tokens: PromptTokensOption = None,
    closed_loop: ClosedLoopOption = False,
    tune_n_max: TuneNMaxOption = False,
    fit_id: FitOption = None,
    seed: SeedOption = 0,
) -> None:
    """Recommend --spec-draft-max-slots N: its line on stdout, e.g. for `>> server.env`; an
    answer that is not settled has a `# unresolved: ...` comment line before it.

    `eval "$(tuner recommend --model M --format shell)"` sets it in a shell. The table and the
    reasons go to stderr (with --explain, to stdout after the line).

    Objectives: tps (served tok/s, weighted by the workload or --traffic), tpot (mean time per
    output token under random arrivals at the traffic's rate: each N at the occupancy it causes),
    capacity (the highest arrival rate whose p95 time per output token stays under --slo-tpot-ms).
    With --traffic or --rate, tpot and tps are answered in the open loop where the profile
    measured what arrivals cost (prompts, draft catch-up): every policy serves the traffic in a
    twin of the fit (tokens per busy second for tps); --closed-loop answers from closed levels.
    """
    from tuner.decide.advice import recommend as make_recommendation
    from tuner.decide.depths import parse_context

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
        prompt_tokens=prompt_tokens,
        closed_loop=closed_loop,
    )
    typer.echo(rec.render(output))
    if explain:
        render.recommendation(rec, out)
    elif not quiet:
        render.recommendation(rec, err)
