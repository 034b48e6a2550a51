"""The twin's engine: one simulated llama-server, in virtual time. The decode loop itself, one
pass of llama-server's `update_slots` a step, is tuner.twin.decode (its module docstring has the
order kept, acceptance, rollback and the counters); its inputs are tuner.twin.workload and what it
reports tuner.twin.results. Here, around it, the server's interface (`Engine`: submit, cancel,
set_max_slots, slots, metrics, a closed level on a launch) and the ways in for a whole workload
(`simulate`, `closed_level`, `policies`). The names of those modules are re-exported, as every
caller of the twin imports them from here.

Ways in: the incremental `Engine` (a live server: submit, set_max_slots, step, slots,
metrics, advance_to over idle time), `Engine.closed_level` (a launch measuring level after level,
its noise going on between them) and `simulate(world, policy, workload, seed)` for one closed
level or open loop on a fresh engine, all in virtual seconds.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from tuner.policy import Policy
from tuner.twin.decode import _STATES, DecodeLoop, TwinError
from tuner.twin.results import (
    Emission,
    Metrics,
    RequestResult,
    SimResult,
    SlotState,
    SlotView,
    StepResult,
)
from tuner.twin.workload import ARRIVALS, Request, Workload, arrival_offsets, request_seed
from tuner.twin.world import World

__all__ = [
    "ARRIVALS",
    "DecodeLoop",
    "Emission",
    "Engine",
    "Metrics",
    "Request",
    "RequestResult",
    "SimResult",
    "SlotState",
    "SlotView",
    "StepResult",
    "TwinError",
    "Workload",
    "arrival_offsets",
    "closed_level",
    "policies",
    "request_seed",
    "simulate",
]


class Engine(DecodeLoop):
    """One simulated llama-server, stepped by its caller.

    `Engine(world, policy, seed)`: policy is a Policy, or the value of --spec-draft-max-slots
    (0 = always draft, N = threshold, None = plain: no draft model). Its n_max (else the
    world's) is --spec-draft-n-max. `seed` seeds the noise only; acceptance is seeded by each
    request's own seed. `noise=False` runs noise-free (the truth's way)."""

    # -- policy --

    @property
    def policy(self) -> Policy:
        """The policy in force now."""
        if not self._spec:
            return Policy.plain()
        return Policy.of_max_slots(self._max_slots, self._n_max)

    @property
    def n_max(self) -> int:
        return self._n_max

    def set_max_slots(self, n: int) -> None:
        """--spec-draft-max-slots changed live; the next step counts against it."""
        if not self._spec:
            raise TwinError("a plain server has no draft model: its threshold cannot be set")
        if n < 0:
            raise TwinError(f"--spec-draft-max-slots is 0 or more, not {n}")
        self._max_slots = int(n)

    # -- requests --

    def submit(self, request: Request, at: float | None = None) -> int:
        """Queue a request arriving at virtual time `at` (default, or anything earlier: now);
        its id. It takes a slot at the start of the first step at or after its arrival."""
        if request.prompt_tokens >= self._slot_context:
            raise TwinError(
                f"request ({request.prompt_tokens} tokens) exceeds the available context size "
                f"({self._slot_context} tokens)"
            )
        try:
            klass = self.world.class_of(request.seed, request.content)
        except ValueError as exc:
            raise TwinError(str(exc)) from exc
        arrival = self.now if at is None else max(float(at), self.now)
        rid = self._next_id
        self._next_id += 1
        res = RequestResult(rid, request, arrival, klass=klass)
        self._results[rid] = res
        if arrival <= self.now:
            self._waiting.append(res)
        else:
            heapq.heappush(self._pending, (arrival, rid, res))
        return rid

    def cancel(self, rid: int) -> bool:
        """Drop a request (a client that went away): waiting ones leave the queue, a busy slot
        is freed before the next step. False if it had finished or is unknown."""
        res = self._results.get(rid)
        if res is None or res.done:
            return False
        res.cancelled = True
        res.finished_at = self.now
        if res in self._waiting:
            self._waiting.remove(res)
        self._pending = [p for p in self._pending if p[2] is not res]
        heapq.heapify(self._pending)
        for i, slot in enumerate(self._slots):
            if slot is not None and slot.res is res:
                self._slots[i] = None
        return True

    def result(self, rid: int) -> RequestResult:
        return self._results[rid]

    def results(self) -> list[RequestResult]:
        """Every request submitted, in submission order."""
        return list(self._results.values())

    # -- state --

    @property
    def busy(self) -> bool:
        """Slots processing or requests waiting (arrived) for one."""
        return bool(self._waiting) or any(s is not None for s in self._slots)

    @property
    def deferred(self) -> int:
        """Requests that arrived and found no idle slot at the last step's start (the gauge
        requests_deferred)."""
        return len(self._waiting)

    @property
    def next_arrival(self) -> float | None:
        return self._pending[0][0] if self._pending else None

    @property
    def steps(self) -> int:
        return self._steps

    def slots(self) -> list[SlotView]:
        views = []
        for i, slot in enumerate(self._slots):
            if slot is None:
                views.append(SlotView(i, SlotState.IDLE, None, 0, 0, 0, 0, 0, 0))
                continue
            req = slot.res.request
            views.append(
                SlotView(
                    id=i,
                    state=_STATES[slot.state],
                    request=slot.res.id,
                    prompt_tokens=req.prompt_tokens,
                    prompt_done=req.prompt_tokens - slot.prompt_left,
                    n_decoded=slot.res.tokens,
                    max_tokens=req.max_tokens,
                    context=slot.kv,
                    draft=slot.replay or slot.draft,
                )
            )
        return views

    def metrics(self) -> Metrics:
        m = self._metrics
        m.requests_processing = sum(s is not None for s in self._slots)
        m.requests_deferred = len(self._waiting)
        return Metrics(**{**m.__dict__, "accepted_per_pos": list(m.accepted_per_pos)})

    def closed_level(
        self,
        streams: int,
        output_tokens: int | Sequence[int] = 128,
        prompt_tokens: int = 32,
        depth: int = 0,
        seed: int = 0,
    ) -> SimResult:
        """One closed level on this engine (a launch measuring level after level): `streams`
        requests released now, run until they finish; the noise goes on from where it was."""
        work = Workload.closed(streams, output_tokens, prompt_tokens, depth, seed)
        t0, steps0 = self.now, self._steps
        ids = [self.submit(r) for r in work.requests]
        while not all(self._results[i].done for i in ids):
            if self._step(False) is None:
                break
            self._coast()
        return SimResult(
            world=self.world.name,
            policy=self.policy,
            requests=tuple(self._results[i] for i in ids),
            duration=self.now - t0,
            steps=self._steps - steps0,
            metrics=self.metrics(),
        )


# -- simulation --


def simulate(
    world: World,
    policy: Policy | int | None,
    workload: Workload,
    seed: int = 0,
    *,
    noise: bool = True,
) -> SimResult:
    """Run a workload (closed level or open loop) on a fresh engine, in virtual time."""
    engine = Engine(world, policy, seed, noise=noise)
    ids = [
        engine.submit(r, at=t) for r, t in zip(workload.requests, workload.arrivals, strict=True)
    ]
    steps = engine.run()
    return SimResult(
        world=world.name,
        policy=engine.policy,
        requests=tuple(engine.result(i) for i in ids),
        duration=engine.now,
        steps=steps,
        metrics=engine.metrics(),
    )


def closed_level(
    world: World,
    policy: Policy | int | None,
    streams: int,
    output_tokens: int | Sequence[int] = 128,
    prompt_tokens: int = 32,
    depth: int = 0,
    seed: int = 0,
    *,
    noise: bool = True,
) -> SimResult:
    """One closed level: `streams` requests released together (request seeds from `seed`,
    noise seeded by it too)."""
    workload = Workload.closed(streams, output_tokens, prompt_tokens, depth, seed)
    return simulate(world, policy, workload, seed, noise=noise)


def policies(world: World, include_plain: bool = True) -> list[Policy]:
    """plain (optionally), N=0 and N=1..n_parallel at the world's n_max."""
    out: Iterable[Policy] = [Policy.always(world.n_max)] + [
        Policy.threshold(n, world.n_max) for n in range(1, world.n_parallel + 1)
    ]
    return ([Policy.plain()] if include_plain else []) + list(out)
