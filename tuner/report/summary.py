"""summary.md: host, build, model, the data used, fit quality, the recommendation with its reasons,
and the validation figures when a validation exists. Pure: text from what writer.py read."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from tuner.decide.regret import ValidationReport
from tuner.model.quality import FitQuality
from tuner.recommendation import Origin, Recommendation
from tuner.report.dimensions import Dimensions, open_loop_lines
from tuner.report.figure import PNG_NAME, SVG_NAME
from tuner.report.series import ReportData
from tuner.report.tables import fit_quality_table, markdown, pct, streams

SHA_PREFIX = 12


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
        f"- workload: {_md(inputs.get('workload') or 'unknown')}",
        f"- context depth of the fit: {inputs.get('context_tokens') or 0} tokens per stream",
        *(
            f"- crossover at depth {depth}: {_md(text)}"
            for depth, text in (inputs.get("crossover_by_depth") or {}).items()
        ),
        *(
            f"- acceptance with {_md(name)}: {value:.2f} tokens per stream per step (always "
            "draft, median over levels)"
            for name, value in (inputs.get("acceptance_by_prompt_set") or {}).items()
        ),
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


def _quality_lines(quality: FitQuality, data: ReportData) -> list[str]:
    return markdown(fit_quality_table(quality, data.crossover))


def _recommendation_title(rec: Recommendation) -> str:
    """The section's title: the answer as every surface states it (never as settled where it
    is not)."""
    return f"Recommendation: {rec.headline()}"


def _recommendation_lines(data: ReportData) -> list[str]:
    rec = data.recommendation
    origin = (
        f"made by this report for fit {rec.fit_id} (no stored recommendation of it)"
        if rec.made_now
        else f"stored recommendation {rec.id}, from fit {rec.fit_id}"
    )
    lines = ["```", rec.render("env"), "```", "", f"- {origin}"]
    lines.append(
        f"- {rec.policy.label}: {rec.policy.describe(data.n_parallel)}, "
        f"n_max {rec.n_max or data.n_max}"
    )
    if rec.objective is not None and rec.objective_kind != "tps":
        lines.append(f"- objective ({rec.objective_kind}): {rec.objective_text}")
    elif rec.objective is not None:
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
        lines.append(
            f"Measure next: {', '.join(streams(c) for c in rec.measure_next)} "
            f"(`{rec.measure_command}`)."
        )
    else:
        lines.append("Measure next: no unmeasured level the choice rests on is undecided.")
    return lines


def _validation_lines(
    validation: ValidationReport | None,
    model: str,
    problem: str | None,
    origin: Origin | None = None,
) -> list[str]:
    if validation is None:
        if problem:
            return [problem]
        if origin is not None and origin.url is not None:
            # validate launches servers of a spec; a running server's data were measured by
            # tune --url, whose paired comparisons at the answer's contenders are its check
            return [
                "no validation run: the data come from a running server (`tune --url`), whose "
                f"live comparisons are the check; `{origin.measure()}` measures more"
            ]
        return [f"no validation yet (run `tuner validate --model {model}`)"]
    v = validation
    lines = [
        f"Validation run {v.run_id} (it checked {v.recommended.label}), levels "
        f"{', '.join(map(str, v.levels))}; measured tok/s (model prediction, model error).",
        "",
        "| policy | weighted tok/s | " + " | ".join(streams(c) for c in v.levels) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in v.levels) + " |",
    ]
    for policy in v.policies:
        cells = []
        for c in v.levels:
            tps = v.measured[policy].get(c)
            if tps is None:
                cells.append("-")
                continue
            pred = (v.predicted.get(policy) or {}).get(c)
            err = (v.errors_pct.get(policy) or {}).get(c)
            cells.append(f"{tps:.1f}" + (f" ({pred:.1f}, {pct(err)})" if pred is not None else ""))
        weighted = v.weighted.get(policy)
        marks = []
        if policy.max_slots == v.recommended.max_slots:
            marks.append("recommended")
        if policy == v.best:
            marks.append("best")
        shown = f"{policy.label} ({', '.join(marks)})" if marks else policy.label
        lines.append(
            f"| {shown} | {f'{weighted:.1f}' if weighted is not None else '-'} | "
            + " | ".join(cells)
            + " |"
        )
    mean = v.mean_abs_error_pct
    worst = v.worst_abs_error_pct
    lines += [
        "",
        f"- best measured: {v.best.label if v.best else '-'}; regret of the recommendation: "
        f"{v.regret_text()}",
        f"- model error: mean |error| {f'{mean:.1f}%' if mean is not None else '-'}, "
        f"worst |error| {f'{worst:.1f}%' if worst is not None else '-'}",
    ]
    if v.standing is not None:
        lines.append(f"- {v.standing_text()}")
    return lines


def render_summary(
    data: ReportData,
    facts: Facts,
    quality: FitQuality,
    inputs: dict[str, Any],
    validation: ValidationReport | None = None,
    validation_problem: str | None = None,
    host_note: str | None = None,
    generated_at: dt.datetime | None = None,
    dims: Dimensions | None = None,
) -> str:
    """summary.md: host, build, model, data, fit quality, recommendation, validation, open
    loop."""
    when = (generated_at or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%d %H:%M UTC")
    from tuner import __version__

    sections: list[tuple[str, list[str]]] = [
        ("Host", _host_lines(facts, data)),
        ("Build", _build_lines(facts)),
        ("Model", _model_lines(facts)),
        (f"Data used (fit {data.fit_id})", _data_lines(facts, inputs)),
        ("Fit quality", _quality_lines(quality, data)),
        (_recommendation_title(data.recommendation), _recommendation_lines(data)),
        (
            "Validation",
            _validation_lines(
                validation, data.model, validation_problem, data.recommendation.origin
            ),
        ),
        ("Open loop", open_loop_lines(dims or Dimensions())),
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
