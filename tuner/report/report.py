"""`tuner report`: one model's measurements, fitted curves and recommendation as a picture.

`write_report` writes three files into one folder and no file anywhere else (the database may
gain the fit and the recommendation the report needed, as `tuner recommend` would store them):

- `report.png` and `report.svg`: two panels over concurrency 1..n_parallel. Top: aggregate tok/s,
  with the measured plain, spec and threshold points (error bars: the spread across repeats, MAD
  over median, times the value), the cost model's plain and always-draft curves with their
  bootstrap intervals as bands, the recommended threshold policy as a wide highlight under them,
  the crossover (where spec stops beating plain) as a dotted line in its shaded interval, and the
  latest validation run's points as open diamonds. Bottom: the same per stream (aggregate /
  streams), what one client feels.
- `summary.md`: host, build, model, the data used, fit quality (per-point residuals, the worst
  one), the recommendation with its reasons, and the validation figures when a validation exists.

The work is split so that the figures can be checked without pixels: `load_inputs` reads the
database (the current fit, the recommendation of that fit -- made and stored here when there is
none --, the points, the facts, the validation), `report_data` turns a cost model and points into
the plotted series (pure), `render_figure` and `render_summary` draw and write them (pure; the
figure uses matplotlib's object API with the Agg canvas, no pyplot state).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlalchemy import select

from tuner.errors import ConfigError, NothingToDoError, TunerError
from tuner.model.costmodel import CostModel, Crossover
from tuner.storage.engine import Store
from tuner.storage.orm import Fit, Recommendation, Run
from tuner.storage.queries import LevelPoint, model_points, run_points

PNG_NAME = "report.png"
SVG_NAME = "report.svg"
SUMMARY_NAME = "summary.md"
DEFAULT_OUT = Path("tuner-report")
SHA_PREFIX = 12

# Colours per candidate (matplotlib's tab10): plain blue, always-draft orange, policy green,
# other thresholds purple, brown, pink, olive.
PLAIN_COLOUR = "tab:blue"
SPEC_COLOUR = "tab:orange"
POLICY_COLOUR = "tab:green"
THRESHOLD_COLOURS = ("tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")
CROSSOVER_COLOUR = "0.35"
VALIDATION_DODGE = 0.06  # streams between the markers of validation candidates at one level


# --- the plotted series (pure) --------------------------------------------------------------


def candidate_label(max_slots: int | None) -> str:
    """plain, N=0 (always draft), N=k: the names tables and the legend use."""
    return "plain" if max_slots is None else f"N={max_slots}"


@dataclass(frozen=True)
class ModelSeries:
    """A policy's predicted tok/s at 1..n_parallel with its interval (a curve and its band)."""

    key: str  # "plain" | "spec" | "policy"
    label: str  # legend text
    max_slots: int | None
    n_max: int
    concurrency: list[int]
    tokens_per_second: list[float]
    lower: list[float]
    upper: list[float]

    def per_stream(self) -> ModelSeries:
        """The same series divided by the number of streams."""
        return replace(
            self,
            tokens_per_second=_per_stream(self.concurrency, self.tokens_per_second),
            lower=_per_stream(self.concurrency, self.lower),
            upper=_per_stream(self.concurrency, self.upper),
        )


@dataclass(frozen=True)
class PointSeries:
    """Measured levels of one candidate: tok/s with an absolute error bar (0 without spread)."""

    key: str  # e.g. "measured plain", "validation N=2"
    label: str  # legend text
    candidate: str  # plain | N=0 | N=k
    validation: bool
    run_ids: tuple[int, ...]
    concurrency: list[int]
    tokens_per_second: list[float]
    error: list[float]

    def per_stream(self) -> PointSeries:
        return replace(
            self,
            tokens_per_second=_per_stream(self.concurrency, self.tokens_per_second),
            error=_per_stream(self.concurrency, self.error),
        )


def _per_stream(concurrency: Sequence[int], values: Sequence[float]) -> list[float]:
    return [v / c for c, v in zip(concurrency, values, strict=True)]


