"""Benchmark figures as data: every benchmark writes what it prints into one JSON file per run,
and docs/results.md is rendered from those files.

A run's file is benchmarks/results/<benchmark>/<UTC date-time>.json:

    {"benchmark": "regret", "date": "2026-12-05T10:31:22Z",
     "machine": {"cpu", "cores", "memory_gib", "kernel", "os", "python", "gpus"},
     "version": {"tuner": tuner.__version__, "checkout": `git describe --always --dirty`},
     "command": [argv], "summary": {headline figures},
     "tables": [{"title", "columns", "rows"}]}

A benchmark adds `--no-record` (a trial run: print only) and `--results-dir` to its parser
with `record_arguments`, and writes its figures with `save_run` at its end. Figures that may be
missing or infinite are printed with `fmt` and stored as JSON null, "inf" or "-inf" (strict JSON
has no NaN or Infinity).

    .venv/bin/python benchmarks/record.py render           # write docs/results.md
    .venv/bin/python benchmarks/record.py render --check   # exit 1 when it is not current

The same command writes the README's table of headline figures (between its `figures` markers):
the newest run of each benchmark in QUOTED (of each set of worlds it was graded on), the
figures `headline` picks from it.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
REPO = BENCHMARKS.parent
RESULTS = BENCHMARKS / "results"
PAGE = REPO / "docs" / "results.md"
README = REPO / "README.md"
BEGIN = "<!-- figures: written by benchmarks/record.py render; do not edit -->"
END = "<!-- figures: end -->"
RENDER = ".venv/bin/python benchmarks/record.py render"


# --- printing figures that may be missing -----------------------------------------------------


def fmt(value: float | None, spec: str = ".2f") -> str:
    """A figure as text: `n/a` for a missing one (None or NaN), `unbounded` or `-unbounded` for
    an infinite one (an interval's bound before its second value, a regret against a policy
    whose queue grows without bound), else `format(value, spec)`."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "unbounded" if value > 0 else "-unbounded"
    return format(value, spec)


# --- writing a run's figures --------------------------------------------------------------------


@dataclass
class Table:
    """One table of a run: a title, column names and rows of cells (numbers, text, None)."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(
                    f"table {self.title!r}: a row of {len(row)} cells for "
                    f"{len(self.columns)} columns: {row!r}"
                )

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "columns": list(self.columns), "rows": plain(self.rows)}


def record_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark has: --no-record and --results-dir."""
    parser.add_argument(
        "--no-record", action="store_true", help="print the figures only: write no results file"
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS,
        help="where runs' JSON files go (default: benchmarks/results)",
    )


def plain(value: Any) -> Any:
    """A value as strict JSON: mappings and sequences walked, tuples as lists, floats to six
    significant digits, NaN as null, infinities as "inf" and "-inf", anything else not JSON as
    its text."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return float(f"{value:.6g}")  # six significant digits: more is the clock's noise
    if hasattr(value, "item"):  # a numpy scalar
        return plain(value.item())
    return str(value)


def _run(*command: str) -> str | None:
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=10, check=False, cwd=REPO
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def machine() -> dict[str, Any]:
    """The machine a run measured: CPU, cores, memory, kernel, OS, Python and GPUs (names from
    nvidia-smi where it is installed). No host name: the files are committed."""
    from tuner.measure.fingerprint import probe_host

    host = probe_host(None)
    gpus: list[str] = []
    if shutil.which("nvidia-smi"):
        listed = _run("nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader")
        gpus = [line.strip() for line in (listed or "").splitlines() if line.strip()]
    return {
        "cpu": host.cpu_model,
        "cores": host.cpu_cores,
        "memory_gib": round(host.memory_bytes / (1 << 30), 1) if host.memory_bytes else None,
        "kernel": platform.release(),
        "os": platform.system(),
        "python": platform.python_version(),
        "gpus": gpus,
    }


def version() -> dict[str, str | None]:
    """tuner's version and the checkout's `git describe --always --dirty` (None outside git)."""
    import tuner

    return {"tuner": tuner.__version__, "checkout": _run("git", "describe", "--always", "--dirty")}


def command(argv: Sequence[str]) -> list[str]:
    """The command line, the script's path relative to the checkout where it lies in it."""
    if not argv:
        return []
    script = Path(argv[0]).resolve()
    first = str(script.relative_to(REPO)) if script.is_relative_to(REPO) else argv[0]
    return [first, *argv[1:]]


