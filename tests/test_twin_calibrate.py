"""Calibrating a twin to a table (tuner.twin.calibrate): fitted to the plain and always-draft
rows only, the seed's max-slots 2 row is then predicted within 2 % at 1, 2, 4 and 8 streams.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tuner.policy import Policy
from tuner.storage.importer import ImportDoc, load_import
from tuner.twin import load_world, world_from_dict
from tuner.twin.calibrate import calibrate_table, estimate_synth_len, fit_world
from tuner.twin.tables import Curve
from tuner.twin.truth import closed_truth

REPO = Path(__file__).resolve().parent.parent
SEED_TABLE = REPO / "profiles" / "reference" / "seed-qwen3.8-flash-next-gfx1151.toml"
SEED_WORLD = REPO / "profiles" / "twin" / "seed-gfx1151.toml"


def table_rows(doc: ImportDoc) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for row in doc.rows:
        key = row.config if row.max_slots is None else f"{row.config}-{row.max_slots}"
        out[key] = dict(zip(doc.concurrency, row.tokens_per_second, strict=True))
    return out


def test_the_seed_world_predicts_the_held_out_threshold_row_within_2_percent() -> None:
    doc = load_import(SEED_TABLE)
    rows = table_rows(doc)
    world = load_world(SEED_WORLD)
    truth = closed_truth(world, concurrency=doc.concurrency)
    for c, value in rows["plain"].items():
        assert truth.tps(Policy.plain(), c) == pytest.approx(value, rel=1e-4)
    for c, value in rows["spec"].items():
        assert truth.tps(Policy.always(), c) == pytest.approx(value, rel=0.005)
    errors = {
        c: truth.tps(Policy.threshold(2), c) / value - 1.0
        for c, value in rows["threshold-2"].items()
    }
    assert all(abs(e) < 0.02 for e in errors.values()), errors
    # Where N=2 drafts (1, 2 streams) it is the spec world; above, plain plus the draft
    # model's re-evaluation of every batch (2 % of the target's forward).
    assert truth.tps(Policy.threshold(2), 2) == truth.tps(Policy.always(), 2)
    assert truth.tps(Policy.threshold(2), 8) == pytest.approx(78.3 / 1.02, rel=1e-6)


@pytest.mark.slow
def test_calibrating_the_seed_table_gives_the_stored_world() -> None:
    calibration = calibrate_table(SEED_TABLE, name="seed-gfx1151")
    assert calibration.max_held_out_error < 0.02, calibration.report()
    assert all(abs(f.error) < 0.005 for f in calibration.fitted), calibration.report()
    stored = load_world(SEED_WORLD)
    world = calibration.world
    assert world.acceptance == stored.acceptance and world.n_max == 3
    for fresh, kept in (
        (world.step.rows_ms, stored.step.rows_ms),
        (world.draft.call_ms, stored.draft.call_ms),
    ):
        assert [x for x, _ in fresh] == [x for x, _ in kept]
        assert [y for _, y in fresh] == pytest.approx([y for _, y in kept], rel=1e-5)
    assert "held out" in calibration.report()


@pytest.mark.slow
def test_fitting_recovers_the_knots_of_a_known_world() -> None:
    known = world_from_dict(
        {
            "name": "known",
            "model_name": "twin-known",
            "n_parallel": 4,
            "n_max": 4,
            "acceptance": {"synth_len": 2.6},
            "step": {
                "rows_ms": [[1, 20.0], [2, 26.0], [4, 30.0], [20, 70.0]],
                "slots_ms": [[1, 1.0], [4, 4.0]],
            },
            "draft": {"call_ms": [[1, 3.0], [2, 3.5], [4, 6.0]], "reeval_ms": [[1, 0.2]]},
            "depth": {"ms_per_row_per_1k": 1.0},
            "noise": {"preset": "off"},
        }
    )
    truth = closed_truth(known, rel_se=0.003)
    plain = {c: truth.tps(Policy.plain(), c) for c in (1, 2, 4)}
    spec = {c: truth.tps(Policy.always(), c) for c in (1, 2, 4)}
    # a template with the right structure and wrong knots
    template = known.model_copy(
        update={
            "step": known.step.model_copy(
                update={"rows_ms": [(1, 5.0), (2, 5.0), (4, 5.0), (20, 70.0)]}
            ),
            "draft": known.draft.model_copy(update={"call_ms": [(1, 9.0), (2, 9.0), (4, 9.0)]}),
        }
    )
    fitted, notes = fit_world(template, plain, spec, rel_se=0.003)
    assert notes == []
    assert [y for _, y in fitted.step.rows_ms] == pytest.approx([20.0, 26.0, 30.0, 70.0], rel=1e-6)
    assert [y for _, y in fitted.draft.call_ms] == pytest.approx([3.0, 3.5, 6.0], rel=0.03)


@pytest.mark.slow
def test_between_its_levels_a_fit_follows_the_measured_kernel_shape() -> None:
    """A world whose target costs as much at 3 rows as at 4 and whose draft call costs more at 3
    slots than at 4 (the bench's one-block draft on this CPU): fitted at 1, 2 and 4 streams, a
    straight line between the levels misses both at 3; the kernel rows' shape (each here the
    world's cost less a constant, as llama-batched-bench sees less than the server pays) does
    not."""
    known = world_from_dict(
        {
            "name": "sawtooth",
            "model_name": "twin-sawtooth",
            "n_parallel": 4,
            "n_max": 3,
            "acceptance": {"synth_len": 2.4},
            "step": {"rows_ms": [[1, 20.0], [2, 26.0], [3, 30.0], [4, 30.0], [16, 60.0]]},
            "draft": {"call_ms": [[1, 3.0], [2, 3.5], [3, 7.0], [4, 6.0]]},
            "noise": {"preset": "off"},
        }
    )
    truth = closed_truth(known, rel_se=0.003, concurrency=[1, 2, 3, 4])
    plain = {c: truth.tps(Policy.plain(), c) for c in (1, 2, 4)}
    spec = {c: truth.tps(Policy.always(), c) for c in (1, 2, 4)}
    template = known.model_copy(
        update={
            "step": known.step.model_copy(update={"rows_ms": [(1, 5.0), (16, 60.0)]}),
            "draft": known.draft.model_copy(update={"call_ms": [(1, 1.0)]}),
        }
    )
    rows_shape = Curve([(1, 15.0), (2, 21.0), (3, 25.0), (4, 25.0)])
    call_shape = Curve([(1, 2.0), (2, 2.5), (3, 6.0), (4, 5.0)])
    shaped, _ = fit_world(
        template, plain, spec, rel_se=0.003, rows_shape=rows_shape, call_shape=call_shape
    )
    assert Curve(shaped.step.rows_ms)(3) == pytest.approx(30.0, rel=0.01)
    assert Curve(shaped.draft.call_ms)(3) == pytest.approx(7.0, rel=0.03)
    line, _ = fit_world(template, plain, spec, rel_se=0.003)
    assert Curve(line.step.rows_ms)(3) == pytest.approx(28.0, rel=0.01)
    at_3 = {"shaped": closed_truth(shaped, rel_se=0.003, concurrency=[3])}
    at_3["line"] = closed_truth(line, rel_se=0.003, concurrency=[3])
    for policy in (Policy.plain(), Policy.always()):
        want = truth.tps(policy, 3)
        assert at_3["shaped"].tps(policy, 3) == pytest.approx(want, rel=0.01)
        assert at_3["line"].tps(policy, 3) > 1.05 * want  # the line's cheaper steps
    # the levels fitted are the same either way
    for c, value in spec.items():
        assert closed_truth(shaped, rel_se=0.003, concurrency=[c]).tps(
            Policy.always(), c
        ) == pytest.approx(value, rel=0.01)


def test_acceptance_is_estimated_only_where_the_table_has_none() -> None:
    plain = {1: 38.7, 2: 54.0, 4: 67.5, 8: 78.3}
    spec = {1: 56.5, 2: 57.9, 4: 64.8, 8: 69.9}
    length = estimate_synth_len(plain, spec, n_max=3, reeval_share=0.02, min_draft_share=0.05)
    assert 1.0 < length <= 4.0
    # at that length the steady-state draft share of the binding level is the floor
    rows = Curve(sorted((float(c), 1000.0 * c / v) for c, v in plain.items()))
    shares = [
        ((c * length / v * 1000.0) - 1.02 * rows(4 * c)) / 3 / rows(c) for c, v in spec.items()
    ]
    assert min(shares) == pytest.approx(0.05, abs=1e-9)
    assert estimate_synth_len(plain, spec, 3, 0.02, min_draft_share=10.0) == 4.0
    doc = load_import(SEED_TABLE)
    with pytest.raises(ValueError, match="plain row and a spec row"):
        calibrate_table(doc.model_copy(update={"rows": doc.rows[:1]}))
    assert math.isfinite(length)


@pytest.mark.slow  # calibrates a world to the stored run: about ten seconds
def test_the_draft_models_kernel_rows_reach_the_twin_and_not_the_cost_model(
    tmp_path: Path,
) -> None:
    from benchdata import BENCH_KERNEL, store_profile

    from tuner.storage.fits import select_data
    from tuner.storage.store import Store
    from tuner.twin.from_run import calibrate_run, kernel_curve, run_levels

    store = Store(f"sqlite:///{tmp_path / 'tuner.db'}")
    draft = [
        ("draft", c, 1, ms) for c, ms in zip(range(1, 9), (2, 4, 7, 5, 8, 6, 9, 7), strict=True)
    ]
    run_id = store_profile(store, kernel=BENCH_KERNEL + draft)
    data, _ = select_data(store, "smollm2-bench", None)
    assert len(data.kernel) == len(BENCH_KERNEL)
    run = run_levels(store, run_id)
    call_shape = kernel_curve(run, "draft")
    assert call_shape is not None and [call_shape(c) for c in (3, 4)] == [7.0, 5.0]
    rows_shape = kernel_curve(run, "decode")
    assert rows_shape is not None and rows_shape(1) == BENCH_KERNEL[0][3]
    calibration = calibrate_run(run, rel_se=0.02)
    assert calibration.synth_len_source == "pooled /metrics acceptance per position"
    notes = "\n".join(calibration.notes)
    assert "call_ms follows the shape of the draft model's generation rows" in notes, notes
    assert "rows_ms follows the shape of the target's decode rows" in notes, notes


@pytest.mark.slow  # calibrates a world to the stored run: about ten seconds
def test_the_threshold_servers_overhead_is_measured_from_the_runs_off_arms(
    tmp_path: Path,
) -> None:
    """A run with threshold levels above their N (the off arms) gives the share a threshold
    server pays over plain: each level's plain / threshold - 1, their mean; each such level is
    held out with the others' share."""
    from benchdata import BENCH_LEVELS, store_profile

    from tuner.storage.store import Store
    from tuner.twin.from_run import calibrate_run, run_levels, threshold_shares

    def off(n: int, c: int, tps: float) -> tuple[str, int, list[tuple]]:
        return (f"max-slots-{n}", c, [(tps, 1.0, 1000.0 * c / tps, 0, [])])

    store = Store(f"sqlite:///{tmp_path / 'tuner.db'}")
    levels = [*BENCH_LEVELS, off(1, 2, 118.354 / 1.10), off(3, 4, 191.09 / 1.04)]
    run = run_levels(store, store_profile(store, levels=levels))
    plain = {c: lv.tokens_per_second for c, lv in run.of("plain").items()}
    shares = threshold_shares(run)
    assert shares == pytest.approx(
        {2: plain[2] / (118.354 / 1.10) - 1, 4: plain[4] / (191.09 / 1.04) - 1}
    )
    calibration = calibrate_run(run, rel_se=0.02)
    assert calibration.reeval_share == pytest.approx(sum(shares.values()) / 2)
    assert "the mean over the run's threshold levels that do not draft" in "".join(
        calibration.notes
    )
    held = {f.streams: f for f in calibration.held_out}
    assert held[2].twin == pytest.approx(plain[2] / (1 + shares[4]), rel=0.01)
    assert held[4].twin == pytest.approx(plain[4] / (1 + shares[2]), rel=0.01)
    given = calibrate_run(run, rel_se=0.02, reeval_share=0.0)
    assert given.reeval_share == 0.0
    assert {f.streams: f.twin for f in given.held_out}[2] == pytest.approx(plain[2], rel=0.01)
