"""Proof that a built bench runs on this machine, before anything trusts it.

A build can compile and still die on the first draft step: ggml's native flags compile AMX tile
kernels on a VM that advertises AMX but faults on it (SIGILL), and a cached build carried to
another CPU may use instructions that CPU lacks. So every built binary answers real work with
every bench model (llama-server one short completion with drafting on; llama-batched-bench a
tiny batch per model), llama-server's live switch (`POST /props` with the draft threshold) must
read back through `GET /props`, and the CPU features the build was compiled for (llama-server's
`system_info` line) must all be present in this CPU's flags. A proof is recorded per machine.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuner.errors import BenchError, ServerDiedError, ServerError
from tuner.measure import kernel
from tuner.measure.client import LlamaClient
from tuner.measure.fingerprint import cpu_model
from tuner.measure.launcher import LaunchConfig, ManagedServer

# llama-server's system_info names (compile-time features of the CPU backend) -> /proc/cpuinfo.
FEATURE_FLAGS = {
    "SSE3": "pni",
    "SSSE3": "ssse3",
    "AVX": "avx",
    "AVX_VNNI": "avx_vnni",
    "AVX2": "avx2",
    "F16C": "f16c",
    "FMA": "fma",
    "BMI2": "bmi2",
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}
PROOF_TIMEOUT_S = 120.0
PROOF_VERSION = "4"  # bump when prove() checks more: older proofs are then run again


# Instructions a portable build must not contain, as objdump spells their registers/mnemonics.
WIDE_INSTRUCTIONS = {
    "AMX": re.compile(r"%tmm\d|\btile(zero|loadd|stored|release)\b|\bldtilecfg\b|\btdp"),
    "AVX-512": re.compile(r"%zmm\d"),
}


class IllegalInstruction(BenchError):
    """A bench binary died by SIGILL: the build uses instructions this machine cannot run."""


@dataclass(frozen=True)
class Proof:
    """What proving a build on one machine showed."""

    machine: str
    cpu: str
    system_info: str
    built_for: list[str]
    draft_tokens: int
    accepted_tokens: int
    seconds: float
    instructions: dict[str, dict[str, int]] | None = None  # file -> AMX / AVX-512 counts
    version: str = PROOF_VERSION

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as /proc/cpuinfo lists them (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def machine_id() -> str:
    """Which CPU a proof holds for: architecture, model name and feature flags."""
    name = cpu_model() or platform.machine()
    text = "|".join([platform.machine(), name, " ".join(sorted(cpu_flags()))])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def built_features(system_info: str) -> list[str]:
    """The CPU features a build was compiled for, from its `system_info` line
    (`CPU : SSE3 = 1 | AVX = 1 | ...`)."""
    return [
        name
        for name, value in re.findall(r"\b([A-Z0-9_]+) = (\d+)", system_info)
        if value != "0" and name in FEATURE_FLAGS
    ]


def missing_features(built_for: list[str], flags: frozenset[str]) -> list[str]:
    """Features the build uses that this CPU does not list (nothing, when flags are unknown)."""
    if not flags:
        return []
    return [name for name in built_for if FEATURE_FLAGS[name] not in flags]


def scan_instructions(folder: Path) -> dict[str, dict[str, int]] | None:
    """Per binary and shared library in folder, how many AMX and AVX-512 instructions its code
    holds (objdump's disassembly); None where objdump is not installed."""
    objdump = shutil.which("objdump")
    if objdump is None:
        return None
    counts: dict[str, dict[str, int]] = {}
    for path in sorted(folder.iterdir()):
        if path.is_symlink() or not path.is_file() or not os.access(path, os.X_OK):
            continue
        result = subprocess.run(
            [objdump, "-d", "--no-show-raw-insn", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            continue
        counts[path.name] = {
            name: len(pattern.findall(result.stdout)) for name, pattern in WIDE_INSTRUCTIONS.items()
        }
    return counts


def _system_info(log: Path) -> str:
    for line in log.read_text(errors="replace").splitlines():
        if "system_info:" in line:
            return line[line.index("system_info:") :].strip()
    return ""


def _prove_server(
    server_binary: Path, target: Path, draft: Path, log: Path
) -> tuple[str, int, int]:
    config = LaunchConfig(
        binary=server_binary,
        model=target,
        n_parallel=1,
        ctx_size=512,
        args=[
            "--model-draft",
            str(draft),
            "--spec-type",
            "draft-simple",
            "--spec-draft-n-max",
            "3",
            "-lv",
            "4",  # trace level: llama-server then logs its system_info line
            "--props",  # enables POST /props, the patch's live switch
        ],
    )
    server = ManagedServer(config, log, start_timeout_s=PROOF_TIMEOUT_S, name="bench llama-server")
    try:
        with server:
            timings = server.answer_one(
                "at the bench proof (one completion, drafting on)",
                n_predict=24,
                timeout_s=PROOF_TIMEOUT_S,
            )
            _prove_live_switch(server)
    except ServerDiedError as exc:
        if exc.returncode == -signal.SIGILL:
            raise IllegalInstruction(str(exc)) from exc
        raise BenchError(f"the bench failed its proof: {exc}") from exc
    except ServerError as exc:
        raise BenchError(f"the bench failed its proof: {exc}") from exc
    drafted = int(timings.get("draft_n") or 0)
    if drafted == 0:
        raise BenchError(
            f"the bench failed its proof: llama-server with the draft model drafted nothing "
            f"(timings {timings}); see {log}"
        )
    return _system_info(log), drafted, int(timings.get("draft_n_accepted") or 0)


def _prove_live_switch(server: ManagedServer, value: int = 2) -> None:
    """POST /props sets the draft threshold and GET /props reads it back (the client's
    set_max_slots refuses a switch that does not read back: an older patch, or an unpatched
    server, answers the POST with 200 and changes nothing)."""
    try:
        with LlamaClient(server.url) as api:
            api.set_max_slots(value)
    except ServerError as exc:
        raise BenchError(
            f"the bench failed its proof: the build lacks the patch's live switch: {exc}"
        ) from exc


def _prove_batched_bench(binary: Path, model: Path, log: Path) -> None:
    cmd = [str(binary), "-m", str(model), "-c", "256", "-npp", "8", "-ntg", "4", "-npl", "1,2"]
    try:
        kernel.run_batched_bench([*cmd, "--output-format", "jsonl"], log, PROOF_TIMEOUT_S)
    except ServerDiedError as exc:
        message = f"{exc} (on {model.name} at the bench proof; see {log})"
        if exc.returncode == -signal.SIGILL:
            raise IllegalInstruction(message) from exc
        raise BenchError(f"the bench failed its proof: {message}") from exc
    except ServerError as exc:
        raise BenchError(f"the bench failed its proof on {model.name}: {exc}") from exc


def prove(
    server: Path,
    batched_bench: Path,
    models: dict[str, Path],
    draft: str,
    target: str,
    log_dir: Path,
    wide_allowed: bool = False,
) -> Proof:
    """Run every binary on every model (drafting on); raise IllegalInstruction on SIGILL, a
    BenchError on any other failure or when the build uses features this CPU lacks.

    Unless wide_allowed (the native variant, kept for comparisons), the build must hold no AMX
    and no AVX-512 instruction at all: a VM may advertise AMX and still fault on it.
    """
    started = time.monotonic()
    instructions = scan_instructions(server.parent)
    wide = {
        f"{name} in {file}": count
        for file, found in (instructions or {}).items()
        for name, count in found.items()
        if count
    }
    if wide and not wide_allowed:
        raise BenchError(
            "the bench build holds instructions it must not (a native-flags build?): "
            + ", ".join(f"{n} {where}" for where, n in wide.items())
        )
    system_info, drafted, accepted = _prove_server(
        server, models[target], models[draft], log_dir / "proof-llama-server.log"
    )
    for name, path in models.items():
        _prove_batched_bench(batched_bench, path, log_dir / f"proof-batched-bench-{name}.log")
    if not system_info:
        raise BenchError(
            f"the bench failed its proof: llama-server logged no system_info line "
            f"(see {log_dir / 'proof-llama-server.log'})"
        )
    built_for = built_features(system_info)
    missing = missing_features(built_for, cpu_flags())
    if missing:
        raise IllegalInstruction(
            f"the bench build uses {', '.join(missing)}, which this CPU does not list in "
            f"/proc/cpuinfo ({system_info})"
        )
    return Proof(
        machine=machine_id(),
        cpu=cpu_model() or platform.machine(),
        system_info=system_info,
        built_for=built_for,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        seconds=round(time.monotonic() - started, 1),
        instructions=instructions,
    )
