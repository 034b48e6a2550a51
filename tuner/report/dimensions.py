"""The report's other dimensions, drawn under the tok/s panels when the data have them: how the
crossover moves with context depth, what each prompt set's drafts accept, and the open-loop
validation (time per output token and throughput against the arrival rate, per configuration).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tuner.measure.arrivals import OpenLoopFigures
from tuner.model.costmodel import Crossover


@dataclass
class Dimensions:
    """What the extra panels show; each is drawn only when it has something to say."""

    crossover_by_depth: dict[int, Crossover] = field(default_factory=dict)
    acceptance_by_prompt_set: dict[str, float] = field(default_factory=dict)
    open_loop_run: int | None = None
    open_loop: dict[float, dict[str, OpenLoopFigures]] = field(default_factory=dict)

    def panels(self) -> list[str]:
        names = []
        if len(self.crossover_by_depth) > 1:
            names.append("depth")
        if len(self.acceptance_by_prompt_set) > 1:
            names.append("acceptance")
        if self.open_loop:
            names += ["tpot", "openloop-tps"]
        return names


def _by_config(dims: Dimensions) -> dict[str, list[tuple[float, OpenLoopFigures]]]:
    series: dict[str, list[tuple[float, OpenLoopFigures]]] = {}
    for rate in sorted(dims.open_loop):
        for config, figures in dims.open_loop[rate].items():
            series.setdefault(config, []).append((rate, figures))
    return series


def draw(subfig: Any, dims: Dimensions) -> None:
    """One row of panels in subfig, one per dimension with data."""
    names = dims.panels()
    axes = subfig.subplots(1, len(names), squeeze=False)[0]
    for ax, name in zip(axes, names, strict=True):
        if name == "depth":
            depths = sorted(dims.crossover_by_depth)
            found = [d for d in depths if dims.crossover_by_depth[d].streams is not None]
            xs = [dims.crossover_by_depth[d] for d in found]
            ax.errorbar(
                found,
                [x.streams for x in xs],
                yerr=[
                    [x.streams - x.lower for x in xs],  # type: ignore[operator]
                    [x.upper - x.streams for x in xs],  # type: ignore[operator]
                ],
                fmt="o-",
                capsize=4,
                gid="crossover-by-depth",
            )
            missing = [d for d in depths if d not in found]
            for d in missing:
                ax.annotate("no crossover", (d, 1.0), rotation=90, fontsize=8, ha="center")
            ax.set_xlabel("context depth (tokens per stream)")
            ax.set_ylabel("crossover (streams)")
            ax.set_title("Crossover against depth")
            ax.set_ylim(bottom=0)
        elif name == "acceptance":
            labels = sorted(dims.acceptance_by_prompt_set)
            ax.bar(
                labels,
                [dims.acceptance_by_prompt_set[k] for k in labels],
                gid="acceptance-by-prompt-set",
            )
            ax.set_ylabel("tokens per stream per step")
            ax.set_title("Acceptance per prompt set")
            ax.tick_params(axis="x", labelrotation=20, labelsize=8)
        else:
            tpot = name == "tpot"
            for config, points in _by_config(dims).items():
                rates = [r for r, _ in points]
                values = [f.tpot_ms[1] if tpot else f.tokens_per_second for _, f in points]
                values = [v if math.isfinite(v) else float("nan") for v in values]
                ax.plot(rates, values, "o-", label=config, gid=f"openloop-{name}-{config}")
            ax.set_xlabel("arrival rate (requests/s)")
            ax.set_ylabel("p95 time per output token (ms)" if tpot else "served tok/s")
            ax.set_title(
                f"Open loop (run {dims.open_loop_run}): " + ("p95 TPOT" if tpot else "throughput")
            )
            ax.legend(fontsize=7)
            ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)


def open_loop_lines(dims: Dimensions) -> list[str]:
    """summary.md's open-loop table: per rate and configuration."""
    if not dims.open_loop:
        return [
            "no open-loop validation yet (run `tuner validate --model M --arrivals poisson "
            "--rate R1,R2`)"
        ]
    lines = [
        f"Open-loop run {dims.open_loop_run}: requests arriving at random (or replayed).",
        "",
        "| rate /s | config | done | tok/s | TTFT p50 / p95 ms | TPOT p50 / p95 / p99 ms | "
        "generating |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for rate in sorted(dims.open_loop):
        for config, f in dims.open_loop[rate].items():
            lines.append(
                f"| {rate:.3g} | {config} | {f.completed}/{f.offered} | "
                f"{f.tokens_per_second:.1f} | {f.ttft_ms[0]:.0f} / {f.ttft_ms[1]:.0f} | "
                f"{f.tpot_ms[0]:.1f} / {f.tpot_ms[1]:.1f} / {f.tpot_ms[2]:.1f} | "
                f"{f.mean_generating:.2f} |"
            )
    return lines
