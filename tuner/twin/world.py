"""A twin world: everything about one simulated llama-server that is not the decode loop itself.

A world is a TOML file (commented example: profiles/twin/bench-smollm2-cpu.toml) read into a
frozen pydantic model; unknown keys are errors and every problem is one line naming its field
(tuner.inputs). It holds the model identity (`name`, `model_name`: stored data of two worlds never
pool), the server's shape (`n_parallel`, `n_max`, `n_batch`, `slot_context`, `rollback`), the
synthetic acceptance (which may move with the drafts verified together, the slot's context depth
and the request's content class: `Acceptance`), the cost of a step and the noise model
(tuner.twin.noise).

The cost of one step, in milliseconds, before noise:

    step.rows_ms(R)                 the target's forward over the R decode rows of the batch: one
                                    sampled row per generating slot plus its draft rows (n + 1
                                    rows for a slot verifying a draft of n); a batch of prompt
                                    rows alone pays rows_ms(1) for its forward's fixed part
  + step.slots_ms(G)                per step, by the G generating slots in the batch (sampling,
                                    bookkeeping, HTTP: what grows with slots, not rows)
  + depth.ms_per_row_per_1k * sum over decode rows of (KV tokens of the row's slot) / 1000
  + depth.ms_per_slot_per_1k * sum over generating slots of (KV tokens it holds) / 1000
  + prefill.ms_per_token * P        P prompt rows batched into this step (continuous batching)
and, on a server started with a draft model (every policy but plain), whether it drafts or not:
  + draft.overhead_ms
  + draft.reeval_ms(R)              the draft model re-evaluates every target batch (llama.cpp
                                    calls common_speculative_process after each decode)
  + prefill.draft_ms_per_token * P
  + sum_i draft.call_ms(d_i)        the drafting phase: the draft model runs once per draft
                                    position, batched over the d_i slots whose draft is still
                                    growing at position i (i = 0 .. longest draft - 1)
  + draft.catch_up_ms_per_token * (tokens a slot generated since it last drafted), paid by a
                                    slot in the step where it starts drafting again

`rows_ms`, `slots_ms`, `call_ms` and `reeval_ms` are piecewise-linear tables `[[x, ms], ...]`
(x strictly increasing, first x at most 1), extended beyond their last point along their last
segment. Tables are what lets a world leave any smooth family: a plateau (equal ms over a range
of rows), a saw-tooth (a bump in slots_ms at 5 and at 7 slots), a spec/plain gain that changes
sign twice (a cheap stretch of rows_ms where verify batches land); values may fall as well as
rise. A table holding one point is a constant. A world without a [noise] table gets the "quiet"
preset; the truth always runs noise-free.

`draft.kind` says which drafter the terms describe (DraftCost): "eager" (llama.cpp 11434's
draft-simple and MTP process every target batch: tools/server/server-context.cpp calls
`common_speculative_process(spec, batch.view)` right after the target's decode, and
draft-simple's `process()` in common/speculative.cpp decodes every row of it on the draft
context), so its prompt is paid at admission (draft_ms_per_token), every step pays reeval_ms
whether the slot drafts or not, and a resumed slot has nothing to catch up; or "lazy" (the
n-gram drafters, whose `process()` is a no-op: a slot's context is taken in when it drafts),
paying catch_up_ms_per_token per token it had not seen, its prompt at its first draft. A world
of either kind charges no other kind's terms; docs/twin.md names the source lines. Worlds
without a kind charge the terms as written (the sets written before kinds).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from tuner.errors import ConfigError
from tuner.inputs import read_toml, validation_message
from tuner.twin.noise import NoiseSpec
from tuner.twin.tables import CostTables, Curve

Table = list[tuple[float, float]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_table(points: Table) -> Table:
    if not points:
        raise ValueError("a table needs at least one [x, ms] point")
    xs = [x for x, _ in points]
    if any(not math.isfinite(x) or not math.isfinite(y) for x, y in points):
        raise ValueError("table values must be finite")
    if xs[0] > 1:
        raise ValueError(f"a table starts at x <= 1 (here {xs[0]:g})")
    if any(b <= a for a, b in itertools.pairwise(xs)):
        raise ValueError("table x values must be strictly increasing")
    if any(y < 0 for _, y in points):
        raise ValueError("table ms values must be 0 or more")
    return points


def _check_factors(points: Table) -> Table:
    """A factor table [[x, factor], ...]: the same rules as a cost table (x strictly increasing
    from at most 1, values finite and 0 or more)."""
    return _check_table(points)


def _rates_rule(rates: list[float] | None) -> list[float] | None:
    if rates is None:
        return rates
    if not rates:
        raise ValueError("rates needs one value per draft position")
    if any(not 0.0 <= r <= 1.0 for r in rates):
        raise ValueError("rates are shares between 0 and 1")
    if any(b > a for a, b in itertools.pairwise(rates)):
        raise ValueError("rates must not increase with position")
    return rates


class AcceptanceClass(_Strict):
    """One kind of content with acceptance of its own (`[[acceptance.classes]]`).

    A request belongs to the class whose `marker` its prompt carries (the twin server and the
    in-process backend look for the text in the prompt; a workload names the class); a request
    no marker claims falls into a class with a `share` by a hash of its seed (the shares are
    of the unmarked requests, in the order given; what they leave is the world's default
    acceptance). `synth_len` or `rates`, exactly one, as for the world's own acceptance."""

    name: str = Field(min_length=1, max_length=64)
    marker: str | None = Field(None, min_length=1, description="text a prompt of this class holds")
    share: float = Field(0.0, ge=0.0, le=1.0, description="of the unmarked requests, by seed")
    synth_len: float | None = Field(None, ge=1.0)
    rates: list[float] | None = None

    @field_validator("rates")
    @classmethod
    def _rates(cls, rates: list[float] | None) -> list[float] | None:
        return _rates_rule(rates)

    @model_validator(mode="after")
    def _one(self) -> AcceptanceClass:
        if (self.synth_len is None) == (self.rates is None):
            raise ValueError(f"class {self.name!r}: give exactly one of synth_len and rates")
        if self.marker is None and self.share == 0.0:
            raise ValueError(f"class {self.name!r}: give a marker, a share or both")
        return self


