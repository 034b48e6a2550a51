"""A busy machine on the real bench: a CPU-bound program started part-way through a profile marks
the rounds it touched (stored with the figure, measured again, left out of verdicts), the run
warns in words that name it, and a tune while it runs settles nothing from those rounds; the
suite's shared profile blames no program that was not there. What is asserted is what
the tuner saw and said, never a throughput ratio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ProfiledBench
from sqlalchemy import func, select
from tunerproc import finish, run_tuner, start_tuner, tuner_env

from tuner.measure.interference import BUSY_CORES, round_load, snapshot
from tuner.measure.recorder import rounds_stored
from tuner.storage.orm import Level, Sample
from tuner.storage.store import Store

pytestmark = pytest.mark.bench

SPEC = Path(__file__).resolve().parent.parent / "profiles" / "bench-smollm2-cpu.toml"
MODEL = "smollm2-135m-f32"
SHORT = [
    *("--levels", "1,2", "--budget", "0", "--set", "workload.max_tokens=32"),
    *("--set", "workload.min_repeats=2", "--set", "workload.max_repeats=2"),
    *("--set", "workload.warmup=0", "--set", "kernel.enabled=false"),
    *("--set", "probes.enabled=false"),
]
BLAME = "other programs used"


def rounds(db: Path, counted_only: bool = False) -> list[dict]:
    """The stored rounds; counted_only: those the levels' figures count (not set apart)."""
    store = Store(f"sqlite:///{db}")
    try:
        with store.session() as session:
            levels = list(session.scalars(select(Level)))
            if counted_only:
                return [r for level in levels for r in (level.metrics or {}).get("repeats", [])]
            return [r for level in levels for r in rounds_stored(level.metrics or {})]
    except Exception:  # read while the profile writes: the caller polls again
        return []
    finally:
        store.dispose()


def stored_samples(db: Path) -> int:
    if not db.exists():
        return 0
    store = Store(f"sqlite:///{db}")
    try:
        with store.session() as session:
            return int(session.scalar(select(func.count()).select_from(Sample)) or 0)
    except Exception:
        return 0
    finally:
        store.dispose()


HALF_A_CORE = """
import time
while True:
    t = time.monotonic()
    while time.monotonic() - t < 0.05:
        pass
    time.sleep(0.05)
"""


def _hog() -> subprocess.Popen:
    """A program busy half the time, at the usual priority. Not niced: where the kernel groups
    processes by session (autogroup), a nice-19 program still takes its share from a server in
    a session of its own, but where it does not, the server's threads leave it next to nothing
    and no round is ever touched."""
    return subprocess.Popen([sys.executable, "-c", HALF_A_CORE])


def _stop(hog: subprocess.Popen) -> None:
    hog.kill()
    hog.wait()


def _others_now(seconds: float = 2.0) -> float:
    """The cores other programs use now (all but this process), as a round would count them."""
    start = snapshot(gpu=False)
    time.sleep(seconds)
    return round_load(start, snapshot(gpu=False), server=[], tuner=os.getpid()).others


def test_a_busy_program_started_part_way_is_named_and_its_rounds_left_out(
    tmp_path: Path,
) -> None:
    """A program busy half the time runs from the first stored round until a round is marked
    busy: the rounds it touched are marked, measured again once it is gone, and the warning
    names it. Then a tune with it running throughout settles nothing. (A whole core taken
    slows this 2-core machine's rounds thirty times over; half a core is plenty to be seen.)"""
    busy = _others_now()
    if busy >= BUSY_CORES:
        # every round is busy from its start already: what this program marks cannot be told
        # from what was there (the shared profile's test holds the rule on a busy machine too)
        pytest.skip(f"the machine is busy before the program starts ({busy:.2f} cores used)")
    db = tmp_path / "busy.db"
    env = tuner_env(db, tmp_path / "cache")
    profile = start_tuner(["profile", str(SPEC), *SHORT], env)
    hog = None
    try:
        deadline = time.monotonic() + 300
        while stored_samples(db) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        hog = _hog()  # part-way: after the first round is stored
        while not any(r.get("busy") for r in rounds(db)) and time.monotonic() < deadline + 300:
            if profile.poll() is not None:
                break
            time.sleep(0.2)
        _stop(hog)
        profiled = finish(profile, 900)
    finally:
        if hog is not None and hog.poll() is None:
            _stop(hog)
    assert profiled.returncode == 0, profiled.stderr[-3000:]
    # the warning names what was busy: other programs, this one among them by its pid
    assert BLAME in profiled.stderr and f"pid {hog.pid}" in profiled.stderr, profiled.stderr[-3000:]
    stored = rounds(db)
    busy = [r for r in stored if r.get("busy")]
    assert busy, "no stored round is marked busy"
    assert all((r.get("machine") or {}).get("others", 0) >= 0.1 for r in busy)
    # measured again once it was gone: every level has its counted rounds, none of them busy
    counted = rounds(db, counted_only=True)
    assert counted and not [r for r in counted if r.get("busy")], counted

    hog = _hog()
    try:
        tune = ["tune", "--model", MODEL, "--budget", "10s", "--format", "json"]
        tune += ["--set", "workload.max_tokens=16"]  # rounds take many times as long now
        tuned = run_tuner(tune, env, 900)
    finally:
        _stop(hog)
    # the tune while it ran: rounds the program touched are no pairs, so nothing is settled
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    assert BLAME in tuned.stderr, tuned.stderr[-3000:]
    assert json.loads(tuned.stdout)["answer_status"] != "settled"


def test_the_shared_profile_blames_only_what_was_there(
    bench_profile: ProfiledBench,
) -> None:
    """The suite's shared bench profile (conftest.bench_profile): every round carries what the
    rest of the machine did while it ran, and a round is marked busy, and the run warns, only
    where other programs used the cores the threshold counts. On a quiet machine (the bench
    tests run one at a time) that is no round and no warning; beside someone else's work the
    same rule holds, so the test does not depend on how busy the machine is."""
    db = Path(bench_profile.db_url.removeprefix("sqlite:///"))
    measured = [r for r in rounds(db) if r.get("tokens_per_second")]
    assert measured and all("machine" in r for r in measured)
    for r in measured:
        load = r["machine"]
        there = load["others"] >= BUSY_CORES or load["steal"] >= BUSY_CORES
        assert bool(r.get("busy")) == there, r
    busy = [r for r in measured if r.get("busy")]
    assert (BLAME in bench_profile.output) == any(
        r["machine"]["others"] >= BUSY_CORES for r in busy
    ), bench_profile.output[-3000:]
