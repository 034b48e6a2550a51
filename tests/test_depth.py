"""Context depth on the real bench: every level measured at each depth in the same launches,
stored with its depth, fitted per depth, and recommend answering for a depth it measured.

That the deep context was really there is read from the server's own accounting (a deep
request processed no more than the token or two decoding starts from: the rest came from the
cache), not from speed. The step-time contrast between depths (seen 1.63 plain and 1.89 spec
times slower at 2 streams) is not asserted: one round per cell, and a spell of this VM once
made the spec cells 1.03 apart (86.4 against 83.5 ms). benchmarks/depth.py prints the figures;
how the model uses a slowdown is tests/test_depth_model.py's, on data with a known one. One
repeat per level and no preflight: what is tested is that each depth is prefilled, measured,
stored and fitted on its own, not the figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import PROFILES
from sqlalchemy import select
from tunerproc import assert_env_line_is, run_tuner, tuner_env, tuner_json

from tuner.storage.orm import Level, Sample
from tuner.storage.store import Store

pytestmark = pytest.mark.bench

MODEL = "smollm2-135m-f32"
DEEP = 1024


def test_levels_are_measured_and_fitted_per_context_depth(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'tuner.db'}"
    env = tuner_env(db_url, tmp_path / "cache")
    profile = run_tuner(
        [
            "profile",
            str(PROFILES / "bench-smollm2-cpu.toml"),
            "--levels",
            "1,2",
            "--budget",
            "0",
            "--set",
            f"workload.context_tokens=[0, {DEEP}]",
            "--set",
            "server.ctx_size=8192",
            "--set",
            "workload.max_tokens=16",
            "--set",
            "workload.min_repeats=1",
            "--set",
            "workload.max_repeats=1",
            "--set",
            "workload.warmup=0",
            "--set",
            "kernel.enabled=false",
            "--set",
            "probes.enabled=false",
            "--skip-preflight",
        ],
        env,
        timeout_s=900,
    )
    assert profile.returncode == 0, profile.stderr[-3000:]

    # Each launch prefilled the deep streams' context before measuring them, so no measured
    # request prefilled more than the token or two that decoding starts from.
    assert f"prefilled depth {DEEP} for 2 streams" in profile.stderr + profile.stdout
    store = Store(db_url)
    with store.session() as session:
        deep_prompts = session.scalars(
            select(Sample.prompt_tokens).join(Level).where(Level.context_tokens == DEEP)
        ).all()
        assert deep_prompts and max(deep_prompts) <= 4, sorted(deep_prompts)[-5:]
        levels = session.scalars(select(Level).where(Level.status == "completed")).all()
        step = {(lv.config, lv.concurrency, lv.context_tokens): lv.step_ms for lv in levels}
        passes = {
            (lv.config, lv.concurrency, lv.context_tokens): {
                r["pass"] for r in lv.metrics["repeats"]
            }
            for lv in levels
        }
    store.dispose()
    cells = {(config, c, d) for config in ("plain", "spec") for c in (1, 2) for d in (0, DEEP)}
    assert {key for key in step if key[0] in ("plain", "spec")} == cells, sorted(step)
    # Each pass's launch measured both depths: the same pass at both.
    for config in ("plain", "spec"):
        assert passes[(config, 2, 0)] == passes[(config, 2, DEEP)]
    data = tuner_json(env, "dev", "fit", "--model", MODEL)
    assert data["inputs"]["context_tokens"] == 0 and data["inputs"]["depths"] == [0, DEEP]
    assert set(data["crossover_by_depth"]) == {"0", str(DEEP)}

    deep = tuner_json(env, "recommend", "--model", MODEL, "--context", str(DEEP))
    assert deep["fit_id"] != data["fit_id"]  # its own fit, of the deep levels
    # A depth not measured is interpolated between the measured ones: printed, said, not stored.
    between = run_tuner(["recommend", "--model", MODEL, "--context", "1000"], env)
    assert between.returncode == 0, between.stderr[-3000:]
    # the env line last, the same answer as --format json gives for that depth (a threshold, or
    # plain with the threshold as a comment: which one, one round per cell decides)
    at_1000 = tuner_json(env, "recommend", "--model", MODEL, "--context", "1000")
    assert_env_line_is(between.stdout.splitlines()[-1], at_1000)
    assert f"predicted from the fits at depths 0, {DEEP}" in between.stderr
    assert "not stored" in between.stderr
    # fit answers for measured depths only, and names them.
    missing = run_tuner(["dev", "fit", "--model", MODEL, "--context", "1000"], env)
    assert missing.returncode != 0
    assert f"measured: 0, {DEEP}" in missing.stderr and "Traceback" not in missing.stderr
