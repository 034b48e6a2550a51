"""The depth model: time per token interpolated linearly in context depth between fits."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.model.costmodel import CostModel
from tuner.model.data import FitData, LevelObs, Repeat
from tuner.model.depth import bracket, tps_at_depth
from tuner.model.fitting import fit
from tuner.policy import Policy

LEVELS = [1, 2, 4, 8]


def _model(step_ms_per_depth: float, depth: int, off: float | None = None) -> CostModel:
    """A machine whose step time is 10 ms + 2 ms per stream, plus a KV read that grows
    linearly with depth; spec steps cost 2.5x and yield 2 tokens; with `off`, the threshold
    server not drafting (threshold c-1 at c) takes `off` times plain's step."""
    levels = []
    for c in LEVELS:
        plain_step = 10.0 + 2.0 * c + step_ms_per_depth * depth * c
        spec_step = 2.5 * plain_step
        levels.append(LevelObs(Policy.plain(), c, (Repeat(1000 * c / plain_step),)))
        levels.append(
            LevelObs(Policy.always(), c, (Repeat(1000 * c * 2.0 / spec_step, accept_len=2.0),))
        )
        if off is not None and c > 1:
            tps = 1000 * c / (off * plain_step)
            levels.append(LevelObs(Policy.threshold(c - 1), c, (Repeat(tps),)))
    return fit(FitData(8, 3, tuple(levels)), replicates=5, form_uncertainty=False).model


def test_bracket_picks_the_neighbours_or_the_nearest_pair() -> None:
    assert bracket([0, 1024, 4096], 2048) == (1024, 4096)
    assert bracket([0, 1024, 4096], 512) == (0, 1024)
    assert bracket([0, 1024, 4096], 8192) == (1024, 4096)
    assert bracket([1024, 4096], 0) == (1024, 4096)
    with pytest.raises(ValueError):
        bracket([0], 10)


def test_a_held_out_depth_is_predicted_from_its_neighbours() -> None:
    slope = 0.004  # ms per token of depth per stream
    models = {d: _model(slope, d) for d in (0, 4096)}
    truth = _model(slope, 2048)
    for policy in (Policy.plain(), Policy.always(), Policy.of_max_slots(2)):
        predicted = tps_at_depth(models, policy, LEVELS, 2048)
        measured = truth.policy_tps(LEVELS, policy)
        # per-token time is linear in depth here: the interpolation is close to exact
        assert np.max(np.abs(predicted / measured - 1)) < 0.03
    # deeper is slower, and the model says so beyond the measured range too
    beyond = tps_at_depth(models, Policy.plain(), LEVELS, 8192)
    assert np.all(beyond < models[4096].policy_tps(LEVELS, Policy.plain()))
    assert np.allclose(
        tps_at_depth(models, Policy.plain(), LEVELS, 0),
        models[0].policy_tps(LEVELS, Policy.plain()),
    )


def test_the_threshold_server_above_n_is_interpolated_in_depth_from_its_off_curves() -> None:
    """Fits with an off curve at two depths: at a depth between them, a threshold above its N
    is the parts' off curves combined (time per token linear in depth), not plain's, and spec
    against off is what the combined model's gain says too."""
    from tuner.model.depth import model_at

    slope = 0.004
    models = {d: _model(slope, d, off=1.05) for d in (0, 4096)}
    assert all(m.off is not None for m in models.values())
    middle = model_at(models, 2048)
    truth = _model(slope, 2048, off=1.05)
    above = np.array([4, 6, 8])
    predicted = middle.policy_tps(above, Policy.threshold(2))
    assert np.max(np.abs(predicted / truth.threshold_tps(above) - 1)) < 0.03
    assert np.all(predicted < 0.97 * middle.plain_tps(above))  # 5 % below plain, as measured
    gain = middle.gain(against="off")
    spec, off = middle.spec_tps(above), middle.threshold_tps(above)
    assert gain.point[above - 1] == pytest.approx(spec / off - 1)
    assert len(middle.replicate_models) == 5


def _deeper(factor_per_stream: float) -> list:
    """The bench levels with every step slower by factor_per_stream per stream (a KV read
    that grows with concurrency at depth)."""
    from benchdata import BENCH_LEVELS

    out = []
    for config, c, reps in BENCH_LEVELS:
        slow = 1.0 + factor_per_stream * c
        out.append(
            (config, c, [(tps / slow, acc, ms * slow, d, per) for tps, acc, ms, d, per in reps])
        )
    return out


