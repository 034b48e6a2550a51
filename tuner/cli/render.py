"""Rendering results for the terminal with rich: measured tables, the fit quality table (built
once in tuner.report.tables), predictions, recommendations and validations."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from tuner.cli.options import out
from tuner.recommendation import PLAIN, UNRESOLVED, ReasonCode
from tuner.report import tables

if TYPE_CHECKING:  # types only: every `tuner` command imports this module before it runs
    from tuner.decide.openloop import OpenLoopReport
    from tuner.decide.predict import PredictReport
    from tuner.decide.regret import ValidationReport
    from tuner.decide.running import RunningReport
    from tuner.decide.settle import Standing
    from tuner.decide.tune import TuneReport
    from tuner.decide.watch import WatchSummary
    from tuner.model.costmodel import Crossover
    from tuner.recommendation import Recommendation
    from tuner.storage.fits import StoredFit
    from tuner.storage.queries import LevelPoint
    from tuner.traffic import ServerView, TrafficProfile


def rich_table(table: tables.Table) -> Table:
    shown = Table(title=table.title)
    first, *rest = table.columns
    shown.add_column(first, no_wrap=True)
    for column in rest:
        shown.add_column(column, justify="right")
    for row in table.rows:
        shown.add_row(*row)
    return shown


def points(title: str, levels: list[LevelPoint]) -> None:
    """The measured table: concurrency down, configuration across (tok/s, spread, ms/step)."""
    # plain, always draft, then thresholds by N, whatever order the run measured them in; an
    # attached server's labels last
    order = {p.config: (0, *p.policy.sort_key) if p.policy else (1, 0, 0) for p in levels}
    configs = sorted(order, key=lambda config: (order[config], config))
    table = Table(title=title)
    table.add_column("streams", justify="right")
    for config in configs:
        table.add_column(f"{config}\ntok/s (±%)", justify="right")
        table.add_column(f"{config}\nms/step", justify="right")
    for depth, c in sorted({(p.context_tokens, p.concurrency) for p in levels}):
        row = [f"{c} at depth {depth}" if depth else str(c)]
        for config in configs:
            p = next(
                (
                    p
                    for p in levels
                    if p.config == config and p.concurrency == c and p.context_tokens == depth
                ),
                None,
            )
            if p is None or p.tokens_per_second is None:
                row += [p.status if p is not None else "", ""]
                continue
            spread = (
                f" ±{100 * p.tokens_per_second_spread:.0f}" if p.tokens_per_second_spread else ""
            )
            row.append(f"{p.tokens_per_second:.1f}{spread}")
            row.append(f"{p.step_ms:.1f}" if p.step_ms else "")
        table.add_row(*row)
    out.print(table)


def fit(
    stored: StoredFit,
    by_depth: Mapping[int, Crossover] | None = None,
    by_prompt_set: Mapping[str, float] | None = None,
) -> None:
    """`tuner dev fit`: where the data came from, then the fit quality table, then (with several
    depths measured) the crossover at each depth."""
    inputs = stored.inputs
    reused = " (reused: same data)" if stored.reused else ""
    out.print(
        f"fit {stored.id}{reused} of {inputs['model']} ({stored.model.version}): host "
        f"{inputs.get('host') or '(none)'}, runs {', '.join(map(str, inputs['runs']))} "
        f"({', '.join(inputs['sources'])}), -np {inputs['n_parallel']}, n_max {inputs['n_max']}, "
        f"{inputs['kernel_rows']} kernel rows"
        + (f"; workload: {inputs['workload']}" if inputs.get("workload") else "")
        + (
            f"; context depth {inputs['context_tokens']} tokens"
            if inputs.get("context_tokens")
            else ""
        ),
        highlight=False,
    )
    table = tables.fit_quality_table(stored.quality, stored.model.crossover())
    for line in table.head:
        out.print(line, highlight=False)
    out.print(rich_table(table))
    for line in table.notes:
        out.print(line, highlight=False)
    if by_prompt_set:
        out.print(
            "acceptance by prompt set (always draft, tokens per stream per step, median over "
            "levels): " + "; ".join(f"{name}: {v:.2f}" for name, v in by_prompt_set.items()),
            highlight=False,
        )
    if by_depth:
        out.print(
            "crossover by context depth: "
            + "; ".join(
                f"{depth} tokens: {tables.crossover_text(x)}" for depth, x in by_depth.items()
            ),
            highlight=False,
        )


def predict(model: str, report: PredictReport) -> None:
    pct = f"{100 * report.prediction.interval:.0f}%"
    table = Table(
        title=f"{model}: --spec-draft-max-slots {report.policy.max_slots}, n_max "
        f"{report.policy.n_max} (fit {report.fit.id}, {pct} intervals)"
    )
    for column in ("streams", "tok/s", "interval", "plain", "spec", "measured"):
        table.add_column(column, justify="right")
    pred, plain, spec = report.prediction, report.plain, report.spec
    for i, c in enumerate(pred.concurrency):
        seen = [k for k, levels in report.fit.measured.items() if c in levels]
        table.add_row(
            str(c),
            f"{pred.tokens_per_second[i]:.1f}",
            f"{pred.lower[i]:.1f}-{pred.upper[i]:.1f}",
            f"{plain.tokens_per_second[i]:.1f}",
            f"{spec.tokens_per_second[i]:.1f}",
            ", ".join(seen),
        )
    out.print(table)


def recommendation(rec: Recommendation, console: Console) -> None:
    """The predicted table of the recommendation and its reasons."""
    table = Table(
        title=f"{rec.model}: predicted tok/s, chosen = --spec-draft-max-slots {rec.max_slots}"
        + (f", n_max {rec.n_max}" if rec.tune_n_max else "")
    )
    # plain not measured (tune --url without --plain-url): its column is the drafting server
    # not drafting, which stands in for it, and says so
    plain = "plain" if rec.plain_measured else "not drafting"
    for column in ("streams", "measured", plain, "spec", "chosen", f"vs {plain}", "vs spec"):
        table.add_column(column, justify="right")
    for row in rec.table:
        table.add_row(
            str(row.concurrency),
            ", ".join(row.measured_as) or ("yes" if row.measured else ""),
            f"{row.plain:.1f}",
            f"{row.spec:.1f}",
            f"{row.chosen:.1f}",
            f"{100 * row.gain_vs_plain:+.1f}%",
            f"{100 * row.gain_vs_spec:+.1f}%",
        )
    console.print(table)
    for line in rec.explain_lines():
        console.print(line, highlight=False, markup=False)


def validation(report: ValidationReport) -> None:
    """Measured (and predicted) tok/s per policy and level; best, regret, model error, and the
    recommendation that stands now."""
    table = Table(
        title=f"validation run {report.run_id}: {report.model}, "
        f"recommended {report.recommended.label}"
    )
    table.add_column("streams", justify="right")
    table.add_column("weight", justify="right")
    for policy in report.policies:
        mark = " *" if policy.max_slots == report.recommended.max_slots else ""
        table.add_column(f"{policy.label}{mark}\nmeasured (model)", justify="right")
    for c in report.levels:
        row = [str(c), f"{report.weights[c]:.2f}"]
        for policy in report.policies:
            tps = report.measured[policy].get(c)
            pred = report.predicted.get(policy, {}).get(c)
            row.append("" if tps is None else f"{tps:.1f} ({pred:.1f})")
        table.add_row(*row)
    table.add_row(
        "weighted",
        "",
        *(f"{report.weighted[p]:.1f}" if p in report.weighted else "" for p in report.policies),
        style="bold",
    )
    out.print(table)
    best = report.best.label if report.best else "-"
    out.print(
        f"best measured: {best}; regret of {report.recommended.label}: {report.regret_text()}",
        highlight=False,
    )
    if report.mean_abs_error_pct is not None:
        out.print(
            f"model error on these points: mean {report.mean_abs_error_pct:.1f} %, "
            f"worst {report.worst_abs_error_pct:.1f} %",
            highlight=False,
        )
    if text := report.standing_text():
        out.print(text, highlight=False, markup=False)


def tuning(report: TuneReport) -> None:
    """Every comparison of the answer with a contender (advantage, one-sided bounds, verdict),
    the pairs behind them, and the recommendation that stands now."""
    settled = report.settled
    table = Table(
        title=f"live comparisons, run {report.run_id} ({report.way}, study "
        f"{report.study_name}): started from N={report.started_from.max_slots}, "
        f"{report.sweeps} sweep(s), {report.seconds:.0f} s"
    )
    for column in ("contender", "levels", "advantage tok/s", "95 % bounds", "df", "verdict"):
        table.add_column(column, justify="left" if column == "verdict" else "right")
    answer = report.standing.max_slots if report.standing is not None else None
    pairs = {c: d.n for c, d in report.gains.items()}
    for comp in settled.comparisons if settled else []:
        adv = comp.advantage
        table.add_row(
            f"N={comp.contender} vs N={answer}",
            ",".join(map(str, comp.levels)),
            *tables.contrast_cells(adv.estimate, adv.bounds(0.95), adv.df, comp.levels, pairs),
            # a smaller contender measured on for the tie question: not settled yet
            comp.verdict + _open_question(settled, comp.contender),
        )
    if report.plain is not None:
        plain = report.plain
        adv = plain.advantage
        measured = (
            tables.contrast_cells(adv.estimate, adv.bounds(0.95), adv.df, [], {})
            if plain.passes
            else ["not measured (no pass kept)", "", ""]
        )
        table.add_row(
            f"plain vs N={answer}",
            "every (side by side)",
            *measured,
            f"{plain.verdict} ({plain.passes} passes)",
        )
    out.print(table)
    if settled is not None:
        pairs = ", ".join(f"{c}: {d.n}" for c, d in sorted(report.gains.items()) if d.n)
        out.print(
            f"tolerance +-{settled.tolerance:.2f} tok/s; pairs per level {{{pairs}}}"
            + (f"; tie {settled.tie}" if len(settled.tie) > 1 else "")
            # unresolved: the tie its data already show (the answer moves to its smallest
            # only once the open questions close)
            + (f"; tie so far {settled.provisional}" if len(settled.provisional) > 1 else "")
            + (
                f"; may tie {settled.may_tie} ("
                + (
                    "at the tolerance's edge"
                    if settled.edge
                    else "not yet shown equivalent or apart"
                )
                + ")"
                if len(settled.may_tie) > max(1, len(settled.tie))
                else ""
            )
            + (
                f"; measure next at {', '.join(map(str, settled.measure_next))} streams"
                if settled.measure_next
                else ""
            ),
            highlight=False,
            markup=False,
        )
    if report.standing is not None:
        out.print(report.standing_text(), highlight=False, markup=False)


def _open_question(settled: Standing, contender: int) -> str:
    """The "(equivalent?)" of a contender whose tie question is still measured on, with its
    bounds where the question is asked against the best estimate rather than the answer."""
    from tuner.decide.tune import question_text  # lazily: see TYPE_CHECKING above

    q = next((q for q in settled.tie_questions if q.contender == contender), None)
    if q is None:
        return ""
    text = question_text(settled.answer, q)
    if q.against == settled.answer:
        return text
    return text + " " + q.advantage.figures(df=False)


def traffic(name: str, view: ServerView, profile: TrafficProfile) -> None:
    """What observe saw: time at each number of generating slots, and request lengths."""
    table = Table(
        title=f"traffic {name}: {view.model} on {view.url} ({view.n_slots} slots, from "
        f"/{view.source}), {profile.covered_s:.0f} s this time"
    )
    for column in ("generating", "seconds", "share"):
        table.add_column(column, justify="right")
    shares = profile.shares()
    for k, seconds in sorted(profile.seconds.items()):
        table.add_row(str(k), f"{seconds:.1f}", f"{100 * shares[k]:.1f}%")
    out.print(table)
    data = profile.to_dict()
    for what in ("prompt_tokens", "output_tokens"):
        summary = data[what]
        if summary:
            out.print(
                f"{what.replace('_', ' ')}: median {summary['median']:.0f}, p90 "
                f"{summary['p90']:.0f} over {summary['n']} finished requests",
                highlight=False,
            )
    from tuner.decide.observed import acceptance_line  # lazily: see TYPE_CHECKING above

    out.print(acceptance_line(profile), highlight=False, markup=False)
    rate = profile.arrival_rate
    out.print(
        f"mean generating slots {profile.mean_generating():.2f}"
        + (f", {rate:.3g} requests/s finished" if rate else "")
        + f"; `tuner recommend --model M --traffic {name}` weights the objective by it",
        highlight=False,
        markup=False,
    )


def watch_summary(summary: WatchSummary) -> None:
    """What a watch did before it stopped, and what its experiments cost the users."""
    out.print(
        f"watched {summary.view.url} as {summary.name}: {len(summary.events)} intervals, "
        f"{summary.changes} answer changes, {summary.writes} env-file writes",
        highlight=False,
        markup=False,
    )
    for report in summary.experiments:
        out.print(
            f"experiment from N={report.start}: {report.status}, N={report.answer}; "
            f"{report.cost.text()}",
            highlight=False,
            markup=False,
        )


def open_loop(report: OpenLoopReport) -> None:
    """Per arrival rate: each configuration's throughput, latencies and occupancy."""
    for rate, by_config in report.results.items():
        table = Table(
            title=f"open loop, run {report.run_id}: Poisson arrivals at {rate:g}/s for "
            f"{report.window_s:.0f} s (recommended N={report.recommendation.max_slots})"
        )
        for column in (
            "config",
            "done",
            "tok/s",
            "TTFT p50/p95 ms",
            "TPOT p50/p95/p99 ms",
            "generating",
        ):
            table.add_column(column, justify="left" if column == "config" else "right")
        for config, f in by_config.items():
            table.add_row(
                config,
                f"{f.completed}/{f.offered}",
                f"{f.tokens_per_second:.1f}",
                f"{f.ttft_ms[0]:.0f} / {f.ttft_ms[1]:.0f}",
                f"{f.tpot_ms[0]:.1f} / {f.tpot_ms[1]:.1f} / {f.tpot_ms[2]:.1f}",
                f"{f.mean_generating:.2f}",
            )
        out.print(table)


