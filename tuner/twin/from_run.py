"""A twin world calibrated to a stored profile run: its plain and always-draft levels fitted, its
threshold levels held out (`tuner dev twin calibrate --run RUN`).

`run_levels(store, run_id)` reads what the fit needs from the database (tuner.storage): the
run's completed levels at its shallowest depth (tok/s, tokens per step, the pooled per-position
acceptance from /metrics), its llama-batched-bench rows and its workload. `calibrate_run(data)`
is then pure, the solver of tuner.twin.calibrate on a template built from the run:

- acceptance: the rates a_i pooled over the always-draft levels' /metrics (accepted tokens at
  position i over drafts) where the run has them, else the mean tokens per step of those levels
  as the synthetic length (a little short of the server's: drafts shortened at a request's end
  count too);
- `step.rows_ms` is solved at every plain level and `draft.call_ms` at every always-draft level
  so that the world's noise-free closed levels (the run's own prompt and output lengths) give
  the run's tok/s (`fit_world`); beyond the largest plain level rows_ms follows the kernel rows
  (decode and verify batches by rows) shifted onto the plain step there, or its last segment
  without kernel rows. Between two solved levels rows_ms follows the shape of the target's
  decode rows and call_ms that of the draft model's generation rows (tuner.measure.kernel),
  where the run has them, else a straight line: on this CPU a draft call over 3 slots costs
  more than over 4, which no line through the levels 2 and 4 can know;
- the draft model's re-evaluation of every batch is `reeval_share` of the target's forward: what
  a threshold server pays over plain where it does not draft, which plain and spec levels
  cannot tell. It is measured where the run has threshold levels above their N (each such
  level beside plain at its concurrency gives plain / threshold - 1; the share is their mean,
  at least 0), else assumed (DEFAULT_REEVAL_SHARE, 2 %: an MTP head or one-block draft re-runs
  about one block of a ~48-block target). On the bench the threshold server ran 0-14 % below
  plain at levels where it did not draft, across launches;
- prompt rows cost what the run's own time to first token says: every round starts its c
  streams together, so their c x P prompt rows are one batch, and a level's median TTFT rises
  with c x P by `prefill.ms_per_token` (the Theil-Sen slope over the plain levels); the
  drafting server's extra (`prefill.draft_ms_per_token`) is the always-draft levels' slope
  beyond it. A run without streamed TTFTs at two levels leaves prefill at 0 and says so. The
  closed levels cannot see prefill (it is done before their window opens); open-loop traffic,
  where prompts arrive into running decode batches, does;
- slots and depth costs are 0 and the noise is the preset given (a run's noise is not a world's:
  its spread is the machine's).

Threshold levels are predicted by the world and set beside the run (`Calibration.held_out`);
one that gave the share is predicted with the share of the others (left out), or with the
assumed share where it is the only one.
The world's `model_name` is "twin-" and the run's model: never the measured model's own, so
data measured on the twin never pools with the real model's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from sqlalchemy import select

from tuner.errors import NotFoundError, NothingToDoError
from tuner.model.arrivals import TtftRound, fit_prefill
from tuner.policy import Policy
from tuner.storage.orm import KernelRow, Level, Run, Sample
from tuner.storage.store import Store
from tuner.twin.calibrate import (
    Calibration,
    LevelFit,
    fit_world,
    level_fits,
    with_reeval_share,
)
from tuner.twin.tables import Curve
from tuner.twin.truth import closed_truth
from tuner.twin.world import World

DEFAULT_REEVAL_SHARE = 0.02  # assumed where a run has no threshold level above its N


@dataclass(frozen=True)
class RunLevel:
    """One completed level of the run."""

    policy: Policy
    concurrency: int
    tokens_per_second: float
    accept_len: float | None = None
    drafts: float = 0.0
    accepted_per_position: tuple[float, ...] = ()
    ttft_ms: float | None = None  # the median over its requests


@dataclass(frozen=True)
class RunData:
    """What a calibration takes from a stored run."""

    run_id: int
    model: str
    n_parallel: int
    n_max: int
    output_tokens: int
    prompt_tokens: int
    depth: int
    levels: tuple[RunLevel, ...]
    kernel: tuple[tuple[str, int, float], ...] = field(default=())  # (shape, rows, step_ms)

    def of(self, kind: str) -> dict[int, RunLevel]:
        """plain, spec (always draft) or threshold levels by concurrency (thresholds: the last
        one stored at a concurrency)."""
        test = {
            "plain": lambda p: p.is_plain,
            "spec": lambda p: p.is_always,
            "threshold": lambda p: p.is_threshold,
        }[kind]
        return {lv.concurrency: lv for lv in self.levels if test(lv.policy)}


def run_levels(store: Store, run_id: int) -> RunData:
    """A stored run's completed levels at its shallowest depth, its kernel rows and workload."""
    with store.session() as session:
        run = session.get(Run, run_id)
        if run is None:
            raise NotFoundError(f"run {run_id} does not exist; `tuner runs` lists them")
        spec = run.spec or {}
        workload = spec.get("workload") or {}
        done = [lv for lv in run.levels if lv.status == "completed" and lv.tokens_per_second]
        if not done:
            raise NothingToDoError(f"run {run_id} has no completed level to calibrate to")
        depth = min(lv.context_tokens for lv in done)
        shallow = [lv for lv in done if lv.context_tokens == depth and lv.policy]
        ttfts: dict[int, list[float]] = {}
        for level_id, ttft in session.execute(
            select(Sample.level_id, Sample.ttft_ms).where(
                Sample.level_id.in_([lv.id for lv in shallow]), Sample.ttft_ms.is_not(None)
            )
        ):
            ttfts.setdefault(level_id, []).append(float(ttft))
        levels = tuple(
            _level(lv, statistics.median(ttfts[lv.id]) if ttfts.get(lv.id) else None)
            for lv in shallow
        )
        rows = session.scalars(select(KernelRow).where(KernelRow.run_id == run_id)).all()
        kernel = tuple(sorted((row.shape, row.rows, row.step_ms) for row in rows))
        n_max = run.n_max or (spec.get("speculative") or {}).get("n_max") or 3
        return RunData(
            run_id=run_id,
            model=run.model.name,
            n_parallel=int(run.n_parallel or max(lv.concurrency for lv in levels)),
            n_max=int(n_max),
            output_tokens=int(workload.get("max_tokens") or 128),
            prompt_tokens=int(workload.get("prompt_tokens") or 32),
            depth=depth,
            levels=levels,
            kernel=kernel,
        )


