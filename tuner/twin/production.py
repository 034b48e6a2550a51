"""The twin serving a production server's traffic, in-process and in virtual time: requests
arriving on their own (Poisson, or in bursts) on one engine whose threshold is switched
between windows, as `tuner watch` sees a running server.

`ServedTraffic` runs the engine window by window. Each window's figures are exact (every step
counted: the slots generating at its start, as the threshold counts them, its duration, the
tokens the generating slots got; requests waiting for a slot), as `tuner.measure.windows`
describes them; it is the in-process `WindowBackend` that `watch --experiment` is graded on
(benchmarks/watch_experiment.py), thirty simulated minutes in a second or two. Optionally a
window also fills a TrafficProfile as `tuner observe` would (time at each number of generating
slots, requests finished, the acceptance counters read every `poll_s` where a request ended).

Arrivals are a stream of times (`arrivals`: the twin's Poisson, gamma or two-state MMPP
processes, tuner.twin.bursts, seeded), each request's prompt and output length fixed by the
caller and its seed by its index; or a Workload's own requests (lengths, classes) and times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from tuner.measure.windows import WindowFigures
from tuner.policy import Policy
from tuner.traffic import Finished, TrafficProfile
from tuner.twin.engine import (
    Engine,
    Metrics,
    Request,
    Workload,
    arrival_offsets,
    request_seed,
)
from tuner.twin.world import World

POLL_S = 0.25  # how often observe reads the counters, where a request ended
HORIZON_S = 4 * 3600.0  # arrivals are drawn this far ahead


def arrivals(
    process: str, rate: float, seed: int = 0, horizon_s: float = HORIZON_S, **shape: float
) -> Iterator[float]:
    """Arrival times (virtual seconds from 0) of one of the twin's processes (poisson, gamma,
    mmpp: tuner.twin.engine.arrival_offsets, `shape` their parameters) over horizon_s,
    conditioned on their count there; none after it."""
    return iter(arrival_offsets(process, rate, horizon_s, seed, **shape))


class ServedTraffic:
    """One twin server (see the module docstring): `switch` sets the threshold live, `window`
    serves the arrivals for that many virtual seconds and reports them."""

    def __init__(
        self,
        world: World,
        arrivals: Iterator[float] | Workload,
        start_n: int = 0,
        *,
        seed: int = 0,
        prompt_tokens: int = 32,
        output_tokens: int | Callable[[int], int] = 128,
        noise: bool = True,
    ) -> None:
        """arrivals: times, each a request of prompt_tokens and output_tokens (a length, or
        one by the request's index) seeded by its index; or a Workload's own requests."""
        self.world = world
        self.engine = Engine(world, Policy.of_max_slots(start_n, world.n_max), seed, noise=noise)
        if isinstance(arrivals, Workload):
            self._stream = zip(arrivals.arrivals, arrivals.requests, strict=True)
        else:
            self._stream = self._made(arrivals, seed, prompt_tokens, output_tokens)
        self._next = next(self._stream, None)
        self._reader = CounterReader(self.engine)
        self.current = start_n

    @staticmethod
    def _made(
        times: Iterator[float], seed: int, prompt: int, output: int | Callable[[int], int]
    ) -> Iterator[tuple[float, Request]]:
        for i, at in enumerate(times):
            length = output if isinstance(output, int) else output(i)
            yield at, Request(prompt, max(1, length), request_seed(seed, i))

    @property
    def n_slots(self) -> int:
        return self.world.n_parallel

    @property
    def elapsed(self) -> float:
        return self.engine.now

    def switch(self, n: int) -> None:
        self.engine.set_max_slots(n)
        self.current = n

    def _submit_until(self, end: float) -> int:
        submitted = 0
        while self._next is not None and self._next[0] < end:
            at, request = self._next
            self.engine.submit(request, at=at)
            self._next = next(self._stream, None)
            submitted += 1
        return submitted

    def window(self, seconds: float, profile: TrafficProfile | None = None) -> WindowFigures:
        """Serve for `seconds` at the threshold in force; the window's figures (and what
        observe would have seen, into profile)."""
        engine = self.engine
        start = engine.now
        end = start + seconds
        figures = WindowFigures(self.current, arrivals=self._submit_until(end))
        last = start
        while engine.now < end:
            step = engine.step()
            if step is None:
                break
            if step.start > last:  # idle until an arrival: nothing generated
                figures.add(0, step.start - last, 0.0)
                if profile is not None:
                    profile.add(0, step.start - last)
            firsts = sum(
                1 for e in step.emitted if len(engine.result(e.request).token_times) == e.tokens
            )
            figures.add(
                step.generating, step.duration, step.tokens - firsts, reading=step.prompt_rows > 0
            )
            if engine.deferred:
                figures.waited_s += step.duration
            figures.finished += len(step.finished)
            last = step.end
            if profile is not None:
                self._observe(profile, step.generating, step.duration, step.finished)
        if engine.now < end:
            if profile is not None:
                profile.add(0, end - engine.now)
            figures.add(0, end - engine.now, 0.0)
            engine.advance_to(end)
        figures.seconds = engine.now - start
        figures.backlog = engine.deferred
        return figures

    def _observe(
        self, profile: TrafficProfile, generating: int, duration: float, finished: tuple[int, ...]
    ) -> None:
        profile.add(generating, duration)
        engine = self.engine
        for rid in finished:
            res = engine.result(rid)
            profile.add_finished(Finished(res.arrival, res.request.prompt_tokens, res.tokens))
        self._reader.after(profile, finished)


def add_reading(profile: TrafficProfile, before: Metrics, after: Metrics) -> None:
    """One reading of the server's acceptance counters into profile, as observe adds it: the
    increase of each counter between two reads of /metrics."""
    positions = [
        b - a for a, b in zip(before.accepted_per_pos, after.accepted_per_pos, strict=True)
    ]
    profile.readings += 1
    profile.acceptance.add(
        after.spec_decode_num_drafts_total - before.spec_decode_num_drafts_total,
        after.spec_decode_num_draft_tokens_total - before.spec_decode_num_draft_tokens_total,
        after.spec_decode_num_accepted_tokens_total - before.spec_decode_num_accepted_tokens_total,
        positions,
        after.tokens_predicted_total - before.tokens_predicted_total,
    )


class CounterReader:
    """observe's readings of an engine's acceptance counters: at a poll where a request ended,
    at most every POLL_S of the engine's clock, their increase since the last reading."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.counters = engine.metrics()
        self.read_at = 0.0

    def after(self, profile: TrafficProfile, finished: Sequence[int]) -> None:
        """After a step: a reading into profile where requests finished and a poll is due."""
        if finished and self.engine.now - self.read_at >= POLL_S:
            now = self.engine.metrics()
            add_reading(profile, self.counters, now)
            self.counters, self.read_at = now, self.engine.now
