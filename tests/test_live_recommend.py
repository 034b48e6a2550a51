"""recommend and validate on real bench profiles: the answer agrees with the measurements."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import ProfiledBench, copy_db
from sqlalchemy import select
from tunerproc import tuner_cmd, tuner_env, tuner_json

from tuner.storage.engine import Store
from tuner.storage.orm import Level, Run, Sample

pytestmark = pytest.mark.bench

MODELS = {"bench_profile": "smollm2-135m-f32", "bench_profile_nmax3": "smollm2-135m-f32-nmax3"}
# One level's live tok/s swings about this much between launches on a shared machine (random
# acceptance included): a closer spec-vs-plain margin is a tie that noise may flip either way.
TIE = 0.10


def _measured(store: Store, run_id: int) -> dict[str, dict[int, float]]:
    table: dict[str, dict[int, float]] = {}
    with store.session() as session:
        for level in session.scalars(select(Level).filter_by(run_id=run_id)):
            table.setdefault(level.config, {})[level.concurrency] = level.tokens_per_second
    return table


@pytest.mark.parametrize("profile_fixture", list(MODELS))
def test_recommended_n_matches_the_measured_crossover(
    profile_fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    profiled: ProfiledBench = request.getfixturevalue(profile_fixture)
    db_url = copy_db(profiled, tmp_path)
    result = subprocess.run(
        tuner_cmd("recommend", "--model", MODELS[profile_fixture]),
        env=tuner_env(db_url, tmp_path),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    match = re.fullmatch(r"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=(\d+)\n", result.stdout)
    assert match, f"stdout must be exactly one env line, got {result.stdout!r}"
    n = int(match.group(1))
    measured = _measured(Store(db_url), profiled.run_id)
    gains = {c: measured["spec"][c] / plain - 1 for c, plain in measured["plain"].items()}
    ahead = [gains[c] > 0 for c in sorted(gains)]
    if any(not before and after for before, after in itertools.pairwise(ahead)):
        # Behind, then ahead again (a spell of the VM in the middle of the profile): no
        # threshold agrees with both, and the rule is that the model decides and the reasons
        # say the measurements are noisy.
        answer = subprocess.run(
            tuner_cmd("recommend", "--model", MODELS[profile_fixture], "--format", "json", "-q"),
            env=tuner_env(db_url, tmp_path),
            capture_output=True,
            text=True,
            check=True,
        )
        codes = {r["code"] for r in json.loads(answer.stdout)["reasons"]}
        assert "noisy-gains" in codes, (gains, codes)
        return
    clear = {c: g for c, g in gains.items() if abs(g) > TIE}
    if not clear:
        # The VM in a spell where spec and plain tie everywhere (the profile test, which
        # re-profiles, checks the bench's contrast itself): no level for N to agree with.
        pytest.skip(f"no level where spec and plain differ by more than {TIE:.0%}: {gains}")
    for c, gain in gains.items():
        drafts_at_c = n == 0 or c <= n
        if gain > TIE:
            assert drafts_at_c, f"spec clearly ahead at {c} streams ({gain:+.0%}) but N={n}"
        elif gain < -TIE and drafts_at_c:
            # A threshold cannot switch drafting off at 1 stream: N=1 is the least, and the
            # reasons must say that running without drafting is the better choice.
            assert (n, c) == (1, 1), f"spec clearly behind at {c} streams ({gain:+.0%}), N={n}"
            answer = subprocess.run(
                tuner_cmd(
                    "recommend", "--model", MODELS[profile_fixture], "--format", "json", "-q"
                ),
                env=tuner_env(db_url, tmp_path),
                capture_output=True,
                text=True,
                check=True,
            )
            codes = {r["code"] for r in json.loads(answer.stdout)["reasons"]}
            assert "plain-everywhere" in codes, codes
    assert "streams" in result.stderr  # the explanation table went to stderr


def test_validate_measures_the_neighbours_and_the_threshold_really_applies(
    bench_profile: ProfiledBench, tmp_path: Path
) -> None:
    db_url = copy_db(bench_profile, tmp_path)
    env = tuner_env(db_url, tmp_path / "cache")
    model = MODELS["bench_profile"]
    subprocess.run(
        tuner_cmd("recommend", "--model", model, "-q"), env=env, check=True, capture_output=True
    )
    report = tuner_json(
        env,
        "validate",
        "--model",
        model,
        "--set",
        "workload.max_repeats=1",
        "--set",
        "workload.min_repeats=1",
        "--set",
        "workload.max_tokens=64",
    )
    n = report["recommended"]
    expected = {"plain", "N=0"} | {f"N={k}" for k in (n - 1, n, n + 1) if 1 <= k <= 8}
    assert set(report["measured"]) == expected
    assert {n, n + 1} & set(range(1, 9)) <= set(report["levels"])  # where neighbours differ
    assert report["best"] in expected
    assert report["regret_pct"] is not None and report["regret_pct"] >= 0
    assert 0 <= report["mean_abs_error_pct"] <= report["worst_abs_error_pct"]

    store = Store(db_url)
    with store.session() as session:
        run = session.get(Run, report["run_id"])
        assert (run.kind, run.status) == ("validate", "completed")
        # Threshold N really applied: streams at or under N draft, above N they do not.
        for level in session.scalars(select(Level).filter_by(run_id=run.id)):
            drafted = sum(
                s.draft_n for s in session.scalars(select(Sample).filter_by(level_id=level.id))
            )
            if level.max_slots is None:
                assert drafted == 0
            elif level.max_slots == 0 or level.concurrency <= level.max_slots:
                assert drafted > 10 * level.concurrency, (level.config, level.concurrency)
            else:
                # at most the drafts in flight when the last stream joined
                assert drafted <= 6 * 2 * level.concurrency, (level.config, level.concurrency)

    # The validation's points feed the next fit.
    fitted = subprocess.run(
        tuner_cmd("fit", "--model", model, "--format", "json"),
        env=env,
        capture_output=True,
        text=True,
    )
    assert fitted.returncode == 0, fitted.stderr
    assert report["run_id"] in json.loads(fitted.stdout)["inputs"]["runs"]


def test_tune_measures_the_models_candidates_live_and_its_best_trial_stands(
    bench_profile: ProfiledBench, tmp_path: Path
) -> None:
    import optuna

    db_url = copy_db(bench_profile, tmp_path)
    env = tuner_env(db_url, tmp_path / "cache")
    model = MODELS["bench_profile"]

    def recommended() -> str:
        return subprocess.run(
            tuner_cmd("recommend", "--model", model, "-q"),
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    before = recommended()
    report = tuner_json(
        env,
        "tune",
        "--model",
        model,
        "--trials",
        "3",
        "--passes",
        "2",
        "--set",
        "workload.max_tokens=64",
    )
    trials = report["trials"]
    # The standing recommendation is the first live trial; the model's candidates follow it.
    assert f"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS={trials[0]['max_slots']}" == before
    assert 1 <= len(trials) <= 3
    assert {t["state"] for t in trials} <= {"complete", "pruned"}
    complete = [t for t in trials if t["state"] == "complete"]
    assert complete
    best = max(complete, key=lambda t: (t["value"], -t["max_slots"]))
    assert report["standing"] == best["max_slots"]
    # The answer that stands is what recommend prints now.
    assert recommended() == f"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS={best['max_slots']}"

    # The live study is in the tuner's database, trial for trial.
    study = optuna.load_study(study_name=report["study_name"], storage=db_url)
    stored = {t.number: t for t in study.trials}
    for t in trials:
        assert stored[t["trial"]].params["spec_draft_max_slots"] == t["max_slots"]
        assert stored[t["trial"]].state.name == t["state"].upper()

    # Each round's policies were measured side by side: the same passes at the same levels.
    store = Store(db_url)
    with store.session() as session:
        levels = session.scalars(select(Level).filter_by(run_id=report["run_id"])).all()
        passes: dict[tuple[str, int], set[int]] = {
            (lv.config, lv.concurrency): {r["pass"] for r in lv.metrics["repeats"]} for lv in levels
        }
    first_round = [t for t in trials if t["round"] == 1]
    for c in first_round[0]["levels"]:
        seen = [
            passes[(f"max-slots-{t['max_slots']}" if t["max_slots"] else "spec", c)]
            for t in first_round
            if t["state"] == "complete"
        ]
        assert all(s == seen[0] for s in seen), seen


def test_tune_n_max_measures_draft_lengths_live(
    bench_profile_nmax3: ProfiledBench, tmp_path: Path
) -> None:
    """On the n-max 3 regime: its synthetic acceptance (mean length 2.0) is valid at every draft
    length 1..3, where the other regime's (3.5) makes the server refuse n_max below 3."""
    import optuna

    db_url = copy_db(bench_profile_nmax3, tmp_path)
    env = tuner_env(db_url, tmp_path / "cache")
    model = MODELS["bench_profile_nmax3"]
    report = tuner_json(
        env,
        "tune",
        "--model",
        model,
        "--tune-n-max",
        "--trials",
        "2",
        "--passes",
        "2",
        "--set",
        "workload.max_tokens=64",
    )
    trials = report["trials"]
    assert len(trials) == 2
    # Every trial names its draft length, and the study searched it as a parameter.
    assert all(1 <= t["n_max"] <= 3 for t in trials), trials
    study = optuna.load_study(study_name=report["study_name"], storage=db_url)
    measured = [s for s in study.trials if s.state.name in ("COMPLETE", "PRUNED")]
    assert all("spec_draft_n_max" in s.params for s in measured)
    # A trial at another draft length than the profile's is stored under its own name, with
    # its n_max, so two lengths of one N never share a level.
    store = Store(db_url)
    with store.session() as session:
        levels = session.scalars(select(Level).filter_by(run_id=report["run_id"])).all()
        stored = {(lv.config, lv.n_max) for lv in levels}
    store.dispose()
    for t in trials:
        name = f"max-slots-{t['max_slots']}" if t["max_slots"] else "spec"
        if t["n_max"] != 3:
            name += f"@n{t['n_max']}"
        assert (name, t["n_max"]) in stored, (name, stored)
    # The answer that stands carries both settings.
    line = subprocess.run(
        tuner_cmd("recommend", "--model", model, "-q"),
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert line == [
        f"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS={report['standing']}",
        f"LLAMA_ARG_SPEC_DRAFT_N_MAX={report['standing_n_max']}",
    ]


def test_open_loop_validation_measures_each_configuration_under_poisson_arrivals(
    bench_profile: ProfiledBench, tmp_path: Path
) -> None:
    from tuner.decide.openloop import stored_results

    db_url = copy_db(bench_profile, tmp_path)
    env = tuner_env(db_url, tmp_path / "cache")
    report = tuner_json(
        env,
        "validate",
        "--model",
        MODELS["bench_profile"],
        "--arrivals",
        "poisson",
        "--rate",
        "0.5,4",
        "--window",
        "12s",
        "--set",
        "workload.max_tokens=48",
    )
    results = report["results"]
    assert set(results) == {"0.5", "4.0"}
    configs = set(results["0.5"])
    # plain, always draft, and the standing N with its neighbours within 1..8 (N=0 is always
    # draft: a profile in one of the VM's low-gain spells recommends it, and then only N=1 is
    # added).
    n = report["recommended"]
    around = {f"max-slots-{k}" for k in (n - 1, n, n + 1) if 1 <= k <= 8}
    assert configs == {"plain", "spec"} | around, (n, configs)
    for by_config in results.values():
        for f in by_config.values():
            assert f["completed"] == f["offered"] > 0 and f["failed"] == 0
            assert f["ttft_ms"][0] > 0 and f["tpot_ms"][0] <= f["tpot_ms"][1] <= f["tpot_ms"][2]
    # Eight times the arrivals keep more slots generating, whatever the machine's speed.
    for config in configs:
        assert results["4.0"][config]["mean_generating"] > results["0.5"][config]["mean_generating"]
    # Stored as shown.
    stored = stored_results(Store(db_url), report["run_id"])
    assert {str(rate) for rate in stored} == set(results)
    assert stored[4.0]["plain"].offered == results["4.0"]["plain"]["offered"]


def test_open_loop_replays_an_observed_trace(bench_profile: ProfiledBench, tmp_path: Path) -> None:
    from tuner.storage import traffic
    from tuner.traffic import Finished, ServerView, TrafficProfile

    db_url = copy_db(bench_profile, tmp_path)
    store = Store(db_url)
    seen = TrafficProfile(8)
    seen.add(1, 12.0)
    lengths = [16, 40] * 5
    for i, output in enumerate(lengths):  # one request a second, as observe would record them
        seen.add_finished(Finished(1_800_000_000.0 + i, 20, output))
    view = ServerView("http://127.0.0.1:8080", "m", 8, "slots")
    traffic.save(store, "seen", view, seen.to_dict(), "complete")
    store.dispose()
    env = tuner_env(db_url, tmp_path / "cache")
    report = tuner_json(
        env,
        "validate",
        "--model",
        MODELS["bench_profile"],
        "--arrivals",
        "trace",
        "--traffic",
        "seen",
        "--window",
        "30s",
    )
    (rate, by_config), *others = report["results"].items()
    assert not others and float(rate) == pytest.approx(9 / 9.0)  # 10 arrivals over 9 s
    for f in by_config.values():
        assert f["offered"] == f["completed"] == 10 and f["failed"] == 0
        # every request generated its observed length: 280 tokens in all
        assert f["tokens_per_second"] * f["span_s"] == pytest.approx(sum(lengths))