def run_record(
    benchmark: str,
    summary: Mapping[str, Any],
    tables: Sequence[Table],
    argv: Sequence[str],
) -> dict[str, Any]:
    """A run's JSON object, dated now (ISO 8601, UTC)."""
    return {
        "benchmark": benchmark,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "version": version(),
        "command": command(argv),
        "summary": plain(summary),
        "tables": [t.as_dict() for t in tables],
    }


def save_run(
    script: str,
    args: argparse.Namespace,
    summary: Mapping[str, Any],
    tables: Sequence[Table],
    argv: Sequence[str] | None = None,
) -> Path | None:
    """Write a run's figures (script: the benchmark's __file__, which names it) into
    args.results_dir/<benchmark>/<date>.json; nothing with --no-record. The path, said on
    stderr (a benchmark's stdout may be JSON of its own)."""
    if args.no_record:
        return None
    benchmark = Path(script).stem
    record = run_record(benchmark, summary, tables, sys.argv if argv is None else argv)
    folder = Path(args.results_dir) / benchmark
    folder.mkdir(parents=True, exist_ok=True)
    stem = record["date"].replace(":", "-")
    path, k = folder / f"{stem}.json", 1
    while path.exists():  # two runs in one second
        k += 1
        path = folder / f"{stem}-{k}.json"
    path.write_text(json.dumps(record, indent=1, allow_nan=False) + "\n")
    sys.stdout.flush()  # the figures printed first, where both streams go to one place
    print(f"figures written to {path}", file=sys.stderr)
    return path


# --- rendering docs/results.md ------------------------------------------------------------------


def load_runs(results: Path) -> list[dict[str, Any]]:
    """Every run's record under results (<benchmark>/*.json)."""
    runs = []
    for path in sorted(results.glob("*/*.json")):
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise SystemExit(f"{path}: not JSON: {exc}") from exc
        missing = {"benchmark", "date", "tables"} - set(record)
        if missing:
            raise SystemExit(f"{path}: no {', '.join(sorted(missing))}")
        record["_file"] = path.name
        runs.append(record)
    return runs


