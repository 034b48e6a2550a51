"""The twin as a measurement backend: a schedule's rounds on simulated llama-server launches, in
virtual time, in-process.

It speaks the interface of tuner/measure/backend.py, so the profiler, `tune` and the benchmarks
drive it exactly as they drive a real server: the same schedule, the same requests (prompts,
output lengths and request seeds drawn by `tuner.measure.load.draw_request` from the same round
keys), the same samples and /metrics-style draft counters, stored by the same recorder. Only the
clock differs: every duration is the twin's virtual time, so a profile that takes minutes on a
box takes a fraction of a second here, and what it cost is reported in simulated seconds.

Launches: with `switch="live"` every drafting policy shares one engine, its threshold switched
between rounds as POST /props does; plain has engines of its own. With `switch="relaunch"` each
policy gets its own engine. A launch costs `launch_s` virtual seconds (load and warm-up) and
draws its own launch offset of the noise; the noise process itself goes on through the run.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from tuner.measure import metrics
from tuner.measure.load import Workload, draw_request
from tuner.measure.metrics import parse_metrics
from tuner.measure.plan import Target
from tuner.measure.rounds import Measured
from tuner.measure.schedule import Cell
from tuner.policy import Policy
from tuner.twin.engine import Engine, Metrics, Request
from tuner.twin.world import World

TWIN = "twin"
CHARS_PER_TOKEN = 4.0  # a drawn text prompt's length in tokens, without a tokenizer


def prompt_tokens_of(prompt: Any, synthetic: int) -> int:
    """A request's prompt length in tokens: the synthetic prompt's, or a drawn prompt's text
    (or chat messages) at about four characters a token."""
    if prompt is None:
        return synthetic
    text = prompt_text(prompt)
    if getattr(prompt, "messages", None) is not None:
        return max(1, round(len(text) / CHARS_PER_TOKEN) + 8 * len(prompt.messages))
    return max(1, round(len(text) / CHARS_PER_TOKEN))


def prompt_text(prompt: Any) -> str:
    """A drawn prompt's text (chat messages' contents joined): where an acceptance class's
    marker is looked for."""
    if getattr(prompt, "messages", None) is not None:
        return " ".join(str(m.get("content", "")) for m in prompt.messages)
    return str(getattr(prompt, "text", "") or "")


# A round's scrape before is, most often, the previous round's scrape after: the same text,
# parsed once (the parser reads a character at a time, a quarter of a profile's time here).
_parsed = functools.lru_cache(maxsize=8)(parse_metrics)


def drafting_delta(before: Metrics, after: Metrics) -> dict[str, Any]:
    """The round's draft counters, read from the twin's /metrics text the way a real server's
    are (tuner.measure.metrics)."""
    now, then = _parsed(after.prometheus()), _parsed(before.prometheus())
    return metrics.drafting_summary(now.since(then))


@dataclass
class TwinBackend:
    """Simulated launches of one world (see the module docstring)."""

    world: World
    switch: str = "live"  # live | relaunch
    seed: int = 0
    launch_s: float = 8.0  # virtual seconds a launch costs (model load, warm-up)
    way: str = TWIN
    clock: float = 0.0  # virtual seconds spent so far
    launches: int = 0
    _up: tuple[Hashable, Engine] | None = None
    _rounds: int = field(default=0)

    @property
    def elapsed(self) -> float:
        return self.clock

    def launch_key(self, policy: Target) -> Hashable:
        assert isinstance(policy, Policy)
        if self.switch == "live" and policy.drafting:
            return ("drafting", policy.n_max or self.world.n_max)
        return ("policy", policy.config_name, policy.n_max)

    def _engine(self, policy: Policy) -> Engine:
        key = self.launch_key(policy)
        if self._up is None or self._up[0] != key:
            self.launches += 1
            self.clock += self.launch_s
            launch = Policy.always(policy.n_max) if policy.drafting else Policy.plain()
            engine = Engine(self.world, launch, seed=self.seed * 7919 + self.launches)
            engine.advance_to(self.clock)
            self._up = (key, engine)
        engine = self._up[1]
        if policy.drafting:
            engine.set_max_slots(policy.max_slots or 0)
        return engine

    def _run(self, engine: Engine, requests: list[Request], at: list[float]) -> list[Any]:
        start = engine.now
        ids = [engine.submit(r, at=start + t) for r, t in zip(requests, at, strict=True)]
        engine.run()
        self.clock = engine.now
        return [engine.result(i) for i in ids]

    def prefill(self, policy: Target, depth: int, streams: int, workload: Workload) -> float:
        assert isinstance(policy, Policy)
        if depth <= 0:
            return 0.0
        engine = self._engine(policy)
        started = self.clock
        for _ in range(streams):  # one stream after another, as the load generator does
            self._run(engine, [Request(prompt_tokens=depth, max_tokens=1, seed=0)], [0.0])
        return self.clock - started

    def _requests(
        self,
        workload: Workload,
        concurrency: int,
        round_key: int,
        count: int,
        lengths: list[int] | None = None,
    ) -> list[Request]:
        """The round's requests as the load generator draws them (open loop: concurrency 0,
        keyed by each request's index)."""
        out = []
        for i in range(count):
            length = lengths[i] if lengths else None
            prompt, max_tokens, seed = draw_request(workload, concurrency, round_key, i, length)
            tokens = prompt_tokens_of(prompt, workload.prompt_tokens)
            content = self.world.marked_class(prompt_text(prompt)) if prompt is not None else ""
            if workload.depth > 0:
                total = max(workload.depth, tokens)
                out.append(
                    Request(total, max_tokens, seed, cached_tokens=total - tokens, content=content)
                )
            else:
                out.append(Request(tokens, max_tokens, seed, content=content))
        return out

    def measure(self, policy: Target, cell: Cell, round_key: int, workload: Workload) -> Measured:
        assert isinstance(policy, Policy)
        engine = self._engine(policy)
        requests = self._requests(workload, cell[1], round_key, cell[1])
        before, started = engine.metrics(), self.clock
        results = self._run(engine, requests, [0.0] * len(requests))
        samples = [r.as_sample(i) for i, r in enumerate(results)]
        max_slots = policy.max_slots if policy.drafting else None
        return Measured(
            samples, drafting_delta(before, engine.metrics()), self.clock - started, max_slots
        )

    def arrivals(
        self,
        policy: Target,
        offsets: list[float],
        round_key: int,
        lengths: list[int] | None,
        workload: Workload,
    ) -> Measured:
        assert isinstance(policy, Policy)
        engine = self._engine(policy)
        requests = self._requests(workload, 0, round_key, len(offsets), lengths)
        before, started = engine.metrics(), self.clock
        results = self._run(engine, requests, list(offsets))
        samples = [r.as_sample(i) for i, r in enumerate(results)]
        return Measured(samples, drafting_delta(before, engine.metrics()), self.clock - started)

    def close(self) -> None:
        self._up = None
