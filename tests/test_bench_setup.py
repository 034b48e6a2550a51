"""The bench set-up's safety nets: a patch that no longer applies fails loudly, a damaged model
is rebuilt rather than used, the cache key follows the patch, and a missing bench is explained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner import bench
from tuner.errors import BenchError


def test_a_patch_that_does_not_apply_fails_with_the_reason(tmp_path: Path) -> None:
    source = tmp_path / "llama.cpp"
    (source / "common").mkdir(parents=True)
    (source / "common" / "arg.cpp").write_text("int main() { return 0; }\n")
    with pytest.raises(BenchError) as failure:
        bench.apply_patch(source, bench.PATCH_FILE, tmp_path / "build.log")
    message = str(failure.value)
    assert "does not apply" in message
    assert "arg.cpp" in message  # patch's own words about what failed


def test_the_build_key_follows_the_patch(tmp_path: Path) -> None:
    changed = tmp_path / "changed.patch"
    changed.write_text(bench.PATCH_FILE.read_text() + "\n")
    assert bench.build_key(bench.PATCH_FILE) == bench.build_key(bench.PATCH_FILE)
    assert bench.build_key(changed) != bench.build_key(bench.PATCH_FILE)


def test_a_damaged_or_partial_model_is_not_trusted(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 1000)
    manifest = {model.name: {"recipe": bench.MODEL_RECIPE_VERSION, "size": 1004,
                             "sha256": bench.sha256_file(model)}}
    assert bench._verified(model, manifest)
    model.write_bytes(b"GGUF" + b"\1" * 1000)  # same size, other bytes
    assert not bench._verified(model, manifest)
    model.write_bytes(b"GGUF")  # cut short
    assert not bench._verified(model, manifest)
    assert not bench._verified(model, {})  # never recorded: a leftover of a killed set-up
    stale = {model.name: {**manifest[model.name], "recipe": "0"}}
    assert not bench._verified(model, stale)


def test_a_missing_bench_names_the_command_that_builds_it(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="tuner bench setup"):
        bench.load_bench(tmp_path / "bench.toml")
    manifest = tmp_path / "bench.toml"
    paths = {name: str(tmp_path / name) for name in
             ("llama-server", "llama-batched-bench", "target", "draft", "q4")}
    manifest.write_text("\n".join(f'{k} = {json.dumps(v)}' for k, v in paths.items()))
    with pytest.raises(BenchError, match="bench files missing"):
        bench.load_bench(manifest)
