"""`tuner report`: the plotted series are the cost model's, the files are valid and stay in --out.

Fast and without a server: the bench data is the stored real bench profile (tests/benchdata.py),
the imported data is the seed's table, and a validation run is stored the way `tuner validate`
stores one.
"""

from __future__ import annotations

import re
import statistics
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from benchdata import BENCH_LEVELS, Rep, store_profile
from conftest import copy_sqlite
from sqlalchemy import select
from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.decide import validate
from tuner.decide.advice import recommend
from tuner.errors import NothingToDoError
from tuner.model.quality import PointFit
from tuner.policy import Policy
from tuner.recommendation import Recommendation
from tuner.report.figure import PNG_NAME, SVG_NAME, points_gid
from tuner.report.series import group_points, report_data
from tuner.report.writer import SUMMARY_NAME, load_inputs, write_report
from tuner.storage import validations
from tuner.storage.fits import current_fit
from tuner.storage.orm import RecommendationRow, Run
from tuner.storage.queries import LevelPoint, model_points
from tuner.storage.store import Store

REPO = Path(__file__).resolve().parent.parent
SEED = REPO / "profiles" / "reference" / "seed-qwen3.8-flash-next-gfx1151.toml"
SEED_MODEL = "Qwen3.8-Flash-Next"
SEED_HOST = "Ryzen AI Max+ 395 (gfx1151)"
BENCH_MODEL = "smollm2-bench"
BENCH_HOST = "bench-host"
SVG_NS = "{http://www.w3.org/2000/svg}"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

runner = CliRunner()


@pytest.fixture(autouse=True)
def matplotlib_config(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """matplotlib's font cache goes to a temporary folder, not the user's home."""
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path_factory.mktemp("mplconfig")))


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A database in its own folder, so the tests can watch every other file."""
    return f"sqlite:///{tmp_path / 'db' / 'report.db'}"


@pytest.fixture
def bench_store(db: str, fitted_bench_template: str) -> Store:
    """store_profile()'s bench data (on BENCH_HOST) at db, with its fit made once per session."""
    return Store(copy_sqlite(fitted_bench_template, Path(db.removeprefix("sqlite:///"))))


def cli(db: str, *args: str):
    return runner.invoke(app, ["--db", db, *args], env={"TUNER_HOST_NAME": "this-box"})


def tree(root: Path, skip: str = "db") -> set[str]:
    """Every file and folder under root (relative), except the database folder."""
    return {
        str(p.relative_to(root)) for p in root.rglob("*") if p.relative_to(root).parts[0] != skip
    }


# --- the series: exactly the cost model's predictions ---------------------------------------