@dataclass(frozen=True)
class RecommendationInfo:
    """The recommendation the report shows (stored, or made by the report for the current fit)."""

    id: int
    max_slots: int
    n_max: int
    fit_id: int
    objective: float | None = None
    objective_interval: tuple[float, float] | None = None
    reasons: list[str] = field(default_factory=list)
    measure_next: list[int] = field(default_factory=list)
    tune_n_max: bool = False
    made_by_report: bool = False

    @property
    def env_line(self) -> str:
        from tuner.decide.recommend import ENV_MAX_SLOTS, ENV_N_MAX

        line = f"{ENV_MAX_SLOTS}={self.max_slots}"
        if self.tune_n_max:
            line += f"\n{ENV_N_MAX}={self.n_max}"
        return line


@dataclass(frozen=True)
class ReportData:
    """Everything the figure shows."""

    model: str
    host: str | None
    fit_id: int
    n_parallel: int
    n_max: int
    interval: float
    curves: list[ModelSeries]
    points: list[PointSeries]
    crossover: Crossover
    recommendation: RecommendationInfo

    def curve(self, key: str) -> ModelSeries:
        return next(c for c in self.curves if c.key == key)

    def point_series(self, key: str) -> PointSeries | None:
        return next((p for p in self.points if p.key == key), None)


def _policy_text(max_slots: int, n_parallel: int) -> str:
    if max_slots == 0:
        return "always draft"
    if max_slots >= n_parallel:
        return f"draft at every level up to {n_parallel}"
    return f"draft while <= {max_slots} streams"


def _candidate_of(point: LevelPoint) -> str | None:
    """plain, N=0 or N=k for the configurations a policy names; None for anything else."""
    if point.config == "plain" and point.max_slots is None:
        return "plain"
    if point.config == "spec" and point.max_slots == 0:
        return "N=0"
    if point.config.startswith("max-slots-") and point.max_slots:
        return candidate_label(point.max_slots)
    return None  # attach labels: not a policy of this server


def _point_sort(candidate: str) -> tuple[int, int]:
    if candidate == "plain":
        return (0, 0)
    return (1, int(candidate.removeprefix("N=")))


def group_points(
    points: Iterable[LevelPoint], validation_runs: Iterable[int] = ()
) -> list[PointSeries]:
    """Completed levels by (measured | validation, candidate), each sorted by concurrency."""
    validation = set(validation_runs)
    groups: dict[tuple[bool, str], list[LevelPoint]] = {}
    for p in points:
        candidate = _candidate_of(p)
        if candidate is None or p.status != "completed" or not p.tokens_per_second:
            continue
        groups.setdefault((p.run_id in validation, candidate), []).append(p)
    out = []
    for (is_validation, candidate), members in sorted(
        groups.items(), key=lambda kv: (kv[0][0], _point_sort(kv[0][1]))
    ):
        members.sort(key=lambda p: (p.concurrency, p.run_id))
        prefix = "validation" if is_validation else "measured"
        name = {"plain": "plain", "N=0": "spec (N=0)"}.get(candidate, candidate)
        runs = tuple(sorted({p.run_id for p in members}))
        out.append(
            PointSeries(
                key=f"{prefix} {candidate}",
                label=f"{prefix}: {name}"
                + (f" (run {', '.join(map(str, runs))})" if is_validation else ""),
                candidate=candidate,
                validation=is_validation,
                run_ids=runs,
                concurrency=[p.concurrency for p in members],
                tokens_per_second=[float(p.tokens_per_second or 0.0) for p in members],
                error=[
                    float(p.tokens_per_second or 0.0) * float(p.tokens_per_second_spread or 0.0)
                    for p in members
                ],
            )
        )
    return out


def model_series(
    model: CostModel, key: str, max_slots: int | None, n: int | None, label: str
) -> ModelSeries:
    """`CostModel.predict` of one policy at 1..n_parallel as a series."""
    pred = model.predict(max_slots, n)
    return ModelSeries(
        key,
        label,
        max_slots,
        n if n is not None else model.n_max,
        list(pred.concurrency),
        list(pred.tokens_per_second),
        list(pred.lower),
        list(pred.upper),
    )


