"""Bench-like data for tests and the benchmark: a real profile of the bundled bench, and a helper
that stores it (or any table of levels) through the same code path `tuner profile` stores real
measurements with (Profiler.record_level: samples in, level figures computed and stored).

The profile: SmolLM2-135M F32 on 2 CPU cores, -np 8, a 1-block draft with n-max 6 and synthetic
acceptance (mean length 3.5); per level the repeats as (tok/s, tokens per step, ms per step,
drafts, accepted per position); kernel rows from llama-batched-bench as (shape, n_seq,
tokens_per_seq, ms).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tuner.measure.fingerprint import BuildInfo, HostInfo
from tuner.measure.kernel import KernelPoint
from tuner.measure.load import RequestSample
from tuner.measure.profiler import Context, Profiler
from tuner.measure.spec import ProfileSpec
from tuner.policy import Policy
from tuner.storage.store import Store

BENCH_N_PARALLEL = 8
BENCH_N_MAX = 6
Rep = tuple[float, float, float, int, list[int]]

BENCH_LEVELS: list[tuple[str, int, list[Rep]]] = [
    ("plain", 1, [(75.604, 1.0, 13.124, 0, []), (74.691, 1.0, 13.285, 0, [])]),
    ("plain", 2, [(117.765, 1.0, 17.019, 0, []), (118.943, 1.0, 16.933, 0, [])]),
    ("plain", 4, [(192.549, 1.0, 20.484, 0, []), (189.626, 1.0, 20.882, 0, [])]),
    ("plain", 8, [(260.323, 1.0, 30.339, 0, []), (260.658, 1.0, 30.303, 0, [])]),
    (
        "spec",
        1,
        [
            (121.643, 4.0, 32.357, 31, [25, 22, 17, 14, 11, 7]),
            (110.331, 3.6571, 32.884, 34, [29, 17, 16, 13, 10, 8]),
        ],
    ),
    (
        "spec",
        2,
        [
            (130.448, 3.7101, 54.998, 66, [53, 39, 31, 26, 21, 17]),
            (113.585, 3.2821, 53.939, 75, [56, 39, 29, 24, 16, 14]),
        ],
    ),
    (
        "spec",
        4,
        [
            (127.951, 3.3464, 104.717, 148, [117, 88, 59, 41, 31, 23]),
            (116.525, 2.9767, 99.335, 166, [113, 83, 57, 37, 29, 21]),
            (127.642, 3.3464, 102.058, 148, [113, 83, 63, 49, 31, 20]),
        ],
    ),
    (
        "spec",
        8,
        [
            (169.468, 3.6441, 168.741, 272, [206, 166, 136, 98, 81, 56]),
            (153.153, 3.2508, 167.004, 304, [230, 168, 125, 88, 55, 43]),
        ],
    ),
]

_DECODE = [10.136, 13.18, 16.132, 17.268, 19.73, 21.423, 21.097, 24.197]
_VERIFY = {
    2: [12.935, 16.725, 20.322, 23.019, 25.078, 27.584, 28.696, 29.99],
    4: [16.026, 29.137, 26.393, 28.401, 33.034, 36.951, 39.665, 43.228],
    7: [18.593, 26.294, 32.204, 38.462, 43.891, 50.04, 63.268, 67.142],
}
BENCH_KERNEL: list[tuple[str, int, int, float]] = [
    ("decode", c + 1, 1, ms) for c, ms in enumerate(_DECODE)
] + [("verify", c + 1, k, ms) for k, values in _VERIFY.items() for c, ms in enumerate(values)]


def _samples(c: int, rep: Rep) -> tuple[list[RequestSample], dict[str, Any]]:
    """c identical requests whose summary has this repeat's tok/s and tokens per step, and the
    /metrics drafting figures of its per-position acceptance counts."""
    tps, accept_len, _step_ms, drafts, per_position = rep
    tokens = 10_000  # long enough that tokens / steps matches accept_len to 1e-4
    steps = round(tokens / accept_len)
    generation_ms = 1000.0 * c * tokens / tps  # c streams at tps / c each
    samples = [
        RequestSample(
            stream=i,
            ok=True,
            tokens=tokens,
            prompt_tokens=32,
            generation_ms=generation_ms,
            latency_ms=generation_ms,
            draft_accepted=tokens - steps,
            draft_n=drafts * BENCH_N_MAX // max(c, 1),
        )
        for i in range(c)
    ]
    drafting = {
        "drafts": float(drafts),
        "draft_tokens": float(drafts * BENCH_N_MAX),
        "accepted_tokens": float(sum(per_position)),
        "accepted_per_position": [float(v) for v in per_position],
        "n_decode": 0.0,
    }
    return samples, drafting


def store_profile(
    store: Store,
    model: str = "smollm2-bench",
    host: str = "bench-host",
    levels: list[tuple[str, int, list[Rep]]] | None = None,
    kernel: list[tuple[str, int, int, float]] | None = None,
    n_parallel: int = BENCH_N_PARALLEL,
    n_max: int = BENCH_N_MAX,
    weights: dict[str, float] | None = None,
    build_sha: str = "b" * 64,
    workload: dict[str, Any] | None = None,
    depth: int = 0,
) -> int:
    """Store a completed profile run (plain/spec/max-slots-N levels, kernel rows) the way `tuner
    profile` does (Profiler.create_run, record_level, record_kernel); returns its run id."""
    levels = BENCH_LEVELS if levels is None else levels
    kernel = BENCH_KERNEL if kernel is None else kernel
    spec = ProfileSpec.model_validate(
        {
            "name": "bench",
            "model_name": model,
            "server": {
                "binary": "/bench/llama-server",
                "model": "/bench/target.gguf",
                "n_parallel": n_parallel,
                "ctx_size": max(4096, (depth + 256) * n_parallel),
            },
            "speculative": {"args": [], "n_max": n_max},
            "workload": {
                "concurrency": sorted({c for _, c, _ in levels}),
                "weights": weights,
                "context_tokens": [depth],
                **(workload or {}),
            },
        }
    )
    context = Context(
        model_name=model,
        model=None,
        build=BuildInfo(binary_sha256=build_sha, version_text="", has_max_slots=True),
        host=HostInfo(name=host, cpu_model=None, cpu_cores=None, memory_bytes=None),
    )
    with tempfile.TemporaryDirectory() as logs:
        profiler = Profiler(store, spec, Path(logs))
        run_id = profiler.create_run(context)
        for config, c, reps in levels:
            profiler.record_level(Policy.parse(config), c, [_samples(c, rep) for rep in reps])
        profiler.record_kernel(
            [KernelPoint(shape, n_seq, tokens, ms) for shape, n_seq, tokens, ms in kernel]
        )
        profiler.guarded(lambda: None)  # marks the run completed
    return run_id
