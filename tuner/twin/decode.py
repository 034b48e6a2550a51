"""The twin's decode loop: a discrete-event model of llama-server's, in virtual time.

One `step()` is one pass of llama-server's `update_slots` (tools/server/server-context.cpp,
llama.cpp 11434 with patches/spec-draft-max-slots.patch), and the engine keeps its order:

1. Requests that arrived by the step's start take idle slots, lowest slot first, first come
   first served (the server's task queue runs between passes; a request that finds no idle
   slot waits, "deferred").
2. The threshold is counted: G = slots in state generating. With `--spec-draft-max-slots N`,
   N > 0, new drafts start only while G <= N; N = 0 is no limit; a plain server (no draft
   model) never drafts.
3. Every generating slot joins the batch, in slot order. A slot with a draft in flight (see
   `rollback` below) reuses it whatever the threshold says; otherwise, where drafts may start,
   it drafts n = min(n_max, tokens left - 1) tokens (llama-server's get_n_draft_max: a draft
   never overruns the request; n <= 0 is no draft). A slot adds 1 row (its last sampled token)
   plus its draft rows.
4. Prompt rows fill the rest of the batch, slot by slot, up to n_batch rows in all (continuous
   batching); a slot whose prompt ends in this step samples its first token at the step's end
   and generates from the next step on.
5. The step's duration: the world's cost of those rows (tuner.twin.world) times the noise
   (tuner.twin.noise).
6. At the step's end every generating slot verifies: without a draft it emits 1 token; with a
   draft of n it emits 1 + k, k the accepted prefix: position i is accepted while
   u < p_i (u uniform from the request's own generator, p_i the conditional synthetic rates),
   stopping at the first rejection (server_sample_and_accept_synth: draws = k + 1, or n when
   all are accepted). A slot that has emitted max_tokens finishes and its slot is free for the
   next step.

Acceptance is seeded per request: the generator is `random.Random(request.seed)`, drawn in
order as the request's drafts are verified, exactly as llama-server seeds its synthetic
acceptance from the request's sampling seed. The same request seed therefore gives the same
sequence of accept/reject draws under every policy (bit parity with llama-server's mt19937 is
not attempted); that is what makes paired comparisons of policies work.

Where the world's acceptance moves (tuner.twin.world.Acceptance), p_i are the request's class's
(its class fixed when it is submitted: the class its prompt marks, else one by its seed's
share), times by_drafting at the number of drafts made in the step and by_depth at the tokens
the slot's context holds when the draft is verified. The draws are the same ones from the same
generator: a policy that drafts fewer slots together changes what a draw decides, not which
draw it is. A world without those keys runs the one table it always has.

`rollback` (world): "partial" (a KV cache: rejected draft rows are simply removed) leaves no
draft alive between steps. "checkpoint" (recurrent/hybrid targets, where llama-server restores
a checkpoint): a draft with a rejection emits nothing in its step, and its accepted tokens plus
the target's correction stay in `spec_draft`: a draft in flight, replayed (all accepted, one
more sampled) in the next step whatever the threshold then says. Its verify step is counted
once, at the replay.

Counters: `StepResult` carries each step's (drafts started, draft tokens, accepted, verified);
`Engine.metrics()` mirrors llama-server's /metrics, which adds a request's tokens and draft
counters when the request finishes and counts n_decode per step.

Ways in: the incremental `Engine` (a live server: submit, set_max_slots, step, slots,
metrics, advance_to over idle time), `Engine.closed_level` (a launch measuring level after level,
its noise going on between them) and `simulate(world, policy, workload, seed)` for one closed
level or open loop on a fresh engine, all in virtual seconds. `run()` passes the steps in which
nothing drafts, reads a prompt, arrives or finishes in one go (`_coast`), number for number what
`step()` gives one at a time.
"""

from __future__ import annotations

import heapq
import random
from collections import deque

from tuner.policy import Policy
from tuner.twin.noise import NoiseProcess
from tuner.twin.results import Emission, Metrics, RequestResult, SlotState, StepResult
from tuner.twin.tables import Curve
from tuner.twin.world import World

# -- the engine --

_IDLE, _PREFILL, _GEN = 0, 1, 2
_STATES = {_IDLE: SlotState.IDLE, _PREFILL: SlotState.PREFILLING, _GEN: SlotState.GENERATING}