def _level(level: Level, ttft_ms: float | None = None) -> RunLevel:
    pooled = level.metrics or {}
    policy = level.policy
    assert policy is not None
    return RunLevel(
        policy=policy,
        concurrency=level.concurrency,
        tokens_per_second=float(level.tokens_per_second or 0.0),
        accept_len=level.accept_len,
        drafts=float(pooled.get("drafts") or 0.0),
        accepted_per_position=tuple(float(v) for v in pooled.get("accepted_per_position") or ()),
        ttft_ms=ttft_ms,
    )


def acceptance_of(data: RunData) -> tuple[dict[str, object], float, str]:
    """The world's [acceptance], its mean length (1 + sum a_i) and where it came from."""
    spec = list(data.of("spec").values())
    drafts = sum(lv.drafts for lv in spec)
    width = max((len(lv.accepted_per_position) for lv in spec), default=0)
    if drafts > 0 and width:
        rates = []
        for i in range(data.n_max):
            accepted = sum(
                lv.accepted_per_position[i] for lv in spec if i < len(lv.accepted_per_position)
            )
            rate = min(1.0, accepted / drafts)
            rates.append(min(rate, rates[-1]) if rates else rate)  # never rising with position
        return {"rates": rates}, 1.0 + sum(rates), "pooled /metrics acceptance per position"
    lengths = [lv.accept_len for lv in spec if lv.accept_len]
    if not lengths:
        raise NothingToDoError(
            f"run {data.run_id} measured no tokens per step at its always-draft levels: "
            "no acceptance to calibrate to"
        )
    length = min(max(1.0, statistics.fmean(lengths)), data.n_max + 1.0)
    return {"synth_len": length}, length, "mean tokens per step of the always-draft levels"