def test_report_data_plots_the_cost_model_predictions(bench_store: Store) -> None:
    fit = current_fit(bench_store, BENCH_MODEL, BENCH_HOST, host_explicit=True)
    cm = fit.model
    rec = Recommendation(
        id=1,
        model=BENCH_MODEL,
        host=BENCH_HOST,
        policy=Policy.threshold(3, cm.n_max),
        fit_id=fit.id,
    )
    points = model_points(bench_store, BENCH_MODEL)
    data = report_data(BENCH_MODEL, BENCH_HOST, fit.id, cm, rec, points)
    assert data.recommendation is rec

    expected = {
        "plain": Policy.plain(),
        "spec": Policy.always(cm.n_max),
        "policy": Policy.threshold(3, cm.n_max),
    }
    assert [c.key for c in data.curves] == list(expected)
    for key, policy in expected.items():
        pred = cm.predict(policy)
        curve = data.curve(key)
        assert curve.policy == policy
        assert curve.concurrency == list(range(1, 9))
        assert curve.tokens_per_second == pytest.approx(pred.tokens_per_second, rel=1e-12)
        assert curve.lower == pytest.approx(pred.lower, rel=1e-12)
        assert curve.upper == pytest.approx(pred.upper, rel=1e-12)
        per_stream = curve.per_stream()
        assert per_stream.tokens_per_second == pytest.approx(
            [v / c for c, v in zip(pred.concurrency, pred.tokens_per_second, strict=True)]
        )
        assert per_stream.upper == pytest.approx(
            [v / c for c, v in zip(pred.concurrency, pred.upper, strict=True)]
        )
    # the policy follows spec up to N and plain above it
    policy, spec, plain = data.curve("policy"), data.curve("spec"), data.curve("plain")
    assert policy.tokens_per_second[:3] == pytest.approx(spec.tokens_per_second[:3])
    assert policy.tokens_per_second[3:] == pytest.approx(plain.tokens_per_second[3:])
    assert "N=3" in policy.label
    assert policy.tokens_per_second[2] != pytest.approx(plain.tokens_per_second[2])

    cross = cm.crossover()
    assert data.crossover == cross
    assert cross.streams is not None and 1.5 < cross.streams < 2.5

    medians = {
        (config, c): statistics.median(r[0] for r in reps) for config, c, reps in BENCH_LEVELS
    }
    measured_plain = data.point_series("measured plain")
    measured_spec = data.point_series("measured N=0")
    assert measured_plain is not None and measured_spec is not None
    assert measured_plain.policy == Policy.plain()
    assert measured_spec.policy == Policy.always()
    assert not measured_plain.validation and not measured_spec.validation
    assert measured_plain.concurrency == [1, 2, 4, 8]
    assert measured_plain.tokens_per_second == pytest.approx(
        [medians[("plain", c)] for c in (1, 2, 4, 8)], rel=1e-3
    )
    assert measured_spec.tokens_per_second == pytest.approx(
        [medians[("spec", c)] for c in (1, 2, 4, 8)], rel=1e-3
    )
    assert data.point_series("validation N=0") is None


def test_a_recommended_n_max_outside_the_fit_falls_back_to_the_profiled_one(
    bench_store: Store,
) -> None:
    fit = current_fit(bench_store, BENCH_MODEL, BENCH_HOST, host_explicit=True)
    cm = fit.model
    unknown = max(cm.n_values()) + 5
    rec = Recommendation(
        id=1,
        model=BENCH_MODEL,
        host=BENCH_HOST,
        policy=Policy.threshold(2, unknown),
        fit_id=fit.id,
    )
    data = report_data(BENCH_MODEL, BENCH_HOST, fit.id, cm, rec, [])
    curve = data.curve("policy")
    assert curve.policy == Policy.threshold(2, cm.n_max)
    assert curve.tokens_per_second == pytest.approx(
        cm.predict(Policy.threshold(2, cm.n_max)).tokens_per_second
    )
    assert data.points == []


def _point(run_id: int, policy: Policy | None, c: int, tps: float, spread) -> LevelPoint:
    return LevelPoint(
        run_id=run_id,
        config=policy.config_name if policy is not None else "label-from-attach",
        policy=policy,
        n_max=3,
        concurrency=c,
        status="completed",
        repeats=2,
        tokens_per_second=tps,
        tokens_per_second_spread=spread,
        per_stream_tps=tps / c,
        step_ms=None,
        step_ms_spread=None,
        accept_len=None,
        ttft_ms=None,
    )


def test_points_are_grouped_by_candidate_with_spread_error_bars() -> None:
    points = [
        _point(1, Policy.plain(), 2, 100.0, 0.05),
        _point(1, Policy.plain(), 1, 60.0, None),
        _point(1, Policy.always(3), 1, 90.0, 0.1),
        _point(1, Policy.threshold(2, 3), 4, 120.0, 0.02),
        _point(1, None, 1, 50.0, 0.0),  # an attached server, not a policy: left out
        _point(7, Policy.threshold(2, 3), 2, 110.0, 0.01),  # a validation run
        _point(7, Policy.plain(), 2, 101.0, 0.0),
    ]
    groups = {g.key: g for g in group_points(points, validation_runs=[7])}
    assert list(groups) == [
        "measured plain",
        "measured N=0",
        "measured N=2",
        "validation plain",
        "validation N=2",
    ]
    plain = groups["measured plain"]
    assert plain.policy == Policy.plain()
    assert plain.concurrency == [1, 2]  # sorted by concurrency
    assert plain.tokens_per_second == pytest.approx([60.0, 100.0])
    assert plain.error == pytest.approx([0.0, 5.0])  # spread x value
    assert plain.per_stream().tokens_per_second == pytest.approx([60.0, 50.0])
    assert plain.per_stream().error == pytest.approx([0.0, 2.5])
    assert groups["measured N=0"].error == pytest.approx([9.0])
    assert groups["measured N=0"].policy.is_always
    assert groups["measured N=2"].policy == Policy.threshold(2)  # n_max is not part of the group
    validation = groups["validation N=2"]
    assert validation.validation and validation.run_ids == (7,)
    assert validation.tokens_per_second == pytest.approx([110.0])
    assert "run 7" in validation.label
    assert not groups["measured N=2"].validation
    assert points_gid("validation N=2") == "points-validation-N2"