def report_data(
    model_name: str,
    host: str | None,
    fit_id: int,
    model: CostModel,
    recommendation: RecommendationInfo,
    points: Iterable[LevelPoint],
    validation_runs: Iterable[int] = (),
) -> ReportData:
    """The series the figure draws: model curves (plain, always draft, the recommended policy),
    measured and validation points, and the crossover. Pure: no database, no files."""
    n_rec = recommendation.n_max if recommendation.n_max in model.n_values() else model.n_max
    policy_label = f"recommended: N={recommendation.max_slots}"
    if n_rec != model.n_max:
        policy_label += f", n_max {n_rec}"
    policy_label += f" ({_policy_text(recommendation.max_slots, model.n_parallel)})"
    curves = [
        model_series(model, "plain", None, None, "model: plain (no drafting)"),
        model_series(
            model, "spec", 0, None, f"model: spec, always draft (N=0, n_max {model.n_max})"
        ),
        model_series(model, "policy", recommendation.max_slots, n_rec, policy_label),
    ]
    return ReportData(
        model=model_name,
        host=host,
        fit_id=fit_id,
        n_parallel=model.n_parallel,
        n_max=model.n_max,
        interval=model.interval,
        curves=curves,
        points=group_points(points, validation_runs),
        crossover=model.crossover(),
        recommendation=recommendation,
    )


# --- the figure -----------------------------------------------------------------------------


def _point_colour(candidate: str, recommended: int) -> str:
    if candidate == "plain":
        return PLAIN_COLOUR
    if candidate == "N=0":
        return SPEC_COLOUR
    n = int(candidate.removeprefix("N="))
    if n == recommended:
        return POLICY_COLOUR
    return THRESHOLD_COLOURS[n % len(THRESHOLD_COLOURS)]


def crossover_text(cross: Crossover) -> str:
    if cross.streams is None:
        if cross.spec_wins_upto == 0:
            return "no crossover: plain ahead from 1 stream"
        return "no crossover: spec ahead at every level"
    return f"crossover {cross.streams:.1f} streams [{cross.lower:.1f}, {cross.upper:.1f}]"


def points_gid(key: str) -> str:
    """The SVG id of a point series: "measured N=2" -> "points-measured-N2" (an XML name)."""
    return "points-" + re.sub(r"[^A-Za-z0-9_-]", "", key.replace(" ", "-"))


def _draw_panel(ax: Any, data: ReportData, per_stream: bool) -> None:
    suffix = "-per-stream" if per_stream else ""
    colours = {"plain": PLAIN_COLOUR, "spec": SPEC_COLOUR, "policy": POLICY_COLOUR}
    for curve in data.curves:
        series = curve.per_stream() if per_stream else curve
        colour = colours[curve.key]
        policy = curve.key == "policy"
        if not policy:  # the policy's band is plain's or spec's: drawn by those
            ax.fill_between(
                series.concurrency,
                series.lower,
                series.upper,
                color=colour,
                alpha=0.18,
                linewidth=0,
                gid=f"band-{curve.key}{suffix}",
            )
        # The policy follows spec up to N and plain above it: drawn as a wide translucent
        # highlighter under the dashed plain and spec curves, so those stay visible.
        (line,) = ax.plot(
            series.concurrency,
            series.tokens_per_second,
            color=colour,
            linewidth=7.0 if policy else 1.8,
            alpha=0.45 if policy else 1.0,
            linestyle="-" if policy else "--",
            solid_capstyle="round",
            label=curve.label,
            zorder=2 if policy else 3,
        )
        line.set_gid(f"curve-{curve.key}{suffix}")
    validation = [p.key for p in data.points if p.validation]
    for points in data.points:
        series = points.per_stream() if per_stream else points
        colour = _point_colour(points.candidate, data.recommendation.max_slots)
        # Validation candidates share levels (and, where their policies agree, values): each
        # is nudged sideways so that none hides another.
        shift = (
            VALIDATION_DODGE * (validation.index(points.key) - (len(validation) - 1) / 2)
            if points.validation
            else 0.0
        )
        container = ax.errorbar(
            [c + shift for c in series.concurrency],
            series.tokens_per_second,
            yerr=series.error,
            fmt="D" if points.validation else "o",
            markersize=8 if points.validation else 7,
            markerfacecolor="white" if points.validation else colour,
            markeredgecolor=colour,
            markeredgewidth=1.6,
            ecolor=colour,
            elinewidth=1.2,
            capsize=3,
            linestyle="none",
            label=points.label,
            zorder=6 if points.validation else 5,
        )
        container.lines[0].set_gid(f"{points_gid(points.key)}{suffix}")
    cross = data.crossover
    if cross.streams is not None:
        ax.axvspan(cross.lower, cross.upper, color=CROSSOVER_COLOUR, alpha=0.1, linewidth=0)
        ax.axvline(
            cross.streams,
            color=CROSSOVER_COLOUR,
            linestyle=":",
            linewidth=1.6,
            label=crossover_text(cross) + " (interval shaded)",
            gid=f"crossover{suffix}",
        )
    ax.set_xlim(0.7, data.n_parallel + 0.3)
    ax.set_xticks(list(range(1, data.n_parallel + 1)))
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)


