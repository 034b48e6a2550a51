"""A server that dies is named for what happened (which signal, at which point, the likely cause),
the preflight makes such a death cost seconds with nothing stored, and stopping a server ends its
whole process group.

The dying server is a stand-in (tests/crashing_server.py) that answers like llama-server and
then kills itself with a chosen signal: these tests are about the tuner's handling of a death,
not about measuring. Deaths of the real server mid-level are in test_faults.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fleetkit import env_for, run_tuner

from tuner.measure.launcher import LaunchConfig, ManagedServer, describe_exit
from tuner.storage.orm import Run
from tuner.storage.store import Store

STAND_IN = Path(__file__).resolve().parent / "crashing_server.py"

SPEC = """
name = "crash"
model_name = "crash-model"

[server]
binary = "{binary}"
model = "{model}"
n_parallel = 2
start_timeout_s = 30

[speculative]
args = ["--spec-type", "draft-simple"]

[workload]
concurrency = [1, 2]
max_tokens = 16
request_timeout_s = 20

[kernel]
enabled = false
"""


def tiny_gguf(path: Path) -> Path:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def crash_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "crash.toml"
    spec.write_text(SPEC.format(binary=STAND_IN, model=tiny_gguf(tmp_path / "m.gguf")))
    return spec


def stored_runs(db_url: str) -> list[Run]:
    store = Store(db_url)
    with store.session() as session:
        runs = list(session.query(Run).all())
        for run in runs:
            run.completed_levels = sum(1 for lv in run.levels if lv.status == "completed")
    store.dispose()
    return runs


def test_exit_statuses_are_named_with_their_likely_cause() -> None:
    what, cause = describe_exit(-signal.SIGILL)
    assert what == "was killed by SIGILL"
    assert "CPU instructions this machine cannot run" in cause and "--no-repack" in cause
    what, cause = describe_exit(-signal.SIGKILL)
    assert what == "was killed by SIGKILL" and "out-of-memory killer" in cause
    assert describe_exit(-signal.SIGSEGV)[0] == "was killed by SIGSEGV"
    assert "crashed" in describe_exit(-signal.SIGSEGV)[1]
    assert describe_exit(3) == ("exited with status 3", None)


def test_sigill_at_the_first_request_stops_the_profile_in_seconds(
    tmp_path: Path, crash_spec: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    started = time.monotonic()
    result = run_tuner(["profile", str(crash_spec)], env_for(db, tmp_path / "cache"), 120)
    elapsed = time.monotonic() - started

    assert result.returncode == 2, result.stderr[-3000:]
    assert elapsed < 60, elapsed
    line = result.error_lines[0]
    assert "llama-server (plain) was killed by SIGILL at its preflight request" in line, line
    assert "CPU instructions this machine cannot run" in line
    assert "crashing with SIGILL" in result.stderr  # the log's last lines come with it
    assert stored_runs(db) == []  # nothing stored as if measured


def test_a_death_in_warm_up_is_named_there_and_nothing_counts_as_measured(
    tmp_path: Path, crash_spec: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    env = env_for(db, tmp_path / "cache", CRASH_SIGNAL="SEGV")
    result = run_tuner(["profile", str(crash_spec), "--skip-preflight"], env, 120)

    assert result.returncode == 2, result.stderr[-3000:]
    line = result.error_lines[0]
    # The first launch warms up (which one depends on how the run measures: plain first when it
    # relaunches per policy, the drafting launch when it switches live).
    assert re.search(r"llama-server \([\w-]+\) was killed by SIGSEGV during warm-up", line), line
    assert "segmentation fault" in line
    [run] = stored_runs(db)
    assert run.status == "failed" and run.completed_levels == 0


def test_stop_ends_the_process_group_after_its_leader_exited(tmp_path: Path) -> None:
    server = ManagedServer(LaunchConfig(Path("/bin/sh"), Path("/dev/null"), 1, 64), tmp_path / "l")
    # A leader that leaves a member of its group behind, as a wrapper script might.
    server.process = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 300 & echo $!; exit 0"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    orphan = int(server.process.stdout.readline())
    server.process.wait()
    os.kill(orphan, 0)  # still there

    server.stop()

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(orphan, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"process {orphan} of the server's group survived stop()")


def test_a_port_answered_by_another_process_is_not_taken_for_our_server(tmp_path: Path) -> None:
    """A free port picked a moment ago can be taken by another process before our server binds
    it; that process would answer /health too. Ours is known by the socket it listens on."""
    import sys

    from tuner.measure.launcher import free_port, listens_on

    port = free_port()
    other = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    ours = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not listens_on(other, port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert listens_on(other, port)
        assert not listens_on(ours, port)
    finally:
        other.kill()
        ours.kill()
        other.wait()
        ours.wait()
