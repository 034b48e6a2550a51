"""The built bench, checked on the machine that runs the tests: `tuner bench setup` proved it here
(it answered with drafting on, its live switch read back through GET /props, every binary ran
on every bench model) and recorded that proof; the record is of these very binaries, the CPU
features the build was compiled for (llama-server's own system_info line) are all in this CPU's
flags, and its code holds no AMX and no AVX-512 instruction at all, so a VM that advertises AMX
but faults on it (SIGILL in the first draft step) cannot reach such kernels.

The proof itself (proof.prove: a launch, three kernel runs and objdump over every library, a
minute and a half on two cores) is what setup runs; tests/test_bench_setup.py tests its rules
without the bench. Here the record is held against the files and this CPU as they are now, and
the one library that holds ggml's CPU kernels, where native flags would put AMX or AVX-512
code, is disassembled again. That the server drafts and switches live is what every other
bench test exercises (tests/test_patch.py, tests/test_live_switch.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tuner.bench import Bench, proof, sha256_file

pytestmark = pytest.mark.bench

WIDE = {"AMX_INT8", "AVX512", "AVX512_VNNI", "AVX512_BF16"}


def _record(bench: Bench) -> dict:
    return json.loads((bench.server.parents[3] / "BUILD_OK.json").read_text())


def test_the_build_record_keeps_the_proof_of_this_machine(bench: Bench) -> None:
    record = _record(bench)
    kept = record["proofs"][proof.machine_id()]
    assert kept["version"] == proof.PROOF_VERSION and kept["draft_tokens"] > 0
    assert record["variant"] == bench.variant
    # The record is of the binaries that are here now, not of an earlier build in this folder.
    binaries = {"llama-server": bench.server, "llama-batched-bench": bench.batched_bench}
    for name, path in binaries.items():
        assert record["sha256"][name] == sha256_file(path), name


def test_the_bench_is_proven_here_and_holds_no_wide_instructions(bench: Bench) -> None:
    assert bench.variant in ("portable", "baseline")
    assert bench.machine == proof.machine_id()
    kept = _record(bench)["proofs"][proof.machine_id()]
    built_for = kept["built_for"]
    assert built_for == proof.built_features(kept["system_info"]), kept["system_info"]
    assert "AVX2" in built_for or bench.variant == "baseline"
    assert not WIDE & set(built_for), built_for
    flags = proof.cpu_flags()  # this CPU now, not when the proof was made
    assert all(proof.FEATURE_FLAGS[f] in flags for f in built_for), kept["system_info"]
    scanned = kept["instructions"]
    assert scanned is not None, "objdump was missing at setup: the instruction scan did not run"
    assert any(name.startswith("libggml-cpu") for name in scanned), sorted(scanned)
    assert all(count == 0 for found in scanned.values() for count in found.values()), scanned


def test_the_cpu_kernels_hold_no_amx_and_no_avx512_now(bench: Bench, tmp_path: Path) -> None:
    """ggml's CPU backend, disassembled again: the only library native flags compile for the
    build machine (the others are built for the generic target)."""
    assert shutil.which("objdump"), "objdump is missing: binutils is part of the bench's needs"
    kernels = [
        p
        for p in bench.server.parent.iterdir()
        if p.name.startswith("libggml-cpu") and p.is_file() and not p.is_symlink()
    ]
    assert kernels, sorted(p.name for p in bench.server.parent.iterdir())
    for library in kernels:  # copied alone into a folder: scan_instructions scans a folder
        shutil.copy2(library, tmp_path / library.name)
    scanned = proof.scan_instructions(tmp_path)
    assert scanned and set(scanned) == {p.name for p in kernels}, scanned
    assert all(count == 0 for found in scanned.values() for count in found.values()), scanned