class Acceptance(_Strict):
    """Synthetic acceptance as llama-server's --spec-synth-len / --spec-synth-rates: exactly one.

    `synth_len` is the target mean acceptance length including the target's own token
    (1 .. n_max + 1); llama.cpp turns it into geometric rates a_i = p^i. `rates` are a_i, the
    share of drafts whose first i tokens are all accepted (non-increasing, one per position
    up to n_max). A draft is accepted position by position until the first rejection.

    Acceptance that moves (all optional; a world without them is accepted exactly as before):

    - `by_drafting = [[drafts, factor], ...]`: a piecewise-linear factor (as a cost table:
      linear between points, flat below the first, along the last segment beyond the last, never
      below 0) by the number of drafts verified in the same step (the slots that drafted
      together: a batched draft model whose drafts get worse as more sequences share a batch);
    - `by_depth = [[kv_tokens, factor], ...]`: the same by the tokens the slot's context holds
      when its draft is verified (a long context the draft model follows less well);
    - `classes`: content with acceptance of its own (AcceptanceClass): a request's class is
      decided by its prompt's marker or its seed, never by the policy or the load.

    The factors multiply the conditional acceptance probabilities p_i = a_i / a_(i-1) of the
    request's class: position i is accepted while u < p_i x by_drafting(D) x by_depth(kv)
    (a product above 1 accepts always). The mean accepted length at one factor is
    `World.mean_accept_len(n, factor=...)`."""

    synth_len: float | None = Field(None, ge=1.0)
    rates: list[float] | None = None
    by_drafting: Table | None = None
    by_depth: Table | None = None
    classes: list[AcceptanceClass] = Field(default_factory=list)

    @field_validator("rates")
    @classmethod
    def _rates(cls, rates: list[float] | None) -> list[float] | None:
        return _rates_rule(rates)

    @field_validator("by_drafting", "by_depth")
    @classmethod
    def _factors(cls, points: Table | None) -> Table | None:
        return None if points is None else _check_factors(points)

    @model_validator(mode="after")
    def _one(self) -> Acceptance:
        if (self.synth_len is None) == (self.rates is None):
            raise ValueError("give exactly one of synth_len and rates")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError("acceptance classes need names of their own")
        if sum(c.share for c in self.classes) > 1.0 + 1e-9:
            raise ValueError("the classes' shares add up to more than 1")
        markers = [c.marker for c in self.classes if c.marker is not None]
        if len(set(markers)) != len(markers):
            raise ValueError("acceptance classes need markers of their own")
        return self

    @property
    def moves(self) -> bool:
        """Whether acceptance depends on anything but the position (factors or classes)."""
        return bool(self.by_drafting or self.by_depth or self.classes)