def render_figure(data: ReportData) -> Any:
    """The two-panel figure (a matplotlib Figure on the Agg canvas; no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 11), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    _draw_panel(top, data, per_stream=False)
    _draw_panel(bottom, data, per_stream=True)
    rec = data.recommendation
    where = f" on {data.host}" if data.host else ""
    fig.suptitle(
        f"{data.model}{where}\n--spec-draft-max-slots {rec.max_slots} recommended "
        f"(fit {data.fit_id}, n_max {data.n_max}, -np {data.n_parallel})",
        fontsize=13,
        fontweight="bold",
    )
    top.set_title("Aggregate throughput: all streams together")
    top.set_ylabel("aggregate tok/s")
    bottom.set_title("Per stream: what one client sees (aggregate / streams)")
    bottom.set_ylabel("tok/s per stream")
    bottom.set_xlabel("concurrency (streams generating at once)")
    handles, labels = top.get_legend_handles_labels()
    pct = f"{100 * data.interval:.0f}%"
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncols=2,
        fontsize=9,
        title=f"bands: {pct} bootstrap intervals of the cost model; error bars: spread across "
        f"repeats (MAD/median x value)",
        title_fontsize=8.5,
        frameon=False,
    )
    return fig


def save_figure(fig: Any, path: Path, fmt: str) -> None:
    """One format of the figure; the SVG keeps text as text and is byte-stable for equal data."""
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "tuner-report"}):
        if fmt == "svg":
            fig.savefig(path, format="svg", metadata={"Date": None, "Creator": None})
        else:
            fig.savefig(path, format="png", metadata={"Software": None})


# --- what the summary states --------------------------------------------------------------


@dataclass(frozen=True)
class RunFact:
    id: int
    kind: str
    source: str
    status: str
    spec_name: str
    label: str | None
    started_at: dt.datetime | None
    levels: int


@dataclass(frozen=True)
class Facts:
    """Host, build and model as the database knows them, and the runs the fit used."""

    host: dict[str, Any] | None
    build: dict[str, Any] | None
    model: dict[str, Any]
    runs: list[RunFact]
    imported: dict[str, str] = field(default_factory=dict)  # model/host/build/source/notes text


def _md(text: Any) -> str:
    """A value safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _size(n: int | None) -> str:
    if not n:
        return "unknown"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _streams(c: Any) -> str:
    return f"{c} stream" + ("" if c == 1 else "s")


def _pct(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:+.1f}%"


def _host_lines(facts: Facts, data: ReportData) -> list[str]:
    host = facts.host
    if host is None:
        return [f"- name: {data.host or 'unknown (no host recorded)'}"]
    lines = [f"- name: {host['name']}"]
    known = [host.get(k) for k in ("cpu_model", "cpu_cores", "memory_bytes", "devices")]
    if not any(known):
        where = "the imported table's free text" if facts.imported else "a name only"
        return [*lines, f"- no hardware facts recorded ({where})"]
    return [
        *lines,
        f"- CPU: {host.get('cpu_model') or 'unknown'}",
        f"- cores: {host.get('cpu_cores') or 'unknown'}",
        f"- memory: {_size(host.get('memory_bytes'))}",
        f"- devices: {', '.join(host.get('devices') or []) or 'none listed (CPU only)'}",
    ]


def _build_lines(facts: Facts) -> list[str]:
    build = facts.build
    if build is None:
        text = facts.imported.get("build")
        return [f"- {text} (imported table: not fingerprinted)" if text else "- unknown"]
    version = (build.get("version_text") or "").strip().replace("\n", "; ")
    return [
        f"- sha256: `{build['binary_sha256'][:SHA_PREFIX]}...`",
        f"- version: {version or 'unknown'}",
        "- knows --spec-draft-max-slots: " + ("yes" if build.get("has_max_slots") else "no"),
    ]


