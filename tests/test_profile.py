"""`tuner profile` against the real bench: what it stores, the crossover it sees, and resume."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PROFILES, ProfiledBench, copy_db
from sqlalchemy import func, select
from tunerproc import tuner_cmd, tuner_env

from tuner.errors import StorageError
from tuner.storage.engine import Store
from tuner.storage.orm import Build, Host, KernelRow, Level, Model, Run, Sample

pytestmark = pytest.mark.bench


def _levels(store: Store, run_id: int) -> dict[tuple[str, int], Level]:
    with store.session() as session:
        return {
            (lv.config, lv.concurrency): lv
            for lv in session.scalars(select(Level).filter_by(run_id=run_id))
        }


def test_bench_profile_stores_everything_and_sees_the_crossover(
    bench_profile: ProfiledBench, tmp_path: Path
) -> None:
    store = Store(bench_profile.db_url)
    levels = _levels(store, bench_profile.run_id)
    # Adaptive levels: the ones the profile added by itself are named, with why, and measured
    # for both configurations like the base levels.
    summary = next(
        line for line in bench_profile.output.splitlines() if line.startswith("adaptive levels:")
    )
    added = {int(c) for c in re.findall(r"(\d+) streams \(unmeasured; the model puts", summary)}
    assert added <= set(range(1, 9)) - {1, 2, 4, 8}, summary
    assert set(levels) == {(cfg, c) for cfg in ("plain", "spec") for c in {1, 2, 4, 8} | added}, (
        summary
    )
    if "the data now decide N" in summary or "none needed" in summary:
        answer = subprocess.run(
            tuner_cmd("recommend", "--model", "smollm2-135m-f32", "--format", "json", "-q"),
            env=tuner_env(copy_db(bench_profile, tmp_path), tmp_path / "cache"),
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(answer.stdout)["measure_next"] == [], summary
    with store.session() as session:
        run = session.get(Run, bench_profile.run_id)
        assert run.status == "completed"
        assert run.spec["speculative"]["n_max"] == 6
        for level in levels.values():
            assert level.status == "completed"
            assert 2 <= level.repeats <= 3
            samples = session.scalars(select(Sample).filter_by(level_id=level.id)).all()
            # every request of every repeat is stored, with its server-side timings
            assert len(samples) == level.repeats * level.concurrency
            assert all(s.ok and s.tokens == 192 and s.steps for s in samples)
            assert level.step_ms and level.step_ms_spread is not None
        # Interleaved: every repeat is tagged with its pass, and plain and spec of a level were
        # measured in the same passes (paired neighbours).
        for c in {1, 2, 4, 8} | added:
            passes = {
                cfg: sorted(r["pass"] for r in levels[(cfg, c)].metrics["repeats"])
                for cfg in ("plain", "spec")
            }
            assert passes["plain"] == passes["spec"], (c, passes)
            # one pass after another (adaptive levels continue the run's pass numbers)
            first = passes["plain"][0]
            assert passes["plain"] == list(range(first, first + len(passes["plain"])))
        # The configuration that ends a pass starts the next on the same launch (plain, spec
        # spec, plain plain, ...): passes + 1 launches, and no fewer.
        most = max(level.repeats for level in levels.values())
        logs = list((bench_profile.log_dir / f"run-{run.id}").glob("*.log"))
        launches = [p for p in logs if p.name.startswith(("plain", "spec"))]
        assert len(launches) >= most + 1, launches
        assert "pass 2 on the same launch" in bench_profile.output
        spec_samples = session.scalars(
            select(Sample).join(Level).where(Level.run_id == run.id, Level.config == "spec")
        )
        assert all(s.draft_n > 0 for s in spec_samples)
        model = session.scalars(select(Model)).one()
        assert (model.name, model.architecture, model.quantization) == (
            "smollm2-135m-f32",
            "llama",
            "ALL_F32",
        )
        assert len(model.file_sha256) == 64 and model.file_size > 500e6
        build = session.scalars(select(Build)).one()
        assert build.has_max_slots and len(build.binary_sha256) == 64
        assert session.scalars(select(Host)).one().cpu_cores == os.cpu_count()
        kernel = session.scalars(select(KernelRow).filter_by(run_id=run.id)).all()
        assert {k.shape for k in kernel} == {"decode", "verify"}
        assert max(k.rows for k in kernel) == 8 * 7  # -np x (n_max + 1)
    # Acceptance is measured per position from /metrics: E[L] = 1 + sum a_i, near synth-len 3.5.
    spec_one = levels[("spec", 1)]
    rates = spec_one.metrics["accept_rates"]
    assert len(rates) == 6 and 2.5 < 1 + sum(rates) < 4.5
    # The bench's contrast (about +55 % / -20 %, README): spec ahead at 1 stream, behind at 8.
    contrasts = [_contrast(levels)]
    for attempt in range(EXTRA_PROFILES):
        if _shows_crossover(contrasts[-1]):
            break
        time.sleep(SPELL_PAUSE_S)
        contrasts.append(_contrast(_profile_1_and_8(tmp_path / f"again-{attempt}")))
    assert _shows_crossover(contrasts[-1]), (
        f"(spec / plain at 1 and 8 streams) {contrasts}; {_machine_state()}"
    )


# This shared VM flips, minutes at a time, into a state where a single stream runs faster and
# the draft's many small steps slower, erasing the one-stream gain (spec 91.7 vs plain 94.1
# tok/s); the bench spec's --poll 0 makes that rarer, not impossible.
# Should a profile still land in a bad spell, it is measured again, at most twice, with levels
# 1 and 8 only, after a pause (a spell lasts minutes); the test fails when none shows the
# contrast, and then says what else ran on the machine.
# The bounds ask for spec clearly ahead at 1 stream and clearly behind at 8 (in CI a good spell
# measured 1.233 / 0.914, a bad one 1.045 / 1.048: no crossover at all).
EXTRA_PROFILES = 2
SPELL_PAUSE_S = 30.0


def _contrast(levels: dict[tuple[str, int], Level]) -> tuple[float, float]:
    """spec / plain tok/s at 1 and at 8 streams."""
    return tuple(  # type: ignore[return-value]
        round(levels[("spec", c)].tokens_per_second / levels[("plain", c)].tokens_per_second, 3)
        for c in (1, 8)
    )


def _shows_crossover(contrast: tuple[float, float]) -> bool:
    at_1, at_8 = contrast
    return at_1 > 1.12 and at_8 < 0.94


def _machine_state() -> str:
    """Load average and the five busiest processes: a failure says whether something else held
    the CPUs."""
    ps = subprocess.run(
        ["ps", "-eo", "pid,pcpu,etimes,args", "--sort=-pcpu"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()
    busy = [line.strip()[:120] for line in ps[1:6]]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"load average {load}; busiest processes: {busy}"


def _profile_1_and_8(base: Path) -> dict[tuple[str, int], Level]:
    base.mkdir()
    db_url = f"sqlite:///{base / 'tuner.db'}"
    subprocess.run(
        tuner_cmd(
            "profile",
            str(PROFILES / "bench-smollm2-cpu.toml"),
            "--levels",
            "1,8",
            "--set",
            "kernel.enabled=false",
            "--budget",
            "0",
        ),
        env=tuner_env(db_url, base / "cache"),
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    return _levels(Store(db_url), 1)


def test_show_and_runs_print_the_measured_table(
    bench_profile: ProfiledBench, tmp_path: Path
) -> None:
    env = tuner_env(bench_profile.db_url, tmp_path)
    shown = subprocess.run(
        tuner_cmd("show", str(bench_profile.run_id)),
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    store = Store(bench_profile.db_url)
    plain_8 = _levels(store, bench_profile.run_id)[("plain", 8)].tokens_per_second
    assert "plain" in shown and "spec" in shown
    assert f"{plain_8:.1f}" in shown
    listed = subprocess.run(
        tuner_cmd("runs"), env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "smollm2-135m-f32" in listed and "completed" in listed
    missing = subprocess.run(tuner_cmd("show", "999"), env=env, capture_output=True, text=True)
    assert missing.returncode != 0 and "run 999 does not exist" in missing.stderr


def _llama_servers_under(path: Path) -> list[int]:
    """Pids of running llama-server processes whose command line mentions path."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "llama-server" in cmdline and str(path) in cmdline:
            pids.append(int(entry.name))
    return pids