def prefill_of(data: RunData) -> tuple[dict[str, float], str]:
    """The world's [prefill] from the run's time to first token (see the module docstring) and
    a line that says where it came from."""
    rounds = [
        TtftRound(kind == "spec", lv.concurrency * data.prompt_tokens, lv.ttft_ms)
        for kind in ("plain", "spec")
        for lv in data.of(kind).values()
        if lv.ttft_ms is not None
    ]
    plain, spec = fit_prefill(rounds)
    if not plain.measured:
        return {}, "prefill 0: the run has no time to first token at two plain levels"
    target = max(0.0, plain.value)
    draft = max(0.0, spec.value) if spec.measured else 0.0
    return (
        {"ms_per_token": target, "draft_ms_per_token": draft},
        f"prefill {target:.3f} ms a prompt token ({draft:.3f} more on the drafting server), "
        "from the slope of the levels' median time to first token",
    )


def kernel_curve(data: RunData, *shapes: str) -> Curve | None:
    """The run's llama-batched-bench rows of these shapes as a curve in rows (the median of the
    rows measured at each count), or None without any."""
    by_rows: dict[int, list[float]] = {}
    for shape, rows, ms in data.kernel:
        if shape in shapes and ms > 0:
            by_rows.setdefault(rows, []).append(ms)
    if not by_rows:
        return None
    return Curve(sorted((float(r), statistics.median(v)) for r, v in by_rows.items()))


def threshold_shares(data: RunData) -> dict[int, float]:
    """What the threshold server paid over plain at each level where it did not draft and plain
    was measured too: plain / threshold - 1, by concurrency."""
    plain = data.of("plain")
    return {
        c: plain[c].tokens_per_second / lv.tokens_per_second - 1.0
        for c, lv in data.of("threshold").items()
        if not lv.policy.drafts_at(c) and c in plain and lv.tokens_per_second > 0
    }


def _rows_template(data: RunData, plain: dict[int, float]) -> list[tuple[float, float]]:
    """rows_ms before solving: the plain steps (c / tok/s), and beyond the largest plain level
    the target's kernel rows shifted onto the plain step there."""
    points = sorted((float(c), 1000.0 * c / tps) for c, tps in plain.items())
    if points[0][0] > 1:
        points.insert(0, (1.0, points[0][1]))
    kernel = kernel_curve(data, "decode", "verify")
    if kernel is not None:
        top_x, top_ms = points[-1]
        shift = top_ms - kernel(top_x)
        points += [(x, max(0.0, ms + shift)) for x, ms in kernel.points() if x > top_x]
    return points


