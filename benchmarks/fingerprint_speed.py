"""Benchmark: a model fingerprint's cost, first time (full sha256) and after (stored hash reused).

Writes a valid small GGUF (llama, one tensor) and extends it with os.truncate to a sparse
multi-GiB file, with a few non-zero bytes at scattered offsets so the samples and the full hash
see data. Then, against a fresh SQLite database, times the first probe_model (content_id, full
sha256, stored) and, --repeats times, the next one (content_id only: the stored hash is reused),
and prints every time, the medians and the ratio; last, one fingerprint without the cache (what
every run paid before). A sparse file's holes need no disk, but the full hash still reads (and
hashes) every zero byte through the kernel: it measures hashing and page-cache work, not a disk.
Each timing starts with the file dropped from the page cache (posix_fadvise DONTNEED), as a model
not read lately; --warm keeps it cached instead.

    .venv/bin/python benchmarks/fingerprint_speed.py [--size-gib 8] [--repeats 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from record import Table, record_arguments, save_run

SCATTERED_BYTES = 64


def make_model(path: Path, size: int, seed: int) -> None:
    """A valid GGUF header, then zeros up to size, with SCATTERED_BYTES non-zero bytes in them."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("fingerprint-bench")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_tensor("token_embd.weight", np.arange(1024, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header_end = path.stat().st_size
    os.truncate(path, size)
    rng = random.Random(seed)
    with path.open("r+b") as fh:
        for _ in range(SCATTERED_BYTES):
            fh.seek(rng.randrange(header_end, size))
            fh.write(bytes([rng.randrange(1, 256)]))


def drop_cache(path: Path, warm: bool) -> None:
    """Evict path from the page cache, so a timing does not depend on what the last one read."""
    if warm:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=float, default=8.0, help="model file size (sparse)")
    parser.add_argument("--repeats", type=int, default=5, help="fingerprints after the first")
    parser.add_argument("--dir", type=Path, help="where to write the file (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm", action="store_true", help="leave the file in the page cache")
    record_arguments(parser)
    args = parser.parse_args()

    from tuner.measure.fingerprint import SAMPLE_BYTES, SAMPLE_COUNT, probe_model
    from tuner.storage.hashes import StoredHashes
    from tuner.storage.store import Store

    size = int(args.size_gib * (1 << 30))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "model.gguf"
        started = time.perf_counter()
        make_model(path, size, args.seed)
        print(
            f"model: {size / (1 << 30):.2f} GiB, {path.stat().st_blocks * 512 / (1 << 20):.1f} MiB "
            f"on disk (sparse), written in {time.perf_counter() - started:.2f} s"
        )
        store = Store(f"sqlite:///{Path(tmp) / 'bench.db'}")
        hashes = StoredHashes(store, "bench-host")

        drop_cache(path, args.warm)
        started = time.perf_counter()
        first = probe_model(path, hashes)
        first_s = time.perf_counter() - started
        print(
            f"first fingerprint (full sha256, stored): {first_s:.3f} s "
            f"({size / (1 << 30) / first_s:.2f} GiB/s)"
        )

        times = []
        for i in range(args.repeats):
            drop_cache(path, args.warm)
            started = time.perf_counter()
            again = probe_model(path, hashes)
            times.append(time.perf_counter() - started)
            if again != first:
                print(f"repeat {i + 1}: fingerprint differs from the first: {again} != {first}")
                return 1
            print(f"repeat {i + 1} (stored hash reused): {times[-1] * 1000:.1f} ms")

        # Without a cache every fingerprint is a full read: the time each run used to pay.
        drop_cache(path, args.warm)
        started = time.perf_counter()
        probe_model(path)
        uncached_s = time.perf_counter() - started
        median = statistics.median(times)
        print(
            f"reused: median {median * 1000:.1f} ms over {args.repeats} repeats, reading the "
            f"header and {SAMPLE_COUNT} x {SAMPLE_BYTES >> 20} MiB samples; first / reused = "
            f"{first_s / median:.0f}x; uncached (today's behaviour) {uncached_s:.3f} s"
        )
        store.dispose()
    summary, tables = figures(size, first_s, times, uncached_s, args.warm)
    save_run(__file__, args, summary, tables)
    return 0


def figures(
    size: int, first_s: float, times: list[float], uncached_s: float, warm: bool
) -> tuple[dict, list[Table]]:
    """The headline figures (file size, first and reused fingerprint, their ratio, one without
    the cache) and each reused fingerprint's time."""
    median = statistics.median(times)
    summary = {
        "model file GiB (sparse)": size / (1 << 30),
        "page cache": "kept (--warm)" if warm else "dropped before each timing",
        "first fingerprint s (full sha256, stored)": first_s,
        "reused: median ms": median * 1000,
        "first / reused": first_s / median,
        "uncached s": uncached_s,
    }
    rows = [[i + 1, t * 1000] for i, t in enumerate(times)]
    return summary, [Table("fingerprints reusing the stored hash", ["repeat", "ms"], rows)]


if __name__ == "__main__":
    raise SystemExit(main())