def test_resume_after_a_killed_run_completes_only_the_missing_levels(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'resume.db'}"
    # The port is fixed so the orphan check can find this test's server by its command line.
    env = tuner_env(db_url, tmp_path / "cache")
    args = [
        "profile",
        str(PROFILES / "bench-smollm2-cpu.toml"),
        "--levels",
        "1,2",
        "--set",
        "workload.max_tokens=48",
        "--set",
        "workload.min_repeats=1",
        "--set",
        "workload.max_repeats=1",
        "--set",
        "kernel.enabled=false",
        "--set",
        f'server.args=["--kv-unified", "--alias", "{tmp_path.name}"]',
        "--budget",
        "0",
    ]
    tuner = subprocess.Popen(
        tuner_cmd(*args), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    store = Store(db_url)
    deadline = time.monotonic() + 300
    first_done = None
    while time.monotonic() < deadline and first_done is None:
        time.sleep(0.2)
        try:
            levels = _levels(store, 1)
        except StorageError:  # the tuner may hold the write lock for a moment
            continue
        # Interleaved: a level closes when every configuration has measured it; one finished
        # repeat (the only one asked for) is what must survive the kill.
        done = [lv for lv in levels.values() if lv.repeats]
        if done:
            first_done = done[0]
    assert first_done is not None, "no repeat finished in time"
    tuner.send_signal(signal.SIGKILL)
    tuner.wait()
    time.sleep(1.0)
    assert _llama_servers_under(Path(tmp_path.name)) == [], "llama-server outlived the tuner"
    with store.session() as session:
        assert session.get(Run, 1).status == "running"  # it died without a word
        kept_samples = {
            s.id for s in session.scalars(select(Sample).filter_by(level_id=first_done.id))
        }
    assert kept_samples

    resumed = subprocess.run(
        tuner_cmd(*args, "--resume"), env=env, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming run 1" in resumed.stderr
    with store.session() as session:
        assert session.scalar(select(func.count(Run.id))) == 1
        assert session.get(Run, 1).status == "completed"
        after = session.scalars(select(Level).filter_by(run_id=1)).all()
        assert len(after) == 4 and all(lv.status == "completed" for lv in after)
        again = session.get(Level, first_done.id)
        assert again.created_at == first_done.created_at  # not re-measured
        assert {
            s.id for s in session.scalars(select(Sample).filter_by(level_id=first_done.id))
        } == kept_samples
