"""What was measured and where: host, llama-server build and model fingerprints.

A build is identified by its binary's sha256 plus its `--version` text (tarball builds all print
`build 0, commit unknown`); a model by its GGUF file's size, sha256 and metadata.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tuner.bench import sha256_file
from tuner.errors import ConfigError, ServerError

MAX_SLOTS_FLAG = "--spec-draft-max-slots"
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class BuildInfo:
    binary_sha256: str
    version_text: str
    has_max_slots: bool


@dataclass(frozen=True)
class HostInfo:
    name: str
    cpu_model: str | None
    cpu_cores: int | None
    memory_bytes: int | None
    devices: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ModelInfo:
    file_size: int
    file_sha256: str
    architecture: str | None
    quantization: str | None


def _run_binary(binary: Path, *args: str) -> str:
    if not binary.exists():
        raise ServerError(f"llama-server binary not found: {binary}")
    try:
        result = subprocess.run(
            [str(binary), *args], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError as exc:
        raise ServerError(f"cannot run {binary}: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise ServerError(f"{binary} {' '.join(args)} did not finish within 60 s") from exc
    return result.stdout + result.stderr


def probe_build(binary: Path) -> BuildInfo:
    """Fingerprint a llama-server binary and ask whether it knows --spec-draft-max-slots."""
    help_text = _run_binary(binary, "--help")
    version_lines = [
        line
        for line in _run_binary(binary, "--version").splitlines()
        if line.startswith(("version:", "built with"))
    ]
    return BuildInfo(
        binary_sha256=sha256_file(binary),
        version_text="\n".join(version_lines),
        has_max_slots=MAX_SLOTS_FLAG in help_text,
    )


def list_devices(binary: Path) -> list[str]:
    """Devices as llama-server lists them (`--list-devices`); empty for a CPU-only build."""
    lines = _run_binary(binary, "--list-devices").splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("Available devices"))
    except StopIteration:
        return []
    return [
        line.strip() for line in lines[start + 1 :] if line.strip() and line.strip() != "(none)"
    ]


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def probe_host(binary: Path | None, name: str | None = None) -> HostInfo:
    """This machine: name, CPU, cores, memory and llama-server's devices."""
    return HostInfo(
        name=name or socket.gethostname(),
        cpu_model=_cpu_model(),
        cpu_cores=os.cpu_count(),
        memory_bytes=_memory_bytes(),
        devices=list_devices(binary) if binary is not None else [],
    )


def require_gguf(path: Path, what: str = "model file") -> None:
    """Raise ConfigError unless path is an existing GGUF file."""
    if not path.exists():
        raise ConfigError(f"{what}: file not found: {path}")
    with path.open("rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise ConfigError(f"{what}: {path} is not a GGUF file")


def probe_model(path: Path) -> ModelInfo:
    """GGUF file size, sha256, architecture and quantization; rejects a file that is not GGUF."""
    import gguf

    require_gguf(path)
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"model file {path} is not a readable GGUF file: {exc}") from exc
    arch_field = reader.fields.get(gguf.Keys.General.ARCHITECTURE)
    type_field = reader.fields.get(gguf.Keys.General.FILE_TYPE)
    quantization = None
    if type_field is not None:
        try:
            quantization = gguf.LlamaFileType(int(type_field.contents())).name.removeprefix(
                "MOSTLY_"
            )
        except ValueError:
            quantization = str(type_field.contents())
    return ModelInfo(
        file_size=path.stat().st_size,
        file_sha256=sha256_file(path),
        architecture=arch_field.contents() if arch_field is not None else None,
        quantization=quantization,
    )
