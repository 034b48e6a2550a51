"""Benchmarks write their figures as data (benchmarks/record.py), and docs/results.md is rendered
from those files.

Every script under benchmarks/ (bar the shared code and the exempt ones named below) takes
--no-record and writes its run through the recorder; each one's rows-to-tables function is run
here on made-up figures and written and rendered as a run would be, with no bench. The renderer
and its --check are run on temporary files; the committed page must be what rendering gives.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.append(str(BENCHMARKS))  # appended: a benchmark's name never shadows a package

import record  # noqa: E402  (benchmarks/record.py, found through the path above)
from record import Table, fmt  # noqa: E402

SHARED = {"common", "record"}  # code the benchmarks share, not benchmarks
EXEMPT = {
    "make_frozen_worlds": "writes the frozen twin worlds (inputs); it measures nothing",
    "make_openloop_worlds": "writes the open-loop twin worlds (inputs); it measures nothing",
    "make_openloop2_worlds": "writes version 2 of the open-loop twin worlds (inputs)",
}


def benchmark_names() -> list[str]:
    return sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem not in SHARED)


def load(name: str) -> ModuleType:
    """A benchmark script as a module, under a name of its own (benchmark_<name>)."""
    cached = sys.modules.get(f"benchmark_{name}")
    if cached is not None:
        return cached
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def written(tmp_path: Path, name: str, summary: dict, tables: list[Table]) -> dict[str, Any]:
    """A run's figures saved as the benchmark saves them, read back, and rendered."""
    args = argparse.Namespace(no_record=False, results_dir=tmp_path / "results")
    path = record.save_run(str(BENCHMARKS / f"{name}.py"), args, summary, tables, ["x.py"])
    assert path is not None and path.parent == tmp_path / "results" / name
    run = json.loads(path.read_text())  # strict JSON: no NaN or Infinity in it
    assert record.render_page(record.load_runs(tmp_path / "results")).count(f"## {name}") == 1
    return run


# --- every benchmark is wired to the recorder -------------------------------------------------


