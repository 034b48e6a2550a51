"""Known traffic for the bench: a plain bench server to offer it to, rounds of concurrent
requests in a fixed cycle, and what they offered (each request's first- and last-token time).
Used to check `tuner observe` and `tuner watch` against the truth (tests, benchmarks)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from tuner.bench import Bench
from tuner.measure.launcher import LaunchConfig
from tuner.measure.load import LoadGenerator, Workload


def plain_server(bench: Bench, n_parallel: int = 8, ctx_size: int = 4096) -> LaunchConfig:
    """A bench llama-server that does not draft: the F32 target on 2 threads, sleeping workers."""
    return LaunchConfig(
        binary=bench.server,
        model=bench.target,
        n_parallel=n_parallel,
        ctx_size=ctx_size,
        threads=2,
        args=["--kv-unified", "--poll", "0"],
    )


def offer_cycle(
    url: str,
    cycle: Sequence[tuple[int, int]],
    stop: threading.Event,
    intervals: list[tuple[float, float]],
) -> None:
    """Until stop is set, run the cycle's rounds one after another: (streams, tokens each) all
    starting together. Appends every finished request's (first, last token) perf_counter times
    to intervals."""
    generators = {
        tokens: LoadGenerator(url, Workload(prompt_tokens=32, max_tokens=tokens))
        for _, tokens in cycle
    }
    round_key = 0
    while not stop.is_set():
        for streams, tokens in cycle:
            if stop.is_set():
                return
            samples = generators[tokens].run(streams, round_key)
            round_key += 1
            for s in samples:
                if s.ok and len(s.token_times) >= 2:
                    intervals.append((s.token_times[0], s.token_times[-1]))
            time.sleep(0.05)
