"""What a change of N writes and runs: the env file the watcher owns one key of (written
atomically, every other line kept) and the user's on-change command."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from tuner.errors import ConfigError
from tuner.recommendation import ENV_MAX_SLOTS


class EnvFile:
    """A KEY=VALUE file (systemd's EnvironmentFile, docker's --env-file) the watcher owns one key
    of: written atomically, every other line kept as it was."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def check_writable(self) -> None:
        """Fail now, with the reason, if the file cannot be replaced later."""
        folder = self.path.parent
        if self.path.is_dir():
            raise ConfigError(f"--env-file {self.path}: is a directory")
        try:
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".tuner-check-"):
                pass
        except OSError as exc:
            raise ConfigError(
                f"--env-file {self.path}: cannot write in {folder} ({exc.strerror or exc})"
            ) from None

    def read(self) -> dict[str, str]:
        if not self.path.exists():
            return {}
        values = {}
        for line in self.path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not key.lstrip().startswith("#"):
                values[key.strip()] = value.strip()
        return values

    def current_max_slots(self) -> int | None:
        raw = self.read().get(ENV_MAX_SLOTS)
        try:
            return int(raw) if raw is not None else None
        except ValueError:
            return None

    def write(self, values: Mapping[str, str]) -> None:
        """Set these keys (replacing their lines, or appending), atomically."""
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        pending = dict(values)
        out = []
        for line in lines:
            key = line.partition("=")[0].strip()
            if key in pending:
                out.append(f"{key}={pending.pop(key)}")
            else:
                out.append(line)
        out += [f"{k}={v}" for k, v in pending.items()]
        mode = self.path.stat().st_mode & 0o777 if self.path.exists() else 0o644
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write("\n".join(out) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def run_command(command: str, timeout_s: float) -> tuple[int, str]:
    """The user's on-change command in a shell: its exit status and the end of its output."""
    try:
        done = subprocess.run(
            command,
            shell=True,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout_s:.0f} s"
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    return done.returncode, " | ".join(tail)