def synth_rates(synth_len: float, n_max: int) -> list[float]:
    """llama.cpp's common_speculative_synth_rates_resolve: the geometric a_i = p^i whose sum
    is synth_len - 1, p found by bisection (32 halvings)."""
    if not 1.0 <= synth_len <= n_max + 1:
        raise ValueError(f"synth_len must be within [1, {n_max + 1}], got {synth_len:g}")
    if synth_len == n_max + 1:
        p = 1.0
    elif synth_len == 1.0:
        p = 0.0
    else:
        lo, hi = 0.0, 1.0
        for _ in range(32):
            mid = 0.5 * (lo + hi)
            total, term = 0.0, mid
            for _ in range(n_max):
                total += term
                term *= mid
            if total < synth_len - 1.0:
                lo = mid
            else:
                hi = mid
        p = 0.5 * (lo + hi)
    return [p ** (i + 1) for i in range(n_max)]


class StepCost(_Strict):
    """The target's part of a step (see the module docstring)."""

    rows_ms: Table = Field(description="target forward by decode rows in the batch")
    slots_ms: Table = Field(default=[(1.0, 0.0)], description="per step, by generating slots")

    @field_validator("rows_ms", "slots_ms")
    @classmethod
    def _tables(cls, points: Table) -> Table:
        return _check_table(points)


DRAFTERS = ("eager", "lazy")


class DraftCost(_Strict):
    """What a server started with a draft model pays (see the module docstring), and how its
    drafter keeps its context (`kind`):

    - "eager": the drafter processes every batch the target decodes (llama.cpp 11434's
      draft-simple and MTP: `common_speculative_process` after the target's decode): its prompt
      at admission with the target's (prefill.draft_ms_per_token), every step's rows whether
      it drafts or not (reeval_ms: the off arm's cost against plain), nothing to catch up when
      a slot drafts again (catch_up_ms_per_token must be 0);
    - "lazy": the drafter processes a slot's context only when the slot drafts (prefix reuse at
      draft time; 11434's n-gram drafters update their tables that way): nothing per step
      (reeval_ms 0) nor at admission (draft_ms_per_token 0); a slot's first draft catches up its
      prompt, a resumed one the tokens it generated since it last drafted, at
      catch_up_ms_per_token each;
    - unset: the terms as written, each charged where the module docstring says (the worlds
      written before drafters had kinds: the frozen set, the open-loop set's version 1 and
      seed-flapping keep their accounting)."""

    kind: Literal["eager", "lazy"] | None = None
    call_ms: Table = Field(description="one draft-model forward over d drafting slots")
    reeval_ms: Table = Field(
        default=[(1.0, 0.0)], description="draft model re-evaluating R decode rows, every step"
    )
    overhead_ms: float = Field(0.0, ge=0.0, description="per step, drafting or not")
    catch_up_ms_per_token: float = Field(0.0, ge=0.0)

    @field_validator("call_ms", "reeval_ms")
    @classmethod
    def _tables(cls, points: Table) -> Table:
        return _check_table(points)


class PrefillCost(_Strict):
    """Prompt rows: per token evaluated, by the target and (drafting-capable server) the draft."""

    ms_per_token: float = Field(0.0, ge=0.0)
    draft_ms_per_token: float = Field(0.0, ge=0.0)


class DepthCost(_Strict):
    """Attention over the KV cache: per decode row, per 1000 tokens its slot holds (compute:
    every row attends on its own, as on a CPU); and per generating slot, per 1000 tokens it
    holds, whatever its rows (a memory-bound GPU decode reads a slot's cache once for all the
    rows of its draft)."""

    ms_per_row_per_1k: float = Field(0.0, ge=0.0)
    ms_per_slot_per_1k: float = Field(0.0, ge=0.0)