def _model_lines(facts: Facts) -> list[str]:
    m = facts.model
    sha = m.get("file_sha256")
    lines = [
        f"- name: {m['name']}",
        f"- file size: {_size(m.get('file_size'))}",
        f"- sha256: {f'`{sha[:SHA_PREFIX]}...`' if sha else 'unknown'}",
        f"- architecture: {m.get('architecture') or 'unknown'}",
        f"- quantization: {m.get('quantization') or 'unknown'}",
    ]
    if facts.imported.get("model"):
        lines.append(f"- described as: {facts.imported['model']}")
    return lines


def _data_lines(facts: Facts, inputs: dict[str, Any]) -> list[str]:
    lines = [
        "| run | kind | source | spec / label | levels | started |",
        "| ---: | --- | --- | --- | ---: | --- |",
    ]
    for r in facts.runs:
        started = r.started_at.strftime("%Y-%m-%d %H:%M") if r.started_at else ""
        name = r.label or r.spec_name
        lines.append(f"| {r.id} | {r.kind} | {r.source} | {_md(name)} | {r.levels} | {started} |")
    measured = inputs.get("measured") or {}
    weights = inputs.get("weights")
    lines += [
        "",
        f"- levels used: {len(inputs.get('levels') or [])} "
        + "("
        + "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in measured.items())
        + ")",
        f"- kernel rows (llama-batched-bench): {inputs.get('kernel_rows', 0)}",
        f"- sources: {', '.join(inputs.get('sources') or []) or 'unknown'}",
        f"- -np {inputs.get('n_parallel')}, n_max {inputs.get('n_max')}",
        "- workload weights: "
        + (
            ", ".join(f"{k} streams: {v:g}" for k, v in sorted(weights.items(), key=_weight_key))
            if weights
            else "uniform over 1..n_parallel"
        ),
    ]
    if facts.imported.get("source"):
        lines.append(f"- imported from: {facts.imported['source']}")
    if facts.imported.get("notes"):
        lines.append(f"- notes: {facts.imported['notes']}")
    return lines


def _weight_key(item: tuple[str, float]) -> int:
    return int(item[0])


