"""The report's figure: aggregate tok/s (top) and per-stream tok/s (bottom) over concurrency,
measured points with their spreads, model curves in their interval bands, the recommended policy,
the crossover and validation points; under them, where the data have them, the crossover against
depth, acceptance per prompt set and the open-loop validation (tuner.report.dimensions).
matplotlib's object API on the Agg canvas, no pyplot state.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tuner.policy import Policy
from tuner.report.dimensions import Dimensions
from tuner.report.dimensions import draw as draw_dimensions
from tuner.report.series import ReportData
from tuner.report.tables import crossover_text

PNG_NAME = "report.png"
SVG_NAME = "report.svg"

# Colours per candidate (matplotlib's tab10): plain blue, always-draft orange, policy green,
# other thresholds purple, brown, pink, olive.
PLAIN_COLOUR = "tab:blue"
SPEC_COLOUR = "tab:orange"
POLICY_COLOUR = "tab:green"
THRESHOLD_COLOURS = ("tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")
CROSSOVER_COLOUR = "0.35"
VALIDATION_DODGE = 0.06  # streams between the markers of validation candidates at one level


def _point_colour(policy: Policy, recommended: int) -> str:
    if policy.is_plain:
        return PLAIN_COLOUR
    if policy.is_always:
        return SPEC_COLOUR
    if policy.max_slots == recommended:
        return POLICY_COLOUR
    return THRESHOLD_COLOURS[policy.max_slots % len(THRESHOLD_COLOURS)]


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
        colour = _point_colour(points.policy, data.recommendation.max_slots)
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


def render_figure(data: ReportData, dims: Dimensions | None = None) -> Any:
    """The two-panel figure (a matplotlib Figure on the Agg canvas; no pyplot state), with a row
    of the other dimensions under it where the data have them (tuner.report.dimensions)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    extra = dims is not None and bool(dims.panels())
    fig = Figure(figsize=(11, 15 if extra else 11), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    if extra:
        assert dims is not None
        main, below = fig.subfigures(2, 1, height_ratios=[11, 4])
        draw_dimensions(below, dims)
    else:
        main = fig
    top, bottom = main.subplots(2, 1, sharex=True)
    _draw_panel(top, data, per_stream=False)
    _draw_panel(bottom, data, per_stream=True)
    rec = data.recommendation
    where = f" on {data.host}" if data.host else ""
    fig.suptitle(
        f"{data.model}{where}: {rec.headline()}\n"
        f"fit {data.fit_id}, n_max {data.n_max}, -np {data.n_parallel}",
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
    main.legend(
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
