"""What was measured and where: host, llama-server build and model fingerprints.

A build is identified by its binary's sha256 plus its `--version` text (tarball builds all print
`build 0, commit unknown`); a model by its GGUF file's size, sha256 and metadata.

A model file is 5-60 GB, so its full sha256 is computed once per file and kept by a
FileHashCache (tuner.storage.hashes.StoredHashes: a table keyed by host and path), reused while
the file's size and mtime stand. What identifies it on every run is `content_id`: a hash of the
size, the GGUF header and metadata, and a fixed number of evenly spaced samples, a few tens of
MiB of reads at any size.
"""

from __future__ import annotations

import hashlib
import os
import platform
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tuner.errors import ConfigError, ServerError
from tuner.inputs import read_toml
from tuner.measure.ggufmeta import read_gguf_meta

MAX_SLOTS_FLAG = "--spec-draft-max-slots"
GGUF_MAGIC = b"GGUF"
SAMPLE_COUNT = 16
SAMPLE_BYTES = 1 << 20
# Real models' metadata (the tokenizer's vocabulary mostly) is a few MiB; a header beyond this
# is hashed in part, the samples still cover the rest.
HEADER_CAP_BYTES = 64 << 20
# Changing how content_id is computed changes every id: the tag keeps old and new apart.
CONTENT_ID_TAG = b"tuner-content-id-v1\0"
TWIN_SUFFIX = ".toml"  # a twin world (tuner.twin.world) as the model of the twin server


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
    # Field names are tuner_models' column names: Context.rows stores asdict(ModelInfo) there.
    file_size: int
    file_sha256: str
    content_id: str
    architecture: str | None
    quantization: str | None


class FileHashCache(Protocol):
    """Full sha256s computed before, valid for a file while its size and mtime_ns stand."""

    def get(self, path: Path, size: int, mtime_ns: int, content_id: str) -> str | None:
        """The stored sha256 of path if it was hashed at this size, mtime_ns and content_id."""
        ...

    def put(self, path: Path, size: int, mtime_ns: int, content_id: str, sha256: str) -> None:
        """Remember path's sha256 as of this size, mtime_ns and content_id."""
        ...


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """The sha256 of a whole file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def sample_ranges(
    size: int, count: int = SAMPLE_COUNT, sample_bytes: int = SAMPLE_BYTES
) -> list[tuple[int, int]]:
    """(offset, length) of the content samples: count evenly spaced blocks, the first at 0 and
    the last ending at the end of the file; one block of the whole file when that is smaller."""
    if size <= count * sample_bytes:
        return [(0, size)]
    span = size - sample_bytes
    return [(i * span // (count - 1), sample_bytes) for i in range(count)]


def content_id(path: Path, size: int, header_bytes: int) -> str:
    """sha256 of the file size, its first header_bytes (GGUF header and metadata, capped) and
    the sample blocks: it changes with the metadata and with any sampled byte."""
    digest = hashlib.sha256(CONTENT_ID_TAG)
    digest.update(size.to_bytes(8, "little"))
    with path.open("rb") as fh:
        header = fh.read(max(0, min(header_bytes, HEADER_CAP_BYTES)))
        digest.update(len(header).to_bytes(8, "little"))
        digest.update(header)
        for offset, length in sample_ranges(size):
            fh.seek(offset)
            digest.update(fh.read(length))
    return digest.hexdigest()


def _full_sha256(path: Path, stat: os.stat_result, cid: str, hashes: FileHashCache | None) -> str:
    """The file's full sha256, from hashes when it was computed at this size and mtime."""
    if hashes is None:
        return sha256_file(path)
    # Resolved, so every spelling of a path (and a symlink, as Hugging Face's cache makes) shares
    # one entry.
    key = path.resolve()
    cached = hashes.get(key, stat.st_size, stat.st_mtime_ns, cid)
    if cached is not None:
        return cached
    digest = sha256_file(path)
    after = path.stat()
    # A file written to while it was read has no one hash to keep: store only a stable read.
    if (after.st_size, after.st_mtime_ns) == (stat.st_size, stat.st_mtime_ns):
        hashes.put(key, stat.st_size, stat.st_mtime_ns, cid, digest)
    return digest


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


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo), else what the platform says."""
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
        cpu_model=cpu_model(),
        cpu_cores=os.cpu_count(),
        memory_bytes=_memory_bytes(),
        devices=list_devices(binary) if binary is not None else [],
    )


def require_gguf(path: Path, what: str = "model file") -> None:
    """Raise ConfigError unless path is an existing GGUF file (or a twin world, which stands in
    for the model of the twin server, tuner.twin.server)."""
    if not path.exists():
        raise ConfigError(f"{what}: file not found: {path}")
    if path.suffix == TWIN_SUFFIX:
        twin_model_name(path, what)
        return
    with path.open("rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise ConfigError(f"{what}: {path} is not a GGUF file")


def twin_model_name(path: Path, what: str = "model file") -> str:
    """The model name a twin world stores its data under: all that measuring needs of a world.

    Read here as plain TOML rather than through tuner.twin.world, so that measure stays below
    the twin (which measures through it); the twin checks the rest of the world when it loads
    it, as the twin server does at launch (the preflight's first)."""
    try:
        data = read_toml(path, "twin world")
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from exc
    name = data.get("model_name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{what}: {path}: model_name: a twin world names its model (a string)")
    return name


def probe_model(path: Path, hashes: FileHashCache | None = None) -> ModelInfo:
    """GGUF file size, sha256, content_id, architecture and quantization; rejects a file that is
    not GGUF. The full sha256 comes from hashes when it holds one for the file as it is now, else
    it is computed (and stored there); with no hashes it is always computed. A twin world is
    its own model: its file's hashes, architecture "twin"."""
    import gguf  # its key names and file types only: the header is read by ggufmeta

    require_gguf(path)
    if path.suffix == TWIN_SUFFIX:
        size = path.stat().st_size
        return ModelInfo(size, sha256_file(path), content_id(path, size, size), "twin", None)
    try:
        meta = read_gguf_meta(path)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"model file {path} is not a readable GGUF file: {exc}") from exc
    architecture = meta.fields.get(gguf.Keys.General.ARCHITECTURE)
    file_type = meta.fields.get(gguf.Keys.General.FILE_TYPE)
    quantization = None
    if file_type is not None:
        try:
            quantization = gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
        except (TypeError, ValueError):
            quantization = str(file_type)
    # Stat before reading anything: a change after it shows in the stat _full_sha256 takes after.
    stat = path.stat()
    cid = content_id(path, stat.st_size, meta.data_offset)
    return ModelInfo(
        file_size=stat.st_size,
        file_sha256=_full_sha256(path, stat, cid, hashes),
        content_id=cid,
        architecture=str(architecture) if architecture is not None else None,
        quantization=quantization,
    )