SAID_AFTER_A_TUNE = (
    ReasonCode.DISTURBED,
    ReasonCode.PLAIN_UNMEASURED,
    ReasonCode.PLAIN_AHEAD,
    ReasonCode.PLAIN_UNRESOLVED,
)


def running(report: RunningReport) -> None:
    """`tune --url`: what the server is, what the tune found (its comparisons, as `tune`
    shows them), and how to apply the answer; with one slot, plain against drafting."""
    server = report.server
    out.print(
        f"{server.url}: {server.model}, {server.slots} slot(s), n_max {server.n_max}"
        + (f"; waited {report.waited_s:.0f} s for others' requests" if report.waited_s > 1 else ""),
        highlight=False,
        markup=False,
    )
    for note in report.notes:
        out.print(note, highlight=False, markup=False)
    if report.one_slot is not None:
        out.print(report.one_slot.text(), highlight=False, markup=False)
    if report.tune is None:
        return
    tuning(report.tune)
    standing = report.tune.standing
    for reason in standing.reasons if standing is not None else []:
        if reason.code in SAID_AFTER_A_TUNE:  # whether to draft at all, and disturbed data
            out.print(reason.text, highlight=False, markup=False)
    if standing is None or standing.status == UNRESOLVED:
        return  # the standing line said why it is not settled, and what to measure
    if standing.kind == PLAIN:
        out.print(
            f"to apply: restart {server.url} without --model-draft and --spec-type; "
            f"`tuner recommend --model {server.model}` prints the answer again",
            highlight=False,
            markup=False,
        )
        return
    line = standing.env_line.replace("\n", " ")
    out.print(
        f"to apply: set {line} in the server's environment (or --spec-draft-max-slots "
        f"{standing.max_slots} on its command line) and restart it, or switch it live: "
        f"`tuner watch --model {server.model} --url {server.url} --env-file FILE --apply live` "
        "sets it and keeps it current; `tuner recommend --model "
        f"{server.model}` prints it again",
        highlight=False,
        markup=False,
    )


def running_dict(report: RunningReport) -> dict:
    """`tune --url --format json`."""
    one = report.one_slot
    return {
        "url": report.server.url,
        "model": report.server.model,
        "slots": report.server.slots,
        "n_max": report.server.n_max,
        "waited_s": report.waited_s,
        "notes": report.notes,
        "profile_run": report.profile.run_id if report.profile else None,
        "tune": report.tune.as_dict() if report.tune else None,
        "one_slot": None
        if one is None
        else {
            "plain_minus_drafting": one.advantage.estimate,
            "bounds": list(one.advantage.bounds(0.95)),
            "verdict": one.verdict,
            "tolerance": one.tolerance,
        },
    }