def calibrate_run(
    data: RunData,
    *,
    name: str | None = None,
    reeval_share: float | None = None,
    noise: str = "quiet",
    rel_se: float = 0.002,
) -> Calibration:
    """A world for a stored run (see the module docstring); reeval_share None: measured from the
    run's threshold levels where it has any, else assumed."""
    plain = {c: lv.tokens_per_second for c, lv in data.of("plain").items()}
    spec = {c: lv.tokens_per_second for c, lv in data.of("spec").items()}
    if not plain or not spec:
        raise NothingToDoError(
            f"run {data.run_id} needs completed plain and always-draft (spec) levels to "
            "calibrate a world to"
        )
    acceptance, length, source = acceptance_of(data)
    shares = threshold_shares(data)
    share, share_note = _share_of(reeval_share, shares)
    prefill, prefill_note = prefill_of(data)
    template = World.model_validate(
        {
            "name": name or f"run-{data.run_id}",
            "model_name": f"twin-{data.model}",
            "description": f"calibrated to run {data.run_id} of {data.model}",
            "n_parallel": data.n_parallel,
            "n_max": data.n_max,
            "acceptance": acceptance,
            "step": {"rows_ms": [list(p) for p in _rows_template(data, plain)]},
            "draft": {"kind": "eager", "call_ms": [[1, 1.0]]},
            "prefill": prefill,
            "noise": {"preset": noise},
        }
    )
    work = {"output_tokens": data.output_tokens, "prompt_tokens": data.prompt_tokens}
    rows_shape = kernel_curve(data, "decode")
    call_shape = kernel_curve(data, "draft")
    world, notes = fit_world(
        template,
        plain,
        spec,
        reeval_share=share,
        rel_se=rel_se,
        rows_shape=rows_shape,
        call_shape=call_shape,
        **work,
    )
    thresholds = data.of("threshold")
    levels = sorted(set(plain) | set(spec) | set(thresholds))
    truth = closed_truth(world, rel_se=rel_se, concurrency=levels, **work)
    held: list[LevelFit] = []
    for c, lv in sorted(thresholds.items()):
        policy = lv.policy.with_n_max(data.n_max)
        if reeval_share is None and c in shares:
            # the share without this level: the others' mean, or the assumed one
            others = [v for k, v in shares.items() if k != c]
            left = max(0.0, statistics.fmean(others)) if others else DEFAULT_REEVAL_SHARE
            cell = closed_truth(
                with_reeval_share(world, left), rel_se=rel_se, concurrency=[c], **work
            ).cell(policy, c)
            held.append(LevelFit(policy, c, lv.tokens_per_second, cell.tps, cell.se))
        else:
            held += level_fits(truth, policy, {c: lv.tokens_per_second})
    notes += [share_note, prefill_note, *_shape_notes(data, rows_shape, call_shape)]
    fitted = level_fits(truth, Policy.plain(), plain)
    fitted += level_fits(truth, Policy.always(data.n_max), spec)
    return Calibration(
        world=world,
        synth_len=length,
        synth_len_source=source,
        reeval_share=share,
        fitted=tuple(fitted),
        held_out=tuple(held),
        notes=tuple(notes),
    )


def _share_of(reeval_share: float | None, shares: dict[int, float]) -> tuple[float, str]:
    """The threshold server's overhead (a share of the target's forward) and the note that
    says where it comes from: given, measured from the run's threshold levels, or assumed."""
    if reeval_share is not None:
        return reeval_share, f"threshold server's overhead {reeval_share:.3f}: given"
    if shares:
        share = max(0.0, statistics.fmean(shares.values()))
        each = ", ".join(f"{100 * v:+.1f} % at {c}" for c, v in sorted(shares.items()))
        return share, (
            f"threshold server's overhead over plain {100 * share:.1f} %: the mean over the "
            f"run's threshold levels that do not draft ({each})"
        )
    share = DEFAULT_REEVAL_SHARE
    return share, (
        f"threshold server's overhead {share:.3f} of the target's forward: assumed (the run "
        "has no threshold level above its N)"
    )


def _shape_notes(data: RunData, rows_shape: Curve | None, call_shape: Curve | None) -> list[str]:
    """What the world's curves follow between the run's levels, and the depth it stands for."""
    notes = []
    for what, shape, rows in (
        ("rows_ms", rows_shape, "the target's decode rows"),
        ("call_ms", call_shape, "the draft model's generation rows"),
    ):
        between = "follows the shape of" if shape is not None else "is a straight line: no"
        notes.append(f"between its levels {what} {between} {rows} from llama-batched-bench")
    if data.depth:
        notes.append(f"levels at depth {data.depth} (the run's shallowest); the world's depth is 0")
    return notes
