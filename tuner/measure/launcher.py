"""One llama-server launch: command line, free loopback port, health wait, logs, clean stop.

The tuner only ever signals the process group it started itself (the server runs in a new
session), and every launch waits for the previous server to have exited: llama-server may hold
its port for a moment after SIGTERM. On Linux the server is also bound to the tuner's life
(PR_SET_PDEATHSIG): if the tuner is killed outright, the kernel kills its llama-server too.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import PortInUseError, ServerDiedError, ServerError, ServerStartError
from tuner.measure.client import LlamaClient

LOOPBACK = "127.0.0.1"
STOP_GRACE_S = 10.0
BIND_FAILURE = "couldn't bind HTTP server socket"
BIND_ATTEMPTS = 3  # a free port can be taken by another process before llama-server binds it
PR_SET_PDEATHSIG = 1


def _parent_death_signal() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGKILL when its parent dies (Linux only).

    libc is loaded here, in the parent: the function itself only makes two system calls in the
    forked child. The parent's pid is checked after prctl, in case it died in between. The
    signal fires when the *thread* that started the server ends: start servers from the main
    thread (or one that outlives them).
    """
    if os.uname().sysname != "Linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


# Why a server dies by a signal, in words a user can act on. SIGKILL is listed as "from outside":
# the tuner only sends it while stopping a server, and never reports that as a failure.
_SIGNAL_CAUSES: dict[int, str] = {
    signal.SIGILL: (
        "illegal instruction: this llama-server build uses CPU instructions this machine cannot "
        "run (a build made with native flags on another CPU, or AVX-512/AMX kernels that this "
        "machine or VM advertises but cannot execute). Remedies: rebuild without native flags "
        "(cmake -DGGML_NATIVE=OFF; `tuner bench setup` does this for the bench), or add "
        '"--no-repack" to server.args to keep ggml\'s AMX and repacked kernels off'
    ),
    signal.SIGKILL: (
        "killed from outside the tuner, most likely by the kernel's out-of-memory killer "
        "(see `dmesg` or `journalctl -k`); a smaller model, ctx_size or n_parallel needs "
        "less memory"
    ),
    signal.SIGSEGV: "segmentation fault: llama-server crashed; the log below may say where",
    signal.SIGABRT: "aborted: llama-server stopped itself on a failed check; see the log below",
    signal.SIGBUS: "bus error: a crash, often a model file changed or truncated while mapped",
    signal.SIGFPE: "arithmetic fault: llama-server crashed; see the log below",
    signal.SIGTERM: "terminated from outside the tuner",
    signal.SIGINT: "interrupted from outside the tuner",
}


def describe_exit(returncode: int) -> tuple[str, str | None]:
    """What an exit status means, as (what happened, likely cause): ("was killed by SIGILL",
    "illegal instruction: ...") or ("exited with status 1", None)."""
    if returncode >= 0:
        return f"exited with status {returncode}", None
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name}", _SIGNAL_CAUSES.get(-returncode)