def _quality_lines(quality: dict[str, Any], data: ReportData) -> list[str]:
    forms = quality.get("forms") or {}
    lines = []
    for key in ("plain", "spec"):
        form = forms.get(key) or {}
        chosen = form.get("chosen", "?")
        loo = (form.get("loo_rmse_pct") or {}).get(chosen)
        loo_text = f"leave-one-out error {loo:.1f}%" if loo is not None else "no point to hold out"
        lines.append(f"- {key} step cost: {chosen} ({loo_text})")
    acc = quality.get("acceptance") or {}
    if acc.get("source") == "folded":
        lines.append("- acceptance: unknown (tok/s only): folded into the spec curve")
    elif acc:
        lines.append(
            f"- acceptance ({acc.get('source')}): {acc.get('mean_length', 0):.2f} tokens per "
            f"stream per step at n_max {acc.get('n_max')}"
        )
    unc = quality.get("uncertainty") or {}
    if unc:
        lines.append(
            f"- intervals: {100 * unc.get('interval', data.interval):.0f}%, bootstrap over "
            f"{unc.get('method')} ({unc.get('replicates')} replicates)"
        )
    lines += [
        "",
        "| config | streams | measured tok/s | predicted | interval | residual |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in quality.get("points") or []:
        lines.append(
            f"| {p['config']} | {p['concurrency']} | {p['measured_tps']:.1f} | "
            f"{p['predicted_tps']:.1f} | {p['lower']:.1f}-{p['upper']:.1f} | "
            f"{_pct(p['residual_pct'])} |"
        )
    for p in quality.get("threshold_check") or []:
        lines.append(
            f"| max-slots-{p['max_slots']} (held out) | {p['concurrency']} | "
            f"{p['measured_tps']:.1f} | {p['predicted_tps']:.1f} | "
            f"{p['lower']:.1f}-{p['upper']:.1f} | {_pct(p['error_pct'])} |"
        )
    worst = quality.get("worst_point") or {}
    lines += [
        "",
        f"**Worst residual: {_pct(quality.get('worst_residual_pct'))}** "
        f"({worst.get('config', '?')} at {_streams(worst.get('concurrency'))}); "
        f"rms {abs(quality.get('rms_residual_pct') or 0.0):.1f}%.",
    ]
    if quality.get("worst_threshold_error_pct") is not None:
        lines.append(
            f"Threshold rows (not fitted, predicted from plain and spec): worst error "
            f"{_pct(quality['worst_threshold_error_pct'])}."
        )
    lines.append(f"Model {crossover_text(data.crossover)}.")
    return lines


def _recommendation_lines(data: ReportData) -> list[str]:
    rec = data.recommendation
    origin = (
        f"made by this report for fit {rec.fit_id} (no stored recommendation of it)"
        if rec.made_by_report
        else f"stored recommendation {rec.id}, from fit {rec.fit_id}"
    )
    lines = ["```", rec.env_line, "```", "", f"- {origin}"]
    lines.append(
        f"- N={rec.max_slots}: {_policy_text(rec.max_slots, data.n_parallel)}, n_max {rec.n_max}"
    )
    if rec.objective is not None:
        interval = (
            f" [{rec.objective_interval[0]:.1f}, {rec.objective_interval[1]:.1f}]"
            if rec.objective_interval
            else ""
        )
        lines.append(f"- objective: {rec.objective:.1f} tok/s workload-weighted{interval}")
    if rec.reasons:
        lines += ["", "Reasons:", ""] + [f"- {reason}" for reason in rec.reasons]
    lines.append("")
    if rec.measure_next:
        levels = ",".join(map(str, rec.measure_next))
        lines.append(
            f"Measure next: {', '.join(_streams(c) for c in rec.measure_next)} "
            f"(`tuner profile SPEC.toml --levels {levels}`)."
        )
    else:
        lines.append("Measure next: no unmeasured level the choice rests on is undecided.")
    return lines


def _validation_lines(validation: Any, model: str, problem: str | None) -> list[str]:
    if validation is None:
        if problem:
            return [problem]
        return [f"no validation yet (run `tuner validate --model {model}`)"]
    v = validation
    labels = sorted(v.measured, key=_point_sort)
    lines = [
        f"Validation run {v.run_id} (it checked N={v.recommended}), levels "
        f"{', '.join(map(str, v.levels))}; measured tok/s (model prediction, model error).",
        "",
        "| candidate | weighted tok/s | " + " | ".join(_streams(c) for c in v.levels) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in v.levels) + " |",
    ]
    for name in labels:
        cells = []
        for c in v.levels:
            tps = v.measured[name].get(c)
            if tps is None:
                cells.append("-")
                continue
            pred = (v.predicted.get(name) or {}).get(c)
            err = (v.errors_pct.get(name) or {}).get(c)
            cells.append(f"{tps:.1f}" + (f" ({pred:.1f}, {_pct(err)})" if pred is not None else ""))
        weighted = v.weighted.get(name)
        marks = []
        if name == candidate_label(v.recommended):
            marks.append("recommended")
        if name == v.best:
            marks.append("best")
        shown = f"{name} ({', '.join(marks)})" if marks else name
        lines.append(
            f"| {shown} | {f'{weighted:.1f}' if weighted is not None else '-'} | "
            + " | ".join(cells)
            + " |"
        )
    mean = v.mean_abs_error_pct
    worst = v.worst_abs_error_pct
    lines += [
        "",
        f"- best measured: {v.best or '-'}; regret of the recommendation: {v.regret_text()}",
        f"- model error: mean |error| {f'{mean:.1f}%' if mean is not None else '-'}, "
        f"worst |error| {f'{worst:.1f}%' if worst is not None else '-'}",
    ]
    return lines


