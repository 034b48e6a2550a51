"""Model fingerprints: content_id from metadata and samples; a full sha256 computed once a file."""

from __future__ import annotations

import hashlib
import itertools
import os
from dataclasses import asdict
from pathlib import Path

import gguf
import numpy as np
import pytest
from sqlalchemy import select

from tuner.errors import ConfigError
from tuner.measure import fingerprint
from tuner.measure.fingerprint import SAMPLE_BYTES, SAMPLE_COUNT, probe_model, sample_ranges
from tuner.storage.hashes import StoredHashes
from tuner.storage.orm import FileHash, Model, get_or_create
from tuner.storage.store import Store

SIZE = 40 << 20  # above SAMPLE_COUNT x SAMPLE_BYTES: content_id samples instead of reading it all


def write_gguf(path: Path, name: str = "model-a", size: int = SIZE) -> Path:
    """A small valid GGUF (llama, Q8_0, one tensor), extended with zeros to size bytes."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.truncate(path, size)
    return path


def poke(path: Path, offset: int, keep_mtime: bool = False) -> None:
    """Flip one byte; with keep_mtime the file's times are put back as they were."""
    before = path.stat()
    with path.open("r+b") as fh:
        fh.seek(offset)
        old = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([old[0] ^ 0xFF]))
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def real_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def hash_calls(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every full-file hash probe_model computes, by path."""
    calls: list[Path] = []
    original = fingerprint.sha256_file

    def counting(path: Path, chunk: int = 1 << 20) -> str:
        calls.append(path)
        return original(path, chunk)

    monkeypatch.setattr(fingerprint, "sha256_file", counting)
    return calls


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'fp.db'}")


def test_sample_ranges_are_evenly_spaced_and_span_the_file() -> None:
    size = 10 << 30
    ranges = sample_ranges(size)
    assert len(ranges) == SAMPLE_COUNT
    assert all(length == SAMPLE_BYTES for _, length in ranges)
    assert ranges[0][0] == 0 and ranges[-1][0] + SAMPLE_BYTES == size
    gaps = {b[0] - a[0] for a, b in itertools.pairwise(ranges)}
    assert max(gaps) - min(gaps) <= 1
    assert sample_ranges(5000) == [(0, 5000)]  # a small file is read whole


def test_probe_model_reads_gguf_facts(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    info = probe_model(path)
    assert info.architecture == "llama" and info.quantization == "Q8_0"
    assert info.file_size == SIZE
    assert info.file_sha256 == real_sha256(path)
    assert len(info.content_id) == 64 and info.content_id != info.file_sha256


def test_content_id_changes_when_a_sampled_byte_changes(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    before = probe_model(path).content_id
    offset, length = sample_ranges(SIZE)[SAMPLE_COUNT // 2]
    poke(path, offset + length // 2)
    assert probe_model(path).content_id != before


def test_content_id_samples_rather_than_reads_everything(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    before = probe_model(path)
    # A byte between two samples: outside what content_id reads, inside the full hash.
    first, second = sample_ranges(SIZE)[SAMPLE_COUNT // 2 : SAMPLE_COUNT // 2 + 2]
    gap = first[0] + first[1] + (second[0] - first[0] - first[1]) // 2
    assert first[0] + first[1] < gap < second[0]
    poke(path, gap)
    after = probe_model(path)
    assert after.content_id == before.content_id
    assert after.file_sha256 != before.file_sha256


def test_content_id_changes_when_metadata_changes(tmp_path: Path) -> None:
    a = write_gguf(tmp_path / "a.gguf", name="model-a")
    b = write_gguf(tmp_path / "b.gguf", name="model-b")  # same length, same size, same tensors
    assert a.stat().st_size == b.stat().st_size
    assert probe_model(a).content_id != probe_model(b).content_id
    c = write_gguf(tmp_path / "c.gguf", name="model-a")
    assert probe_model(c).content_id == probe_model(a).content_id


def test_content_id_changes_with_the_size(tmp_path: Path) -> None:
    a = write_gguf(tmp_path / "a.gguf", size=SIZE)
    b = write_gguf(tmp_path / "b.gguf", size=SIZE + 1)
    assert probe_model(a).content_id != probe_model(b).content_id


def test_without_a_cache_the_full_hash_is_computed_every_time(
    tmp_path: Path, hash_calls: list[Path]
) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    probe_model(path)
    probe_model(path)
    assert len(hash_calls) == 2


def test_full_hash_is_reused_while_size_and_mtime_stand(
    tmp_path: Path, store: Store, hash_calls: list[Path]
) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    hashes = StoredHashes(store, "host-a")
    first = probe_model(path, hashes)
    assert first.file_sha256 == real_sha256(path)
    assert len(hash_calls) == 1
    second = probe_model(path, hashes)
    assert second == first
    assert len(hash_calls) == 1  # not read again
    # Proof that the stored hash is what is returned: a change outside the samples with the
    # mtime put back is invisible, so the (now stale) stored hash comes back.
    first_sample, second_sample = sample_ranges(SIZE)[3:5]
    poke(path, (first_sample[0] + first_sample[1] + second_sample[0]) // 2, keep_mtime=True)
    stale = probe_model(path, hashes)
    assert stale.file_sha256 == first.file_sha256 != real_sha256(path)
    assert len(hash_calls) == 1


def test_full_hash_is_recomputed_after_the_mtime_changes(
    tmp_path: Path, store: Store, hash_calls: list[Path]
) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    hashes = StoredHashes(store, "host-a")
    first = probe_model(path, hashes)
    first_sample, second_sample = sample_ranges(SIZE)[3:5]
    poke(path, (first_sample[0] + first_sample[1] + second_sample[0]) // 2)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    changed = probe_model(path, hashes)
    assert len(hash_calls) == 2
    assert changed.file_sha256 == real_sha256(path) != first.file_sha256
    with store.session() as session:
        row = session.scalars(select(FileHash)).one()  # updated in place, not a second row
    assert (row.mtime_ns, row.sha256) == (path.stat().st_mtime_ns, changed.file_sha256)
    assert row.path == str(path.resolve()) and row.host == "host-a"
    probe_model(path, hashes)
    assert len(hash_calls) == 2  # the new hash is reused in turn


def test_full_hash_is_recomputed_after_the_size_changes(
    tmp_path: Path, store: Store, hash_calls: list[Path]
) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    hashes = StoredHashes(store, "host-a")
    probe_model(path, hashes)
    stat = path.stat()
    os.truncate(path, SIZE + 4096)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # only the size tells
    grown = probe_model(path, hashes)
    assert len(hash_calls) == 2
    assert grown.file_size == SIZE + 4096 and grown.file_sha256 == real_sha256(path)


def test_full_hash_is_recomputed_when_the_content_id_differs(
    tmp_path: Path, store: Store, hash_calls: list[Path]
) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    hashes = StoredHashes(store, "host-a")
    probe_model(path, hashes)
    offset, _ = sample_ranges(SIZE)[5]
    poke(path, offset + 7, keep_mtime=True)  # same size and mtime, but a sampled byte changed
    again = probe_model(path, hashes)
    assert len(hash_calls) == 2
    assert again.file_sha256 == real_sha256(path)


def test_stored_hashes_are_per_host(tmp_path: Path, store: Store, hash_calls: list[Path]) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    probe_model(path, StoredHashes(store, "host-a"))
    probe_model(path, StoredHashes(store, "host-b"))
    assert len(hash_calls) == 2
    probe_model(path, StoredHashes(store, "host-a"))
    assert len(hash_calls) == 2


def test_a_file_changing_while_hashed_is_not_stored(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    original = fingerprint.sha256_file

    def hash_while_written(p: Path, chunk: int = 1 << 20) -> str:
        digest = original(p, chunk)
        poke(p, SIZE - 1)  # a download or copy still writing it
        return digest

    monkeypatch.setattr(fingerprint, "sha256_file", hash_while_written)
    probe_model(path, StoredHashes(store, "host-a"))
    with store.session() as session:
        assert session.scalars(select(FileHash)).all() == []


def test_model_info_fields_are_model_columns(tmp_path: Path, store: Store) -> None:
    info = probe_model(write_gguf(tmp_path / "m.gguf"))
    assert set(asdict(info)) <= set(Model.__table__.columns.keys())
    with store.session() as session:
        get_or_create(session, Model, {"name": "m"}, asdict(info))
    with store.session() as session:
        row = session.scalars(select(Model)).one()
    assert (row.content_id, row.file_sha256) == (info.content_id, info.file_sha256)


def test_bench_uses_the_shared_sha256_file() -> None:
    from tuner import bench

    assert bench.sha256_file is fingerprint.sha256_file


def write_vocab_gguf(path: Path, alignment: int | None = None) -> Path:
    """A GGUF laid out like a real model's header: a vocabulary array of 50 000 strings, scores
    (floats), nested arrays, every scalar type and several tensors (optionally aligned)."""
    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_name("vocab-model")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_token_list([f"tok{i}" for i in range(50_000)])
    writer.add_token_scores([float(i) for i in range(50_000)])
    writer.add_array("test.nested", [[1, 2, 3], [4, 5]])
    writer.add_uint8("test.u8", 7)
    writer.add_int16("test.i16", -3)
    writer.add_uint64("test.u64", 1 << 40)
    writer.add_float64("test.f64", 0.25)
    writer.add_bool("test.flag", True)
    writer.add_string("test.text", "ünïcode")
    for i in range(5):
        writer.add_tensor(f"blk.{i}.weight", np.arange(10 + i, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_the_header_reader_agrees_with_gguf_py(tmp_path: Path, alignment: int | None) -> None:
    """ggufmeta steps over arrays that gguf-py's reader builds element by element (3-4 s for
    the bench model's vocabulary): the scalars and the data offset must be the same."""
    from tuner.measure.ggufmeta import read_gguf_meta

    path = write_vocab_gguf(tmp_path / "vocab.gguf", alignment)
    ours = read_gguf_meta(path)
    reader = gguf.GGUFReader(path)
    theirs = {
        key: field.contents()
        for key, field in reader.fields.items()
        if not key.startswith("GGUF.") and field.types[0] != gguf.GGUFValueType.ARRAY
    }
    assert ours.fields == theirs
    assert ours.data_offset == reader.data_offset and ours.tensor_count == 5
    assert ours.fields["test.text"] == "ünïcode" and ours.fields["test.u64"] == 1 << 40
    assert "tokenizer.ggml.tokens" not in ours.fields  # an array: stepped over
    assert probe_model(path).quantization == "Q4_K_M"


def test_a_cut_short_header_is_not_a_readable_gguf(tmp_path: Path) -> None:
    path = write_vocab_gguf(tmp_path / "vocab.gguf")
    os.truncate(path, 200_000)  # inside the vocabulary
    with pytest.raises(ConfigError, match="not a readable GGUF file"):
        probe_model(path)
