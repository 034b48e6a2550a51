"""recommend, validate (closed and open loop) and tune end to end over HTTP against the bench's
twin: the commands launch it from the spec as they launch llama-server, switch it live, store
what they measured and what they decided, and the threshold they set shows in the draft
counters. What only the real server can show (the threshold in its draft counters, the live
switch, launching) is tests/test_profile.py's, test_patch.py's and test_live_switch.py's; which
N is right is test_decisions.py's. The twin runs 20 times faster than the wall, noise on.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED_WORKLOAD_ARGS, copy_sqlite
from sqlalchemy import select
from tunerproc import (
    TWIN_MODEL,
    TWIN_SPEC,
    tuner_cmd,
    tuner_env,
    tuner_json,
    tuner_ok,
    twin_spec_args,
)

from tuner.measure.schedule import off_arm
from tuner.storage.orm import Level, Run, Sample
from tuner.storage.store import Store

# Subprocesses over HTTP, a minute of both cores in all: the full suite's, not the edit loop's.
pytestmark = pytest.mark.slow

MODEL = TWIN_MODEL
BRIEF = ["--skip-preflight", "--set", "workload.warmup=0"]
ONE_REPEAT = ["--set", "workload.min_repeats=1", "--set", "workload.max_repeats=1"]
# The n-max 3 regime of profiles/bench-smollm2-cpu-nmax3.toml on the twin: synthetic acceptance
# of mean length 2.0, valid at every draft length 1..3.
NMAX3 = [
    "--set",
    "speculative.n_max=3",
    "--set",
    'speculative.args=["--model-draft", "twin-draft", "--spec-type", "draft-simple", '
    '"--spec-synth-len", "2.0"]',
]


@pytest.fixture(scope="module")
def twin_profile(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The bench twin profiled as conftest's shared bench profile is (levels 1 and 4, two
    passes, 64 tokens); its database's URL. Tests add to copies of it."""
    base = tmp_path_factory.mktemp("twin-profile")
    db_url = f"sqlite:///{base / 'tuner.db'}"
    tuner_ok(
        tuner_env(db_url, base / "cache"),
        "profile",
        str(TWIN_SPEC),
        *twin_spec_args(base),
        "--skip-preflight",
        *SHARED_WORKLOAD_ARGS,
    )
    return db_url


def _drafted(store: Store, run_id: int) -> dict[tuple[str, int], dict[int, dict[str, Any]]]:
    """Per (config, concurrency), per round key: the round's drafts inside its measured window
    (window_drafted) and the profiler's mark of a threshold that drafted there (drafted_off)."""
    with store.session() as session:
        return {
            (level.config, level.concurrency): {
                r["round_key"]: {k: r.get(k) for k in ("window_drafted", "drafted_off")}
                for r in level.metrics["repeats"]
            }
            for level in session.scalars(select(Level).filter_by(run_id=run_id))
        }


def _total_drafted(store: Store, run_id: int) -> dict[tuple[str, int], int]:
    """Draft tokens per (config, concurrency) of a run, from the requests' own timings."""
    with store.session() as session:
        return {
            (level.config, level.concurrency): sum(
                s.draft_n for s in session.scalars(select(Sample).filter_by(level_id=level.id))
            )
            for level in session.scalars(select(Level).filter_by(run_id=run_id))
        }


def test_validate_measures_the_neighbours_and_the_threshold_applies(
    twin_profile: str, tmp_path: Path
) -> None:
    db_url = copy_sqlite(twin_profile, tmp_path / "copy.db")
    env = tuner_env(db_url, tmp_path / "cache")
    # recommend prints exactly one env line on stdout, its explanation on stderr
    answer = subprocess.run(
        tuner_cmd("recommend", "--model", MODEL), env=env, capture_output=True, text=True
    )
    assert answer.returncode == 0, answer.stderr[-3000:]
    # (an answer the model cannot settle carries a comment line before it saying so)
    match = re.fullmatch(
        r"(# unresolved: [^\n]*\n)?LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=(\d+)\n", answer.stdout
    )
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
    assert n == int(match.group(2))
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
    # a stream: at least 5 steps, each drafting), above N they do not inside the window where
    # all streams generate (around it they may: the twin's clock makes the window exact).
    totals = _total_drafted(store, report["run_id"])
    for (config, c), rounds in _drafted(store, report["run_id"]).items():
        limit = max_slots[(config, c)]
        if limit is None:
            assert totals[(config, c)] == 0, (config, c)
        elif limit == 0 or c <= limit:
            assert totals[(config, c)] > 4 * c, (config, c, totals)
        else:
            assert all(not r["window_drafted"] for r in rounds.values()), (config, c, rounds)
    store.dispose()

    # The validation's points feed the next fit.
    fitted = subprocess.run(
        tuner_cmd("dev", "fit", "--model", MODEL, "--format", "json"),
        env=env,
        capture_output=True,
        text=True,
    )
    assert fitted.returncode == 0, fitted.stderr
    assert report["run_id"] in json.loads(fitted.stdout)["inputs"]["runs"]


