"""The built bench, checked on the machine that runs the tests: it answers with drafting on,
its live switch (POST /props with the draft threshold) reads back through GET /props (inside
proof.prove), it was compiled only for CPU features this machine has (llama-server's own
system_info line), and its code holds no AMX and no AVX-512 instruction at all, so a VM that
advertises AMX but faults on it (SIGILL in the first draft step) cannot reach such kernels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.bench import Bench, proof

pytestmark = pytest.mark.bench


def test_the_bench_is_proven_here_and_holds_no_wide_instructions(
    bench: Bench, tmp_path: Path
) -> None:
    assert bench.variant in ("portable", "baseline")
    assert bench.machine == proof.machine_id()
    shown = proof.prove(
        bench.server,
        bench.batched_bench,
        {"target": bench.target, "draft": bench.draft, "q4": bench.source_q4},
        draft="draft",
        target="target",
        log_dir=tmp_path,
    )
    assert shown.draft_tokens > 0
    assert "AVX2" in shown.built_for or bench.variant == "baseline"
    assert not {"AMX_INT8", "AVX512", "AVX512_VNNI", "AVX512_BF16"} & set(shown.built_for)
    flags = proof.cpu_flags()
    assert all(proof.FEATURE_FLAGS[f] in flags for f in shown.built_for), shown.system_info
    scanned = shown.instructions
    assert scanned is not None, "objdump is missing: the instruction scan did not run"
    assert any(name.startswith("libggml-cpu") for name in scanned), sorted(scanned)
    assert all(count == 0 for found in scanned.values() for count in found.values()), scanned


def test_the_build_record_keeps_the_proof_of_this_machine(bench: Bench) -> None:
    record = json.loads((bench.server.parents[3] / "BUILD_OK.json").read_text())
    kept = record["proofs"][proof.machine_id()]
    assert kept["version"] == proof.PROOF_VERSION and kept["draft_tokens"] > 0
    assert record["variant"] == bench.variant