class _Slot:
    """A busy slot's state."""

    __slots__ = (
        "behind",
        "draft",
        "draft_len",
        "index",
        "kv",
        "left",
        "probs",
        "prompt_left",
        "replay",
        "res",
        "rng",
        "state",
    )

    def __init__(
        self, index: int, res: RequestResult, probs: list[float], lazy: bool = False
    ) -> None:
        self.index = index
        self.res = res
        req = res.request
        self.state = _PREFILL
        self.prompt_left = req.evaluated_tokens
        self.kv = req.prompt_tokens - self.prompt_left  # context held before its prompt runs
        self.left = req.max_tokens  # tokens still to generate
        self.draft = 0  # draft rows in this step
        self.replay = 0  # checkpoint worlds: rows of a draft in flight, replayed next step
        self.draft_len = 0  # checkpoint worlds: the length the draft in flight was made with
        # tokens its drafter has not seen (catch-up): a lazy drafter starts behind by the
        # prompt it evaluates; every drafter falls behind by what it generates without drafting
        self.behind = self.prompt_left if lazy else 0
        self.rng = random.Random(req.seed)
        self.probs = probs  # its class's conditional acceptance per position


class TwinError(ValueError):
    """A request or call the simulated server refuses (as llama-server would answer 400)."""


def _policy_of(policy: Policy | int | None) -> Policy:
    if isinstance(policy, Policy):
        return policy
    return Policy.of_max_slots(policy)