def calls(path: Path) -> set[str]:
    """The names of the functions a file calls."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            out.add(f.id if isinstance(f, ast.Name) else getattr(f, "attr", ""))
    return out


def test_every_benchmark_takes_no_record_and_saves_its_run() -> None:
    names = benchmark_names()
    assert set(EXEMPT) <= set(names), "an exempt benchmark is gone: drop it from EXEMPT"
    missing = [
        n
        for n in names
        if n not in EXEMPT and not {"record_arguments", "save_run"} <= calls(BENCHMARKS / f"{n}.py")
    ]
    assert not missing, f"benchmarks that do not write their figures through record: {missing}"


@pytest.mark.parametrize("name", [n for n in benchmark_names() if n not in EXEMPT])
def test_a_benchmark_imports_and_has_a_main(name: str) -> None:
    module = load(name)
    assert callable(module.main)


def test_a_benchmark_writes_its_run_and_no_record_writes_nothing(tmp_path: Path) -> None:
    """fingerprint_speed for real, on a small sparse file: the file it writes, and none with
    --no-record."""
    script = [sys.executable, str(BENCHMARKS / "fingerprint_speed.py"), "--size-gib", "0.01"]
    script += ["--repeats", "1", "--dir", str(tmp_path), "--results-dir", str(tmp_path / "r")]
    subprocess.run([*script, "--no-record"], check=True, capture_output=True, timeout=120)
    assert not (tmp_path / "r").exists()
    subprocess.run(script, check=True, capture_output=True, timeout=120)
    [path] = (tmp_path / "r" / "fingerprint_speed").glob("*.json")
    run = json.loads(path.read_text())
    assert run["benchmark"] == "fingerprint_speed"
    assert run["command"][0] == "benchmarks/fingerprint_speed.py"
    assert run["machine"]["cores"] and run["version"]["tuner"]
    assert run["summary"]["first / reused"] > 0
    [table] = run["tables"]
    assert table["columns"] == ["repeat", "ms"] and [r[0] for r in table["rows"]] == [1]


# --- the recorder ------------------------------------------------------------------------------


def test_fmt_says_n_a_for_a_missing_figure_and_unbounded_for_an_infinite_one() -> None:
    assert fmt(None, "+.2f") == "n/a"
    assert fmt(math.nan) == "n/a"
    assert fmt(math.inf, "+.2f") == "unbounded"
    assert fmt(-math.inf, "+.2f") == "-unbounded"
    assert fmt(1.234, "+.2f") == "+1.23"
    assert fmt(3, "d") == "3"


def test_figures_are_stored_as_strict_json() -> None:
    value = {"a": (1.0, math.nan, math.inf, -math.inf), 2: [True, None, "x"], "p": Path("/x")}
    assert record.plain(value) == {
        "a": [1.0, None, "inf", "-inf"],
        "2": [True, None, "x"],
        "p": "/x",
    }
    assert record.plain(1 / 3) == 0.333333


def test_a_table_refuses_a_row_of_the_wrong_width() -> None:
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        Table("t", ["a", "b", "c"], [[1, 2]])


def test_a_run_holds_date_machine_version_command_and_tables(tmp_path: Path) -> None:
    args = argparse.Namespace(no_record=False, results_dir=tmp_path)
    table = Table("t", ["a", "b"], [[1, math.inf]])
    first = record.save_run("/x/bench_a.py", args, {"n": 2}, [table], ["benchmarks/bench_a.py"])
    second = record.save_run("/x/bench_a.py", args, {"n": 3}, [table], ["benchmarks/bench_a.py"])
    assert first != second and first is not None and second is not None  # one second, two files
    run = json.loads(first.read_text())
    assert run["benchmark"] == "bench_a"
    assert run["date"].endswith("Z") and first.name.startswith(run["date"][:10])
    assert set(run["machine"]) >= {"cpu", "cores", "memory_gib", "kernel", "gpus"}
    assert set(run["version"]) == {"tuner", "checkout"}
    assert run["command"] == ["benchmarks/bench_a.py"]
    assert run["summary"] == {"n": 2}
    assert run["tables"] == [{"title": "t", "columns": ["a", "b"], "rows": [[1, "inf"]]}]
    args.no_record = True
    assert record.save_run("/x/bench_a.py", args, {}, [table]) is None
    assert len(list((tmp_path / "bench_a").glob("*.json"))) == 2


def fake_run(results: Path, name: str, date: str, value: float) -> None:
    folder = results / name
    folder.mkdir(parents=True, exist_ok=True)
    run = {
        "benchmark": name,
        "date": date,
        "machine": {"cpu": "CPU X", "cores": 2, "memory_gib": 8.0, "kernel": "6.1", "gpus": []},
        "version": {"tuner": "0.1.0", "checkout": None},
        "command": [f"benchmarks/{name}.py"],
        "summary": {"answer": "N=4"},
        "tables": [{"title": "t", "columns": ["c", "tok/s"], "rows": [[1, value]]}],
    }
    (folder / f"{date.replace(':', '-')}.json").write_text(json.dumps(run))


def test_the_page_has_a_section_per_benchmark_and_its_runs_newest_first(tmp_path: Path) -> None:
    results = tmp_path / "results"
    fake_run(results, "zeta", "2026-01-02T00:00:00Z", 1.5)
    fake_run(results, "alpha", "2026-01-01T00:00:00Z", 10.25)
    fake_run(results, "alpha", "2026-03-01T00:00:00Z", 20.5)
    page = record.render_page(record.load_runs(results))
    assert page.startswith("# Benchmark results\n")
    assert record.RENDER in page.splitlines()[2]  # says it is generated, and by what
    assert page.index("## alpha") < page.index("## zeta")
    assert page.index("### 2026-03-01") < page.index("### 2026-01-01") < page.index("## zeta")
    assert "| 1 | 20.50 |" in page and "| 1 | 10.25 |" in page
    assert "CPU X (2 cores, 8.0 GiB)" in page and "checkout unknown" in page
    assert "No results recorded yet." in record.render_page([])


def test_render_check_fails_on_a_stale_page_and_passes_once_rendered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results, page = tmp_path / "results", tmp_path / "results.md"
    options = ["--results-dir", str(results), "--page", str(page)]
    fake_run(results, "alpha", "2026-01-01T00:00:00Z", 1.0)
    assert record.main(["render", "--check", *options]) == 1  # no page yet
    assert record.main(["render", *options]) == 0
    assert record.main(["render", "--check", *options]) == 0
    fake_run(results, "alpha", "2026-02-01T00:00:00Z", 2.0)  # a new run, the page not redone
    assert record.main(["render", "--check", *options]) == 1
    assert (
        "not current: run .venv/bin/python benchmarks/record.py render" in capsys.readouterr().err
    )


def test_a_broken_results_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "alpha").mkdir()
    (tmp_path / "alpha" / "x.json").write_text("{")
    with pytest.raises(SystemExit, match=r"x\.json: not JSON"):
        record.load_runs(tmp_path)


def test_the_committed_page_is_current() -> None:
    assert record.main(["render", "--check"]) == 0, f"run {record.RENDER}"


# --- each benchmark's figures, written and rendered -------------------------------------------


def contrast(estimate: float, se: float, df: float) -> Any:
    from tuner.decide.paired import Contrast

    return Contrast(estimate, se, df)


def test_regret_reads_a_one_pass_side_by_side_verdict_with_unbounded_bounds() -> None:
    regret = load("regret")
    report = {
        "plain_advantage": [1.5, None, 2.0],
        "plain_live": {
            "estimate": 1.25,
            "low": None,  # tune's report: a bound that is not finite, after one pass
            "high": None,
            "df": None,
            "verdict": "unresolved",
            "passes": 1,
            "against": 4,
        },
    }
    text = regret.plain_text(report)
    assert text == (
        "+1.50 [n/a, +2.00] tok/s; side by side +1.25 [-unbounded, unbounded] against N=4, "
        "unresolved (1 passes)"
    )
    assert regret.plain_text({"plain_advantage": None, "plain_live": None}) == "not judged"


def test_regret_writes_the_judge_verdicts(tmp_path: Path) -> None:
    regret = load("regret")
    result = {
        "comparisons": {
            3: (contrast(-1.0, 0.5, 10.0), "behind"),
            5: (contrast(2.0, 0.2, 10.0), regret.BEYOND),
        },
        "plain": (contrast(1.0, math.inf, 0.0), "unresolved", 1),  # one pass: no spread yet
    }
    rows, resolved, ahead = regret.judge_rows(result, 4, says_plain=False)
    assert not resolved and ahead == ["N=5"]
    assert [r[0] for r in rows] == ["N=3", "N=5", "plain"] and rows[0][1] == "4"
    tables = regret.tables(
        [["r1", "N=4", "resolved", [4], "not judged", 100.0, 2, 50.0]],
        {"r1": rows},
        [["r1", "N=4", 100.0, resolved, ", ".join(ahead), 3.0]],
    )
    run = written(tmp_path, "regret", {"regimes": 1}, tables)
    judged = run["tables"][1]["rows"]
    assert judged[2][2:6] == [1.0, "-inf", "inf", 0.0]  # unbounded both ways
    assert run["tables"][2]["rows"][0][3] is False


def test_build_variants_rows(tmp_path: Path) -> None:
    bv = load("build_variants")
    tps = {
        (b, cfg, c): [v, v + 2]
        for b, v in (("x86-64-v3", 9.0), ("native", 10.0))
        for cfg in ("plain", "spec")
        for c in (1, 8)
    }
    rows = bv.median_rows(tps, [1, 8], "x86-64-v3")
    assert rows[0] == ["plain", 1, 10.0, 11.0, 10.0 / 11.0] and len(rows) == 4
    written(tmp_path, "build_variants", {}, [Table("t", ["config", "c", "p", "n", "r"], rows)])


def test_coverage_rows(tmp_path: Path) -> None:
    cov = load("coverage")
    point = SimpleNamespace(
        policy=SimpleNamespace(label="plain"),
        concurrency=2,
        measured=50.0,
        predicted=48.0,
        lower=45.0,
        upper=52.0,
        inside=True,
    )
    run = SimpleNamespace(inside=1, points=[point, point], mean_abs_error_pct=4.0)
    rows = cov.coverage_rows({"honest": [run, run]})
    assert rows == [["honest", 2, 4, 50.0, 4.0]]
    assert cov.held_out_rows(run)[0] == ["plain", 2, 50.0, 48.0, 45.0, 52.0, True]
    written(tmp_path, "coverage", {}, [Table("t", ["m", "in", "of", "%", "err"], rows)])


def test_deliberate_bugs_row(tmp_path: Path) -> None:
    db = load("deliberate_bugs")
    row = db.bug_row("tie-reversed", ["tests/test_decisions.py::test_tie"], 12, 95.0)
    assert row == ["tie-reversed", True, 1, 12, 95.0, ["test_tie"]]
    assert db.bug_row("weights-ignored", [], 12, 90.0)[1:3] == [False, 0]
    written(tmp_path, "deliberate_bugs", {}, [Table("t", db.BUG_COLUMNS, [row])])


def test_depth_rows(tmp_path: Path) -> None:
    depth = load("depth")
    rows = depth.crossover_rows(
        {
            "0": {"streams": 5.5, "lower": 4.0, "upper": None, "spec_wins_upto": 5},
            "1024": {"streams": None, "lower": None, "upper": None, "spec_wins_upto": 0},
        }
    )
    assert rows[0] == [0, 5.5, 4.0, None, "5.5 streams [4.0, n/a]"]
    assert rows[1][4] == "none (plain ahead from 1 stream)"
    held = depth.held_row(depth.HeldOut(5.0, 3.0, 2.0, 1.0, 6))
    assert len(held) == len(depth.HELD_COLUMNS)
    written(tmp_path, "depth", {}, [Table("t", ["d", "s", "l", "u", "w"], rows)])


def test_fit_search_speed_row(tmp_path: Path) -> None:
    fss = load("fit_search_speed")
    report = SimpleNamespace(trials=9, sampler="BruteForceSampler", max_slots=2, n_max=6)
    row = fss.repeat_row(0, 10.0, 11.0, 12.5, report, n_max=False)
    assert row == [1, 1.0, 1.5, 2.5, 9, "BruteForceSampler", 2, None]
    written(tmp_path, "fit_search_speed", {}, [Table("t", fss.REPEAT_COLUMNS, [row])])


def test_join_cost_rows(tmp_path: Path) -> None:
    jc = load("join_cost")
    results = {"plain": (10.0, 5.0, 15.0, 2.0), "drafting": (20.0, 12.0, 28.0, 1.5)}
    assert jc.join_rows(results, None)[0] == ["plain", 10.0, 5.0, 15.0, 2.0, None]
    rows = jc.join_rows(results, (70.4, 73.6))
    assert rows[1] == ["drafting", 20.0, 12.0, 28.0, 1.5, 73.6]
    written(tmp_path, "join_cost", {}, [Table("t", jc.JOIN_COLUMNS, rows)])


def test_observe_accuracy_rows(tmp_path: Path) -> None:
    oa = load("observe_accuracy")
    rows = oa.share_rows({0: 0.5, 1: 0.5}, {1: 0.25, 2: 0.75})
    assert rows == [[0, 50.0, 0.0], [1, 50.0, 25.0], [2, 0.0, 75.0]]
    written(tmp_path, "observe_accuracy", {}, [Table("t", ["k", "o", "s"], rows)])


def test_openloop_rows(tmp_path: Path) -> None:
    ol = load("openloop")
    rows = ol.verdict_rows([(0.5, 4, 5, contrast(0.01, math.inf, 0.0), "unresolved", 2)])
    assert rows[0][:4] == [0.5, "N=4", "N=5", 1.0] and rows[0][6:] == [2, "unresolved"]
    run = written(tmp_path, "openloop", {}, [Table("t", ol.VERDICT_COLUMNS, rows)])
    assert run["tables"][0]["rows"][0][4:6] == ["-inf", "inf"]


def test_profile_time_rows(tmp_path: Path) -> None:
    pt = load("profile_time")
    level = SimpleNamespace(
        repeats=3,
        tokens_per_second=40.0,
        tokens_per_second_spread=0.05,
        step_ms=25.0,
        step_ms_spread=None,
    )
    rows = pt.level_rows([{("plain", 1): level}])
    assert rows == [["plain", 1, 3, 40.0, 5.0, 25.0, 0.0, None]]  # one run: no spread across runs
    written(tmp_path, "profile_time", {}, [Table("t", pt.LEVEL_COLUMNS, rows)])


def test_prompt_sets_rows(tmp_path: Path) -> None:
    ps = load("prompt_sets")
    result = {
        "set": "stories",
        "acceptance": {"mean_length": 1.8},
        "crossover": {"streams": None, "spec_wins_upto": 0},
        "ratio": {1: 1.2},
        "recommended": 1,
        "wall_s": 300.0,
    }
    [row] = ps.set_rows([result])
    assert row == [
        "stories",
        1.8,
        1.2,
        None,
        None,
        None,
        None,
        "none (spec wins up to 0)",
        1,
        300.0,
    ]
    written(tmp_path, "prompt_sets", {}, [Table("t", ps.SET_COLUMNS, [row])])


def test_resolution_rows_without_pairs(tmp_path: Path) -> None:
    res = load("resolution")
    rows = res.way_rows("live", {}, 60.0, [2, 4], 0.05)
    assert [r[:3] for r in rows] == [["live", 2, 0], ["live", 4, 0]]
    assert all(math.isnan(r[3]) and r[5] == math.inf for r in rows)
    run = written(tmp_path, "resolution", {}, [Table("t", res.WAY_COLUMNS, rows)])
    assert run["tables"][0]["rows"][0][3:] == [None, 0.0, "inf", "inf"]


def test_soak_two_workers_figures(tmp_path: Path) -> None:
    soak = load("soak_two_workers")
    worker = {
        "host": "soak-host-0",
        "runs": 2,
        "levels": 16,
        "samples": 60,
        "seconds": 4.0,
        "error": None,
    }
    result = soak.SoakResult("sqlite:///x.db", 5.0, [worker], 2, 2, 16, 16, 60, 60, 0, 1, 1)
    summary, tables = soak.figures(result, live=False)
    assert summary["result"] == "OK" and summary["database"] == "sqlite"
    assert tables[0].rows == [["soak-host-0", 2, 16, 60, 4.0, None]]
    written(tmp_path, "soak_two_workers", summary, tables)


def test_twin_agreement_figures(tmp_path: Path) -> None:
    ta = load("twin_agreement")
    runs = [
        {
            "seed": s,
            "answer": n,
            "status": "resolved",
            "may_tie": tie,
            "regret_pct": r,
            "seconds": 600.0,
            "wall_s": 20.0,
        }
        for s, n, tie, r in ((1, 4, [3, 4], 0.0), (2, 3, [3, 4], 0.5), (3, 6, [6], 1.0))
    ]
    summary, rows = ta.figures(runs)
    assert summary["pairs of runs that agree"] == "1/3"
    assert summary["answers"] == "N=3 x1, N=4 x1, N=6 x1"
    assert summary["regret %: median"] == 0.5
    written(tmp_path, "twin_agreement", summary, [Table("t", ta.RUN_COLUMNS, rows)])


def regret_row(name: str, crossover: str, regret: float) -> dict[str, Any]:
    method = {
        "label": "N=4",
        "in_ties": regret == 0,
        "regret_pct": regret,
        "seconds": 900.0,
        "status": "resolved",
        "tie": [4],
        "held_out": [["plain", 3, 9.0, 10.0, 11.0, 10.5]],
    }
    return {
        "name": name,
        "n_parallel": 8,
        "n_max": 3,
        "accept_len": 2.5,
        "crossover": crossover,
        "noise": "quiet",
        "traffic": "uniform",
        "shape": "hill",
        "truth": {"best": "N=4", "margin_pct": 1.0},
        "methods": {"full": method},
    }


def test_twin_regret_tables(tmp_path: Path) -> None:
    tr = load("twin_regret")
    rows = [regret_row("frozen-01", "inside", 0.0), regret_row("frozen-02", "outside", 2.0)]
    worlds = tr.world_rows(rows, ["full", "naive"])
    assert worlds[1][10:] == ["N=4", False, 2.0, 900.0, None, None, None, None, "resolved", [4]]
    groups = tr.summary_rows(rows, ["full"])
    assert groups[0] == ["all", 2, "full", 1.0, 1.9, 2.0, 1, 900.0, 2, 2, "MISSED"]
    assert ["noise noisy", 0, *[None] * 9] in groups
    lines = tr.summary_table(rows, ["full"])
    assert lines[4].split() == [
        "all",
        "2",
        "full",
        "1.00%",
        "1.90%",
        "2.00%",
        "1/2",
        "900",
        "100.0",
        "%",
        "(2/2)",
        "MISSED",
    ]
    assert lines[lines.index("") + 1 :].count("") == 7  # a blank line after each of 7 groups
    assert any(line.split() == ["noise", "noisy", "0", "(no", "worlds)"] for line in lines)
    tables = [
        Table("w", tr.world_columns(["full", "naive"]), worlds),
        Table("s", tr.SUMMARY_COLUMNS, groups),
    ]
    written(tmp_path, "twin_regret", {"worlds": 2}, tables)


def openloop_row(name: str, tags: list[str], regret: float) -> dict[str, Any]:
    method = {"label": "N=2", "in_ties": regret == 0.0, "regret_pct": regret, "seconds": 300.0}
    return {
        "name": name,
        "tags": tags,
        "n_parallel": 8,
        "load": 0.5,
        "arrivals": "gamma",
        "truth": {
            "best": "N=2",
            "margin_pct": 1.5,
            "margin_se_pct": 0.1,
            "plain_pct": 4.0,
            "always_pct": 2.0,
            "ties": ["N=2"],
            "overloaded": [],
            "resolution_pct": 0.3,
            "requests": 2400,
            "seconds": 30.0,
        },
        "methods": {"closed": method},
        "skipped": {"open": "not built"},
    }


def test_openloop_regret_tables(tmp_path: Path) -> None:
    ol = load("openloop_regret")
    rows = [
        openloop_row("openloop-01", ["surface-apu", "load-low"], 0.0),
        openloop_row("openloop-02", ["surface-gpu", "load-low"], 3.0),
    ]
    worlds = ol.world_rows(rows, ["closed", "open"])
    assert worlds[1][2] == "gpu low" and worlds[1][12:16] == ["N=2", False, 3.0, 300.0]
    assert worlds[1][16:] == [None] * 4  # open: skipped
    # an answer the arrivals outrun where another policy keeps up: infinite regret, the
    # largest in every percentile that reaches it
    over = openloop_row("openloop-03", ["surface-cpu", "load-high"], math.inf)
    over["truth"]["overloaded"] = ["N=2"]
    summary = ol.summary_rows([*rows, over], ["closed"])[0]
    assert summary[3] == 3.0 and summary[4] == math.inf and summary[5] == math.inf
    groups = ol.summary_rows(rows, ["closed", "open"])
    assert groups[0] == ["all", 2, "closed", 1.5, pytest.approx(2.85), 3.0, 1, 0, 300.0]
    names = ["all", "truth: drafting best", "load-low", "surface-apu", "surface-gpu"]
    assert [g[0] for g in groups if g[2] == "closed"] == names
    lines = ol.summary_table(rows, ["closed"])
    assert lines[3].split()[:7] == ["all", "2", "closed", "1.50%", "2.85%", "3.00%", "1/2"]
    one = [SimpleNamespace(name="openloop-01")]
    text = ol.render({r["name"]: r for r in rows}, one, ["closed"])
    assert "openloop-01" in text and "openloop-02" not in text and "Skipped: open" in text
    tables = [
        Table("w", ol.world_columns(["closed", "open"]), worlds),
        Table("s", ol.SUMMARY_COLUMNS, groups),
    ]
    written(tmp_path, "openloop_regret", {"worlds": 2}, tables)


def test_twin_serve_and_twin_fidelity_keep_what_they_print(tmp_path: Path) -> None:
    ts, tf = load("twin_serve"), load("twin_fidelity")
    kept: list[Table] = []
    text = ts.shown(kept, "part", ["a", "b"], [[1, "x"]])
    assert text == ts.table(["a", "b"], [[1, "x"]]) and kept[0].rows == [[1, "x"]]
    holder = SimpleNamespace(tables=[])
    assert tf.Fidelity.shown(holder, "closed", ["a"], [["1.0 (+2.0 %)"]]).startswith("| a |")
    written(tmp_path, "twin_serve", {}, [*kept, *holder.tables])


def test_watch_soak_memory(tmp_path: Path) -> None:
    ws = load("watch_soak")
    assert ws.memory_figures([(10.0, 1000)], every=120.0) is None
    memory = ws.memory_figures([(100.0, 999), (200.0, 1024), (900.0, 1126), (950.0, 1100)], 120.0)
    assert memory is not None and list(memory.values())[:3] == [1.0, 1100 / 1024, 1126 / 1024]
    written(tmp_path, "watch_soak", memory, [Table("t", ["watch"], [["N=3 (was N=4)"]])])


def test_the_readme_quotes_the_newest_run_of_each_benchmark_between_its_markers() -> None:
    def run(date: str, agree: int) -> dict[str, Any]:
        summary = {"runs": 10, "agree": agree, "restored": 10, "check_ok": 10}
        return {"benchmark": "tune_url", "date": date, "summary": summary, "tables": []}

    block = record.readme_block([run("2026-01-01T00:00:00Z", 7), run("2026-02-01T00:00:00Z", 2)])
    assert "| agree | 2 |" in block and "| agree | 7 |" not in block
    assert "2026-02-01" in block and block.startswith(record.BEGIN)
    page = f"# title\n{record.BEGIN}\nold rows\n{record.END}\nafter\n"
    quoted = record.with_readme_block(page, block)
    assert quoted is not None and "old rows" not in quoted and quoted.endswith("\nafter\n")
    assert record.with_readme_block("# no markers\n", block) is None


def test_the_readme_quotes_the_newest_run_of_each_set_and_names_them_where_there_are_several() -> (
    None
):
    """A benchmark graded on sets of worlds: its newest run on each set, named where runs on
    several sets exist; a newer run on no set (a bench run) stays in docs/results.md only."""

    def run(date: str, set_: str | None, settled: int) -> dict[str, Any]:
        summary: dict[str, Any] = {"worlds x traffic": 4, "settled": settled}
        if set_ is not None:
            summary["set"] = set_
        return {"benchmark": "watch_experiment", "date": date, "summary": summary, "tables": []}

    one = record.readme_block([run("2026-01-01T00:00:00Z", "a", 1)])
    assert "| settled | 1 |" in one and "set a" not in one
    block = record.readme_block(
        [
            run("2026-01-01T00:00:00Z", "a", 1),
            run("2026-01-15T00:00:00Z", "a", 4),
            run("2026-02-01T00:00:00Z", "b", 2),
            run("2026-03-01T00:00:00Z", None, 3),
        ]
    )
    assert "| settled | 4 |" in block and "set a" in block
    assert "| settled | 2 |" in block and "set b" in block
    assert block.index("set a") < block.index("set b")
    assert "| settled | 1 |" not in block and "| settled | 3 |" not in block


def test_a_cell_says_an_infinite_figure_in_words() -> None:
    """A regret against a policy whose queue grows without bound is infinite: the page says
    so in words, never inf or nan (a reader would take them for a bug)."""
    assert record.cell(math.inf) == "unbounded"
    assert record.cell(-math.inf) == "-unbounded"
    assert record.cell(math.nan) == "n/a"
    assert record.cell(12.345) == "12.35" and record.cell(0.01234) == "0.0123"
    # as the results files store it
    assert record.cell("inf") == "unbounded" and record.cell("-inf") == "-unbounded"
    assert record.fmt(math.inf) == "unbounded"


def test_a_pool_keeps_the_newer_run_of_a_case_and_says_why_cases_stayed_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """watch_experiment --pool: a case run again after columns were added replaces its older
    row (counted once, said), older files' rows get empty new columns, and the cases that
    started behind and did not reach the best are counted by the experiment's own reason."""
    we = load("watch_experiment")
    old_columns = we.COLUMNS[: we.COLUMNS.index("why behind")]

    def row(world: str, seed: int, why: list[Any] | None) -> list[Any]:
        # started 13 % behind at 0.2 requests/s, still there after 30 minutes
        base = [world, "poisson", 0.2, 2, 5, 5, "unresolved", 13.0, 30.0, 25.0, 25.0, 10.0]
        return base + [0, False, False, 13.0, seed] + (why or [])

    def saved(date: str, columns: list[str], rows: list[list[Any]]) -> str:
        record = {
            "benchmark": "watch_experiment",
            "date": date,
            "version": {"checkout": date[:10]},
            "summary": {"set": "openloop"},
            "tables": [{"title": "per world and traffic", "columns": columns, "rows": rows}],
        }
        path = tmp_path / f"{date[:10]}.json"
        path.write_text(json.dumps(record))
        return str(path)

    older = saved("2026-01-01T00:00:00Z", old_columns, [row("a", 1, None), row("b", 2, None)])
    told = ["needs more traffic to tell", 91.0]
    newer = saved("2026-01-02T00:00:00Z", we.COLUMNS, [row("a", 1, told)])
    args = argparse.Namespace(
        pool=[newer, older], results_dir=tmp_path / "results", no_record=False,
        minutes=30.0, start="model", load=None,
    )  # fmt: skip
    we.pooled(args)
    said = capsys.readouterr().out
    assert "1 case(s) in two files: the newer file's row is kept" in said
    assert "started behind, not reached: needs more traffic to tell 1" in said
    assert "needs more traffic to tell: median 91 minutes more" in said
    (path,) = (tmp_path / "results" / "watch_experiment").glob("*.json")
    run = json.loads(path.read_text())
    rows = run["tables"][0]["rows"]
    assert sorted((r[0], r[17]) for r in rows) == [("a", "needs more traffic to tell"), ("b", None)]
    assert run["summary"]["started 5 % or more behind at 0.1 req/s or more"] == 2
    assert run["summary"]["started behind, not reached: needs more traffic to tell"] == 1
    assert run["summary"]["cases taken from a newer file"] == 1