def test_failed_and_empty_levels_are_not_drawn() -> None:
    failed = _point(1, Policy.plain(), 4, 100.0, 0.0)
    failed = LevelPoint(**{**failed.__dict__, "status": "failed"})
    empty = _point(1, Policy.plain(), 8, 0.0, None)
    kept = _point(1, Policy.plain(), 1, 60.0, None)
    (group,) = group_points([failed, empty, kept])
    assert group.concurrency == [1]


# --- the files --------------------------------------------------------------------------------


def _svg_groups(svg: Path) -> dict[str, ET.Element]:
    root = ET.parse(svg).getroot()
    return {g.get("id"): g for g in root.iter(f"{SVG_NS}g") if g.get("id")}


def _path_points(group: ET.Element) -> list[tuple[float, float]]:
    """The vertices of the first path of a line's <g> ("M x y L x y ...")."""
    path = next(group.iter(f"{SVG_NS}path"))
    numbers = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", path.get("d", ""))]
    return list(zip(numbers[0::2], numbers[1::2], strict=True))


def _marker_count(group: ET.Element) -> int:
    """Markers of a point series are <use> elements."""
    return sum(1 for _ in group.iter(f"{SVG_NS}use"))


def _assert_affine(pixels: list[float], values: list[float]) -> None:
    """The plotted y pixels are a linear map of the values (a linear axis): the curve is them."""
    (p0, v0), (p1, v1) = (pixels[0], values[0]), (pixels[-1], values[-1])
    scale = (p1 - p0) / (v1 - v0)
    for p, v in zip(pixels, values, strict=True):
        assert p == pytest.approx(p0 + scale * (v - v0), abs=0.02)


def _section(summary: str, title: str) -> str:
    """The body of the summary's "## title..." section (up to the next "## ")."""
    match = re.search(rf"^## {re.escape(title)}[^\n]*\n(.*?)(?=^## |\Z)", summary, re.M | re.S)
    assert match is not None, f"no section {title!r} in:\n{summary}"
    return match.group(1)