class DecodeLoop:
    """The decode loop's state and its step (see the module docstring); tuner.twin.engine.Engine
    adds the server's interface around it."""

    def __init__(
        self,
        world: World,
        policy: Policy | int | None = 0,
        seed: int = 0,
        *,
        noise: bool = True,
    ) -> None:
        pol = _policy_of(policy)
        self.world = world
        self._spec = pol.drafting  # a draft model is loaded
        self._max_slots = pol.max_slots or 0
        self._n_max = pol.n_max or world.n_max
        self._probs = world.accept_probs(self._n_max)
        # Acceptance that moves with drafts, depth or content (World's Acceptance); else the
        # one table above serves every slot and step, as it always has.
        acc = world.acceptance
        self._moves = acc.moves
        self._class_probs = {"": self._probs} | {
            c.name: world.accept_probs(self._n_max, c.name) for c in acc.classes
        }
        self._by_drafting = (
            Curve(acc.by_drafting, world.n_parallel).at_int() if acc.by_drafting else None
        )
        self._by_depth = Curve(acc.by_depth, 0) if acc.by_depth else None
        self._n_parallel = world.n_parallel
        self._n_batch = world.n_batch
        self._slot_context = world.slot_context
        self._replay_mode = world.rollback == "checkpoint"
        self._tables = tables = world.cost_tables(self._n_max)
        self._rows, self._slots_cost = tables.rows, tables.slots
        self._call, self._reeval = tables.call, tables.reeval
        ms = 1e-3  # the world's costs are in ms, time in seconds
        self._overhead = world.draft.overhead_ms * ms
        self._catch_up = world.draft.catch_up_ms_per_token * ms
        self._lazy = world.draft.kind == "lazy"
        self._prefill = world.prefill.ms_per_token * ms
        self._prefill_draft = world.prefill.draft_ms_per_token * ms
        self._depth = world.depth.ms_per_row_per_1k * ms / 1000.0
        self._depth_slot = world.depth.ms_per_slot_per_1k * ms / 1000.0
        params = world.noise.resolve()
        self._noise = NoiseProcess(params, seed) if noise and not params.is_off else None

        self.now = 0.0
        self._slots: list[_Slot | None] = [None] * world.n_parallel
        self._waiting: deque[RequestResult] = deque()
        self._pending: list[tuple[float, int, RequestResult]] = []  # heap of future arrivals
        self._results: dict[int, RequestResult] = {}
        self._next_id = 0
        self._steps = 0
        self._metrics = Metrics(accepted_per_pos=[0] * self._n_max if self._spec else [])

    def advance_to(self, t: float) -> None:
        """Move the clock to t while nothing runs (a live server's idle time); it stops at a
        pending arrival before t, which the next step then serves."""
        if t <= self.now:
            return
        if any(s is not None for s in self._slots) or self._waiting:
            raise TwinError("the clock moves by steps while slots are busy")
        if self._pending and self._pending[0][0] < t:
            t = self._pending[0][0]
        if self._noise is not None:
            self._noise.advance(t - self.now)
        self.now = t

    # -- stepping --

    def step(self) -> StepResult | None:
        """Run one step; None when there is nothing to do (no busy slot, nobody waiting, no
        future arrival). With only future arrivals the clock first jumps to the next one."""
        return self._step(True)

    def run(self, until: float | None = None) -> int:
        """Step until nothing is left to do (or the clock passes `until`); the steps run."""
        n = 0
        while until is None or self.now < until:
            if self._step(False) is None:
                break
            n += 1 + self._coast(until)
        return n

    def _coast(self, until: float | None = None) -> int:
        """Run, in one pass, the steps ahead in which nothing can change but the clock and
        each slot's one token a step: every busy slot generating, none drafting (plain, or the
        threshold holds), no request to admit and none finishing (the step where one would is
        left to `_step`). Those steps are what `_step` would run, number for number (`_cost` for
        their rows, the same noise draws in the same order); most steps of a loaded server
        are such steps, and the open-loop answer and the truth run millions of them. The steps
        run."""
        # the cheap refusals first: this runs after every step
        if self._replay_mode or (self._spec and self._max_slots == 0):
            return 0
        slots = self._slots
        n_gen = len(slots) - slots.count(None)
        if not n_gen or (self._spec and n_gen <= self._max_slots):
            return 0
        gen = [s for s in slots if s is not None]
        if any(s.state != _GEN for s in gen):
            return 0
        idle = n_gen < self._n_parallel
        if idle and self._waiting:
            return 0
        slot_context = self._slot_context
        # the steps before the first one in which a slot finishes
        steps = min(min(s.left, slot_context - 1 - s.kv) for s in gen) - 1
        if steps <= 0:
            return 0
        depth_slot = self._depth_slot
        no_drafts: list[int] = []
        noise = self._noise
        pending = self._pending
        kv_rows = sum(s.kv for s in gen)
        ends: list[float] = []
        now = self.now
        for _ in range(steps):
            if until is not None and now >= until:
                break
            if idle and pending and pending[0][0] <= now:
                break  # the next step admits
            cost = self._cost(n_gen, n_gen, kv_rows, 0, 0, no_drafts)
            if depth_slot:
                cost += depth_slot * kv_rows
            now = now + (noise.duration(cost) if noise is not None else cost)
            ends.append(now)
            kv_rows += n_gen
        k = len(ends)
        if not k:
            return 0
        self.now = now
        self._steps += k
        m = self._metrics
        m.n_decode_total += k
        m.n_busy_slots_total += n_gen * k
        for s in gen:
            s.draft = 0
            s.behind += k
            s.left -= k
            s.kv += k
            s.res.token_times.extend(ends)
        return k

    def _admit(self) -> list[int]:
        pending = self._pending
        while pending and pending[0][0] <= self.now:
            self._waiting.append(heapq.heappop(pending)[2])
        admitted: list[int] = []
        if not self._waiting:
            return admitted
        slots = self._slots
        for i in range(self._n_parallel):
            if not self._waiting:
                break
            if slots[i] is None:
                res = self._waiting.popleft()
                res.start = self.now
                res.slot = i
                slots[i] = _Slot(i, res, self._class_probs[res.klass], self._lazy)
                admitted.append(res.id)
        return admitted

    def _step(self, record: bool) -> StepResult | bool | None:
        """One llama-server scheduling step: admit, pick the drafts, fill the batch with prompt
        rows, cost it, advance the clock, then verify the drafts and emit. record: return
        the step's StepResult (else True); None when there is nothing to do."""
        took = self._take_slots()
        if took is None:
            return None
        admitted, busy = took
        # The threshold is counted at the step's start: slots in state generating.
        gen = [s for s in busy if s.state == _GEN]
        n_gen = len(gen)
        can_start = self._spec and (self._max_slots == 0 or n_gen <= self._max_slots)
        rows, kv_rows, lens, catch = self._draft(gen, can_start)
        # prompt rows only where a slot still reads its prompt
        prompt_rows, prefilled = self._fill_prompts(busy, rows) if n_gen < len(busy) else (0, [])
        cost = self._cost(rows, n_gen, kv_rows, prompt_rows, catch, lens)
        if self._depth_slot:
            cost += self._depth_slot * sum(s.kv for s in gen)
        start = self.now
        duration = self._noise.duration(cost) if self._noise is not None else cost
        end = start + duration
        self.now = end
        self._steps += 1
        m = self._metrics
        m.n_decode_total += 1
        m.n_busy_slots_total += len(busy)
        m.prompt_tokens_total += prompt_rows

        emitted: list[Emission] = []
        finished: list[int] = []
        verified, accepted_step = self._verify(gen, len(lens), end, record, emitted, finished)
        if prefilled:
            self._first_tokens(prefilled, end, record, emitted, finished)
        if not record:
            return True
        return StepResult(
            index=self._steps - 1,
            start=start,
            duration=duration,
            cost=cost,
            generating=n_gen,
            drafts_allowed=can_start,
            rows=rows,
            prompt_rows=prompt_rows,
            drafts_started=len(lens),
            draft_tokens=sum(lens),
            verified=verified,
            accepted=accepted_step,
            admitted=tuple(admitted),
            emitted=tuple(emitted),
            finished=tuple(finished),
        )

    def _take_slots(self) -> tuple[list[int], list[_Slot]] | None:
        """The requests admitted at the step's start and the busy slots; with none busy the
        clock first jumps to the next arrival (None: there is none)."""
        admitted = self._admit()
        slots = self._slots
        busy = [s for s in slots if s is not None]
        if not busy:
            if not self._pending:
                return None
            self.advance_to(self._pending[0][0])
            admitted = self._admit()
            busy = [s for s in slots if s is not None]
        return admitted, busy

    def _draft(self, gen: list[_Slot], can_start: bool) -> tuple[int, int, list[int], int]:
        """Each generating slot's draft for this step: the decode rows, their context rows,
        the lengths of the drafts started and the tokens they catch up."""
        n_max = self._n_max
        rows = 0
        kv_rows = 0
        lens: list[int] = []
        catch = 0
        slot_context = self._slot_context
        if not can_start and not self._replay_mode:
            # Nothing drafts in this step (plain, or the threshold holds): one row a slot.
            for s in gen:
                s.draft = 0
                kv_rows += s.kv
            return len(gen), kv_rows, lens, catch
        for s in gen:
            if s.replay:
                d = s.replay
            elif can_start:
                # min(n_max, tokens left - 1, room left - 2), without min()'s call: hot
                d = n_max
                if s.left - 1 < d:
                    d = s.left - 1
                if slot_context - s.kv - 2 < d:
                    d = slot_context - s.kv - 2
                if d > 0:
                    lens.append(d)
                    catch += s.behind
                    s.behind = 0
                    s.res.draft_n += d
                else:
                    d = 0
            else:
                d = 0
            s.draft = d
            rows += 1 + d
            kv_rows += (1 + d) * s.kv
        return rows, kv_rows, lens, catch

    def _fill_prompts(self, busy: list[_Slot], rows: int) -> tuple[int, list[_Slot]]:
        """Prompt rows fill the batch up to n_batch, slot by slot: the rows taken and the
        slots that took them."""
        prompt_rows = 0
        budget = self._n_batch - rows
        prefilled: list[_Slot] = []
        if budget > 0:
            for s in busy:
                if s.state != _PREFILL:
                    continue
                take = min(s.prompt_left, budget - prompt_rows)
                if take <= 0:
                    break
                s.prompt_left -= take
                s.kv += take
                prompt_rows += take
                prefilled.append(s)
        return prompt_rows, prefilled

    def _cost(
        self, rows: int, n_gen: int, kv_rows: int, prompt_rows: int, catch: int, lens: list[int]
    ) -> float:
        """The step's noise-free duration (seconds)."""
        rows_cost = self._rows
        # A batch of prompt rows alone still runs one forward: rows_ms(1) stands for its part.
        cost = rows_cost[rows or 1] if rows < len(rows_cost) else self._tables.rows_s(rows)
        cost += self._slots_cost[n_gen]
        cost += self._depth * kv_rows + self._prefill * prompt_rows
        if self._spec:
            reeval = self._reeval
            cost += self._overhead + self._prefill_draft * prompt_rows + catch * self._catch_up
            cost += reeval[rows] if rows < len(reeval) else self._tables.reeval_s(rows)
            if lens:
                # one draft-model call per position, batching the drafts still that long
                call = self._call
                d_left = len(lens)
                top = max(lens)
                if min(lens) == top:  # every draft of one length (most steps)
                    per_call = call[d_left]
                    for _ in range(top):
                        cost += per_call
                else:
                    ends = [0] * (self._n_max + 1)
                    for d in lens:
                        ends[d] += 1
                    for i in range(top):
                        cost += call[d_left]
                        d_left -= ends[i + 1]
        return cost

    def _verify(
        self,
        gen: list[_Slot],
        drafts: int,
        end: float,
        record: bool,
        emitted: list[Emission],
        finished: list[int],
    ) -> tuple[int, int]:
        """Verify each generating slot's draft at the step's end and emit what it gives (its
        request's end where its tokens, or its context, are used up): the drafts verified and
        used, and the draft tokens they accepted. drafts: the drafts made in this step (what
        by_drafting counts)."""
        probs = self._probs
        moves = self._moves
        if moves:
            table = self._by_drafting
            per_drafts = (
                1.0
                if table is None
                else table[drafts]
                if drafts < len(table)
                else self.world.drafting_factor(drafts)
            )
            by_depth = self._by_depth
        replay_mode = self._replay_mode
        slot_context = self._slot_context
        verified = accepted_step = 0
        for s in gen:
            d = s.draft
            res = s.res
            if d == 0:
                # no draft: the one token sampled (most steps of most worlds: kept short)
                s.behind += 1
                n_out = 1
                res.token_times.append(end)
            else:
                if s.replay:
                    # A checkpointed draft replayed: all of it accepted, one more sampled.
                    k = s.replay - 1
                    s.replay = 0
                    n_out = k + 2
                    d = s.draft_len
                else:
                    rng = s.rng
                    k = 0
                    if moves:
                        # the request's class, scaled by the drafts verified together and its
                        # depth
                        scale = per_drafts * (by_depth(s.kv) if by_depth is not None else 1.0)
                        own = s.probs
                        while k < d and rng.random() < own[k] * scale:
                            k += 1
                    else:
                        while k < d and rng.random() < probs[k]:
                            k += 1
                    res.draft_marks.append((end, res.draft_n))
                    if replay_mode and k < d:
                        # a rejection in flight: nothing emitted until its replay
                        s.replay = k + 1
                        s.draft_len = d
                        continue
                    n_out = k + 1
                # the draft verified and used: k of its tokens accepted
                res.draft_log.append((d, k))
                verified += 1
                accepted_step += k
                res.drafts += 1
                res.draft_accepted += k
                res.token_times.extend([end] * n_out)
            s.left -= n_out
            s.kv += n_out
            if record:
                emitted.append(Emission(res.id, n_out, end))
            if s.left <= 0 or s.kv + 1 >= slot_context:
                finished.append(res.id)
                self._finish(s, end)
        return verified, accepted_step

    def _first_tokens(
        self,
        prefilled: list[_Slot],
        end: float,
        record: bool,
        emitted: list[Emission],
        finished: list[int],
    ) -> None:
        """A slot whose prompt is all in generates from here: its first token at the step's
        end (the prompt's last row made it)."""
        for s in prefilled:
            if s.prompt_left == 0:
                s.state = _GEN
                res = s.res
                res.token_times.append(end)
                s.left -= 1
                if record:
                    emitted.append(Emission(res.id, 1, end))
                if s.left <= 0:
                    finished.append(res.id)
                    self._finish(s, end)

    def _finish(self, s: _Slot, end: float) -> None:
        res = s.res
        res.finished_at = end
        self._slots[s.index] = None
        m = self._metrics
        m.tokens_predicted_total += res.tokens
        if self._spec:
            m.spec_decode_num_drafts_total += res.drafts
            m.spec_decode_num_draft_tokens_total += res.draft_n
            m.spec_decode_num_accepted_tokens_total += res.draft_accepted
            # the positions each draft of the request accepted (its draft log), counted at its
            # end as the server's counters are
            per_pos = m.accepted_per_pos
            for _, k in res.draft_log:
                for i in range(k):
                    per_pos[i] += 1
