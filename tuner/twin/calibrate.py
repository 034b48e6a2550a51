"""A twin world calibrated to a table: plain and always-draft rows fitted, threshold rows held out.

`calibrate_table(path)` reads an imported table (tuner.storage.importer's format, e.g.
profiles/reference/seed-qwen3.8-flash-next-gfx1151.toml) and builds a world whose truth
(tuner.twin.truth, closed levels of `output_tokens` per stream) reproduces the table's plain and
spec rows at the table's levels; its threshold rows are never used to fit: they are predicted by
the world and reported beside the table (`Calibration.held_out`).

What is fitted, and what is assumed because a table of tok/s alone cannot tell it:

- plain rows fix `step.rows_ms` at each measured concurrency c (a plain step at c streams has c
  rows); the table is extended beyond the largest level along its last segment (verify batches
  of n + 1 rows per slot land there), and `slots_ms` is 0 (a table cannot split a step's cost
  between rows and slots);
- spec rows fix `draft.call_ms` at each measured concurrency (all c slots draft together, so a
  spec level at c reads the draft-call table at c); each knot is solved so that the simulated
  level's windowed tok/s equals the table, by root finding on the paired repeats (window time is
  linear in the knot's value: the trajectory of a noise-free closed level does not depend on
  step costs);
- the draft model's re-evaluation of every batch, which is what a threshold server that does
  not draft pays over a plain one, is `reeval_share` of the target's forward at the same rows
  (default 0.02: an MTP head or one-block draft re-runs about one block of a ~48-block target;
  llama.cpp calls common_speculative_process after every decode). It is not identifiable from
  plain and spec rows, and it alone sets the threshold rows above their N;
- acceptance: the table's `accept_len` when it has one, else `synth_len` when given, else the
  smallest mean acceptance length that leaves every measured spec level a draft cost of at least
  `min_draft_share` (default 5 %) of the plain step at that level. A table without acceptance
  cannot separate acceptance from draft cost; the choice moves only unmeasured levels.

`fit_world(template, plain, spec)` is the same solver on a hand-made template (its slots, depth,
prefill and noise kept, its rows points beyond the plain levels kept): how the bench-like world
profiles/twin/bench-smollm2-cpu.toml was set from the bench's plain and n-max 6 tok/s at 1, 2, 4
and 8 streams (the table at the head of that file).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from scipy.optimize import brentq

from tuner.policy import Policy
from tuner.storage.importer import ImportDoc, load_import
from tuner.twin.engine import Workload, simulate
from tuner.twin.tables import Curve
from tuner.twin.truth import ClosedTruth, closed_truth
from tuner.twin.world import World, synth_rates


@dataclass(frozen=True)
class LevelFit:
    """One table value beside the calibrated world's truth."""

    policy: Policy
    streams: int
    table: float
    twin: float
    twin_se: float

    @property
    def error(self) -> float:
        """(twin - table) / table."""
        return self.twin / self.table - 1.0


@dataclass(frozen=True)
class Calibration:
    """A calibrated world and how it meets its table."""

    world: World
    synth_len: float
    synth_len_source: str
    reeval_share: float
    fitted: tuple[LevelFit, ...]  # plain and spec rows: matched by construction
    held_out: tuple[LevelFit, ...]  # threshold rows: predicted
    notes: tuple[str, ...] = ()

    @property
    def max_held_out_error(self) -> float:
        return max((abs(f.error) for f in self.held_out), default=0.0)

    def report(self) -> str:
        """A plain-text account: every row, table against twin."""
        lines = [
            f"world {self.world.name}: synth_len {self.synth_len:.3f} ({self.synth_len_source}), "
            f"reeval share {self.reeval_share:.3f}"
        ]
        for title, fits in (("fitted", self.fitted), ("held out", self.held_out)):
            lines.append(f"{title}:")
            for f in fits:
                lines.append(
                    f"  {f.policy.label:<6} c={f.streams:<3d} table {f.table:8.2f}  twin "
                    f"{f.twin:8.2f} ± {f.twin_se:.2f}  error {100 * f.error:+6.2f} %"
                )
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


# -- the solver --