class World(_Strict):
    """One simulated server: identity, shape, acceptance, step cost and noise."""

    name: str = Field(min_length=1, max_length=128)
    model_name: str = Field(min_length=1, max_length=255, description="what stored data keys by")
    description: str = ""
    n_parallel: int = Field(ge=1, le=256)
    n_max: int = Field(ge=1, le=64, description="--spec-draft-n-max by default")
    n_batch: int = Field(2048, ge=1, description="-b: rows of one step (decode + prompt)")
    slot_context: int = Field(32768, ge=8, description="tokens a slot's context holds")
    rollback: Literal["partial", "checkpoint"] = Field(
        "partial",
        description="partial: a KV cache drops rejected draft rows (transformers); checkpoint: "
        "the context cannot (recurrent/hybrid targets), a partly rejected draft is restored "
        "and replayed in the next step: a draft in flight across steps",
    )
    acceptance: Acceptance
    step: StepCost
    draft: DraftCost
    prefill: PrefillCost = PrefillCost()
    depth: DepthCost = DepthCost()
    noise: NoiseSpec = NoiseSpec()

    _tables: dict[tuple[object, ...], CostTables] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> World:
        self._drafter_rule()
        acc = self.acceptance
        kinds = [("acceptance", acc.rates, acc.synth_len)] + [
            (f"acceptance class {c.name!r}", c.rates, c.synth_len) for c in acc.classes
        ]
        for where, rates, synth_len in kinds:
            if rates is not None and len(rates) < self.n_max:
                raise ValueError(
                    f"{where}: rates has {len(rates)} values, n_max is {self.n_max}: give one "
                    "per position up to n_max"
                )
            if synth_len is not None and synth_len > self.n_max + 1:
                raise ValueError(
                    f"{where}: synth_len {synth_len:g} exceeds n_max + 1 = {self.n_max + 1}"
                )
        return self

    def _drafter_rule(self) -> None:
        """A drafter of a kind charges that kind's terms and no other's (DraftCost)."""
        draft = self.draft
        if draft.kind == "eager" and draft.catch_up_ms_per_token > 0:
            raise ValueError(
                'draft: an eager drafter (kind = "eager") processes every batch and has '
                "nothing to catch up: catch_up_ms_per_token must be 0"
            )
        if draft.kind == "lazy":
            if any(ms > 0 for _, ms in draft.reeval_ms):
                raise ValueError(
                    'draft: a lazy drafter (kind = "lazy") processes nothing per step: '
                    "reeval_ms must be 0"
                )
            if self.prefill.draft_ms_per_token > 0:
                raise ValueError(
                    'draft: a lazy drafter (kind = "lazy") catches its prompt up at its '
                    "first draft: prefill.draft_ms_per_token must be 0"
                )

    # -- what the engine reads --

    def acceptance_class(self, name: str = "") -> AcceptanceClass | None:
        """The class of that name; None for "" (the world's default acceptance)."""
        if not name:
            return None
        for klass in self.acceptance.classes:
            if klass.name == name:
                return klass
        known = ", ".join(c.name for c in self.acceptance.classes) or "none"
        raise ValueError(f"world {self.name} has no acceptance class {name!r} (known: {known})")

    def rates(self, n_max: int | None = None, klass: str = "") -> list[float]:
        """a_i, i = 1..n, for draft length n (default the world's n_max), of a class (default
        the world's own acceptance).

        synth_len is resolved at the draft length the server runs (llama.cpp resolves it at
        the effective n_max); rates are cut to it, or padded with 0 beyond the given ones."""
        n = n_max or self.n_max
        source: Acceptance | AcceptanceClass = self.acceptance_class(klass) or self.acceptance
        if source.synth_len is not None:
            return synth_rates(min(source.synth_len, n + 1), n)
        given = list(source.rates or [])
        return (given + [0.0] * n)[:n]

    def accept_probs(self, n_max: int | None = None, klass: str = "") -> list[float]:
        """Conditional acceptance per position, p_i = a_i / a_(i-1) (llama.cpp's synth_probs)."""
        probs, prev = [], 1.0
        for rate in self.rates(n_max, klass):
            probs.append(rate / prev if prev > 0 else 0.0)
            prev = rate
        return probs

    def mean_accept_len(
        self, n_max: int | None = None, klass: str = "", factor: float = 1.0
    ) -> float:
        """Tokens per stream per full-length draft: 1 + sum a_i; with a factor on the
        conditional probabilities (Acceptance's by_drafting x by_depth), 1 + sum_i prod_(j<=i)
        min(1, factor x p_j)."""
        if factor == 1.0:
            return 1.0 + sum(self.rates(n_max, klass))
        total, run = 1.0, 1.0
        for p in self.accept_probs(n_max, klass):
            run *= min(1.0, factor * p)
            total += run
        return total

    def drafting_factor(self, drafts: int) -> float:
        """by_drafting at that many drafts verified together (1 without the table)."""
        table = self.acceptance.by_drafting
        return Curve(table, 0)(float(drafts)) if table else 1.0

    def depth_factor(self, kv_tokens: int) -> float:
        """by_depth at a slot holding that many tokens (1 without the table)."""
        table = self.acceptance.by_depth
        return Curve(table, 0)(float(kv_tokens)) if table else 1.0

    def marked_class(self, text: str) -> str:
        """The class whose marker the prompt's text holds (the first such class), else ""."""
        for klass in self.acceptance.classes:
            if klass.marker is not None and klass.marker in text:
                return klass.name
        return ""

    def class_of(self, seed: int, content: str = "") -> str:
        """A request's class: the one it names (its prompt's marker), else one with a share by
        a hash of its seed (the same request, the same class under every policy and load),
        else "" (the world's own acceptance). The hash is not the acceptance generator: the
        request's draws are untouched."""
        if content:
            self.acceptance_class(content)  # a name the world knows
            return content
        shared = [c for c in self.acceptance.classes if c.share > 0]
        if not shared:
            return ""
        digest = hashlib.blake2b(f"class:{seed}".encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "little") / 2.0**64
        edge = 0.0
        for klass in shared:
            edge += klass.share
            if u < edge:
                return klass.name
        return ""

    def cost_tables(self, n_max: int | None = None) -> CostTables:
        """The step-cost tables in seconds, built once per draft length and kept."""
        n = n_max or self.n_max
        # Keyed by the tables themselves: model_copy shares this cache with the original.
        key = (
            n,
            self.n_parallel,
            tuple(self.step.rows_ms),
            tuple(self.step.slots_ms),
            tuple(self.draft.call_ms),
            tuple(self.draft.reeval_ms),
        )
        if key not in self._tables:
            size = self.n_parallel * (n + 1) + 1

            def seconds(points: Table, zero_at_0: bool) -> tuple[list[float], Curve]:
                curve = Curve(points, size)
                values = [v * 1e-3 for v in curve.at_int()]
                if zero_at_0:
                    values[0] = 0.0  # nothing of the kind in the batch costs nothing
                return values, curve

            rows, rows_curve = seconds(self.step.rows_ms, True)
            slots, slots_curve = seconds(self.step.slots_ms, True)
            call, _ = seconds(self.draft.call_ms, True)
            reeval, reeval_curve = seconds(self.draft.reeval_ms, True)
            self._tables[key] = CostTables(
                rows, slots, call, reeval, rows_curve, slots_curve, reeval_curve
            )
        return self._tables[key]

    def with_updates(self, **changes: object) -> World:
        """A copy with top-level fields replaced, validated again."""
        return World.model_validate({**self.model_dump(), **changes})