def cell(value: Any) -> str:
    """A table cell as Markdown: numbers to two decimals (three significant digits below 1),
    missing ones n/a, an infinite one in words (a regret or margin against a policy whose queue
    grows without bound: unbounded), lists joined, pipes escaped."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value in ("inf", "-inf"):  # how the results files store an infinite figure
        value = float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return fmt(value)
    if isinstance(value, float):
        if value == int(value) and abs(value) >= 1000:
            return f"{value:.0f}"
        return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"
    if isinstance(value, list):
        return ", ".join(cell(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {cell(v)}" for k, v in value.items())
    return str(value).replace("|", "\\|").replace("\n", " ")


def machine_text(m: Mapping[str, Any]) -> str:
    parts = [str(m.get("cpu") or "unknown CPU")]
    detail = []
    if m.get("cores"):
        detail.append(f"{m['cores']} cores")
    if m.get("memory_gib"):
        detail.append(f"{m['memory_gib']} GiB")
    if detail:
        parts[0] += f" ({', '.join(detail)})"
    if m.get("os") or m.get("kernel"):
        parts.append(f"{m.get('os') or ''} {m.get('kernel') or ''}".strip())
    parts.append("GPU: " + ("; ".join(m["gpus"]) if m.get("gpus") else "none"))
    return ", ".join(parts)


def run_text(run: Mapping[str, Any]) -> list[str]:
    """One run: its date, machine, version and command, summary, then its tables."""
    date = str(run["date"]).replace("T", " ").replace("Z", " UTC")
    v = run.get("version") or {}
    lines = [
        f"### {date}",
        "",
        f"- machine: {machine_text(run.get('machine') or {})}",
        f"- version: tuner {v.get('tuner', '?')}, checkout {v.get('checkout') or 'unknown'}",
    ]
    if run.get("command"):
        lines.append(f"- command: `{' '.join(map(str, run['command']))}`")
    for name, value in (run.get("summary") or {}).items():
        lines.append(f"- {name}: {cell(value)}")
    for t in run["tables"]:
        lines += ["", f"**{cell(t['title'])}**", ""]
        lines.append("| " + " | ".join(cell(c) for c in t["columns"]) + " |")
        lines.append("|" + "---|" * len(t["columns"]))
        lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in t["rows"]]
    return lines


def render_page(runs: Sequence[Mapping[str, Any]]) -> str:
    """docs/results.md: a section per benchmark (by name), its runs newest first."""
    lines = [
        "# Benchmark results",
        "",
        f"Generated from benchmarks/results/*/*.json by `{RENDER}`: do not edit by hand.",
        f"`{RENDER} --check` (scripts/test.sh runs it) fails when this page is not current.",
        "Each benchmark's docstring (benchmarks/NAME.py) says what it measures and how; its runs",
        "are listed newest first.",
    ]
    by_name: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        by_name.setdefault(str(run["benchmark"]), []).append(run)
    if not by_name:
        lines += ["", "No results recorded yet."]
    for name in sorted(by_name):
        lines += ["", f"## {name}", "", f"benchmarks/{name}.py"]
        newest = sorted(by_name[name], key=lambda r: (r["date"], r.get("_file", "")), reverse=True)
        for run in newest:
            lines += ["", *run_text(run)]
    return "\n".join(lines) + "\n"


# --- the README's headline figures ---------------------------------------------------------------

# benchmark -> what its figures show, in the README's order
QUOTED = {
    "twin_regret": "closed-loop decisions on frozen twin worlds (regret against the truth)",
    "openloop_regret": "open-loop traffic on frozen twin worlds (regret in mean time per token)",
    "watch_experiment": "`watch --experiment` on the open-loop worlds",
    "tune_url": "`tune --url` on a running twin server against profile + tune",
}


def _table(run: Mapping[str, Any], title: str) -> tuple[list[str], list[list[Any]]]:
    for t in run.get("tables", []):
        if t["title"] == title:
            return list(t["columns"]), [list(r) for r in t["rows"]]
    return [], []


def _regret_rows(run: Mapping[str, Any], title: str) -> list[tuple[str, str]]:
    """Median / p95 / max regret of each method over all worlds."""
    columns, rows = _table(run, title)
    if not columns:
        return []
    at = {c: i for i, c in enumerate(columns)}
    out = []
    for row in rows:
        if row[at["group"]] != "all":
            continue
        figures = "/".join(
            cell(row[at[k]]) for k in ("median regret %", "p95 regret %", "max regret %")
        )
        out.append((f"{row[at['method']]}: regret % median/p95/max", figures))
    return out


def headline(run: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The figures the README quotes from a run: (what, value)."""
    name = run["benchmark"]
    summary = run.get("summary") or {}
    if name == "twin_regret":
        return [("worlds", cell(summary.get("worlds"))), *_regret_rows(run, "summary by group")]
    if name == "openloop_regret":
        return [("worlds", cell(summary.get("worlds"))), *_regret_rows(run, "summary by tag")]
    keys = {
        "watch_experiment": (
            "worlds x traffic",
            "within 1 % of the open-loop best (share)",
            "settled",
            "coverage of settled (share within 1 %)",
            "coverage of settled, one-sided 95 % lower bound",
            "started 5 % or more behind at 0.1 req/s or more",
            "of them within 1 % at the end (share)",
        ),
        "tune_url": ("runs", "agree", "restored", "check_ok"),
        "function_lengths": ("functions", "over_limit", "longest"),
    }.get(name)
    items = [(k, summary[k]) for k in keys if k in summary] if keys else list(summary.items())[:4]
    return [(k, cell(v)) for k, v in items]