def _window_parts(world: World, policy: Policy, streams: int, repeat: int, **work: int) -> Any:
    result = simulate(
        world, policy, Workload.closed(streams, seed=repeat, **work), seed=repeat, noise=False
    )
    window = result.window()
    if window is None:
        raise ValueError(f"no window at {streams} streams: outputs too short")
    drafted = any(r.draft_n for r in result.requests)
    return window[2], window[1] - window[0], drafted


def solve_knot(
    make: Callable[[float], World],
    policy: Policy,
    streams: int,
    target: float,
    *,
    output_tokens: int = 128,
    prompt_tokens: int = 32,
    rel_se: float = 0.002,
    min_repeats: int = 64,
    max_repeats: int = 6000,
    batch: int = 64,
) -> tuple[float, float, float]:
    """The value x (ms) of one table knot, `make(x)` the world with it, at which the level's
    mean windowed tok/s over paired repeats equals `target`; with the tok/s reached and its
    standard error. x is 0 when even a free knot cannot reach the target (the tok/s reached
    then says by how much)."""
    # Window time is linear in the knot: sample it at 1 and 2 ms (at 0 a plain window could
    # last no time at all) and extend the line.
    w1, w2 = make(1.0), make(2.0)
    work = {"output_tokens": output_tokens, "prompt_tokens": prompt_tokens}
    tokens: list[int] = []
    base: list[float] = []
    slope: list[float] = []

    def mean_tps(x: float) -> float:
        times = [a + b * x for a, b in zip(base, slope, strict=True)]
        if min(times) <= 0:
            return math.inf
        return statistics.fmean(n / t for n, t in zip(tokens, times, strict=True))

    x = 0.0
    while True:
        start = len(tokens)
        for r in range(start, min(start + batch, max_repeats)):
            n1, t1, drafted = _window_parts(w1, policy, streams, r, **work)
            n2, t2, _ = _window_parts(w2, policy, streams, r, **work)
            if n1 != n2:
                raise AssertionError("a noise-free closed level moved with its costs")
            tokens.append(n1)
            base.append(t1 - (t2 - t1))
            slope.append(t2 - t1)
            if not drafted:
                break  # deterministic: one repeat is all of them
        deterministic = len(tokens) == 1
        if mean_tps(0.0) <= target:
            x = 0.0
        else:
            hi = 1.0
            while mean_tps(hi) > target:
                hi *= 2.0
                if hi > 1e7:
                    raise ValueError(f"no knot value reaches {target:g} tok/s")
            x = float(brentq(lambda v: mean_tps(v) - target, 0.0, hi, xtol=1e-9, rtol=1e-12))
        values = [n / (a + b * x) for n, a, b in zip(tokens, base, slope, strict=True)]
        mean = statistics.fmean(values)
        se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
        done = deterministic or len(tokens) >= max_repeats
        if done or (len(tokens) >= min_repeats and se / mean <= rel_se):
            return x, mean, se


def _with_table(world: World, section: str, key: str, points: list[tuple[float, float]]) -> World:
    data = world.model_dump()
    data[section][key] = [list(p) for p in points]
    return World.model_validate(data)


def with_reeval_share(world: World, share: float) -> World:
    """The world with the draft model's re-evaluation of every batch at `share` x rows_ms."""
    return _with_table(world, "draft", "reeval_ms", [(x, share * y) for x, y in world.step.rows_ms])


def _shaped(solved: Mapping[int, float], shape: Curve | None) -> dict[float, float]:
    """Solved knots and, where a shape is given, every integer between two of them: the shape
    there plus the knots' offsets from the shape, interpolated. The shape's bumps are kept (a
    kernel that costs as much at 3 rows as at 4), its level is the knots'."""
    points = {float(c): v for c, v in solved.items()}
    if shape is None:
        return points
    xs = sorted(solved)
    for lo, hi in pairwise(xs):
        off_lo, off_hi = solved[lo] - shape(lo), solved[hi] - shape(hi)
        for x in range(lo + 1, hi):
            t = (x - lo) / (hi - lo)
            points[float(x)] = max(0.0, shape(x) + off_lo + t * (off_hi - off_lo))
    return points