def free_port() -> int:
    """A port that was free on loopback a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Whether a server could listen on port now (connections in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


@dataclass
class LaunchConfig:
    """Everything one llama-server launch needs."""

    binary: Path
    model: Path
    n_parallel: int
    ctx_size: int
    threads: int | None = None
    args: list[str] = field(default_factory=list)  # drafting args and anything else
    env: dict[str, str] = field(default_factory=dict)
    max_slots: int | None = None  # adds --spec-draft-max-slots N
    port: int | None = None  # None: a fresh free port per launch

    def command(self, port: int) -> list[str]:
        cmd = [
            str(self.binary),
            "--model",
            str(self.model),
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--parallel",
            str(self.n_parallel),
            "--ctx-size",
            str(self.ctx_size),
            "--metrics",
        ]
        if self.threads:
            cmd += ["--threads", str(self.threads)]
        if self.max_slots is not None:
            cmd += ["--spec-draft-max-slots", str(self.max_slots)]
        return cmd + list(self.args)


class ManagedServer:
    """A llama-server this process started; use as a context manager."""

    def __init__(
        self,
        config: LaunchConfig,
        log_path: Path,
        start_timeout_s: float = 180.0,
        name: str = "llama-server",
    ) -> None:
        self.config = config
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.name = name  # how messages name this launch, e.g. "llama-server (spec)"
        self.process: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def __enter__(self) -> ManagedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        binary = self.config.binary
        if not binary.exists():
            raise ServerStartError(f"llama-server binary not found: {binary}")
        if not self.config.model.exists():
            raise ServerStartError(f"model file not found: {self.config.model}")
        for attempt in range(1, BIND_ATTEMPTS + 1):
            if self.config.port is not None:
                if not port_is_free(self.config.port):
                    raise PortInUseError(
                        f"port {self.config.port} on {LOOPBACK} is already in use by another "
                        f"process (server.port); free it or choose another port"
                    )
                self.port = self.config.port
            else:
                self.port = free_port()
            try:
                self._launch()
                return
            except PortInUseError:
                # The port we picked was free a moment ago; another process took it first.
                if self.config.port is not None or attempt == BIND_ATTEMPTS:
                    raise

    def _launch(self) -> None:
        env = {**os.environ, **self.config.env}
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = self.log_path.open("ab")
            log.write(("$ " + " ".join(self.config.command(self.port)) + "\n").encode())
            log.flush()
        except OSError as exc:
            raise ServerStartError(
                f"cannot write {self.name}'s log {self.log_path}: {exc.strerror or exc} "
                "(TUNER_CACHE_DIR sets where logs go)"
            ) from exc
        with log:
            self.process = subprocess.Popen(
                self.config.command(self.port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: we can stop it and its children
                preexec_fn=_parent_death_signal(),  # dies with the tuner, even on SIGKILL
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        with self.client(2.0) as api:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    tail = self.log_tail()
                    if BIND_FAILURE in tail:
                        raise PortInUseError(
                            f"llama-server could not bind port {self.port} on {LOOPBACK}: "
                            f"another process holds it; last lines of {self.log_path}:\n{tail}"
                        )
                    raise self.died("at start-up, before it answered /health")
                # Healthy, and on our port: a free port picked a moment ago can be taken by
                # another process before our server binds it, and that one would answer too.
                if api.health() and listens_on(self.process, self.port):
                    return
                time.sleep(0.2)
        raise ServerStartError(
            f"{self.name} did not become healthy within {self.start_timeout_s:.0f} s; "
            f"last lines of {self.log_path}:\n{self.log_tail()}"
        )

    @property
    def returncode(self) -> int | None:
        """The exit status once the server has exited (negative: killed by that signal)."""
        return self.process.poll() if self.process is not None else None

    def died(self, when: str, detail: str = "") -> ServerDiedError:
        """The error for a server that has exited: which signal or status, when, the likely
        cause, and the end of its log."""
        code = self.returncode
        what, cause = describe_exit(code) if code is not None else ("has exited", None)
        parts = [f"{self.name} {what} {when}", cause, detail]
        return ServerDiedError(
            "; ".join(part for part in parts if part)
            + f"; last lines of {self.log_path}:\n{self.log_tail()}",
            returncode=code,
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exited_within(self, timeout_s: float) -> bool:
        """Whether the server has exited, waiting up to timeout_s for it: a killed server resets
        its connections while the kernel is still tearing it down."""
        if self.process is None:
            return True
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def answer_one(self, when: str, n_predict: int = 8, timeout_s: float = 60.0) -> dict[str, Any]:
        """Send one short completion and return the server's `timings` for it (draft_n and
        draft_n_accepted say whether it drafted). A server that dies on it is named (signal,
        likely cause, `when`); one that errs or stays silent for timeout_s is a ServerError."""
        body = {
            "prompt": "Write one sentence about the sea.",
            "n_predict": n_predict,
            "ignore_eos": True,
            "cache_prompt": False,
        }
        try:
            with self.client(timeout_s) as api:
                return api.complete(body).timings
        except ServerError as exc:
            detail = str(exc)
            if self.exited_within(2.0):
                raise self.died(when, detail) from exc
            raise ServerError(
                f"{self.name} did not answer a short request {when}: {detail}; "
                f"last lines of {self.log_path}:\n{self.log_tail()}"
            ) from exc

    def client(self, timeout_s: float = 10.0) -> LlamaClient:
        """A client of this server's HTTP API (close it, or use it in a with block)."""
        return LlamaClient(self.url, timeout=timeout_s)

    def props(self) -> dict[str, Any]:
        """GET /props (ServerError, one line, when it fails)."""
        with self.client() as api:
            return api.props()

    def stop(self) -> None:
        """TERM the process group, KILL it after a grace period, and wait until it has exited.

        The whole group, even when the main process has already exited: a wrapper script or a
        server that forked may leave members behind, and they may hold the port or the device.
        """
        process = self.process
        if process is None:
            return
        group = process.pid  # start_new_session: the group id is the leader's pid
        if process.poll() is None:
            _signal_group(group, signal.SIGTERM)
            try:
                process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_group(group, signal.SIGKILL)
                process.wait()
        if _group_alive(group):
            _signal_group(group, signal.SIGTERM)
            if not _wait_group_gone(group, STOP_GRACE_S):
                _signal_group(group, signal.SIGKILL)
                _wait_group_gone(group, STOP_GRACE_S)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on a TCP port (Linux /proc/net), empty where /proc is absent."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def listens_on(process: subprocess.Popen[bytes] | None, port: int | None) -> bool:
    """Whether the port's listening socket belongs to the process or its process group (a
    wrapper's child). True where /proc cannot tell (not Linux)."""
    if process is None or port is None or not Path("/proc/net/tcp").exists():
        return True
    inodes = _listening_inodes(port)
    if not inodes:
        return False
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for pid in _group_members(process.pid):
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in wanted:
                    return True
            except OSError:
                continue
    return False


def pids_listening_on(port: int) -> list[int]:
    """The processes holding the socket that listens on a TCP port of this machine (Linux
    /proc); empty where none is, or where the holder's /proc/<pid>/fd cannot be read (another
    user's process)."""
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not wanted:
        return []
    pids = []
    for folder in Path("/proc").glob("[0-9]*/fd"):
        try:
            fds = list(folder.iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in wanted:
                    pids.append(int(folder.parent.name))
                    break
            except OSError:
                continue
    return pids


def _group_members(group: int) -> list[int]:
    """The pids of a process group (the leader first)."""
    members = [group]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        if int(fields[2]) == group and pid != group:  # fields: state, ppid, pgrp, ...
            members.append(pid)
    return members


def _signal_group(group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)
        if sig == signal.SIGTERM:
            # A stopped (SIGSTOP) member cannot act on TERM until it is continued.
            os.killpg(group, signal.SIGCONT)


def _group_alive(group: int) -> bool:
    """Whether any process of the group is left (zombies included: they go once reaped)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_group_gone(group: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _group_alive(group):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
