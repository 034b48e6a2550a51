"""Faults during `tuner profile`, each against the real bench (no mocks).

For every fault: one clear error message, a non-zero exit where the command failed, every
completed sample still in the database and no llama-server left running. The faults that strike
inside a level (Ctrl-C, SIGTERM, llama-server killed or silent, the database locked, the disk
full, a file-size limit, the tuner killed outright) strike one run in turn, and `--resume`
continues it after each without measuring again what was completed: a resume is shown from
every state a fault leaves a run in, at the cost of one profile. The faults at start-up (a
server that cannot load, a port taken) have their own runs.

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
    Snapshot,
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
    from tuner.measure import launcher

    with port_held_by_another_process() as taken:
        real_free_port = launcher.free_port
        picks = iter([taken])
        monkeypatch.setattr(launcher, "free_port", lambda: next(picks, None) or real_free_port())
        config = launcher.LaunchConfig(
            binary=bench.server, model=bench.target, n_parallel=1, ctx_size=512, threads=2
        )
        log = tmp_path / "server.log"
        with launcher.ManagedServer(config, log, start_timeout_s=120) as server:
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


# --- one run through every fault in turn --------------------------------------------------------


class Chain:
    """One profile run, started and then resumed link by link: each link waits until the run is
    inside plain at 2 streams (measured late, on the second launch), lets a fault happen there,
    and checks what the fault leaves (its one error line, the run's state, no server left, every
    completed row kept). The next link resumes from that state, so `--resume` is shown after
    every fault, each time completing only what is missing; the last link completes the run."""

    def __init__(self, case: Case, args: list[str]) -> None:
        self.case, self.args, self.resuming = case, args, False
        self.before: Snapshot | None = None
        self.server = 0  # the pid of the link's llama-server

    def start(self, **env: str) -> subprocess.Popen[str]:
        """The next link's tuner (the first runs the profile, the others resume it), once it is
        inside plain at 2 streams."""
        args = [*self.args, "--resume"] if self.before is not None else self.args
        self.resuming = self.before is not None
        tuner = start_tuner(args, {**self.case.env, **env})
        in_level(self.case, "plain", 2)
        # This tuner's own server is serving the level (a link whose tuner could not write its
        # end left the level's row marked running).
        self.server = server_of(tuner)
        before = snapshot(self.case.db)
        # what the schedule measured before plain at 2 streams (its order is the schedule's)
        assert before.done and ("plain", 2) not in before.done, sorted(before.done)
        if self.before is not None:
            assert_kept(self.case.db, self.before)  # the resume measured nothing again
        self.before = before
        return tuner

    def finish(self, tuner: subprocess.Popen[str], code: int) -> str:
        """The link's tuner exited with code and one error line (returned); a resume said so."""
        result = finish(tuner)
        assert result.returncode == code, result.stderr[-3000:]
        if self.resuming:
            assert "resuming run 1" in result.stderr, result.stderr[-3000:]
            # only plain was left: no drafting launch to check the live switch on
            assert "starting llama-server (drafting" not in result.stderr, result.stderr[-3000:]
        return one_error_line(result)

    def kept(self, state: str | None = None) -> None:
        """No server left, every completed row kept, the database whole; the run in state with
        plain at 2 streams failed (when the tuner could still say so)."""
        assert_no_servers(self.case.marker)
        if state is not None:
            assert runs(self.case.db)[0][1] == state
            assert levels(self.case.db)[("plain", 2)].status == "failed"
        assert_kept(self.case.db, self.before)
        with contextlib.closing(sqlite3.connect(self.case.db_path)) as con:
            assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_run_survives_every_fault_in_turn_and_resumes_after_each(tmp_path: Path) -> None:
    """Ctrl-C, SIGTERM, llama-server killed, llama-server silent, the database locked by another
    process, the kernel refusing to grow the tuner's files, the disk full (on a tmpfs: needs
    mount rights, root), the tuner killed outright; then a resume completes the run. The
    database lives on the small tmpfs throughout (a plain folder where mounting is refused: the
    disk-full link is then left out, and said so)."""
    with small_filesystem(tmp_path / "dbfs") as mounted:
        case = Case(tmp_path, db_dir=tmp_path / "dbfs")
        # request_timeout_s bounds the silence between two streamed tokens (the silent server):
        # 3 s, over forty times the slowest step measured here (about 66 ms).
        args = profile_args("1,2", 64, "--set", "workload.request_timeout_s=3")
        chain = Chain(case, args)

        for signum, name in ((signal.SIGINT, "ctrl-c"), (signal.SIGTERM, "sigterm")):
            tuner = chain.start()
            time.sleep(0.3)  # inside the level's requests
            tuner.send_signal(signum)
            line = chain.finish(tuner, 130)
            assert "run 1 interrupted; completed repeats are kept" in line, (name, line)
            assert "--resume" in line
            chain.kept("interrupted")

        tuner = chain.start()
        os.kill(chain.server, signal.SIGKILL)
        line = chain.finish(tuner, 2)
        assert "llama-server (plain) was killed by SIGKILL during plain at concurrency 2" in line
        assert "out-of-memory killer" in line  # SIGKILL from outside: the likely cause named
        chain.kept("failed")

        tuner = chain.start()
        time.sleep(0.3)  # let the level's requests get going
        os.kill(chain.server, signal.SIGSTOP)
        silent_since = time.monotonic()
        line = chain.finish(tuner, 2)
        assert time.monotonic() - silent_since < 60  # noticed by the timeout, then stopped
        assert "llama-server (plain) stopped answering during plain at concurrency 2" in line
        chain.kept("failed")

        tuner = chain.start(TUNER_DB_BUSY_TIMEOUT_S="2")
        locker = subprocess.Popen(
            [sys.executable, "-c", LOCKER, str(case.db_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
            line = chain.finish(tuner, 2)
        finally:
            locker.communicate("")  # end the other transaction
        assert "is locked: another process held a write lock" in line, line
        assert "TUNER_DB_BUSY_TIMEOUT_S, 2 s" in line
        chain.kept()

        tuner = chain.start()
        # The tuner may write no byte past the first of any file (its llama-server, started
        # before, keeps its own limit): EFBIG at its next write to the database, wherever the
        # earlier links left the database's files (SQLite reuses its write-ahead log's space).
        resource.prlimit(tuner.pid, resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))
        line = chain.finish(tuner, 2)
        assert "cannot write to database" in line, line
        assert "disk I/O error (disk full or file size limit?)" in line, line
        chain.kept()

        if mounted:
            tuner = chain.start()
            filler = fill(tmp_path / "dbfs" / "filler")
            line = chain.finish(tuner, 2)
            assert "cannot write to database" in line and "the disk is full" in line, line
            chain.kept()
            filler.unlink()  # space again: the run resumes on that database
        else:
            print("disk full: left out (mounting a tmpfs is not permitted here)")

        # SIGKILL cannot be handled: the kernel ends llama-server (PR_SET_PDEATHSIG).
        tuner = chain.start()
        tuner.send_signal(signal.SIGKILL)
        tuner.wait()
        assert_no_servers(case.marker, within_s=5)
        # Killed by the kernel (perhaps a zombie that init has yet to reap; exiting takes a
        # moment).
        wait_for(lambda: is_dead(chain.server), timeout_s=10)
        assert runs(case.db)[0][1] == "running"  # it died without a word
        assert_kept(case.db, chain.before)

        case.resume(args)
        assert_kept(case.db, chain.before)
        assert_run_complete(case.db, 1, LEVELS)
        assert completed(case.db)
