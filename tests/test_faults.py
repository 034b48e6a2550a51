"""Faults during `tuner profile`, each against the real bench (no mocks).

For every fault: one clear error message, a non-zero exit where the command failed, every
completed sample still in the database and no llama-server left running. `--resume` finishing
the run without re-measuring what was completed is shown once for each state a fault leaves a
run in: failed (a server killed), never started (a server that cannot load), on a disk that was
full (where a tmpfs can be mounted), interrupted (Ctrl-C), and still marked running (the tuner
killed outright). A fault that leaves a state already shown (a server that stops answering, a
locked database, SIGTERM, the file-size limit) stops there: its resume would run the same code
on the same rows.

The tuner runs as a subprocess (`python -m tuner profile ...`) with this test's own database and
cache dir; its llama-servers inherit that environment, which is how the orphan check finds them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fleetkit import (
    assert_kept,
    assert_no_servers,
    assert_run_complete,
    children_named,
    completed,
    is_dead,
    levels,
    profile_args,
    running_level,
    runs,
    snapshot,
    wait_for,
)
from tunerproc import Finished, finish, run_tuner, start_tuner, tuner_env

from tuner.bench import Bench

pytestmark = pytest.mark.bench

LEVELS = (1, 2)  # --levels 1,2


class Case:
    """One test's database, cache dir and tuner environment."""

    def __init__(self, tmp_path: Path, db_dir: Path | None = None, **env: str) -> None:
        self.cache = tmp_path / "cache"
        self.db_path = (db_dir or tmp_path) / "tuner.db"
        self.db = f"sqlite:///{self.db_path}"
        self.env = tuner_env(self.db, self.cache, **env)
        self.marker = f"TUNER_CACHE_DIR={self.cache}"

    def resume(self, args: list[str], **env: str) -> Finished:
        result = run_tuner([*args, "--resume"], {**self.env, **env})
        assert result.returncode == 0, result.stderr[-3000:]
        assert "resuming run 1" in result.stderr
        assert_no_servers(self.marker)
        return result


def one_error_line(result: Finished) -> str:
    lines = result.error_lines
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def server_of(tuner: subprocess.Popen[str]) -> int:
    """The tuner's llama-server once it is serving a round: its only child of that name, with a
    slot processing (a level's row is open before its launch is up, and the launch before it
    may still be stopping)."""

    def serving() -> int | None:
        pids = children_named(tuner.pid, "llama-server")
        if len(pids) != 1:
            return None
        try:
            cmdline = Path(f"/proc/{pids[0]}/cmdline").read_bytes().split(b"\0")
            port = int(cmdline[cmdline.index(b"--port") + 1])
            slots = httpx.get(f"http://127.0.0.1:{port}/slots", timeout=2).json()
        except (OSError, ValueError, IndexError, httpx.HTTPError):
            return None
        if not isinstance(slots, list):  # {"error": ...} while the model loads
            return None
        return pids[0] if any(slot.get("is_processing") for slot in slots) else None

    return wait_for(serving, timeout_s=60, interval_s=0.02)


def in_level(case: Case, config: str, concurrency: int) -> None:
    """Wait until the tuner is inside this level (its row exists and is running)."""
    wait_for(lambda: running_level(case.db, config, concurrency), timeout_s=180, interval_s=0.02)


# --- the server dies, hangs, or never starts --------------------------------------------------


def test_llama_server_killed_mid_level(tmp_path: Path) -> None:
    case = Case(tmp_path)
    args = profile_args("1,2", 96)
    tuner = start_tuner(args, case.env)
    in_level(case, "plain", 2)
    before = snapshot(case.db)
    # what the schedule measured before plain at 2 streams (its order is the schedule's)
    assert before.done and ("plain", 2) not in before.done, sorted(before.done)
    os.kill(server_of(tuner), signal.SIGKILL)
    result = finish(tuner)

    assert result.returncode == 2, result.stderr[-3000:]
    line = one_error_line(result)
    assert "llama-server (plain) was killed by SIGKILL during plain at concurrency 2" in line, line
    assert "out-of-memory killer" in line  # SIGKILL from outside: the likely cause named
    assert_no_servers(case.marker)
    assert runs(case.db)[0][1] == "failed"
    assert levels(case.db)[("plain", 2)].status == "failed"
    assert_kept(case.db, before)

    case.resume(args)
    assert_kept(case.db, before)
    assert_run_complete(case.db, 1, LEVELS)