def _table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row in text (header and rule rows included)."""
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]


def _assert_point_rows(section: str, points: list[PointFit], held_out: bool) -> None:
    """Every point is a row of the fit-quality table: policy, streams, measured and predicted
    tok/s as the fit stored them."""
    rows = _table_rows(section)
    for p in points:
        name = p.policy.config_name + (" (held out)" if held_out else "")
        wanted = [name, str(p.concurrency), f"{p.measured_tps:.1f}", f"{p.predicted_tps:.1f}"]
        assert any(row[:4] == wanted for row in rows), (wanted, rows)


def _assert_worst_residual(section: str, worst: PointFit) -> None:
    """The worst fitted residual is named with its value, policy and level."""
    (line,) = [ln for ln in section.splitlines() if ln.lower().startswith("worst residual")]
    assert f"{worst.residual_pct:+.1f}%" in line
    assert worst.policy.config_name in line
    assert f"{worst.concurrency} stream" in line


@pytest.mark.slow
def test_bench_report_files_from_the_cli(
    bench_store: Store, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = tree(tmp_path)
    result = cli(db, "report", "--model", BENCH_MODEL, "--host", BENCH_HOST, "--out", "out/r")
    assert result.exit_code == 0, result.output
    out = work / "out" / "r"
    printed = result.stdout.split()
    assert printed == [str(Path("out/r") / name) for name in (PNG_NAME, SVG_NAME, SUMMARY_NAME)]

    # nothing written outside --out (the database folder aside)
    new = tree(tmp_path) - before
    assert new == {
        "work/out",
        "work/out/r",
        f"work/out/r/{PNG_NAME}",
        f"work/out/r/{SVG_NAME}",
        f"work/out/r/{SUMMARY_NAME}",
    }

    png = (out / PNG_NAME).read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 20_000

    fit = current_fit(Store(db), BENCH_MODEL, BENCH_HOST, host_explicit=True)
    cm = fit.model
    with Store(db).session() as session:
        rec = session.scalars(select(RecommendationRow)).one()  # made by the report, stored
        assert rec.fit_id == fit.id
        n, rec_n_max = rec.max_slots, rec.n_max
    assert n == 2  # the bench's recommendation (tests/test_recommend.py)
    assert rec_n_max in (None, cm.n_max)

    groups = _svg_groups(out / SVG_NAME)
    for gid in ("curve-plain", "curve-spec", "curve-policy", "crossover"):
        assert gid in groups and f"{gid}-per-stream" in groups
    for key, policy in (
        ("plain", Policy.plain()),
        ("spec", Policy.always(cm.n_max)),
        ("policy", Policy.threshold(n, cm.n_max)),
    ):
        values = cm.predict(policy).tokens_per_second
        vertices = _path_points(groups[f"curve-{key}"])
        assert len(vertices) == cm.n_parallel
        _assert_affine([y for _, y in vertices], values)
        per_stream = _path_points(groups[f"curve-{key}-per-stream"])
        _assert_affine([y for _, y in per_stream], [v / (i + 1) for i, v in enumerate(values)])
    assert _marker_count(groups[points_gid("measured plain")]) == 4
    assert _marker_count(groups[points_gid("measured N=0")]) == 4
    assert points_gid("validation N=2") not in groups
    texts = " ".join("".join(t.itertext()) for t in ET.parse(out / SVG_NAME).iter(f"{SVG_NS}text"))
    for label in ("model: plain", "always draft", "recommended: N=2", "crossover", "tok/s"):
        assert label in texts

    summary = (out / SUMMARY_NAME).read_text()
    assert "LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=2" in summary
    assert "## Recommendation: N=2" in summary
    assert "made by this report" in _section(summary, "Recommendation")
    assert "- name: bench-host" in _section(summary, "Host")
    assert "- name: smollm2-bench" in _section(summary, "Model")
    assert "`bbbbbbbbbbbb...`" in _section(summary, "Build")  # the build's sha256 prefix
    assert "kernel rows (llama-batched-bench): 32" in _section(summary, "Data used")

    quality = _section(summary, "Fit quality")
    _assert_worst_residual(quality, fit.quality.worst_point)
    assert f"rms {fit.quality.rms_residual_pct:.1f}%" in quality
    assert len(fit.quality.points) == 8  # plain and spec at 1, 2, 4, 8 streams
    _assert_point_rows(quality, fit.quality.points, held_out=False)
    assert fit.quality.held_out == [] and "held out" not in quality  # no threshold levels
    assert "no validation yet (run `tuner validate --model smollm2-bench`)" in summary

    # a second report reuses the stored recommendation and writes the same figure
    svg_first = (out / SVG_NAME).read_bytes()
    again = cli(db, "report", "--model", BENCH_MODEL, "--host", BENCH_HOST, "--out", "out/r")
    assert again.exit_code == 0, again.output
    assert (out / SVG_NAME).read_bytes() == svg_first
    second = (out / SUMMARY_NAME).read_text()
    assert f"stored recommendation {rec.id}" in second
    assert "made by this report" not in second
    with Store(db).session() as session:
        assert len(session.scalars(select(RecommendationRow)).all()) == 1
    assert tree(tmp_path) - before == new


def test_default_out_is_tuner_report_in_the_working_folder(
    bench_store: Store, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    result = cli(db, "report", "--model", BENCH_MODEL, "--host", BENCH_HOST)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (work / "tuner-report").iterdir()) == sorted(
        [PNG_NAME, SVG_NAME, SUMMARY_NAME]
    )
    assert sorted(p.name for p in work.iterdir()) == ["tuner-report"]


@pytest.mark.slow
def test_seed_report_from_the_imported_table(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    imported = cli(db, "dev", "import", str(SEED))
    assert imported.exit_code == 0, imported.output
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    result = cli(db, "report", "--model", SEED_MODEL, "--out", str(tmp_path / "seed"))
    assert result.exit_code == 0, result.output
    assert "using the imported data" in result.stderr  # no data of this box: the note says so
    assert tree(tmp_path) - before == {
        "seed",
        f"seed/{PNG_NAME}",
        f"seed/{SVG_NAME}",
        f"seed/{SUMMARY_NAME}",
    }
    out = tmp_path / "seed"
    assert (out / PNG_NAME).read_bytes().startswith(PNG_MAGIC)

    groups = _svg_groups(out / SVG_NAME)
    # the table's "max-slots 2" row is drawn as measured N=2 points beside the model's curves
    assert _marker_count(groups[points_gid("measured N=2")]) == 4
    assert _marker_count(groups[points_gid("measured plain")]) == 4
    assert len(_path_points(groups["curve-policy"])) == 8

    fit = current_fit(Store(db), SEED_MODEL, SEED_HOST, host_explicit=True)
    summary = (out / SUMMARY_NAME).read_text()
    assert "LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=2" in summary
    assert f"- name: {SEED_HOST}" in summary
    assert "Qwen3.8-Flash-Next ROCmFP4-FAST with its MTP head" in summary
    assert "llama.cpp with --spec-draft-max-slots (PR #151)" in summary

    quality = _section(summary, "Fit quality")
    _assert_worst_residual(quality, fit.quality.worst_point)
    _assert_point_rows(quality, fit.quality.points, held_out=False)
    # the table's threshold levels are predicted, not fitted: shown as held-out rows
    assert fit.quality.held_out and all(p.policy.max_slots == 2 for p in fit.quality.held_out)
    _assert_point_rows(quality, fit.quality.held_out, held_out=True)
    worst_held = fit.quality.worst_held_out
    assert worst_held is not None
    (held_line,) = [ln for ln in quality.splitlines() if "worst error" in ln]
    assert f"{worst_held.residual_pct:+.1f}%" in held_line

    assert "Measure next: 3 streams" in summary  # the seed did not measure 3 streams
    assert "no validation yet" in summary


# --- with a validation run --------------------------------------------------------------------


def _store_validation(store: Store, rec: Recommendation) -> int:
    """A completed validate run checking rec: plain, N=0 and N-1..N+1 at 1, 2, 3, 4, 8 streams,
    each within a few % of the fit's prediction (stored like the profiler stores it, and naming
    the recommendation it checks, as `tuner validate` does)."""
    cm = current_fit(store, BENCH_MODEL, fit_id=rec.fit_id).model
    levels: list[tuple[str, int, list[Rep]]] = []
    wobble = iter([1.02, 0.97, 1.01, 0.99, 1.03] * 10)
    n = rec.max_slots
    policies = [Policy.plain(), Policy.always(), *(Policy.threshold(k) for k in (n - 1, n, n + 1))]
    for policy in policies:
        for c in (1, 2, 3, 4, 8):
            tps = float(cm.policy_tps([c], policy)[0]) * next(wobble)
            length = 3.4 if policy.drafts_at(c) else 1.0
            rep: Rep = (tps, length, 1000.0 * c * length / tps, 0, [])
            levels.append((policy.config_name, c, [rep, rep]))
    run_id = store_profile(store, host=BENCH_HOST, levels=levels, kernel=[])
    with store.session() as session:
        run = session.get(Run, run_id)
        run.kind = "validate"
        run.spec_name = "bench-validate"
    validations.record_checked(store, run_id, rec)
    return run_id


@pytest.mark.slow
def test_report_shows_the_validation(
    bench_store: Store, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = recommend(bench_store, BENCH_MODEL, BENCH_HOST, host_explicit=True)
    assert rec.max_slots == 2
    run_id = _store_validation(bench_store, rec)
    assert validations.latest_validation(bench_store, BENCH_MODEL, BENCH_HOST) == run_id
    expected = validate.analyse(bench_store, run_id, BENCH_MODEL)
    assert expected.regret_pct is not None and expected.worst_abs_error_pct is not None

    monkeypatch.chdir(tmp_path)
    files = write_report(bench_store, BENCH_MODEL, tmp_path / "val", BENCH_HOST, host_explicit=True)
    assert files.paths == [tmp_path / "val" / n for n in (PNG_NAME, SVG_NAME, SUMMARY_NAME)]

    groups = _svg_groups(files.svg)
    for label in ("plain", "N=0", "N=1", "N=2", "N=3"):
        assert _marker_count(groups[points_gid(f"validation {label}")]) == 5, label

    summary = files.summary.read_text()
    section = _section(summary, "Validation")
    assert f"Validation run {run_id} (it checked N={rec.max_slots})" in section
    assert f"regret of the recommendation: {expected.regret_pct:.1f}%" in section
    assert f"worst |error| {expected.worst_abs_error_pct:.1f}%" in section
    # one row per measured policy, with its workload-weighted tok/s; the checked N is marked
    rows = {row[0].split(" (")[0]: row for row in _table_rows(section)}
    for policy, value in expected.weighted.items():
        assert rows[policy.label][1] == f"{value:.1f}", policy
    assert "recommended" in rows[f"N={rec.max_slots}"][0]
    assert "no validation yet" not in summary

    # the validation's points feed the fit: the report shows the recommendation that stands for
    # the refit (made and stored now), not the one the validation checked
    fit = current_fit(bench_store, BENCH_MODEL, BENCH_HOST, host_explicit=True)
    assert run_id in fit.inputs["runs"] and fit.id != rec.fit_id
    shown = files.recommendation
    assert shown.fit_id == fit.id and shown.made_now
    assert f"## Recommendation: N={shown.max_slots}" in summary
    assert shown.env_line in _section(summary, "Recommendation")
    # ...and the Validation section names it as what stands after the validation
    standing = f"{shown.env_line} " + (
        f"now stands: validation changed the recommendation from N={rec.max_slots}"
        if shown.max_slots != rec.max_slots
        else "stands after validation (unchanged)"
    )
    assert standing in section


@pytest.mark.slow
def test_a_validation_on_another_host_is_named_not_shown(
    bench_store: Store, tmp_path: Path
) -> None:
    rec = recommend(bench_store, BENCH_MODEL, BENCH_HOST, host_explicit=True)
    # the same data measured on a second host, and a validation run there
    store_profile(bench_store, host="other-host")
    other_rec = recommend(bench_store, BENCH_MODEL, "other-host", host_explicit=True)
    levels = [(Policy.plain().config_name, 1, [(70.0, 1.0, 14.0, 0, [])])]
    run_id = store_profile(bench_store, host="other-host", levels=levels, kernel=[])
    with bench_store.session() as session:
        session.get(Run, run_id).kind = "validate"
    validations.record_checked(bench_store, run_id, other_rec)
    assert validations.latest_validation(bench_store, BENCH_MODEL, BENCH_HOST) is None

    files = write_report(bench_store, BENCH_MODEL, tmp_path / "r", BENCH_HOST, host_explicit=True)
    section = _section(files.summary.read_text(), "Validation")
    assert f"no validation on {BENCH_HOST} yet" in section
    assert f"run {run_id}" in section and "other-host" in section
    assert "Validation run" not in section
    # bench-host's fit and stored recommendation are untouched by the other host's runs
    assert files.recommendation.id == rec.id and not files.recommendation.made_now
    assert points_gid("validation plain") not in _svg_groups(files.svg)


# --- errors -----------------------------------------------------------------------------------


def test_unknown_model_writes_nothing_and_names_tuner_profile(
    bench_store: Store, db: str, tmp_path: Path
) -> None:
    out = tmp_path / "nothing"
    with pytest.raises(NothingToDoError, match="tuner profile"):
        write_report(bench_store, "no-such-model", out)
    assert not out.exists()
    result = cli(db, "report", "--model", "no-such-model", "--out", str(out))
    assert result.exit_code == 1
    assert "tuner profile" in result.stderr
    assert not out.exists()


def test_out_that_is_a_file_is_refused(bench_store: Store, db: str, tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("keep me")
    result = cli(db, "report", "--model", BENCH_MODEL, "--host", BENCH_HOST, "--out", str(target))
    assert result.exit_code == 2
    assert "not a folder" in result.stderr
    assert target.read_text() == "keep me"


# --- the other dimensions: open loop, depth, prompt sets --------------------------------------


def store_open_loop(store: Store, profile_run: int) -> int:
    """An open-loop run beside a profile, stored as `validate --arrivals poisson` stores one."""
    from tuner.measure.arrivals import OpenLoopFigures
    from tuner.storage.orm import COMPLETED, OpenLoopResult

    with store.session() as session:
        base = session.get(Run, profile_run)
        run = Run(
            kind="openloop",
            status=COMPLETED,
            model_id=base.model_id,
            host_id=base.host_id,
            build_id=base.build_id,
            spec=base.spec,
        )
        session.add(run)
        session.flush()
        for rate, slow in ((0.5, 1.0), (2.0, 1.6)):
            for config, tpot in (("plain", 14.0), ("max-slots-2", 11.0)):
                figures = OpenLoopFigures(
                    rate, 30, 30, 0, 60.0, 100.0 * rate, (80.0, 120.0, 150.0),
                    (tpot * slow, tpot * slow * 1.3, tpot * slow * 1.5), 1.2 * rate,
                )  # fmt: skip
                session.add(
                    OpenLoopResult(
                        run_id=run.id,
                        config=config,
                        max_slots=None,
                        rate=rate,
                        figures=figures.to_dict(),
                    )
                )
        return run.id


@pytest.mark.slow
def test_the_report_plots_and_tables_the_open_loop_run(db: str, tmp_path: Path) -> None:
    store = Store(db)
    run_id = store_open_loop(store, store_profile(store, host=BENCH_HOST))
    files = write_report(store, BENCH_MODEL, tmp_path / "out", BENCH_HOST, host_explicit=True)
    svg = ET.parse(files.svg)
    gids = {el.get("id") for el in svg.iter() if el.get("id")}
    for name in ("openloop-tpot-plain", "openloop-tpot-max-slots-2", "openloop-openloop-tps-plain"):
        assert name in gids, sorted(g for g in gids if "openloop" in g)
    text = files.summary.read_text()
    assert f"Open-loop run {run_id}" in text
    # p95 TPOT of max-slots-2 at 2/s: 11 * 1.6 * 1.3 = 22.9 ms
    assert "| 2 | max-slots-2 | 30/30 | 200.0 | 80 / 120 | 17.6 / 22.9 / 26.4 | 2.40 |" in text
    # Without open-loop data (one depth, one prompt set) there is no extra row of panels.
    other = Store(f"sqlite:///{tmp_path / 'other.db'}")
    store_profile(other, host=BENCH_HOST)
    bare = write_report(other, BENCH_MODEL, tmp_path / "bare", BENCH_HOST, host_explicit=True)
    assert not any("openloop" in (el.get("id") or "") for el in ET.parse(bare.svg).iter())
    assert "no open-loop validation yet" in bare.summary.read_text()


@pytest.mark.slow
def test_the_report_draws_the_crossover_against_depth(db: str, tmp_path: Path) -> None:
    from tuner.report.dimensions import Dimensions

    store = Store(db)
    store_profile(store, host=BENCH_HOST)
    store_profile(store, host=BENCH_HOST, depth=2048)
    dims: Dimensions = load_inputs(store, BENCH_MODEL, BENCH_HOST, host_explicit=True).dimensions
    assert sorted(dims.crossover_by_depth) == [0, 2048]
    assert "depth" in dims.panels() and "tpot" not in dims.panels()
    files = write_report(store, BENCH_MODEL, tmp_path / "out", BENCH_HOST, host_explicit=True)
    gids = {el.get("id") for el in ET.parse(files.svg).iter() if el.get("id")}
    assert "crossover-by-depth" in gids