def render_summary(
    data: ReportData,
    facts: Facts,
    quality: dict[str, Any],
    inputs: dict[str, Any],
    validation: Any = None,
    validation_problem: str | None = None,
    host_note: str | None = None,
    generated_at: dt.datetime | None = None,
) -> str:
    """summary.md: host, build, model, data, fit quality, recommendation, validation."""
    when = (generated_at or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%d %H:%M UTC")
    from tuner import __version__

    sections: list[tuple[str, list[str]]] = [
        ("Host", _host_lines(facts, data)),
        ("Build", _build_lines(facts)),
        ("Model", _model_lines(facts)),
        (f"Data used (fit {data.fit_id})", _data_lines(facts, inputs)),
        ("Fit quality", _quality_lines(quality, data)),
        (f"Recommendation: N={data.recommendation.max_slots}", _recommendation_lines(data)),
        ("Validation", _validation_lines(validation, data.model, validation_problem)),
    ]
    lines = [
        f"# tuner report: {data.model}",
        "",
        f"tuner {__version__}, {when}. Figures: [{PNG_NAME}]({PNG_NAME}), "
        f"[{SVG_NAME}]({SVG_NAME}).",
        "",
        f"![aggregate and per-stream tok/s versus concurrency]({PNG_NAME})",
    ]
    if host_note:
        lines += ["", f"> note: {host_note}"]
    for title, body in sections:
        lines += ["", f"## {title}", "", *body]
    return "\n".join(lines).rstrip() + "\n"


# --- reading the database -------------------------------------------------------------------


@dataclass
class ReportInputs:
    """What load_inputs read: the fit, the recommendation, the points, facts and validation."""

    fit: Any  # tuner.recommend.StoredFit
    recommendation: RecommendationInfo
    points: list[LevelPoint]
    validation_runs: list[int]
    facts: Facts
    validation: Any = None  # tuner.validate.ValidationReport
    validation_problem: str | None = None


def _stored_recommendation(store: Store, fit_id: int) -> RecommendationInfo | None:
    """The newest stored recommendation made from this fit."""
    with store.session() as session:
        row = session.scalars(
            select(Recommendation)
            .where(Recommendation.fit_id == fit_id)
            .order_by(Recommendation.id.desc())
        ).first()
        if row is None:
            return None
        details = dict(row.details or {})
    interval = details.get("objective_interval")
    return RecommendationInfo(
        id=row.id,
        max_slots=row.max_slots,
        n_max=int(row.n_max or details.get("n_max") or 0),
        fit_id=fit_id,
        objective=row.objective,
        objective_interval=(
            (float(interval[0]), float(interval[1])) if interval and None not in interval else None
        ),
        reasons=list(details.get("reasons") or []),
        measure_next=[int(c) for c in details.get("measure_next") or []],
        tune_n_max=bool(details.get("tune_n_max")),
    )


def _recommendation(store: Store, model: str, fit: Any, seed: int) -> RecommendationInfo:
    from tuner.decide import recommend

    stored = _stored_recommendation(store, fit.id)
    if stored is not None:
        if not stored.n_max:
            stored = replace(stored, n_max=fit.model.n_max)
        return stored
    report = recommend.recommend(store, model, fit_id=fit.id, seed=seed)
    return RecommendationInfo(
        id=report.id,
        max_slots=report.max_slots,
        n_max=report.n_max,
        fit_id=fit.id,
        objective=report.objective,
        objective_interval=report.objective_interval,
        reasons=list(report.reasons),
        measure_next=list(report.measure_next),
        tune_n_max=report.tune_n_max,
        made_by_report=True,
    )


def _facts(store: Store, fit_id: int, run_ids: Sequence[int]) -> Facts:
    with store.session() as session:
        fit = session.get(Fit, fit_id)
        assert fit is not None
        host = fit.host
        build = fit.build
        model = fit.model
        runs = list(session.scalars(select(Run).where(Run.id.in_(run_ids)).order_by(Run.id)))
        imported: dict[str, str] = {}
        for run in reversed(runs):  # the newest imported table's texts
            if run.source == "imported":
                spec = run.spec or {}
                for key in ("model", "host", "build", "source", "notes"):
                    if spec.get(key) and key not in imported:
                        imported[key] = str(spec[key])
        return Facts(
            host=(
                {
                    "name": host.name,
                    "cpu_model": host.cpu_model,
                    "cpu_cores": host.cpu_cores,
                    "memory_bytes": host.memory_bytes,
                    "devices": [str(d) for d in host.devices or []],
                }
                if host
                else None
            ),
            build=(
                {
                    "binary_sha256": build.binary_sha256,
                    "version_text": build.version_text,
                    "has_max_slots": build.has_max_slots,
                }
                if build
                else None
            ),
            model={
                "name": model.name,
                "file_size": model.file_size,
                "file_sha256": model.file_sha256,
                "architecture": model.architecture,
                "quantization": model.quantization,
            },
            runs=[
                RunFact(
                    run.id,
                    run.kind,
                    run.source,
                    run.status,
                    run.spec_name,
                    run.label,
                    run.started_at,
                    sum(1 for lv in run.levels if lv.status == "completed"),
                )
                for run in runs
            ],
            imported=imported,
        )


def _validation(store: Store, model: str, host: str | None) -> tuple[int | None, Any, str | None]:
    """The latest validation run of the model on the fit's host, its analysis, or why not."""
    from tuner.decide import validate

    run_id = validate.latest_validation(store, model, host)
    if run_id is None:
        elsewhere = validate.latest_validation(store, model) if host is not None else None
        if elsewhere is None:
            return None, None, None
        other = run_points(store, elsewhere)[0].host or "an unnamed host"
        return (
            None,
            None,
            (
                f"no validation on {host} yet (the newest, run {elsewhere}, is from {other}); "
                f"run `tuner validate --model {model}` there"
            ),
        )
    try:
        return run_id, validate.analyse(store, run_id, model), None
    except TunerError as exc:
        return run_id, None, f"validation run {run_id} could not be analysed: {exc}"


def load_inputs(
    store: Store,
    model: str,
    host: str | None = None,
    *,
    host_explicit: bool = False,
    seed: int = 0,
) -> ReportInputs:
    """Read (and where missing, make) everything the report shows, from the database."""
    from tuner.decide import recommend

    fit = recommend.current_fit(store, model, host, host_explicit=host_explicit, seed=seed)
    fit_host = fit.inputs.get("host")
    rec = _recommendation(store, model, fit, seed)
    val_run, validation, problem = _validation(store, model, fit_host)
    run_ids = set(int(r) for r in fit.inputs.get("runs") or [])
    if val_run is not None:
        run_ids.add(val_run)
    points = [p for p in model_points(store, model) if p.run_id in run_ids]
    with store.session() as session:
        validation_runs = sorted(
            session.scalars(select(Run.id).where(Run.id.in_(run_ids), Run.kind == "validate"))
        )
    if not points:
        raise NothingToDoError(
            f"model {model!r} has no completed levels to report; run `tuner profile SPEC.toml`"
        )
    facts = _facts(store, fit.id, sorted(run_ids))
    return ReportInputs(fit, rec, points, validation_runs, facts, validation, problem)


# --- writing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportFiles:
    """The files write_report wrote (all inside out_dir)."""

    out_dir: Path
    png: Path
    svg: Path
    summary: Path
    recommendation: RecommendationInfo
    host_note: str | None = None

    @property
    def paths(self) -> list[Path]:
        return [self.png, self.svg, self.summary]


def _prepare_dir(out_dir: Path) -> Path:
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir}: exists and is not a folder")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out_dir}: cannot create the folder: {exc}") from exc
    return out_dir


