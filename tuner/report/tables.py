"""Tables that more than one output shows, built once as plain rows: the CLI draws them with rich
(tuner.cli.render), the report's summary as Markdown (`markdown`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.model.costmodel import Crossover
    from tuner.model.quality import FitQuality, PointFit, Uncertainty


@dataclass(frozen=True)
class Table:
    """A titled table with lines before and after it."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    head: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def contrast_cells(
    estimate: float,
    bounds: tuple[float, float],
    df: float,
    levels: Sequence[int],
    pairs: Mapping[int, int],
    unit: str = "",
) -> list[str]:
    """A paired comparison's advantage, bounds and degrees of freedom as table cells, in words
    where the data cannot give them: a level without a pair ("not measured at 3 streams"), or
    one pair where a bound needs two. Never nan or inf in anything a user reads."""
    missing = [c for c in levels if pairs.get(c, 0) == 0]
    if missing:
        return [f"not measured at {_levels_text(missing)}", "", ""]
    if not math.isfinite(estimate):
        return ["not measured", "", ""]
    low, high = bounds
    if not (math.isfinite(low) and math.isfinite(high)):
        single = [c for c in levels if pairs.get(c, 0) < 2]
        where = f" at {_levels_text(single)}" if single else ""
        return [f"{estimate:+.2f}{unit}", f"no bounds: one pair{where}", ""]
    return [f"{estimate:+.2f}{unit}", f"[{low:+.2f}, {high:+.2f}]{unit}", f"{df:.1f}"]


def _levels_text(levels: Sequence[int]) -> str:
    return ", ".join(map(str, sorted(levels))) + (" stream" if list(levels) == [1] else " streams")


def pct(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:+.1f}%"


def streams(c: int) -> str:
    return f"{c} stream" + ("" if c == 1 else "s")


def crossover_text(cross: Crossover) -> str:
    """Where drafting stops paying: against plain (whether to draft at all) or against the
    threshold server not drafting (where N sits)."""
    off = getattr(cross, "against", "plain") == "off"
    other = "not drafting" if off else "plain"
    if cross.streams is None:
        if cross.spec_wins_upto == 0:
            return f"no crossover: {other} ahead from 1 stream"
        return f"no crossover: drafting ahead of {other} at every level"
    what = "crossover against not drafting" if off else "crossover"
    return f"{what} {cross.streams:.1f} streams [{cross.lower:.1f}, {cross.upper:.1f}]"


def _row(p: PointFit, held_out: bool) -> list[str]:
    name = p.policy.config_name + (" (held out)" if held_out else "")
    step = (
        [f"{p.measured_step_ms:.1f}", f"{p.predicted_step_ms:.1f}"]
        if p.measured_step_ms is not None and p.predicted_step_ms is not None
        else ["", ""]
    )
    return [
        name,
        str(p.concurrency),
        f"{p.measured_tps:.1f}",
        f"{p.predicted_tps:.1f}",
        f"{p.lower:.1f}-{p.upper:.1f}",
        pct(p.residual_pct),
        *step,
    ]


def fit_quality_table(quality: FitQuality, crossover: Crossover) -> Table:
    """The forms, acceptance and intervals; per point measured against predicted; the worst
    residual, the held-out threshold levels and the crossover."""
    unc = quality.uncertainty
    regime = quality.threshold_regime
    head = [*_forms_lines(quality), _intervals_line(unc), *_threshold_lines(quality)]
    worst = quality.worst_point
    notes = [
        f"worst residual: {pct(worst.residual_pct)} ({worst.policy.config_name} at "
        f"{streams(worst.concurrency)}); rms {quality.rms_residual_pct:.1f}%"
    ]
    held = quality.worst_held_out
    if held is not None:
        what = (
            "threshold levels up to their N (drafting; not in the curves)"
            if regime.get("source") == "curve"
            else "threshold levels (spec up to N, plain with the overhead above; not in the curves)"
        )
        notes.append(f"{what}: worst error {pct(held.residual_pct)}")
    notes.append(f"model {crossover_text(crossover)}")
    return Table(
        title=f"fit quality ({100 * unc.interval:.0f}% intervals)",
        columns=[
            "policy",
            "streams",
            "measured tok/s",
            "predicted",
            "interval",
            "residual",
            "step ms meas.",
            "step ms pred.",
        ],
        rows=[_row(p, False) for p in quality.points] + [_row(p, True) for p in quality.held_out],
        head=head,
        notes=notes,
    )


def _forms_lines(quality: FitQuality) -> list[str]:
    """Each regime's step-cost form with its leave-one-out error, and the acceptance."""
    head = []
    for key in ("plain", "spec", "off"):
        if key not in quality.forms:
            continue
        form = quality.forms[key]
        loo = form.chosen_loo_pct
        loo_text = f"leave-one-out error {loo:.1f}%" if loo is not None else "no point to hold out"
        head.append(f"{key} step cost: {form.chosen} ({loo_text})")
    acc = quality.acceptance
    if acc.get("source") == "folded":
        head.append("acceptance: unknown (tok/s only): folded into the spec curve, n_max fixed")
    else:
        head.append(
            f"acceptance ({acc.get('source')}): {acc.get('mean_length', 0):.2f} tokens per "
            f"stream per step at n_max {acc.get('n_max')}"
        )
    return head


def _intervals_line(unc: Uncertainty) -> str:
    """What the intervals are: their level, the bootstrap, the floor and the forms averaged."""
    extra = ""
    if unc.launch_noise_pct is not None:
        averaged = "; ".join(
            f"{key} " + ", ".join(f"{form} {w:.0%}" for form, w in weights.items())
            for key, weights in unc.form_weights.items()
        )
        extra = (
            f", launch-to-launch floor {unc.launch_noise_pct:.0f}%, forms averaged "
            f"({averaged}) with their leave-one-out errors between levels"
        )
    return (
        f"intervals: {100 * unc.interval:.0f}%, bootstrap over {unc.method} "
        f"({unc.replicates} replicates){extra}"
    )


def _threshold_lines(quality: FitQuality) -> list[str]:
    """How the threshold server above N was modelled: its own curve, a measured overhead
    against plain, or plain's (nothing where the fit says nothing of it)."""
    regime = quality.threshold_regime
    if regime.get("source") == "curve":
        levels = ", ".join(str(c) for c in regime.get("levels", []))
        return [
            f"threshold server above N: its own curve ({quality.forms['off'].chosen}) from off "
            f"rows at {levels} streams; {pct(100 * regime['overhead'])} against plain (median "
            "over those levels)"
        ]
    if regime.get("rows"):
        unfitted = regime.get("unfitted_levels")
        why = (
            f"; no curve fits the off rows at {', '.join(map(str, unfitted))} streams"
            if unfitted
            else ""
        )
        return [
            f"threshold server above N: {pct(100 * regime['overhead'])} against plain "
            f"(median of {regime['rows']} measured row(s){why})"
        ]
    if regime:
        return ["threshold server above N: assumed equal to plain (no threshold rows above N)"]
    return []


def markdown(table: Table) -> list[str]:
    """The table as Markdown lines: its head as bullets, the rows, its notes as sentences."""
    lines = [f"- {line}" for line in table.head]
    lines += [
        "",
        "| " + " | ".join(table.columns) + " |",
        "| --- | " + " | ".join("---:" for _ in table.columns[1:]) + " |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table.rows]
    lines.append("")
    lines += [f"{note[0].upper()}{note[1:]}." for note in table.notes]
    return lines
