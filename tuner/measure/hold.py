"""A server left as found: a tune of a llama-server the tuner did not start switches its
threshold live (`POST /props {"spec_draft_max_slots": N}`) and gives the threshold it found back
on every way out.

- One tune a server: `ServerHold` takes an exclusive `flock` on `state_dir/holds/<key>.lock`,
  the key a hash of the normalised URL. The OS drops the lock when the process ends, however it
  ends, so a lock is never stale; the holder writes its pid, host and start time into the file,
  and a second tuner fails at once with one line naming them.
- A record (`state_dir/holds/<key>.json`: the URL, the threshold found, the tuner's pid, host
  and start time) is written atomically (a temporary file, fsync, rename) by `before_switch`,
  before the caller's first switch, and removed once the threshold found is back.
- On the way out (a return, an error, Ctrl-C, SIGTERM: the CLI turns SIGTERM into
  KeyboardInterrupt) the hold sets the threshold found back and reads it back. Where the server
  cannot be reached the record stays, and the hold says that the next run restores it.
- A record found by whoever takes the lock next was left by a tuner that died without its way
  out (SIGKILL, the machine's power, the OOM killer): its threshold is restored then, and said
  so. `recover_left_hold` does only that, for any command against a URL (check, observe,
  watch, profile --url) that holds no tune itself.
- A server that restarted mid-tune is back at its command line's threshold: `check_threshold`
  compares what the server reports with what the tuner set, after a round, and raises one line.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from tuner.errors import ServerError
from tuner.measure.client import MAX_SLOTS_FIELD, LlamaClient
from tuner.measure.plan import Observer, ProgressEvent, quiet

HOLDS = "holds"
# Names a client may use for this machine's loopback: the same server whichever is typed.
_LOOPBACK = {"localhost", "0.0.0.0", "::1", "::", "ip6-localhost"}


def normalise_url(url: str) -> str:
    """The URL as one server has it, whatever the spelling: scheme and host in lower case, the
    loopback under one name, the default port written out, no trailing slash."""
    parsed = httpx.URL(url if "://" in url else f"http://{url}")
    host = parsed.host.lower()
    if host in _LOOPBACK or host.startswith("127."):
        host = "127.0.0.1"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return f"{parsed.scheme.lower()}://{host}:{port}{parsed.path.rstrip('/')}"


def hold_paths(url: str, state_dir: Path) -> tuple[Path, Path]:
    """(the lock file, the record) of a server under state_dir."""
    key = hashlib.sha256(normalise_url(url).encode()).hexdigest()[:16]
    folder = state_dir / HOLDS
    return folder / f"{key}.lock", folder / f"{key}.json"


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a server: a tuner process, where and since when."""

    pid: int
    host: str
    started: str  # local time, ISO 8601 to the second

    @classmethod
    def me(cls) -> Holder:
        now = datetime.now().astimezone().isoformat(timespec="seconds")
        return cls(os.getpid(), socket.gethostname(), now)

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, started {self.started}"


