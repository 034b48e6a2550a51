"""The bench set-up's safety nets: a patch that no longer applies fails loudly, a damaged model
is rebuilt rather than used, the cache key follows the patch and the instruction set, a build
that dies of an illegal instruction gives way to a safer one, a build whose POST /props changes
nothing fails its proof, and a bench proven on another CPU or missing is explained."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import tuner.bench as bench_setup
from tuner.bench import build, load_bench, models, proof
from tuner.errors import BenchError
from tuner.measure.launcher import LaunchConfig, ManagedServer


def test_a_patch_that_does_not_apply_fails_with_the_reason(tmp_path: Path) -> None:
    source = tmp_path / "llama.cpp"
    (source / "common").mkdir(parents=True)
    (source / "common" / "arg.cpp").write_text("int main() { return 0; }\n")
    with pytest.raises(BenchError) as failure:
        build.apply_patch(source, build.PATCH_FILE, tmp_path / "build.log")
    message = str(failure.value)
    assert "does not apply" in message
    assert "arg.cpp" in message  # patch's own words about what failed


def test_the_build_key_follows_the_patch(tmp_path: Path) -> None:
    changed = tmp_path / "changed.patch"
    changed.write_text(build.PATCH_FILE.read_text() + "\n")
    assert build.build_key(patch=build.PATCH_FILE) == build.build_key(patch=build.PATCH_FILE)
    assert build.build_key(patch=changed) != build.build_key(patch=build.PATCH_FILE)


def test_a_damaged_or_partial_model_is_not_trusted(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 1000)
    manifest = {
        model.name: {
            "recipe": models.MODEL_RECIPE_VERSION,
            "size": 1004,
            "sha256": models.sha256_file(model),
        }
    }
    assert models._verified(model, manifest)
    model.write_bytes(b"GGUF" + b"\1" * 1000)  # same size, other bytes
    assert not models._verified(model, manifest)
    model.write_bytes(b"GGUF")  # cut short
    assert not models._verified(model, manifest)
    assert not models._verified(model, {})  # never recorded: a leftover of a killed set-up
    stale = {model.name: {**manifest[model.name], "recipe": "0"}}
    assert not models._verified(model, stale)


def test_a_missing_bench_names_the_command_that_builds_it(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="tuner bench setup"):
        load_bench(tmp_path / "bench.toml")
    manifest = tmp_path / "bench.toml"
    paths = {
        name: str(tmp_path / name)
        for name in ("llama-server", "llama-batched-bench", "target", "draft", "q4")
    }
    manifest.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in paths.items()))
    with pytest.raises(BenchError, match="bench files missing"):
        load_bench(manifest)


def test_safe_variants_name_their_instruction_set_and_leave_wide_ones_out() -> None:
    wide_off = [
        f"-DGGML_{f}=OFF"
        for f in ("AVX512", "AVX512_VNNI", "AVX512_BF16", "AMX_TILE", "AMX_INT8", "AMX_BF16")
    ]
    for variant in ("portable", "baseline"):
        flags = build.build_flags(variant)
        assert "-DGGML_NATIVE=OFF" in flags
        assert all(f in flags for f in wide_off), variant
    assert "-DGGML_AVX2=ON" in build.build_flags("portable")
    assert "-DGGML_AVX2=OFF" in build.build_flags("baseline")
    keys = {build.build_key(v) for v in build.BUILD_VARIANTS}
    assert len(keys) == len(build.BUILD_VARIANTS)
    with pytest.raises(BenchError, match="unknown build variant"):
        build.build_flags("fastest")


def test_the_features_a_build_uses_are_checked_against_the_cpu() -> None:
    info = (
        "system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 | AVX = 1 | "
        "AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | AVX512_BF16 = 0 | LLAMAFILE = 1 | REPACK = 1 |"
    )
    built = proof.built_features(info)
    assert built == ["SSE3", "AVX", "AVX2", "AVX512", "AMX_INT8"]
    assert proof.missing_features(built, frozenset({"pni", "avx", "avx2"})) == [
        "AVX512",
        "AMX_INT8",
    ]
    assert proof.missing_features(built, frozenset()) == []  # flags unknown: the run decides


def test_a_build_that_dies_of_sigill_is_replaced_by_the_safer_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[str] = []

    def fake_build(cache_dir, progress, jobs, variant):
        built.append(variant)
        marker = tmp_path / variant / "BUILD_OK.json"
        marker.parent.mkdir(exist_ok=True)
        return {
            "variant": variant,
            "marker": str(marker),
            "binaries": {
                "llama-server": str(tmp_path / variant / "llama-server"),
                "llama-batched-bench": str(tmp_path / variant / "bb"),
            },
        }

    crashing = {"portable"}

    def fake_prove(server, batched_bench, models, draft, target, log_dir, wide_allowed):
        variant = server.parent.name
        if variant in crashing:
            raise proof.IllegalInstruction(f"{variant}: killed by SIGILL")
        return proof.Proof(
            machine=proof.machine_id(),
            cpu="x",
            system_info="s",
            built_for=[],
            draft_tokens=5,
            accepted_tokens=1,
            seconds=1.0,
        )

    monkeypatch.setattr(bench_setup, "build_llama_cpp", fake_build)
    monkeypatch.setattr(bench_setup, "prove", fake_prove)
    monkeypatch.setattr(bench_setup, "variants_for_this_cpu", lambda: ["portable", "baseline"])
    record, _ = bench_setup.proven_build(tmp_path, {})
    assert built == ["portable", "baseline"] and record["variant"] == "baseline"
    stored = json.loads((tmp_path / "baseline" / "BUILD_OK.json").read_text())
    assert proof.machine_id() in stored["proofs"]  # a second set-up reuses the proof

    crashing.add("baseline")
    built.clear()
    monkeypatch.setattr(bench_setup, "variants_for_this_cpu", lambda: ["portable"])
    (tmp_path / "baseline" / "BUILD_OK.json").unlink()
    with pytest.raises(BenchError, match="no bench build runs on this machine"):
        bench_setup.proven_build(tmp_path, {})


def test_a_bench_proven_on_another_cpu_is_not_used_here(tmp_path: Path) -> None:
    paths = {
        name: tmp_path / name
        for name in ("llama-server", "llama-batched-bench", "target", "draft", "q4")
    }
    for path in paths.values():
        path.write_text("x")
    manifest = tmp_path / "bench.toml"
    lines = [f"{k} = {json.dumps(str(v))}" for k, v in paths.items()]
    manifest.write_text("\n".join([*lines, 'variant = "portable"', 'machine = "elsewhere"']))
    with pytest.raises(BenchError, match="not proven on this machine"):
        load_bench(manifest)
    manifest.write_text(
        "\n".join([*lines, 'variant = "portable"', f'machine = "{proof.machine_id()}"'])
    )
    assert load_bench(manifest).variant == "portable"


class _PropsStandIn(BaseHTTPRequestHandler):
    """GET/POST /props as llama-server answers them; `patched` says whether POST sets the value
    (an unpatched or older server started with --props answers 200 and changes nothing)."""

    patched = False
    value = 0

    def _answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        props = {"total_slots": 1}
        if self.patched:
            props["spec_draft_max_slots"] = type(self).value
        self._answer(props)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.patched:
            type(self).value = body["spec_draft_max_slots"]
        self._answer({"success": True})

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("patched", [False, True], ids=["changes-nothing", "live-switch"])
def test_the_proof_reads_the_live_switch_back(tmp_path: Path, patched: bool) -> None:
    handler = type("Handler", (_PropsStandIn,), {"patched": patched, "value": 0})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    server = ManagedServer(LaunchConfig(Path("x"), Path("m"), 1, 256), tmp_path / "log")
    server.port = httpd.server_address[1]
    try:
        if patched:
            proof._prove_live_switch(server)
            assert handler.value == 2
        else:
            with pytest.raises(BenchError, match="lacks the patch's live switch"):
                proof._prove_live_switch(server)
    finally:
        httpd.shutdown()
        httpd.server_close()