def load_world(path: Path | str) -> World:
    """A world TOML file; problems are one ConfigError line each."""
    path = Path(path)
    data = read_toml(path, "twin world")
    try:
        return World.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(str(path), exc)) from exc


def world_from_dict(data: dict[str, object], source: str = "twin world") -> World:
    """A world from a dict (e.g. a parsed TOML string); problems as one ConfigError line each."""
    try:
        return World.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(source, exc)) from exc


def world_to_toml(world: World) -> str:
    """The world as TOML that load_world reads back (no comments; the example file has them)."""
    lines: list[str] = []
    data = world.model_dump(exclude_defaults=False)
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    for key, value in data.items():
        if key not in tables:
            lines.append(f"{key} = {_toml_value(value)}")
    for name, table in tables.items():
        lines.append("")
        lines.append(f"[{name}]")
        arrays = {k: v for k, v in table.items() if isinstance(v, list) and v and _is_tables(v)}
        for key, value in table.items():
            if value is None or key in arrays or (isinstance(value, list) and not value):
                continue
            if (name, key) in _WRITTEN_WHEN_SET and value == 0:
                continue
            lines.append(f"{key} = {_toml_value(value)}")
        for key, items in arrays.items():
            for item in items:
                lines.append("")
                lines.append(f"[[{name}.{key}]]")
                lines += [f"{k} = {_toml_value(v)}" for k, v in item.items() if v is not None]
    return "\n".join(lines) + "\n"


# keys added after worlds were committed: written only when set, so a world that does not use
# them writes as it always has
_WRITTEN_WHEN_SET = {("depth", "ms_per_slot_per_1k")}


def _is_tables(values: list[object]) -> bool:
    return all(isinstance(v, dict) for v in values)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(round(value, 6))
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")