def _replace_into(out_dir: Path, name: str, write: Any) -> Path:
    """Write through a temporary file in out_dir, then rename: no half-written report."""
    target = out_dir / name
    tmp = out_dir / f".{name}.{os.getpid()}.tmp"
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def write_report(
    store: Store,
    model: str,
    out_dir: Path = DEFAULT_OUT,
    host: str | None = None,
    *,
    host_explicit: bool = False,
    seed: int = 0,
) -> ReportFiles:
    """`tuner report`: report.png, report.svg and summary.md in out_dir (created if needed).

    Everything is read and computed before out_dir is touched, so a model without data writes
    nothing (NothingToDoError, naming `tuner profile`).
    """
    inputs = load_inputs(store, model, host, host_explicit=host_explicit, seed=seed)
    fit = inputs.fit
    data = report_data(
        model,
        fit.inputs.get("host"),
        fit.id,
        fit.model,
        inputs.recommendation,
        inputs.points,
        inputs.validation_runs,
    )
    text = render_summary(
        data,
        inputs.facts,
        fit.quality,
        fit.inputs,
        inputs.validation,
        inputs.validation_problem,
        fit.host_note,
    )
    fig = render_figure(data)
    out = _prepare_dir(out_dir)
    png = _replace_into(out, PNG_NAME, lambda p: save_figure(fig, p, "png"))
    svg = _replace_into(out, SVG_NAME, lambda p: save_figure(fig, p, "svg"))
    summary = _replace_into(out, SUMMARY_NAME, lambda p: p.write_text(text, encoding="utf-8"))
    return ReportFiles(out, png, svg, summary, inputs.recommendation, fit.host_note)