def test_llama_server_stops_answering_mid_level(tmp_path: Path) -> None:
    case = Case(tmp_path)
    # request_timeout_s bounds the silence between two streamed tokens.
    args = profile_args("1,2", 96, "--set", "workload.request_timeout_s=6")
    tuner = start_tuner(args, case.env)
    in_level(case, "plain", 2)
    before = snapshot(case.db)
    server = server_of(tuner)
    time.sleep(0.3)  # let the level's requests get going
    os.kill(server, signal.SIGSTOP)
    started = time.monotonic()
    result = finish(tuner)

    assert result.returncode == 2, result.stderr[-3000:]
    line = one_error_line(result)
    assert "llama-server (plain) stopped answering during plain at concurrency 2" in line, line
    assert time.monotonic() - started < 60  # noticed by the timeout, then stopped for good
    assert_no_servers(case.marker)
    assert runs(case.db)[0][1] == "failed"
    assert levels(case.db)[("plain", 2)].status == "failed"
    assert_kept(case.db, before)


def test_llama_server_exits_at_start_up(tmp_path: Path, bench: Bench) -> None:
    case = Case(tmp_path)
    draft = tmp_path / "draft.gguf"  # missing at first: the spec server cannot load it
    speculative = (
        f'speculative.args=["--model-draft", "{draft}", "--spec-type", "draft-simple", '
        f'"--spec-synth-len", "3.5"]'
    )
    args = profile_args("1,2", 32, "--set", speculative, preflight=True)

    # The preflight launches spec before anything is measured: seconds, and no run stored.
    started = time.monotonic()
    result = run_tuner(args, case.env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert time.monotonic() - started < 60
    line = one_error_line(result)
    assert "llama-server (spec) exited with status 1 at start-up" in line, line
    assert "preflight" in result.stderr and "spec.log" in result.stderr  # the log to read
    assert_no_servers(case.marker)
    assert runs(case.db) == []

    # Without it, and relaunching for every policy (no drafting launch that checks the live
    # switch before anything is measured), plain is measured first and kept when spec fails to
    # start.
    args = [*args, "--switch", "relaunch"]
    result = run_tuner([*args, "--skip-preflight"], case.env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "llama-server (spec) exited with status 1 at start-up" in one_error_line(result)
    assert_no_servers(case.marker)
    assert runs(case.db)[0][1] == "failed"
    before = snapshot(case.db)
    assert set(before.done) == {("plain", 1), ("plain", 2)}

    draft.symlink_to(bench.draft)
    case.resume(args)
    assert_kept(case.db, before)
    assert_run_complete(case.db, 1, LEVELS)


# --- the port ----------------------------------------------------------------------------------


@contextlib.contextmanager
def port_held_by_another_process() -> Iterator[int]:
    """A loopback port that another process listens on until the block ends."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        yield int(holder.stdout.readline())
    finally:
        holder.kill()
        holder.wait()


def test_port_taken_by_another_process(tmp_path: Path) -> None:
    case = Case(tmp_path)
    with port_held_by_another_process() as port:
        args = profile_args("1,2", 32, "--set", f"server.port={port}", preflight=True)
        result = run_tuner(args, case.env)
        assert result.returncode == 2, result.stderr[-3000:]
        line = one_error_line(result)
        assert f"port {port} on 127.0.0.1 is already in use by another process" in line, line
        assert "server.port" in line
        assert_no_servers(case.marker)
        assert runs(case.db) == []  # the preflight found it: nothing was measured


def test_a_free_port_taken_before_the_server_binds_it_is_retried(
    tmp_path: Path, bench: Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race behind free ports: another process takes ours between the pick and the bind."""
    from tuner.measure import server as server_module

    with port_held_by_another_process() as taken:
        real_free_port = server_module.free_port
        picks = iter([taken])
        monkeypatch.setattr(
            server_module, "free_port", lambda: next(picks, None) or real_free_port()
        )
        config = server_module.LaunchConfig(
            binary=bench.server, model=bench.target, n_parallel=1, ctx_size=512, threads=2
        )
        log = tmp_path / "server.log"
        with server_module.ManagedServer(config, log, start_timeout_s=120) as server:
            assert server.port != taken
            assert server.props()["total_slots"] == 1
        assert "couldn't bind HTTP server socket" in log.read_text()
        assert not server.alive()


# --- the database ------------------------------------------------------------------------------


LOCKER = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
con.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
con.execute("ROLLBACK")
"""


def test_database_locked_by_a_long_transaction_in_another_process(tmp_path: Path) -> None:
    case = Case(tmp_path, TUNER_DB_BUSY_TIMEOUT_S="2")
    args = profile_args("1,2", 96)
    tuner = start_tuner(args, case.env)
    in_level(case, "plain", 2)
    before = snapshot(case.db)
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(case.db_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        result = finish(tuner)
    finally:
        locker.communicate("")  # end the other transaction

    assert result.returncode == 2, result.stderr[-3000:]
    line = one_error_line(result)
    assert "is locked: another process held a write lock" in line, line
    assert "TUNER_DB_BUSY_TIMEOUT_S, 2 s" in line
    assert_no_servers(case.marker)
    assert_kept(case.db, before)


@contextlib.contextmanager
def small_filesystem(path: Path, size: str = "16m", mount: bool = True) -> Iterator[bool]:
    """A tmpfs of the given size at path (True), or a plain folder (False) where mounting is
    not permitted or not wanted."""
    path.mkdir()
    mounted = mount and (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tuner-test", str(path)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> Path:
    """Write a file at path until the filesystem has no space left."""
    chunk = b"\0" * (64 * 1024)
    with path.open("wb") as fh:
        try:
            while True:
                fh.write(chunk)
                fh.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return path


@pytest.mark.parametrize("how", ["full-tmpfs", "file-size-limit"])
def test_disk_full_on_the_database_path(tmp_path: Path, how: str) -> None:
    """full-tmpfs: the database lives on a small tmpfs that another process fills up (needs
    mount rights: root). file-size-limit: the kernel refuses to grow the tuner's files
    (RLIMIT_FSIZE set on the running tuner), the same failure seen through EFBIG."""
    with small_filesystem(tmp_path / "dbfs", mount=how == "full-tmpfs") as mounted:
        if how == "full-tmpfs" and not mounted:
            pytest.skip("mounting a tmpfs is not permitted here; file-size-limit covers it")
        case = Case(tmp_path, db_dir=tmp_path / "dbfs")
        args = profile_args("1,2", 96)
        tuner = start_tuner(args, case.env)
        in_level(case, "plain", 2)
        before = snapshot(case.db)
        filler = None
        if mounted:
            filler = fill(tmp_path / "dbfs" / "filler")
            expected = "the disk is full"
        else:
            # The tuner may not grow any file beyond what the database's files hold now.
            cap = max(p.stat().st_size for p in case.db_path.parent.glob("tuner.db*"))
            resource.prlimit(tuner.pid, resource.RLIMIT_FSIZE, (cap, resource.RLIM_INFINITY))
            expected = "disk I/O error (disk full or file size limit?)"
        result = finish(tuner)

        assert result.returncode == 2, result.stderr[-3000:]
        line = one_error_line(result)
        assert "cannot write to database" in line and expected in line, line
        assert_no_servers(case.marker)
        assert_kept(case.db, before)

        with contextlib.closing(sqlite3.connect(case.db_path)) as con:
            assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        if filler is not None:  # space again: the run resumes on that database
            filler.unlink()
            case.resume(args)
            assert_kept(case.db, before)
            assert_run_complete(case.db, 1, LEVELS)


# --- the user stops the tuner ------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_during_a_level(tmp_path: Path, signum: int) -> None:
    case = Case(tmp_path)
    args = profile_args("1,2", 96)
    tuner = start_tuner(args, case.env)
    in_level(case, "plain", 2)
    before = snapshot(case.db)
    time.sleep(0.3)  # inside the level's requests
    tuner.send_signal(signum)
    result = finish(tuner)

    assert result.returncode == 130, result.stderr[-3000:]
    line = one_error_line(result)
    assert "run 1 interrupted; completed repeats are kept" in line, line
    assert "--resume" in line
    assert_no_servers(case.marker)
    assert runs(case.db)[0][1] == "interrupted"
    assert levels(case.db)[("plain", 2)].status == "failed"
    assert_kept(case.db, before)

    if signum == signal.SIGINT:  # SIGTERM leaves the same state
        case.resume(args)
        assert_kept(case.db, before)
        assert_run_complete(case.db, 1, LEVELS)


def test_tuner_killed_outright_takes_its_server_along(tmp_path: Path) -> None:
    """SIGKILL cannot be handled: the kernel ends llama-server (PR_SET_PDEATHSIG)."""
    case = Case(tmp_path)
    args = profile_args("1,2", 96)
    tuner = start_tuner(args, case.env)
    in_level(case, "plain", 2)
    server = server_of(tuner)
    before = snapshot(case.db)
    tuner.send_signal(signal.SIGKILL)
    tuner.wait()
    assert_no_servers(case.marker, within_s=5)
    # Killed by the kernel (perhaps a zombie that init has yet to reap; exiting takes a moment).
    wait_for(lambda: is_dead(server), timeout_s=10)
    assert runs(case.db)[0][1] == "running"  # it died without a word
    assert_kept(case.db, before)

    case.resume(args)
    assert_kept(case.db, before)
    assert_run_complete(case.db, 1, LEVELS)
    assert completed(case.db)