def test_tune_settles_live_at_draft_lengths_and_its_answer_stands(tmp_path: Path) -> None:
    """`tuner tune --tune-n-max` on the n-max 3 regime: sweeps of on and off in turn on one
    drafting launch (the live switch), the off arm drafting nothing, every trial in the study,
    the answer standing with both settings. A brief budget: it may stop unresolved; how well it
    settles is test_decisions.py's."""
    import optuna

    db_url = f"sqlite:///{tmp_path / 'tuner.db'}"
    env = tuner_env(db_url, tmp_path / "cache")
    # The cheapest profile tune starts from: two levels (a fit needs two), one round each.
    tuner_ok(
        env,
        "profile",
        str(TWIN_SPEC),
        *twin_spec_args(tmp_path),
        *NMAX3,
        "--levels",
        "1,2",
        "--budget",
        "0",
        *BRIEF,
        *ONE_REPEAT,
        "--set",
        "workload.max_tokens=24",  # not tune's 16 below: tune finds no round to settle on
        "--set",
        "kernel.enabled=false",
    )
    report = tuner_json(
        env,
        "tune",
        "--model",
        MODEL,
        "--tune-n-max",
        "--budget",
        "15s",
        *BRIEF,
        "--set",
        "workload.max_tokens=16",
    )
    assert report["way"] == "live", report
    assert report["status"] in ("settled", "unresolved"), report
    # No stored round measured 16 tokens (the profile's are 24): the first assessment had
    # nothing to settle on, so at least one sweep ran.
    assert report["sweeps"] >= 1, report
    n, n_max = report["standing"], report["standing_n_max"]
    assert 0 <= n <= 8 and 1 <= n_max <= 3, report

    store = Store(db_url)
    with store.session() as session:
        levels = session.scalars(select(Level).filter_by(run_id=report["run_id"])).all()
        rounds = {
            (lv.config, lv.concurrency): {r["round_key"] for r in lv.metrics["repeats"]}
            for lv in levels
        }
        n_maxes = {(lv.config, lv.n_max) for lv in levels}
        # what a failure below needs to be read: each level's threshold, length and rounds
        seen = {
            (lv.config, lv.concurrency): (
                lv.max_slots,
                lv.n_max,
                sorted(rounds[(lv.config, lv.concurrency)]),
            )
            for lv in levels
        }
    assert rounds, "tune measured nothing"
    # A level at another draft length than the profile's is stored under its own name, with
    # its n_max, so two lengths of one N never share a level.
    for config, level_n_max in n_maxes:
        assert config.endswith(f"@n{level_n_max}") == (level_n_max != 3), n_maxes
    # Each sweep measured always-draft and the threshold just below each level as pairs (the
    # same round keys), on one launch: inside the measured window (all streams generating; the
    # twin's chunks carry its own clock, so the window is exact) the threshold drafted nothing
    # and always-draft did. Around the window the threshold drafts legitimately: how much
    # depends on how far apart the streams reached the twin, so it is not counted.
    drafted = _drafted(store, report["run_id"])
    store.dispose()
    windowed = 0
    for (config, c), keys in rounds.items():
        if config.startswith("max-slots-"):
            on = next(k for k in rounds if k[1] == c and k[0].split("@")[0] == "spec")
            assert rounds[on] == keys, (config, c, rounds)
            for key in keys:
                off_round, on_round = drafted[(config, c)][key], drafted[on][key]
                assert off_round.get("drafted_off") is None, (config, c, off_round, seen)
                if off_round["window_drafted"] is None or on_round["window_drafted"] is None:
                    continue  # no window: the streams never all generated at once
                windowed += 1
                assert off_round["window_drafted"] == 0 < on_round["window_drafted"], (
                    config,
                    c,
                    off_round,
                    on_round,
                    seen,
                )
    assert windowed, f"no pair had a window where all its streams generated: {seen}"
    # Every answer it evaluated is a trial of the live study in the tuner's database.
    study = optuna.load_study(study_name=report["study_name"], storage=db_url)
    answers = [t for t in study.trials if t.user_attrs.get("role") == "answer"]
    assert [t.params["spec_draft_max_slots"] for t in answers] == [n], study.trials
    assert len(study.trials) == 1 + len(report["comparisons"]), study.trials
    # The answer that stands is what recommend prints now, both settings: as variables, or, where
    # the answer is to serve without the draft model (which the measurement may say), as comments.
    lines = subprocess.run(
        tuner_cmd("recommend", "--model", MODEL, "-q"),
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    stated = tuner_json(env, "recommend", "--model", MODEL, "--format", "json")
    assert (stated["max_slots"], stated["n_max"]) == (n, n_max), stated
    settings = [f"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS={n}", f"LLAMA_ARG_SPEC_DRAFT_N_MAX={n_max}"]
    if stated["answer"] == "plain":
        assert all(x.startswith("#") for x in lines), lines
        assert [s for s in settings if any(x.endswith(s) for x in lines)] == settings, lines
    else:
        # an unresolved answer's comment line aside
        assert [x for x in lines if not x.startswith("# ")] == settings, lines


def _open_loop_validate(env: dict[str, str], arrivals: str, *args: str) -> dict:
    """`tuner validate --max-slots 1 --arrivals ARRIVALS ARGS` on the twin profile's model."""
    return tuner_json(
        env, "validate", "--model", MODEL, "--max-slots", "1", "--arrivals", arrivals, *args
    )


def test_open_loop_validation_measures_each_configuration_under_poisson_arrivals(
    twin_profile: str, tmp_path: Path
) -> None:
    from tuner.decide.openloop import stored_results

    db_url = copy_sqlite(twin_profile, tmp_path / "copy.db")
    env = tuner_env(db_url, tmp_path / "cache")
    # N=1 validated whatever stands: plain, always draft, N=1 and N=2 (four configurations)
    report = _open_loop_validate(
        env,
        "poisson",
        "--rate",
        "0.5,4",
        "--window",
        "4s",
        *BRIEF,
        "--set",
        "workload.max_tokens=24",
    )
    results = report["results"]
    assert set(results) == {"0.5", "4.0"}
    configs = set(results["0.5"])
    assert report["recommended"] == 1
    assert configs == {"plain", "spec", "max-slots-1", "max-slots-2"}, configs
    for by_config in results.values():
        for f in by_config.values():
            assert f["completed"] == f["offered"] > 0 and f["failed"] == 0
            assert f["ttft_ms"][0] > 0 and f["tpot_ms"][0] <= f["tpot_ms"][1] <= f["tpot_ms"][2]
    # Eight times the arrivals keep more slots generating, whatever the machine's speed: at 0.5
    # a second a request is mostly alone; at 4 a second they overlap (a slow spell makes both
    # requests last longer, so it raises both figures, and 8 slots cap the busy one).
    for config in configs:
        assert results["4.0"][config]["mean_generating"] > results["0.5"][config]["mean_generating"]
    # Stored as shown.
    stored = stored_results(Store(db_url), report["run_id"])
    assert {str(rate) for rate in stored} == set(results)
    assert stored[4.0]["plain"].offered == results["4.0"]["plain"]["offered"]


def test_open_loop_replays_an_observed_trace(twin_profile: str, tmp_path: Path) -> None:
    from tuner.storage import traffic_profiles as traffic
    from tuner.traffic import Finished, ServerView, TrafficProfile

    db_url = copy_sqlite(twin_profile, tmp_path / "copy.db")
    store = Store(db_url)
    seen = TrafficProfile(8)
    seen.add(1, 12.0)
    lengths = [16, 40] * 3
    for i, output in enumerate(lengths):  # one request a second, as observe would record them
        seen.add_finished(Finished(1_800_000_000.0 + i, 20, output))
    view = ServerView("http://127.0.0.1:8080", "m", 8, "slots")
    traffic.save(store, "seen", view, seen.to_dict(), "complete")
    store.dispose()
    env = tuner_env(db_url, tmp_path / "cache")
    report = _open_loop_validate(
        env,
        "trace",
        "--traffic",
        "seen",
        "--window",
        "30s",
        *BRIEF,
    )
    (rate, by_config), *others = report["results"].items()
    assert not others and float(rate) == pytest.approx(5 / 5.0)  # 6 arrivals over 5 s
    assert set(by_config) == {"plain", "spec", "max-slots-1", "max-slots-2"}, by_config
    for f in by_config.values():
        assert f["offered"] == f["completed"] == len(lengths) and f["failed"] == 0
        # every request generated its observed length
        assert f["tokens_per_second"] * f["span_s"] == pytest.approx(sum(lengths))