@dataclass(frozen=True)
class HoldRecord:
    """What a tuner writes before its first switch: the threshold to give back."""

    url: str
    original: int
    holder: Holder

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def read(cls, path: Path) -> HoldRecord | None:
        """The record at path; None where there is none. An unreadable one (cut short by a
        disk that filled up) is a ServerError naming the file, never silently dropped: the
        threshold it held would be lost."""
        try:
            data: Any = json.loads(path.read_text())
            return cls(str(data["url"]), int(data["original"]), Holder(**data["holder"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ServerError(
                f"{path} (the threshold a tuner found on a server) cannot be read: {exc}; "
                "restore the server's threshold by hand and remove the file"
            ) from exc


def _write_atomically(path: Path, text: str) -> None:
    """text at path, whole or not at all, and on the disk before this returns."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a crash
    finally:
        os.close(folder)


def _say(observer: Observer, text: str) -> None:
    observer(ProgressEvent("message", text=text))


class _Lock:
    """The per-server lock: flock on the lock file, the holder written into it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def take(self) -> Holder | None:
        """Take the lock; None on success, else the holder named in the file (pid 0 where the
        other tuner has not written itself in yet)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited across exec
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return Holder(**json.loads(os.pread(fd, 4096, 0).decode()))
            except (ValueError, TypeError):
                return Holder(0, "?", "?")
            finally:
                os.close(fd)
        me = json.dumps(asdict(Holder.me())).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, me, 0)
        self.fd = fd
        return None

    def release(self) -> None:
        if self.fd is not None:
            # The file stays: removing it would let a tuner that opened it before the removal
            # lock a file no other tuner can find any more.
            os.ftruncate(self.fd, 0)
            os.close(self.fd)  # drops the flock
            self.fd = None


def _restore_left(
    url: str, api_key: str | None, record_path: Path, observer: Observer
) -> int | None:
    """With the lock held: a record left by a tuner that died, restored on the server and
    removed, and said so; its threshold, or None where there was none. Where the server cannot
    be reached the record stays for the next run, and that is said too."""
    record = HoldRecord.read(record_path)
    if record is None:
        return None
    try:
        with LlamaClient(url, api_key) as api:
            api.set_max_slots(record.original)
    except ServerError as exc:
        _say(
            observer,
            f"warning: a tuner ({record.holder.describe()}) stopped without giving {url} back "
            f"its {MAX_SLOTS_FIELD}={record.original}, and it cannot be restored now "
            f"({exc}); {record_path} keeps it for the next run",
        )
        return None
    record_path.unlink(missing_ok=True)
    _say(
        observer,
        f"restored {MAX_SLOTS_FIELD}={record.original} on {url}: a tuner "
        f"({record.holder.describe()}) stopped without giving it back",
    )
    return record.original


def recover_left_hold(
    url: str, api_key: str | None, state_dir: Path, observer: Observer = quiet
) -> int | None:
    """Before any command against a server it did not start: the threshold a tuner that died
    left switched is restored, and said so; returns it, or None where nothing was left (or
    where a live tuner holds the server: its record is its own, and it restores it itself)."""
    lock_path, record_path = hold_paths(url, state_dir)
    if not record_path.exists():
        return None  # the usual case: nothing to lock for
    lock = _Lock(lock_path)
    if lock.take() is not None:
        return None
    try:
        return _restore_left(url, api_key, record_path, observer)
    finally:
        lock.release()


def check_threshold(url: str, api_key: str | None, expected: int) -> None:
    """After a round: the server still runs the threshold the tuner set, else one ServerError
    line (a server that restarted is back at its command line's threshold; someone else may
    have switched it)."""
    with LlamaClient(url, api_key) as api:
        seen = api.max_slots()
    if seen != expected:
        shown = "no threshold" if seen is None else f"{MAX_SLOTS_FIELD}={seen}"
        raise ServerError(
            f"{url} reports {shown} where the tuner had set {expected}: the server restarted "
            "or something else switched it, so the last round did not measure what it meant to"
        )


class ServerHold:
    """A server held for one tune: one tuner at a time, the threshold found given back on every
    way out (see the module docstring).

        with ServerHold(url, api_key, state_dir, observer) as hold:
            hold.switch(3)        # the first switch writes the record before it switches
            ... measure ...
            hold.check()          # the server still runs 3
    """

    def __init__(
        self,
        url: str,
        api_key: str | None,
        state_dir: Path,
        observer: Observer = quiet,
    ) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.observer = observer
        lock_path, self.record_path = hold_paths(url, state_dir)
        self._lock = _Lock(lock_path)
        self.original: int | None = None  # the threshold found, once before_switch read it
        self.current: int | None = None  # the threshold switch set last

    def __enter__(self) -> ServerHold:
        other = self._lock.take()
        if other is not None:
            who = "another tuner" if other.pid == 0 else f"another tuner ({other.describe()})"
            raise ServerError(
                f"{who} is tuning {self.url}; a server takes one tune at a time: wait for it "
                "to finish, or stop it"
            )
        try:
            _restore_left(self.url, self.api_key, self.record_path, self.observer)
        except BaseException:
            self._lock.release()
            raise
        return self

    def before_switch(self) -> int:
        """The threshold found, read from the server and recorded on the disk on the first
        call, before the caller's first switch; the same value after."""
        if self.original is not None:
            return self.original
        with LlamaClient(self.url, self.api_key) as api:
            found = api.max_slots()
        if found is None:
            raise ServerError(
                f"{self.url} reports no {MAX_SLOTS_FIELD} in GET /props: it cannot switch the "
                "threshold live (it needs a llama-server built with the tuner's patch)"
            )
        record = HoldRecord(self.url, found, Holder.me())
        _write_atomically(self.record_path, record.to_json())
        self.original = found
        return found

    def switch(self, n: int) -> None:
        """The threshold switched to n live and read back, the one found recorded first."""
        self.before_switch()
        with LlamaClient(self.url, self.api_key) as api:
            api.set_max_slots(n)
        self.current = n

    def check(self, expected: int | None = None) -> None:
        """The server still runs `expected` (default: what switch set last); see
        check_threshold."""
        wanted = self.current if expected is None else expected
        if wanted is not None:
            check_threshold(self.url, self.api_key, wanted)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self.original is not None:
                self._give_back(self.original)
        finally:
            self._lock.release()

    def _give_back(self, original: int) -> None:
        try:
            with LlamaClient(self.url, self.api_key) as api:
                try:
                    api.set_max_slots(original)
                except ServerError:
                    # A switch refused (POST /props off) may never have changed anything: a
                    # server that still reads as found needs nothing given back.
                    if api.max_slots() != original:
                        raise
                    self.record_path.unlink(missing_ok=True)
                    return
        except ServerError as exc:
            _say(
                self.observer,
                f"warning: could not give {self.url} back its {MAX_SLOTS_FIELD}={original} "
                f"({exc}); the next tuner run against this URL restores it "
                f"(kept in {self.record_path})",
            )
            return
        with contextlib.suppress(FileNotFoundError):
            self.record_path.unlink()
        _say(self.observer, f"{self.url}: {MAX_SLOTS_FIELD} back to {original}, as found")
