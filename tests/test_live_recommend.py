"""recommend and validate on a real bench profile: the commands run end to end on the patched
llama-server (the live switch on one drafting launch), store what they measured, and the
threshold they set shows in the draft counters. tune and open-loop validation run against the
bench's twin (tests/test_live_twin.py): what they add is the tuner's own bookkeeping.

Which N is right is not asked here: on this shared 2-core machine a spell of 10-30 % can flip
any speed comparison, so decisions are graded on the bench's twin (tests/test_bench_twin.py:
recommend after a profile drafts where drafting clearly pays, both regimes; test_decisions.py:
tune settles within its tolerance of the truth). The shared profiles are cheap
(conftest.SHARED_PROFILE_ARGS) and every command here measures briefly: short outputs, one
repeat, no preflight (tests/test_faults.py and tests/test_server_death.py test the preflight).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import ProfiledBench, copy_db
from sqlalchemy import select
from tunerproc import tuner_cmd, tuner_env, tuner_json

from tuner.measure.schedule import off_arm
from tuner.storage.engine import Store
from tuner.storage.orm import Level, Run, Sample

pytestmark = pytest.mark.bench

MODEL = "smollm2-135m-f32"
MODEL_NMAX3 = "smollm2-135m-f32-nmax3"
BRIEF = ["--skip-preflight", "--set", "workload.warmup=0"]
ONE_REPEAT = ["--set", "workload.min_repeats=1", "--set", "workload.max_repeats=1"]


def _drafted(store: Store, run_id: int) -> dict[tuple[str, int], int]:
    """Draft tokens per (config, concurrency) of a run, from the requests' own timings."""
    with store.session() as session:
        return {
            (level.config, level.concurrency): sum(
                s.draft_n for s in session.scalars(select(Sample).filter_by(level_id=level.id))
            )
            for level in session.scalars(select(Level).filter_by(run_id=run_id))
        }


def test_validate_measures_the_neighbours_and_the_threshold_really_applies(
    bench_profile: ProfiledBench, tmp_path: Path
) -> None:
    db_url = copy_db(bench_profile, tmp_path)
    env = tuner_env(db_url, tmp_path / "cache")
    # recommend prints exactly one env line on stdout, its explanation on stderr
    answer = subprocess.run(
        tuner_cmd("recommend", "--model", MODEL), env=env, capture_output=True, text=True
    )
    assert answer.returncode == 0, answer.stderr[-3000:]
    match = re.fullmatch(r"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=(\d+)\n", answer.stdout)
    assert match, f"stdout must be exactly one env line, got {answer.stdout!r}"
    assert "streams" in answer.stderr  # the explanation table
    report = tuner_json(
        env,
        "validate",
        "--model",
        MODEL,
        *BRIEF,
        *ONE_REPEAT,
        "--set",
        "workload.max_tokens=32",
    )
    n = report["recommended"]
    assert n == int(match.group(1))
    expected = {"plain", "N=0"} | {f"N={k}" for k in (n - 1, n, n + 1) if 1 <= k <= 8}
    assert {n, n + 1} & set(range(1, 9)) <= set(report["levels"])  # where neighbours differ
    assert report["regret_pct"] is not None and report["regret_pct"] >= 0
    assert 0 <= report["mean_abs_error_pct"] <= report["worst_abs_error_pct"]

    store = Store(db_url)
    with store.session() as session:
        run = session.get(Run, report["run_id"])
        assert (run.kind, run.status) == ("validate", "completed")
        if run.way == "live":
            # On the drafting launch always-draft's gain at c is measured against the threshold
            # c-1 (off_arm), a candidate or not: at 4 streams with N=1 recommended, N=3.
            expected |= {arm.label for c in report["levels"] if (arm := off_arm(c))}
        assert set(report["measured"]) == expected, (run.way, report["levels"])
        assert report["best"] in expected
        max_slots = {
            (lv.config, lv.concurrency): lv.max_slots
            for lv in session.scalars(select(Level).filter_by(run_id=run.id))
        }
    # Threshold N really applied, by the draft counters: streams at or under N draft (32 tokens
    # a stream: at least 5 steps, each drafting), above N they do not.
    for (config, c), drafted in _drafted(store, report["run_id"]).items():
        limit = max_slots[(config, c)]
        if limit is None:
            assert drafted == 0, (config, c)
        elif limit == 0 or c <= limit:
            assert drafted > 4 * c, (config, c, drafted)
        else:
            # at most the drafts in flight when the last stream joined
            assert drafted <= 6 * 2 * c, (config, c, drafted)
    store.dispose()

    # The validation's points feed the next fit.
    fitted = subprocess.run(
        tuner_cmd("fit", "--model", MODEL, "--format", "json"),
        env=env,
        capture_output=True,
        text=True,
    )
    assert fitted.returncode == 0, fitted.stderr
    assert report["run_id"] in json.loads(fitted.stdout)["inputs"]["runs"]
