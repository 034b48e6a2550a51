"""A busy machine on the real bench: a CPU-bound program started part-way through a profile marks
the rounds it touched (stored with the figure, measured again, left out of verdicts), the run
warns in words that name it, and a tune while it runs settles nothing from those rounds; a profile
on the quiet machine (the suite's shared one) blames no other program. What is asserted is what
the tuner saw and said, never a throughput ratio."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ProfiledBench
from sqlalchemy import func, select
from tunerproc import finish, run_tuner, start_tuner, tuner_env

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


def test_a_busy_program_started_part_way_is_named_and_its_rounds_left_out(
    tmp_path: Path,
) -> None:
    """A program busy half the time runs from the first stored round until a round is marked
    busy: the rounds it touched are marked, measured again once it is gone, and the warning
    names it. Then a tune with it running throughout settles nothing. (A whole core taken
    slows this 2-core machine's rounds thirty times over; half a core is plenty to be seen.)"""
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


def test_the_shared_profile_on_the_quiet_machine_blames_no_program(
    bench_profile: ProfiledBench,
) -> None:
    """The suite's shared bench profile (conftest.bench_profile), run with nothing else on the
    machine (the bench tests run one at a time): no warning, no round marked busy, and every
    round carries what the rest of the machine did while it ran."""
    assert BLAME not in bench_profile.output, bench_profile.output[-3000:]
    db = Path(bench_profile.db_url.removeprefix("sqlite:///"))
    measured = [r for r in rounds(db) if r.get("tokens_per_second")]
    assert measured and not [r for r in measured if r.get("busy")]
    assert all("machine" in r for r in measured)