def test_why_an_answer_stays_behind_is_the_experiments_own_account() -> None:
    """The contender ahead nearest a verdict and its minutes, to tell its sides apart or to
    give its counts their data; none ahead within reach; an answer within 1 % of the best has
    no reason."""
    we = load("watch_experiment")
    from tuner.decide import settle

    truth = {1: 10.0, 2: 10.05, 3: 11.0, 4: 12.0}  # mean TPOT by N (4: always draft)

    def report(answer: int, **kw: Any) -> SimpleNamespace:
        fields = {"confounded": [], "to_tell": {}, "to_wait": {}, "status": settle.OPEN}
        return SimpleNamespace(answer=answer, **(fields | kw))

    def why(answer: int, **kw: Any) -> tuple[str, float | None]:
        return we.why_behind(report(answer, **kw), truth, 4)

    assert why(2) == ("", None)  # within 1 % of the best
    # the nearest verdict among the contenders ahead; one behind (N=4) does not count
    assert why(3, to_tell={2: 40.0, 1: 60.0, 0: 1.0}) == ("needs more traffic to tell", 40.0)
    assert why(3, to_wait={2: 12.0, 1: None}) == ("needs more traffic at its counts", 12.0)
    assert why(3, to_wait={1: None}) == ("its counts not reached by the traffic", None)
    assert why(3, confounded=[2]) == ("contender ahead confounded by reading steps", None)
    # always draft (0) is N=4; N=3 is 8 % ahead of it but no contender
    assert why(0, to_tell={0: 5.0}) == ("no contender ahead within reach", None)
    assert why(3, status="stopped", to_tell={2: 7.0}) == ("stopped", 7.0)
