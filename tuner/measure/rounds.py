"""What a round does on any llama-server, whichever backend switched it: the round as measured
(`Measured`: requests, the /metrics deltas, the machine's load and others' requests beside it),
a closed round and an arrivals round run and read, the deep context prefilled, the warm-up."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from tuner.errors import LoadError, ServerError
from tuner.measure import interference, metrics
from tuner.measure.client import LlamaClient
from tuner.measure.foreign import Foreign, foreign_requests
from tuner.measure.interference import RoundLoad, Snapshot
from tuner.measure.load import (
    LoadGenerator,
    RequestSample,
    Workload,
)
from tuner.measure.schedule import Cell
from tuner.measure.spec import ProfileSpec


@dataclass
class Measured:
    """One round as a backend measured it."""

    samples: list[RequestSample]
    drafting: dict[str, Any]  # /metrics deltas over the round (drafts, tokens, accepted...)
    seconds: float  # what the round took on the backend's clock (virtual time for the twin)
    max_slots: int | None = None  # live: the threshold /props reported for the round
    # Where requests failed: what the backend makes of it (the server's death named, or a hang),
    # for the level's error; None where it knows nothing more than the requests' own errors.
    failure: str | None = None
    machine: RoundLoad | None = None  # what the rest of the machine did (None: not watched)
    foreign: Foreign | None = None  # others' requests the round overlapped


Explain = Callable[[str, str], str]  # (where, detail) -> the message a failure raises with


def watched(
    measure: Callable[[], Measured],
    snapshot: Callable[[], Snapshot] | None,
    server_pids: Callable[[], Collection[int]],
    siblings: Mapping[int, str] | None = None,
) -> Measured:
    """A round measured between two snapshots of the machine (none: not watched)."""
    start = snapshot() if snapshot is not None else None
    measured = measure()
    if start is not None and snapshot is not None:
        measured.machine = interference.round_load(
            start, snapshot(), server_pids(), siblings=siblings
        )
    return measured


def measure_round(
    url: str,
    cell: Cell,
    round_key: int,
    workload: Workload,
    explain: Explain,
    where: str,
    api_key: str | None = None,
) -> Measured:
    """One round of cell's concurrency: the requests, and the /metrics deltas around them."""
    generator = LoadGenerator(url, workload, api_key=api_key)
    started = time.perf_counter()
    try:
        with LlamaClient(url, api_key) as api:
            before = api.metrics()
            samples = generator.run(cell[1], round_key)
            # When requests failed the server may be gone or hung: their errors say more than
            # a failed /metrics scrape would.
            failed = any(not s.ok for s in samples)
            after = before if failed else api.metrics()
    except (ServerError, LoadError) as exc:
        raise ServerError(explain(where, str(exc))) from exc
    seconds = time.perf_counter() - started
    failure = None
    if failed:
        bad = [s for s in samples if not s.ok]
        failure = explain(where, f"{len(bad)} of {cell[1]} requests failed ({bad[0].error})")
    own = sum(s.tokens for s in samples)
    return Measured(
        samples,
        metrics.drafting_summary(after.since(before)),
        seconds,
        failure=failure,
        foreign=None if failed else foreign_requests(before, after, own),
    )


def arrivals_round(
    url: str,
    offsets: list[float],
    round_key: int,
    lengths: list[int] | None,
    workload: Workload,
    api_key: str | None = None,
) -> Measured:
    """An open-loop round on a running server, with the /metrics deltas around it."""
    generator = LoadGenerator(url, workload, api_key=api_key)
    with LlamaClient(url, api_key) as api:
        before = api.metrics()
        started = time.perf_counter()
        _, samples = generator.run_arrivals(offsets, round_key, lengths)
        seconds = time.perf_counter() - started
        after = api.metrics()
    return Measured(samples, metrics.drafting_summary(after.since(before)), seconds)


def prefill_server(
    url: str,
    depth: int,
    streams: int,
    workload: Workload,
    explain: Explain,
    api_key: str | None = None,
) -> float:
    """Every stream's padding at a depth brought into the server's cache outside any
    measurement (see LoadGenerator.prefill_async); returns its seconds."""
    if depth <= 0:
        return 0.0
    started = time.perf_counter()
    generator = LoadGenerator(url, workload, api_key=api_key)
    where = f"while prefilling depth {depth}"
    try:
        samples = generator.prefill(streams)
    except (ServerError, LoadError) as exc:
        raise ServerError(explain(where, str(exc))) from exc
    failed = [s for s in samples if not s.ok]
    if failed:
        detail = f"{len(failed)} of {streams} requests failed ({failed[0].error})"
        raise LoadError(explain(where, detail))
    return time.perf_counter() - started


def warm_up(spec: ProfileSpec, url: str, explain: Explain, api_key: str | None = None) -> None:
    """The spec's warm-up rounds at its widest level, after a launch."""
    w = spec.workload
    if not w.warmup:
        return
    warm = Workload(
        prompt_tokens=w.prompt_tokens,
        max_tokens=16,
        stream=False,
        request_timeout_s=w.request_timeout_s,
    )
    generator = LoadGenerator(url, warm, api_key=api_key)
    for _ in range(w.warmup):
        try:
            samples = generator.run(max(spec.levels))
            failure = None if any(s.ok for s in samples) else samples[0].error
        except (LoadError, ServerError) as exc:
            failure = str(exc)
        if failure is not None:
            raise ServerError(explain("during warm-up", f"warm-up requests failed: {failure}"))