@pytest.mark.slow
def test_recommend_answers_for_a_depth_it_did_not_measure_without_storing_it(tmp_path) -> None:
    from benchdata import store_profile
    from sqlalchemy import func, select

    from tuner.decide.advice import recommend
    from tuner.decide.depths import parse_context
    from tuner.errors import ConfigError
    from tuner.recommendation import ReasonCode
    from tuner.storage.orm import RecommendationRow
    from tuner.storage.store import Store

    store = Store(f"sqlite:///{tmp_path / 'tuner.db'}")
    store_profile(store)
    with pytest.raises(ConfigError, match="measured at one depth only"):
        recommend(store, "smollm2-bench", "bench-host", context=1024)
    store_profile(store, levels=_deeper(0.08), depth=2048)

    def stored() -> int:
        with store.session() as session:
            return session.scalar(select(func.count()).select_from(RecommendationRow))

    shallow = recommend(store, "smollm2-bench", "bench-host")
    deep = recommend(store, "smollm2-bench", "bench-host", context=2048)
    assert deep.fit_id != shallow.fit_id and stored() == 2
    middle = recommend(store, "smollm2-bench", "bench-host", context=1024)
    assert middle.made_now and stored() == 2  # derived: printed, not stored
    assert middle.reasons[0].code is ReasonCode.DERIVED_DEPTH
    plain = {r.concurrency: r.plain for r in middle.table}
    for rows in (shallow.table, deep.table):
        assert all(r.plain for r in rows)
    # the middle depth's plain speed lies between the measured depths' at every level
    for lo, hi in zip(shallow.table, deep.table, strict=True):
        assert min(lo.plain, hi.plain) <= plain[lo.concurrency] <= max(lo.plain, hi.plain)
    # a mix of measured depths rests on measured levels at each: it is stored
    mix = recommend(store, "smollm2-bench", "bench-host", context=parse_context("0:0.5,2048:0.5"))
    assert not mix.made_now and stored() == 3
    assert "each was measured" in mix.reasons[0].text
    assert parse_context("4096") == 4096
    for bad in ("-1", "deep", "0:x", "0:0,10:0"):
        with pytest.raises(ConfigError, match="--context"):
            parse_context(bad)
    store.dispose()


def test_equal_time_at_depth_follows_the_measured_slowdown() -> None:
    from tuner.measure.stats import depth_slowdown

    steps = {(0, 1): 10.0, (0, 2): 12.0, (0, 4): 16.0, (1024, 1): 20.0, (1024, 2): 30.0}
    assert depth_slowdown(steps, 0, 1024, 2) == pytest.approx(2.5)  # the cell itself
    assert depth_slowdown(steps, 0, 1024, 4) == pytest.approx(2.5)  # the nearest below
    # no step at 2048 yet: 1024's slowdown scaled linearly in depth
    assert depth_slowdown(steps, 0, 2048, 1) == pytest.approx(3.0)
    assert depth_slowdown({(0, 1): 10.0}, 0, 1024, 1) is None  # nothing deep measured yet


def test_a_scaled_workload_shortens_outputs_to_no_fewer_than_its_floor() -> None:
    import asyncio

    from tuner.measure.load import LoadGenerator, Workload

    async def lengths(scale: float) -> list[int]:
        generator = LoadGenerator(
            "http://127.0.0.1:9",
            Workload(
                prompt_tokens=4, max_tokens=192, stream=False, output_scale=scale, min_tokens=32
            ),
        )
        generator._prompts = {i: [1, 2, 3, 4] for i in range(3)}  # no server: tokens known
        requests = [await generator._request(None, 3, 0, i) for i in range(3)]  # type: ignore[arg-type]
        return [r.body["n_predict"] for r in requests]

    assert asyncio.run(lengths(1.0)) == [192] * 3
    assert asyncio.run(lengths(0.25)) == [48] * 3
    assert asyncio.run(lengths(0.05)) == [32] * 3  # the floor


@pytest.mark.slow
def test_recommend_answers_for_the_spec_depth_mix_by_default(tmp_path) -> None:
    from benchdata import store_profile

    from tuner.decide.advice import recommend
    from tuner.recommendation import ReasonCode
    from tuner.storage.store import Store

    store = Store(f"sqlite:///{tmp_path / 'tuner.db'}")
    store_profile(store)
    mostly_deep = {"depth_weights": {0: 0.2, 2048: 0.8}}
    store_profile(store, levels=_deeper(0.08), depth=2048, workload=mostly_deep)
    default = recommend(store, "smollm2-bench", "bench-host")
    assert default.reasons[0].code is ReasonCode.DERIVED_DEPTH
    assert "workload.depth_weights" in default.reasons[0].text
    explicit = recommend(store, "smollm2-bench", "bench-host", context={0: 0.2, 2048: 0.8})
    assert explicit.max_slots == default.max_slots
    assert [r.chosen for r in explicit.table] == pytest.approx([r.chosen for r in default.table])
    shallow = recommend(store, "smollm2-bench", "bench-host", context=0)
    assert shallow.reasons[0].code is not ReasonCode.DERIVED_DEPTH
    store.dispose()


def test_a_model_combined_in_depth_keeps_what_its_parts_measured() -> None:
    """A depth between two fits is no more sure of plain than its parts: where a part's plain
    was not measured (the off rows stood in), the combined model cannot say whether to draft
    at all either; the arrival costs and the acceptance trend come along from the parts."""
    from dataclasses import replace

    from tuner.model.depth import model_at

    models = {d: _model(0.004, d, off=1.05) for d in (0, 4096)}
    assert model_at(models, 2048).plain_measured
    models[4096] = replace(models[4096], plain_measured=False)
    middle = model_at(models, 2048)
    assert not middle.plain_measured
    assert middle.arrivals is models[0].arrivals and middle.trend is models[0].trend