def _merge_points(
    solved: Mapping[float, float], kept: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Solved knots, plus kept points beyond the largest solved one, starting at x <= 1."""
    top = max(solved)
    points = sorted((float(c), v) for c, v in solved.items())
    points += [(x, y) for x, y in kept if x > top]
    if points[0][0] > 1:
        points.insert(0, (1.0, points[0][1]))
    return points


def fit_world(
    template: World,
    plain: Mapping[int, float],
    spec: Mapping[int, float],
    *,
    reeval_share: float | None = None,
    output_tokens: int = 128,
    prompt_tokens: int = 32,
    rel_se: float = 0.002,
    rows_shape: Curve | None = None,
    call_shape: Curve | None = None,
) -> tuple[World, list[str]]:
    """The template with rows_ms solved at the plain levels and call_ms at the spec levels (see
    the module docstring); reeval_ms becomes reeval_share x rows_ms when a share is given.
    Between two solved knots the tables are linear, or follow `rows_shape` / `call_shape` (a
    measured kernel cost by rows, `_shaped`) where one is given."""
    notes: list[str] = []
    kw = {"output_tokens": output_tokens, "prompt_tokens": prompt_tokens, "rel_se": rel_se}
    world = template
    rows_kept = list(template.step.rows_ms)
    rows: dict[int, float] = {}
    curve = Curve(template.step.rows_ms)
    for c in sorted(plain):
        guess = {**{k: curve(k) for k in plain}, **rows}

        def make_rows(x: float, c: int = c, guess: dict[int, float] = guess) -> World:
            return _with_table(world, "step", "rows_ms", _merge_points({**guess, c: x}, rows_kept))

        x, tps, _ = solve_knot(make_rows, Policy.plain(), c, plain[c], **kw)
        if x == 0.0:
            notes.append(f"plain at {c}: {tps:.2f} tok/s at most, table {plain[c]:.2f}")
        rows[c] = x
    world = _with_table(
        world, "step", "rows_ms", _merge_points(_shaped(rows, rows_shape), rows_kept)
    )
    if reeval_share is not None:
        world = with_reeval_share(world, reeval_share)

    calls_kept = list(template.draft.call_ms)
    calls: dict[int, float] = {}
    call_curve = Curve(template.draft.call_ms)
    policy = Policy.always(world.n_max)
    for c in sorted(spec):
        guess = {**{k: call_curve(k) for k in spec}, **calls}

        def make_call(x: float, c: int = c, guess: dict[int, float] = guess) -> World:
            return _with_table(
                world, "draft", "call_ms", _merge_points({**guess, c: x}, calls_kept)
            )

        x, tps, _ = solve_knot(make_call, policy, c, spec[c], **kw)
        if x == 0.0:
            notes.append(
                f"spec at {c}: {tps:.2f} tok/s at most with free drafts, table {spec[c]:.2f} "
                "(acceptance too low for this table)"
            )
        calls[c] = x
    world = _with_table(
        world, "draft", "call_ms", _merge_points(_shaped(calls, call_shape), calls_kept)
    )
    return world, notes


# -- from a table --


def estimate_synth_len(
    plain: Mapping[int, float],
    spec: Mapping[int, float],
    n_max: int,
    reeval_share: float,
    min_draft_share: float = 0.05,
) -> float:
    """The smallest mean acceptance length at which every measured spec level leaves its draft
    calls at least min_draft_share of the plain step at that level, from the steady state
    (tokens per step per stream L, a step of c (n+1) verify rows plus n draft calls); at most
    n_max + 1. Analytic, so only a starting choice: the knots are then solved by simulation."""
    rows = Curve(sorted((float(c), 1000.0 * c / v) for c, v in plain.items()))
    need = 1.0
    for c, tps in spec.items():
        plain_step = rows(c)
        fixed = (1.0 + reeval_share) * rows(c * (n_max + 1))
        # c L / tps (s) = fixed + n_max * call, call >= share * plain_step
        need = max(need, (fixed + n_max * min_draft_share * plain_step) * tps / (1000.0 * c))
    return min(need, float(n_max + 1))


def calibrate_table(
    source: Path | str | ImportDoc,
    *,
    name: str | None = None,
    synth_len: float | None = None,
    reeval_share: float = 0.02,
    min_draft_share: float = 0.05,
    noise: str = "quiet",
    output_tokens: int = 128,
    prompt_tokens: int = 32,
    rel_se: float = 0.002,
) -> Calibration:
    """A world for an imported table (see the module docstring)."""
    doc = source if isinstance(source, ImportDoc) else load_import(Path(source))
    levels = doc.concurrency
    plain, spec, thresholds = _table_rows(doc)
    notes: list[str] = []
    length, source_text = _synth_len_of(doc, plain, spec, synth_len, reeval_share, min_draft_share)
    synth_rates(length, doc.n_max)  # checks the range
    slug = name or f"table-{doc.model_name.lower().replace(' ', '-')}"
    first = min(plain)
    template = World.model_validate(
        {
            "name": slug,
            "model_name": f"twin-{doc.model_name}",
            "description": f"calibrated to {doc.source or doc.model_name} ({doc.host})".strip(),
            "n_parallel": doc.n_parallel,
            "n_max": doc.n_max,
            "acceptance": {"synth_len": length},
            "step": {"rows_ms": [[1, 1000.0 * first / plain[first]]]},
            "draft": {"kind": "eager", "call_ms": [[1, 1.0]]},
            "noise": {"preset": noise},
        }
    )
    world, fit_notes = fit_world(
        template,
        plain,
        spec,
        reeval_share=reeval_share,
        output_tokens=output_tokens,
        prompt_tokens=prompt_tokens,
        rel_se=rel_se,
    )
    notes += fit_notes
    truth = closed_truth(
        world,
        output_tokens=output_tokens,
        prompt_tokens=prompt_tokens,
        rel_se=rel_se,
        concurrency=sorted(set(levels)),
    )
    fitted = level_fits(truth, Policy.plain(), plain)
    fitted += level_fits(truth, Policy.always(doc.n_max), spec)
    held = [f for policy, values in thresholds for f in level_fits(truth, policy, values)]
    return Calibration(
        world=world,
        synth_len=length,
        synth_len_source=source_text,
        reeval_share=reeval_share,
        fitted=tuple(fitted),
        held_out=tuple(held),
        notes=tuple(notes),
    )


def _table_rows(
    doc: ImportDoc,
) -> tuple[dict[int, float], dict[int, float], list[tuple[Policy, dict[int, float]]]]:
    """The table's plain and spec rows (tok/s per level), and its threshold rows."""
    rows_by_config: dict[str, dict[int, float]] = {}
    thresholds: list[tuple[Policy, dict[int, float]]] = []
    for row in doc.rows:
        pairs = zip(doc.concurrency, row.tokens_per_second, strict=True)
        values = {c: v for c, v in pairs if not math.isnan(v)}
        if row.config == "threshold":
            thresholds.append((Policy.threshold(row.max_slots or 1, doc.n_max), values))
        else:
            rows_by_config[row.config] = values
    if "plain" not in rows_by_config or "spec" not in rows_by_config:
        raise ValueError("calibration needs a plain row and a spec row")
    return rows_by_config["plain"], rows_by_config["spec"], thresholds


def _synth_len_of(
    doc: ImportDoc,
    plain: dict[int, float],
    spec: dict[int, float],
    synth_len: float | None,
    reeval_share: float,
    min_draft_share: float,
) -> tuple[float, str]:
    """The world's mean acceptance length and where it comes from: the table's, given, or
    estimated."""
    if doc.accept_len is not None:
        return doc.accept_len, "the table's accept_len"
    if synth_len is not None:
        return synth_len, "given"
    length = estimate_synth_len(plain, spec, doc.n_max, reeval_share, min_draft_share)
    length = math.ceil(length * 100) / 100
    return length, (
        f"estimated: smallest leaving every spec level draft calls of at least "
        f"{100 * min_draft_share:.0f} % of its plain step"
    )


def level_fits(truth: ClosedTruth, policy: Policy, values: dict[int, float]) -> list[LevelFit]:
    """Each measured level (tok/s) beside the world's truth there."""
    out = []
    for c, v in sorted(values.items()):
        cell = truth.cell(policy, c)
        out.append(LevelFit(policy, c, v, cell.tps, cell.se))
    return out
