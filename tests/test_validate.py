"""`tuner validate` without a live server: which candidates and levels it measures, how it grades
them (regret and model error against figures worked out by hand), and its refusal of a
llama-server that lacks --spec-draft-max-slots. The live run, over HTTP against the bench's
twin, is in test_live_twin.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from benchdata import Rep, store_profile
from sqlalchemy import func, select
from typer.testing import CliRunner

from tuner.bench import Bench
from tuner.cli.app import app
from tuner.decide.advice import recommend
from tuner.decide.validate import analyse, candidates, validation_levels
from tuner.measure.spec import ProfileSpec, load_spec
from tuner.policy import Policy
from tuner.recommendation import Recommendation
from tuner.storage import validations
from tuner.storage.fits import current_fit
from tuner.storage.orm import Level, Run
from tuner.storage.store import Store

MODEL = "smollm2-bench"
HOST = "bench-host"
PROFILES = Path(__file__).resolve().parent.parent / "profiles"

# Measured tok/s per candidate at 1, 2, 4, 8 streams (uniform weights: 0.25 each).
MEASURED: dict[str, list[float]] = {
    "plain": [100.0, 150.0, 200.0, 250.0],  # weighted 175.0
    "N=0": [150.0, 160.0, 150.0, 180.0],  # 160.0
    "N=1": [150.0, 150.0, 200.0, 250.0],  # 187.5
    "N=2": [150.0, 160.0, 200.0, 250.0],  # 190.0 (best)
    "N=3": [150.0, 160.0, 150.0, 250.0],  # 177.5
}
LEVELS = [1, 2, 4, 8]


def labels(policies: list[Policy]) -> list[str]:
    return [p.label for p in policies]


def by_label(table: dict[Policy, Any]) -> dict[str, Any]:
    return {p.label: v for p, v in table.items()}


def test_candidates_are_n_its_neighbours_always_draft_and_plain() -> None:
    assert labels(candidates(2, 8)) == ["plain", "N=0", "N=1", "N=2", "N=3"]
    assert labels(candidates(1, 8)) == ["plain", "N=0", "N=1", "N=2"]  # N-1 = 0: listed once
    assert labels(candidates(8, 8)) == ["plain", "N=0", "N=7", "N=8"]  # no N+1 beyond -np
    assert candidates(2, 8)[0].is_plain and candidates(2, 8)[1].is_always


def test_levels_add_n_and_n_plus_1_where_neighbours_differ() -> None:
    spec = ProfileSpec.model_validate(
        {
            "name": "s",
            "model_name": "m",
            "server": {"binary": "/x/llama-server", "model": "/x/m.gguf", "n_parallel": 8},
            "speculative": {"args": []},
        }
    )
    assert spec.levels == [1, 2, 4, 8]
    assert validation_levels(spec, 2) == [1, 2, 3, 4, 8]
    assert validation_levels(spec, 5) == [1, 2, 4, 5, 6, 8]
    assert validation_levels(spec, 8) == [1, 2, 4, 8]


def _store_validation(store: Store) -> int:
    levels: list[tuple[str, int, list[Rep]]] = []
    for name, row in MEASURED.items():
        config = Policy.parse(name).config_name
        for c, tps in zip(LEVELS, row, strict=True):
            levels.append((config, c, [(tps, 1.0, 1000.0 * c / tps, 0, [])]))
    run_id = store_profile(store, levels=levels, kernel=[])
    with store.session() as session:
        session.get(Run, run_id).kind = "validate"
    return run_id


def _checking(rec: Recommendation, n: int) -> Recommendation:
    """The recommendation as validation checks it with --max-slots n."""
    return replace(rec, policy=Policy.of_max_slots(n, rec.n_max))


@pytest.mark.parametrize(
    ("checked", "regret"),
    [(2, 0.0), (3, 100 * (190 - 177.5) / 190), (1, 100 * (190 - 187.5) / 190)],
)
def test_regret_and_model_error_match_the_hand_computed_figures(
    fitted_bench_db: str, checked: int, regret: float
) -> None:
    store = Store(fitted_bench_db)  # store_profile()'s data, its fit made once per session
    rec = recommend(store, MODEL, HOST, host_explicit=True)
    run_id = _store_validation(store)
    # As `tuner validate` does: the run names the recommendation and the N it measures as it;
    # the analysis reads both back from the run.
    validations.record_checked(store, run_id, _checking(rec, checked))

    report = analyse(store, run_id, MODEL)

    assert report.recommended.max_slots == checked
    assert report.levels == LEVELS
    assert report.weights == pytest.approx({c: 0.25 for c in LEVELS})
    assert by_label(report.weighted) == pytest.approx(
        {"plain": 175.0, "N=0": 160.0, "N=1": 187.5, "N=2": 190.0, "N=3": 177.5}
    )
    assert report.best is not None and report.best.label == "N=2"
    assert report.regret_pct == pytest.approx(regret)
    assert report.as_dict()["best"] == "N=2"
    assert report.as_dict()["weighted"]["N=2"] == pytest.approx(190.0)

    # Model error: (predicted - measured) / measured for every point, against the fit it used.
    fit = current_fit(store, MODEL, HOST, fit_id=rec.fit_id).model
    errors_pct = by_label(report.errors_pct)
    errors = []
    for name, row in MEASURED.items():
        predicted = fit.policy_tps(LEVELS, Policy.parse(name))
        for c, tps, pred in zip(LEVELS, row, predicted, strict=True):
            expected = 100 * (pred - tps) / tps
            assert errors_pct[name][c] == pytest.approx(expected), (name, c)
            errors.append(abs(expected))
    assert report.mean_abs_error_pct == pytest.approx(sum(errors) / len(errors))
    assert report.worst_abs_error_pct == pytest.approx(max(errors))


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'validate.db'}"


def test_a_server_without_the_flag_is_refused_before_anything_runs(
    db: str, tmp_path: Path, bench: Bench
) -> None:
    """A stock llama-server (its --help lacks the flag) cannot validate; the message says how to
    point validation at the patched one, and no run is started."""
    store = Store(db)
    run_id = store_profile(store)
    spec = load_spec(
        PROFILES / "bench-smollm2-cpu.toml", [("model_name", MODEL)], bench_refs=bench.as_refs
    )
    with store.session() as session:
        session.get(Run, run_id).spec = spec.model_dump(mode="json")
    recommend(store, MODEL, HOST, host_explicit=True)

    stock = tmp_path / "llama-server"
    stock.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "version: 1 (stock)"; exit 0; fi\n'
        'echo "--spec-draft-n-max N   number of tokens to draft (default: 3)"\n'
    )
    stock.chmod(0o755)

    result = CliRunner().invoke(
        app,
        ["--db", db, "validate", "--model", MODEL, "--set", f"server.binary={stock}"],
        env={"TUNER_HOST_NAME": HOST},
    )

    assert result.exit_code != 0
    assert f"{stock} does not know --spec-draft-max-slots" in result.output
    assert "--set server.binary=PATH" in result.output
    with store.session() as session:
        assert (
            session.scalar(select(func.count()).select_from(Run).where(Run.kind == "validate")) == 0
        )


def test_a_recommended_n_with_a_failed_level_gets_no_regret_figure(fitted_bench_db: str) -> None:
    """Its weighted figure would leave a level out, so it cannot be compared: no number at all
    rather than a flattering 0 %."""
    store = Store(fitted_bench_db)  # store_profile()'s data, its fit made once per session
    rec = recommend(store, MODEL, HOST, host_explicit=True)
    run_id = _store_validation(store)
    with store.session() as session:
        level = session.scalars(
            select(Level).where(
                Level.run_id == run_id, Level.max_slots == 3, Level.concurrency == 8
            )
        ).one()
        level.status = "failed"

    report = analyse(store, run_id, MODEL, _checking(rec, 3))

    assert report.recommended.max_slots == 3
    assert "N=3" in by_label(report.measured)  # measured, at every level but one
    assert "N=3" not in by_label(report.weighted)
    assert report.best is not None and report.best.label == "N=2"
    assert report.regret_pct is None and report.as_dict()["regret_pct"] is None


def test_a_refit_that_fails_leaves_the_validation_standing(
    fitted_bench_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few noisy points can leave no step-cost form that fits them all: validate still shows
    what it measured and graded, says the refit failed and that the checked answer stands."""
    import tuner.decide.validate as validate_module
    from tuner.errors import NothingToDoError

    store = Store(fitted_bench_db)
    rec = recommend(store, MODEL, HOST, host_explicit=True)
    run_id = _store_validation(store)

    def no_fit(*args: Any, **kwargs: Any) -> Recommendation:
        raise NothingToDoError(f"cannot fit {MODEL}: no step-cost form fits these points")

    monkeypatch.setattr(validate_module, "measure", lambda *a, **k: (run_id, rec))
    monkeypatch.setattr(validate_module.advice, "standing", no_fit)
    report = validate_module.validate(store, MODEL, HOST, Path("unused"))
    assert report.standing is None and report.measured
    assert report.refit_error == f"cannot fit {MODEL}: no step-cost form fits these points"
    assert report.standing_text() == (
        f"no refit with the points just measured ({report.refit_error}): "
        f"{rec.policy.label} stands as it was"
    )
    assert report.as_dict()["refit_error"] == report.refit_error
    store.dispose()