def readme_block(runs: Sequence[Mapping[str, Any]]) -> str:
    """The README's table: per quoted benchmark, its newest run's headline figures."""
    lines = [BEGIN, "", "| what | figure | value | measured | command |", "|---|---|---|---|---|"]
    for name, what in QUOTED.items():
        mine = [r for r in runs if r["benchmark"] == name]
        if not mine:
            continue
        # a benchmark graded on sets of worlds: the newest run on each set, the set named where
        # there are several (every run is in docs/results.md; runs on no set, a bench run say,
        # are there only)
        graded = [r for r in mine if _set_of(r)]
        sets = sorted({_set_of(r) for r in graded})
        if not sets:
            lines += _quoted_rows(newest(mine), what)
            continue
        for name_of_set in sets:
            run = newest([r for r in graded if _set_of(r) == name_of_set])
            lines += _quoted_rows(run, f"{what}, set {name_of_set}" if len(sets) > 1 else what)
    lines += ["", END]
    return "\n".join(lines)


def _set_of(run: Mapping[str, Any]) -> str:
    return str((run.get("summary") or {}).get("set") or "")


def newest(runs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    return max(runs, key=lambda r: (r["date"], r.get("_file", "")))


def _quoted_rows(run: Mapping[str, Any], what: str) -> list[str]:
    """One quoted run's rows of the README's table."""
    lines = []
    date = str(run["date"])[:10]
    argv = [str(a) for a in run.get("command") or [f"benchmarks/{run['benchmark']}.py"]]
    # a folder of the machine it ran on (a cache, say) means nothing to a reader
    command = " ".join("DIR" if a.startswith("/") else a for a in argv)
    for i, (figure, value) in enumerate(headline(run)):
        first = i == 0
        lines.append(
            f"| {what if first else ''} | {figure} | {value} | {date if first else ''} | "
            + (f"`{command}`" if first else "")
            + " |"
        )
    return lines


def with_readme_block(text: str, block: str) -> str | None:
    """The README with its figures block replaced; None where it has no markers."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return None
    return text[:start] + block + text[end + len(END) :]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render docs/results.md from benchmark runs.")
    sub = parser.add_subparsers(dest="action", required=True)
    render = sub.add_parser("render", help="write docs/results.md from benchmarks/results")
    render.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    render.add_argument("--results-dir", type=Path, default=RESULTS)
    render.add_argument("--page", type=Path, default=PAGE)
    render.add_argument(
        "--readme", type=Path, default=None, help="default: README.md, with the default results"
    )
    args = parser.parse_args(argv)
    runs = load_runs(args.results_dir)
    text = render_page(runs)
    # the README quotes the repository's own results only (not a --results-dir elsewhere)
    readme_path = args.readme or (README if args.results_dir == RESULTS else None)
    readme = readme_path.read_text() if readme_path and readme_path.exists() else ""
    quoted = with_readme_block(readme, readme_block(runs))
    if args.check:
        current = args.page.read_text() if args.page.exists() else None
        stale = [p for p, now, want in ((args.page, current, text), (readme_path, readme, quoted))
                 if want is not None and now != want]  # fmt: skip
        for page in stale:
            print(f"{page} is not current: run {RENDER}", file=sys.stderr)
        return 1 if stale else 0
    args.page.parent.mkdir(parents=True, exist_ok=True)
    args.page.write_text(text)
    if quoted is not None and readme_path is not None:
        readme_path.write_text(quoted)
    names = {r["benchmark"] for r in runs}
    print(f"wrote {args.page}: {len(runs)} runs of {len(names)} benchmarks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
