"""`tuner tune`: settle N live, comparing only where policies differ, until each comparison's
one-sided bound clears the tolerance.

1. The cost model's recommendation that stands is the answer to beat; its contenders are
   N-2, N-1, N+1, N+2, always draft and any larger answer it held before (decide/settle.py).
2. A contender differs from the answer only at the levels between them, and there the
   difference is the drafting server's gain g(c) = on(c) - off(c). A sweep measures those
   levels on the drafting server, on and off side by side (A B in one sweep, B A in the next:
   A B B A across two): with the live switch on one launch, so a pair's halves are seconds
   apart; by relaunching (a launch for always-draft, one for threshold 1, which drafts at none
   of these levels) where the server cannot switch live. Both halves of a pair send the same
   prompts and request seeds.
3. After each sweep the paired differences give every contender's advantage with its
   t-interval (the degrees of freedom actually taken). A contender whose lower bound clears
   zero takes over the answer (and brings its own contenders); one whose upper bound is within
   the tolerance (1 % of the objective by default) leaves the answer standing; values of N
   shown equivalent both ways are a tie, the smallest chosen. The next sweep measures only the
   levels unresolved comparisons rest on. An answer it left may come back: the data then hold
   every pair the step away saw and more, so the move back is followed once; a second return
   stops with the latest answer, unresolved, and the levels between the two to measure next.
4. It stops when every comparison is settled, or when the budget is spent: then the answer
   stands with what is unresolved named, with its bounds, and the levels to measure next. The
   budget goes to the larger stakes first: contenders that could be more than the tolerance
   ahead before the tie questions (which only choose among values within it), so a budget
   that runs out leaves a tie question open, not a contender that could cost regret. Tie
   questions are measured only within the first `tie_budget_s` (3 minutes by default) of
   tune's measuring; one still open then is named in "may tie".
5. With `plain_live` (`--plain-live`), whether to draft at all is settled the same way once
   no contender is unresolved (against the best threshold found: against a worse one plain
   can sit at the tolerance's edge and take the whole budget), before the tie questions:
   plain's launch held up beside the drafting launch (two models in memory: it has to be
   asked for), plain and the answer in turn at every level the traffic weighs (A B, then B A
   in the next pass), their weighted difference with its one-sided bounds, within
   `plain_budget_s` (90 s by default: two or three passes here). Where a tie then
   moves the answer, plain is measured against the new one with what is left of that budget
   (one plain budget a tune, whatever answers it is spent on); until that
   resolves, the verdict against the earlier answer stands and says which N it was. Without
   it, or while it is unresolved, the cost model over plain's separate launches says
   (choice.plain_verdict).

Every evaluated N is a trial of an Optuna study in the tuner's database (`tuner:live:run<ID>`):
its parameters are N (and n_max), its value the answer's model objective plus the measured
advantage, its user attributes the advantage, bounds, verdict and levels; contenders shown
behind are pruned. The answer is stored as the recommendation that stands (source "live"), so
`recommend` and `report` give the same N while the data stay the same.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tuner.decide import advice, choice, search, settle, validate
from tuner.decide.paired import AHEAD, BEHIND, Acceptance, Contrast, LevelDiffs, verdict
from tuner.errors import ConfigError
from tuner.measure.backend import Backend
from tuner.measure.plan import Observer, ProgressEvent, quiet
from tuner.measure.schedule import PAIRS_PER_PASS, Cell, off_arm
from tuner.model.costmodel import CostModel
from tuner.policy import Policy, drafts_at, stored_policy
from tuner.recommendation import Reason, ReasonCode, Recommendation
from tuner.storage import recommendations
from tuner.storage.fits import current_fit
from tuner.storage.queries import paired_rounds
from tuner.storage.store import Store, optuna_storage

DEFAULT_BUDGET_S = 600.0  # seconds of measuring (the backend's clock) before tune stops
# Seconds of measuring (the same clock, from tune's start) after which tie questions are no
# longer measured: they only choose among values within the tolerance, and on a noisy 2-core VM
# one near the tolerance's edge could take the whole budget. With a profile of about two
# minutes this keeps the tuner's whole cost near six there; the questions that could cost more
# than the tolerance keep the whole budget (step 4).
DEFAULT_TIE_BUDGET_S = 180.0
# Seconds of measuring plain against the answer may take (plain_live), all its passes together,
# against every answer: two or three passes side by side here. Plain's launch beside the
# drafting launch spreads about 4 % of the objective a pass on a 2-core VM
# (bench-smollm2-cpu, AMD EPYC), so where plain and the
# answer are within about 2 % of each other no budget of minutes resolves it, and the model's
# verdict stands, as without the option.
DEFAULT_PLAIN_BUDGET_S = 90.0
MAX_MOVES = 16  # an answer that keeps moving is a sign of noise, not of a better N
# Pairs per level a sweep measures: one, in the order that alternates from sweep to sweep (A B,
# then B A: A B B A across two sweeps). On the twin's bench and zigzag worlds this settled the
# same answers as two pairs a sweep in 36 % less measuring: every pair is a unit of its own.
SWEEP_PAIRS = 1
DONE, TIES_LEFT = "done", "ties left"  # how a run of threshold sweeps ends


# --- what the stored rounds say ---------------------------------------------------------------


# level -> arm ("on" | "off") -> (run id, round key) -> tok/s
_Rounds = dict[int, dict[str, dict[tuple[int, int], float]]]
# level -> (run id, round key) -> (side, tok/s, mean acceptance its requests drew) of the pair's
# drafting half: side +1 where it is "on", -1 where it is "off" (plain - answer)
_Drew = dict[int, dict[tuple[int, int], tuple[float, float, float]]]
# A level's drafting halves are scaled to the workload's mean acceptance only with this many
# blocks or more: with fewer, the twin's bounds missed the truth more often than they said (3
# blocks: 33 of 200 runs outside two one-sided 95 % bounds, against 20 unscaled), at 8 they did
# not (18 against 17).
MIN_BLOCKS = 6
# Fewer distinct request seeds than this, and nothing is scaled: the anchor's own uncertainty
# would outweigh what scaling takes away (the bench's requests spread 0.45 tokens a step around
# 3.3: 24 seeds leave the mean 2.8 % uncertain).
MIN_SEEDS = 24


def _round_acceptance(r: Mapping[str, Any]) -> float | None:
    """The mean acceptance (tokens a step) of a drafting round's requests, as stored."""
    values = [a for a in r.get("accept_by_stream") or [] if a]
    return sum(values) / len(values) if values else None


def acceptance_pool(rounds: Sequence[Mapping[str, Any]]) -> Acceptance | None:
    """The workload's mean acceptance from drafting rounds' requests (accept_by_stream, stored
    by the profiler where the policy drafted the whole round), one value a request seed (a
    round key's stream: every run of one workload sends the same seeds); None below MIN_SEEDS
    seeds."""
    by_seed: dict[tuple[int, int], list[float]] = {}
    for r in rounds:
        if r.get("round_key") is None:
            continue
        for stream, a in enumerate(r.get("accept_by_stream") or []):
            if a:
                by_seed.setdefault((int(r["round_key"]), stream), []).append(float(a))
    values = [statistics.fmean(v) for v in by_seed.values()]
    if len(values) < MIN_SEEDS:
        return None
    mean, var = statistics.fmean(values), statistics.variance(values)
    return Acceptance(mean, var / len(values), len(values))


def _add_round(
    by_level: _Rounds,
    c: int,
    arm: str,
    run_id: int,
    r: Mapping[str, Any],
    drew: _Drew | None = None,
    side: float = 1.0,
) -> None:
    """A stored round as one half of its pair, unless it has no figure of the level: no
    tokens, no round key, apart (no window: the sum of lone streams' rates), or disturbed by
    others (busy, foreign: kept as measured after its third try, profiler). Where `drew`
    is given (the round is the pair's drafting half), the acceptance its requests drew is kept
    there for _block_diffs."""
    if r.get("apart") or r.get("busy") or r.get("foreign"):
        return  # no window; other programs on the machine, or others' requests on the server
    if not r.get("tokens_per_second") or r.get("round_key") is None:
        return
    key = (run_id, int(r["round_key"]))
    tps = float(r["tokens_per_second"])
    by_level.setdefault(c, {}).setdefault(arm, {})[key] = tps
    got = _round_acceptance(r) if drew is not None else None
    if drew is not None and got is not None:
        drew.setdefault(c, {})[key] = (side, tps, got)


def _block_diffs(
    by_level: _Rounds, anchor: Acceptance | None = None, drew: _Drew | None = None
) -> dict[int, LevelDiffs]:
    """on - off per pair, averaged per block (a run's pass at a level): one difference per
    block, its degrees of freedom counted by blocks.

    With an anchor, at a level of MIN_BLOCKS blocks or more, each pair's drafting half is
    scaled to the anchor's mean acceptance: its tok/s times anchor.mean over the mean its own
    requests drew (tokens a step scale tok/s; what a step costs does not depend on how many
    drafted tokens were accepted), and the level carries its slope (d mean / d anchor.mean)
    for the anchor's own uncertainty (Contrast.of)."""
    out = {}
    for c, pairs in settle.gains_from_rounds(by_level, keyed=True).items():
        here = (drew or {}).get(c, {})
        n_blocks = len({(run_id, key // PAIRS_PER_PASS) for run_id, key in pairs})
        scale = anchor is not None and n_blocks >= MIN_BLOCKS and bool(here)
        blocks: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for (run_id, round_key), diff in pairs.items():
            side, tps, got = here.get((run_id, round_key), (0.0, 0.0, 1.0))
            if scale and anchor is not None and side:
                diff += side * tps * (anchor.mean / got - 1.0)
            slope = side * tps / got if scale else 0.0
            blocks.setdefault((run_id, round_key // PAIRS_PER_PASS), []).append((diff, slope))
        means = [
            (statistics.fmean(d for d, _ in v), statistics.fmean(s for _, s in v))
            for _, v in sorted(blocks.items())
        ]
        slope = statistics.fmean(s for _, s in means) if scale else 0.0
        out[c] = LevelDiffs(tuple(d for d, _ in means), slope, anchor if scale else None)
    return out


def live_gains(
    rounds: Mapping[tuple[int, str, int], Sequence[Mapping[str, Any]]],
) -> dict[int, LevelDiffs]:
    """Paired on - off differences per level from stored rounds keyed (run id, config,
    concurrency): "on" a drafting policy that drafts at the level, "off" a threshold that does
    not. A pair is both halves of one round key (one launch, seconds apart, the same prompts
    and seeds; an "off" round whose server drafted inside the window, drafted_off, is left
    out, and so is a round whose streams never all generated at once, apart); the unit is a
    block, the pairs of one pass at the level (A B B A: two pairs whose off rounds sit side by
    side share a spell, so they are not independent), averaged: one difference per (run, pass),
    its degrees of freedom counted by blocks. Plain is another server and never pairs here.

    The "on" half is scaled to the workload's mean acceptance over every drafting round given
    (acceptance_pool): the off half drafts nothing, so the seeds' luck, which both halves
    share in their prompts but only "on" turns into tokens, would otherwise spread every
    difference (on the bench it made 40-70 % of a block's variance)."""
    by_level: _Rounds = {}
    arms: list[tuple[int, str, int, Mapping[str, Any]]] = []
    for (run_id, config, c), reps in rounds.items():
        policy = stored_policy(config)
        if policy is None or not policy.drafting:
            continue
        arm = "on" if policy.drafts_at(c) else "off"
        for r in reps:
            if arm == "off" and r.get("drafted_off"):
                continue  # the threshold drafted inside the window: not a round of "off"
            arms.append((run_id, arm, c, r))
    anchor = acceptance_pool([r for _, arm, _, r in arms if arm == "on"])
    drew: _Drew = {}
    for run_id, arm, c, r in arms:
        _add_round(by_level, c, arm, run_id, r, drew if arm == "on" else None)
    return _block_diffs(by_level, anchor, drew)


def plain_gains(
    rounds: Mapping[tuple[str, int, int], Sequence[Mapping[str, Any]]],
    answer: str,
    pool: Sequence[Mapping[str, Any]] = (),
) -> dict[int, LevelDiffs]:
    """plain - answer per level from one run's rounds keyed (config, depth, concurrency), plain
    and the answer (its config name) measured side by side: a pair is both halves of one round
    key (the same prompts and seeds, seconds apart), the unit a pass's pairs at the level
    averaged (as in live_gains). Where the answer drafts, its half is scaled to the workload's
    mean acceptance (as in live_gains) over its own drafting rounds and any in `pool` (rounds
    of the same workload elsewhere: more seeds, a surer mean)."""
    drafting = [
        r
        for (config, _, c), reps in rounds.items()
        if config == answer and drafts_at(config, c)
        for r in reps
    ]
    anchor = acceptance_pool([*drafting, *pool])
    by_level: _Rounds = {}
    drew: _Drew = {}
    for (config, _, c), reps in rounds.items():
        arm = "on" if config == Policy.plain().config_name else "off" if config == answer else None
        if arm is None:
            continue
        scaled = arm == "off" and bool(drafts_at(config, c))
        for r in reps:
            _add_round(by_level, c, arm, 0, r, drew if scaled else None, side=-1.0)
    return _block_diffs(by_level, anchor, drew)


@dataclass(frozen=True)
class PlainLive:
    """Plain against the answer, measured side by side: the weighted advantage of plain (tok/s),
    its verdict at the tolerance (ahead: drafting does not pay), the passes taken."""

    advantage: Contrast
    verdict: str
    passes: int
    against: int  # the N plain was measured against

    def as_dict(self) -> dict[str, Any]:
        low, high = self.advantage.bounds(settle.CONFIDENCE)

        def finite(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "estimate": finite(self.advantage.estimate),
            "low": finite(low),
            "high": finite(high),
            "df": finite(self.advantage.df),
            "verdict": self.verdict,
            "passes": self.passes,
            "against": self.against,
        }


def sweep_arms(levels: Sequence[int], depth: int, n_max: int, live: bool) -> dict[Cell, list]:
    """The rounds of one sweep: at each level, always draft and a threshold that does not
    draft there (c-1 on a live launch; 1 when relaunching: one launch for every level)."""
    arms: dict[Cell, list] = {}
    for c in sorted(levels):
        off = off_arm(c) if live else Policy.threshold(1)
        assert off is not None
        arms[(depth, c)] = [Policy.always(n_max), off.with_n_max(n_max)]
    return arms


def model_objective(model: CostModel, n: int, n_max: int, weights: np.ndarray) -> float:
    """The answer's workload-weighted tok/s on the cost model: the scale of the tolerance."""
    return search.policy_objective(model, Policy.of_max_slots(n, n_max), weights)


# --- the report -------------------------------------------------------------------------------


@dataclass
class TuneReport:
    """What `tuner tune` did: where it started, the sweeps, the standing it reached, the
    recommendation stored."""

    run_id: int
    study_name: str
    started_from: Recommendation
    way: str = ""
    sweeps: int = 0
    seconds: float = 0.0
    standing: Recommendation | None = None
    settled: settle.Standing | None = None
    history: list[int] = field(default_factory=list)  # the answer after each assessment
    gains: dict[int, LevelDiffs] = field(default_factory=dict)
    plain: PlainLive | None = None  # plain_live: plain against the answer, side by side

    @property
    def changed(self) -> bool:
        return self.standing is not None and (
            self.standing.max_slots != self.started_from.max_slots
            or self.standing.n_max != self.started_from.n_max
        )

    def standing_text(self) -> str:
        if self.standing is None:
            return ""
        line = " ".join(f"{k}={v}" for k, v in self.standing.env().items())
        if self.changed:
            return (
                f"{line} now stands: the live comparisons changed the recommendation from "
                f"N={self.started_from.max_slots}"
            )
        if not self.standing.drafting_pays:
            return (
                f"{line} stands among thresholds, but plain is ahead of it: serve without the "
                "draft model (see its first reason)"
            )
        return f"{line} stands after the live comparisons (unchanged)"

    def as_dict(self) -> dict[str, Any]:
        s = self.settled
        return {
            "run_id": self.run_id,
            "study_name": self.study_name,
            "way": self.way,
            "started_from": self.started_from.max_slots,
            "standing": self.standing.max_slots if self.standing else None,
            "standing_n_max": self.standing.n_max if self.standing else None,
            "changed": self.changed,
            "status": s.status if s else None,
            "tie": s.tie if s else [],
            "tie_so_far": s.provisional if s else [],  # unresolved: the tie the data show
            "may_tie": s.may_tie if s else [],
            "tolerance": s.tolerance if s else None,
            "comparisons": [c.as_dict() for c in s.comparisons] if s else [],
            "measure_next": s.measure_next if s else [],
            "sweeps": self.sweeps,
            "seconds": self.seconds,
            "history": self.history,
            "pairs": {c: d.n for c, d in sorted(self.gains.items())},
            # whether to draft at all: measured side by side (plain_live) where that resolved,
            # else the model on plain's launches against the answer
            "plain_live": self.plain.as_dict() if self.plain else None,
            "drafting_pays": self.standing.drafting_pays if self.standing else None,
            "plain_advantage": (
                list(self.standing.plain_advantage)
                if self.standing and self.standing.plain_advantage
                else None
            ),
        }


# --- the run ----------------------------------------------------------------------------------


def _study(store: Store, name: str, seed: int) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna.create_study(
        study_name=name,
        storage=optuna_storage(store.url),
        sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=0),
        direction="maximize",
        load_if_exists=True,
    )


def tune(
    store: Store,
    model_name: str,
    host: str,
    log_dir: Path,
    observer: Observer = quiet,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    tie_budget_s: float = DEFAULT_TIE_BUDGET_S,
    plain_budget_s: float = DEFAULT_PLAIN_BUDGET_S,
    tolerance: float = settle.TOLERANCE,
    tune_n_max: bool = False,
    resume: bool = False,
    overrides: list[tuple[str, Any]] | None = None,
    skip_preflight: bool = False,
    seed: int = 0,
    switch: str = "auto",
    backend: Backend | None = None,
    plain_live: bool = False,
) -> TuneReport:
    """`tuner tune`: settle N live (see the module docstring); returns its report.

    budget_s: seconds of measuring before it stops unresolved; tie_budget_s: seconds of
    measuring after which tie questions are named, not measured on; plain_budget_s: seconds of
    measuring plain against the answer may take (plain_live); tolerance: the share of the
    objective a contender may be ahead by and the answer still hold; tune_n_max: the model's
    study over (N, n_max) picks the draft length the answer is settled at; backend: measure on
    this backend (the twin's) instead of launching the profile's llama-server; plain_live:
    settle whether to draft at all side by side (step 5 above)."""
    if budget_s <= 0:
        raise ConfigError("--budget must be above 0")
    if tie_budget_s < 0 or plain_budget_s < 0:
        raise ConfigError("--tie-budget and --plain-budget must be 0 or more")
    if not 0 < tolerance < 1:
        raise ConfigError("--tolerance is a share of the objective between 0 and 1, e.g. 0.01")
    fit = current_fit(store, model_name, host, seed=seed)  # once: the data the answer starts from
    rec = advice.standing(store, model_name, host, seed=seed, fit=fit)
    study_now = advice.model_study(
        store, model_name, host, seed=seed, tune_n_max=tune_n_max, fit=fit
    )
    cm, weights = study_now.fit.model, study_now.weights
    n_parallel = cm.n_parallel
    n_max = (rec.n_max or cm.n_max) if tune_n_max else cm.n_max
    answer = rec.policy.effective(n_parallel)

    stored_spec = validate.profile_spec_of(store, model_name, host)
    spec = validate.validation_spec(stored_spec, [1], n_max, overrides, kind="tune")
    preflight_policies = [Policy.always(n_max), Policy.threshold(1, n_max)]
    profiler = validate.open_live_run(
        store,
        spec,
        model_name,
        host,
        rec,
        "tune",
        preflight_policies,
        log_dir,
        observer,
        resume=resume,
        skip_preflight=skip_preflight or backend is not None,
        backend=backend,
        switch=switch,
        side_by_side=plain_live,
    )
    run_id = profiler.run_id
    assert run_id is not None and profiler.backend is not None
    name = f"tuner:live:run{run_id}"
    report = TuneReport(run_id, name, rec)
    depth = profiler.depth
    workload_now = spec.model_dump(mode="json")["workload"]
    objective = model_objective(cm, answer, n_max, weights)
    w = [float(x) for x in weights]
    started = profiler.backend.elapsed

    plain_spent = 0.0  # seconds of measuring plain took, every settle_plain together

    def settle_plain() -> None:
        nonlocal plain_spent
        began = profiler.backend.elapsed
        try:
            measure_plain(began)
        finally:
            plain_spent += profiler.backend.elapsed - began

    def measure_plain(began: float) -> None:
        # a verdict against an earlier answer stands until one against this answer resolves
        earlier = report.plain
        policy = Policy.of_max_slots(answer, n_max)
        coef = {c: w[c - 1] for c in range(1, n_parallel + 1) if w[c - 1] > 0}
        cells = [(depth, c) for c in coef]
        # the sweeps' drafting rounds at this n_max: more seeds for the mean acceptance
        pool = [
            r
            for (_, config, c), reps in paired_rounds(
                store, model_name, host, depth, n_max, workload_now
            ).items()
            if drafts_at(config, c)
            for r in reps
        ]
        while True:
            levels = plain_gains(profiler.repeats_by_cell(), profiler.level_name(policy), pool)
            advantage = Contrast.of(levels, coef)
            passes = min((levels[c].n if c in levels else 0 for c in coef), default=0)
            said = PlainLive(advantage, verdict(advantage, tolerance * objective), passes, answer)
            # an unresolved verdict against an earlier answer gives way only to one with
            # passes of its own against this answer
            if (
                said.verdict != settle.UNRESOLVED
                or earlier is None
                or (earlier.verdict == settle.UNRESOLVED and said.passes > 0)
            ):
                report.plain = said
            if said.verdict != settle.UNRESOLVED:
                return
            now = profiler.backend.elapsed
            # one plain budget for every answer plain is measured against: a tie that moves
            # the answer gets what the first answer left of it, not a budget of its own
            if now - started >= budget_s or plain_spent + now - began >= plain_budget_s:
                spent_on = "budget" if now - started >= budget_s else "plain budget"
                kept = report.plain
                stands = (
                    f"the verdict against N={kept.against} stands"
                    if kept is not None and kept.verdict != settle.UNRESOLVED
                    else "the model's verdict stands"
                )
                observer(
                    ProgressEvent(
                        "message",
                        text=f"{spent_on} spent with plain against N={answer} unresolved after "
                        f"{passes} pass(es): {stands}",
                    )
                )
                return
            observer(
                ProgressEvent(
                    "message",
                    text=f"plain against N={answer}: pass {passes + 1}, side by side at every "
                    "level the traffic weighs",
                )
            )
            profiler.run_pass({cell: [Policy.plain(), policy] for cell in cells}, pairs=1)

    def body() -> None:
        # The contenders that could cost more than the tolerance first, then whether to draft
        # at all (plain against the best threshold found: against a worse one plain can sit
        # at the tolerance's edge), then the tie questions, which only choose among values
        # within the tolerance, with the tie budget: a lesser question never starves a greater.
        left = settle_thresholds(ties=False)
        if plain_live:
            settle_plain()
        if left == TIES_LEFT:
            settle_thresholds(ties=True)
        if plain_live and report.plain is not None and report.plain.against != answer:
            settle_plain()  # a tie moved the answer: plain against it, if the budget allows

    moves = 0
    visited = {answer}
    returned = False

    def settle_thresholds(ties: bool) -> str:
        """Sweep until the standing settles, stops, or (ties false) only tie questions are
        left: DONE, or TIES_LEFT."""
        nonlocal answer, objective, moves, returned
        while True:
            gains = live_gains(paired_rounds(store, model_name, host, depth, n_max, workload_now))
            above = [v for v in visited if v > answer]  # larger answers it held before
            standing = settle.assess(gains, w, answer, n_parallel, objective, tolerance, kept=above)
            report.settled, report.gains = standing, gains
            report.history.append(standing.answer)
            spent = profiler.backend.elapsed - started
            if standing.status == settle.MOVED:
                moves += 1
                observer(
                    ProgressEvent("message", text=_moved_text(answer, standing, report.sweeps))
                )
                back = answer
                answer = standing.answer
                objective = model_objective(cm, answer, n_max, weights)
                if answer in visited:
                    # Back to an answer it left. The latest data, which hold every pair the
                    # earlier step saw, overturn that step: follow them once. A second return
                    # is the data going back and forth at the edge of the tolerance: the
                    # latest answer stands, unresolved, the levels between the two to measure.
                    if returned:
                        report.settled = dataclasses.replace(
                            standing,
                            answer=answer,
                            status=settle.OPEN,
                            measure_next=settle.between(back, answer),
                        )
                        observer(
                            ProgressEvent(
                                "message",
                                text=f"the answer went back to N={answer} a second time: the "
                                f"data do not keep N={back} and N={answer} apart; N={answer} "
                                "stands, unresolved",
                            )
                        )
                        return DONE
                    returned = True
                visited.add(answer)
                if moves < MAX_MOVES:
                    continue
                observer(ProgressEvent("message", text="the answer keeps moving: stopping"))
                return DONE
            if standing.status == settle.SETTLED:
                return DONE
            if not ties and not standing.unresolved:
                return TIES_LEFT
            if spent >= budget_s:
                observer(
                    ProgressEvent(
                        "message",
                        text=f"budget of {budget_s:.0f} s spent with "
                        f"{len(standing.measuring)} comparison(s) unresolved",
                    )
                )
                return DONE
            if ties and not standing.unresolved and spent >= tie_budget_s:
                observer(
                    ProgressEvent(
                        "message",
                        text=f"{tie_budget_s:.0f} s of measuring spent: the tie question(s) "
                        f"left open ({sweep_text(answer, standing)}) are named, not measured on",
                    )
                )
                return DONE
            live = profiler.way == "live" or profiler.way == "twin"
            arms = sweep_arms(standing.measure_next, depth, n_max, live)
            levels = ", ".join(str(c) for c in sorted(standing.measure_next))
            observer(
                ProgressEvent(
                    "message",
                    text=f"sweep {report.sweeps + 1}: {sweep_text(answer, standing)}; "
                    f"on and off in turn at {levels} streams",
                )
            )
            profiler.run_pass(arms, pairs=SWEEP_PAIRS)
            report.sweeps += 1

    profiler.guarded(body, resume_hint=f"tuner tune --model {model_name}")
    report.way = profiler.way
    report.seconds = profiler.backend.elapsed - started
    assert report.settled is not None
    study = _study(store, name, seed)
    _tell(study, report.settled, answer, n_max, objective, tune_n_max)
    report.standing = _store_live(
        store, model_name, host, answer, n_max, objective, report, rec, tune_n_max, weights
    )
    return report


def sweep_text(answer: int, standing: settle.Standing) -> str:
    """What a sweep compares: each contender still measured, and why where it is not a
    plain unresolved comparison (within the tolerance or slightly behind, measured on for the
    tie)."""
    names = [f"N={c.contender}" + question_text(answer, c) for c in standing.measuring]
    return f"N={answer} against " + ", ".join(names)


def question_text(answer: int, c: settle.Comparison) -> str:
    """What a comparison measured on is asking, where it is a tie question."""
    if c.against is None:
        return ""
    if c.against == answer:
        return " (equivalent?)"
    return f" (equivalent to N={c.against}, the best estimate?)"


def _moved_text(answer: int, standing: settle.Standing, sweeps: int) -> str:
    if standing.tie and standing.answer in standing.tie:
        return (
            f"N={standing.answer} is equivalent to N={answer} within the tolerance: "
            f"the smaller is the answer now (tie {standing.tie})"
        )
    comp = next(c for c in standing.comparisons if c.contender == standing.answer)
    low, high = comp.advantage.bounds(settle.CONFIDENCE)
    return (
        f"N={standing.answer} is ahead of N={answer}: {comp.advantage.estimate:+.2f} tok/s "
        f"weighted [{low:+.2f}, {high:+.2f}] after {sweeps} sweep(s): it is the answer now"
    )


def _tell(
    study: Any, standing: settle.Standing, answer: int, n_max: int, objective: float, both: bool
) -> None:
    """Every evaluated N as a trial: the answer with its model objective, each contender with
    the answer's plus its measured advantage; pruned when shown behind."""
    import optuna

    def params(n: int) -> dict[str, int]:
        out = {search.MAX_SLOTS_PARAM: n}
        if both:
            out[search.N_MAX_PARAM] = n_max
        return out

    study.enqueue_trial(params(answer))
    trial = study.ask()
    trial.suggest_int(search.MAX_SLOTS_PARAM, 0, max(answer, 1))
    trial.set_user_attr("role", "answer")
    trial.set_user_attr("status", standing.status)
    trial.set_user_attr("tie", standing.tie)
    study.tell(trial, objective)
    for comp in standing.comparisons:
        study.enqueue_trial(params(comp.contender))
        trial = study.ask()
        trial.suggest_int(search.MAX_SLOTS_PARAM, 0, max(comp.contender, 1))
        for key, value in comp.as_dict().items():
            if isinstance(value, float) and not math.isfinite(value):
                value = None
            trial.set_user_attr(key, value)
        trial.set_user_attr("role", "contender")
        if comp.verdict == BEHIND:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif math.isfinite(comp.advantage.estimate):
            study.tell(trial, objective + comp.advantage.estimate)
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)


def _store_live(
    store: Store,
    model_name: str,
    host: str,
    answer: int,
    n_max: int,
    objective: float,
    report: TuneReport,
    started: Recommendation,
    tune_n_max: bool,
    weights: np.ndarray,
) -> Recommendation:
    """The settled answer as the recommendation that stands for the fit of the data now. Live
    pairs compare thresholds on the drafting launch; whether to draft at all rests on plain's
    launches, so the model says it, on the fit of the data now, as recommend does."""
    standing = report.settled
    assert standing is not None
    fit = current_fit(store, model_name, host)
    policy = Policy.of_max_slots(answer, n_max)
    reasons = [_head_reason(standing, answer, report)]
    plain = choice.plain_verdict(fit.model, np.asarray(weights), policy)
    said = plain.reason(objective)
    plain_advantage, drafting_pays = plain.advantage, not plain.plain_ahead
    live = report.plain
    if live is not None and live.verdict != settle.UNRESOLVED:
        said = _plain_live_reason(live, answer)
        low, high = live.advantage.bounds(settle.CONFIDENCE)
        plain_advantage = (live.advantage.estimate, low, high)
        drafting_pays = live.verdict != AHEAD
    elif live is not None and live.passes > 0:
        # measured and unresolved: said, whichever side the model's estimate leans to, so that
        # an answer that keeps drafting does not read as one that showed drafting pays
        unresolved = _plain_live_reason(live, answer, model=plain.advantage)
        if drafting_pays:
            said = unresolved
        else:  # the model showed plain ahead; the side by side, unresolved, does not overturn it
            reasons.append(unresolved)
    if said is not None:
        reasons.insert(0, said)
    for comp in standing.comparisons:
        low, high = comp.advantage.bounds(settle.CONFIDENCE)
        code = ReasonCode.PRUNED if comp.verdict == BEHIND else ReasonCode.LIVE_TRIALS
        if comp.verdict == settle.UNRESOLVED:
            code = ReasonCode.UNRESOLVED
        reasons.append(
            Reason(
                code,
                f"N={comp.contender} against N={answer}: {comp.advantage.estimate:+.2f} tok/s "
                f"weighted, one-sided 95 % bounds [{low:+.2f}, {high:+.2f}] "
                f"(df {comp.advantage.df:.1f}, levels {', '.join(map(str, comp.levels))}): "
                f"{comp.verdict}",
            )
        )
    if len(standing.tie) > 1:
        reasons.append(
            Reason(
                ReasonCode.TIE,
                f"N in {standing.tie} are equivalent within +-{standing.tolerance:.2f} tok/s: "
                f"the smallest, N={min(standing.tie)}, is the answer",
            )
        )
    rec = Recommendation(
        id=0,
        model=model_name,
        host=host,
        policy=policy,
        fit_id=fit.id,
        objective=objective,
        objective_interval=None,
        tune_n_max=tune_n_max or started.tune_n_max,
        study_name=report.study_name,
        sampler="live comparisons",
        trials=1 + len(standing.comparisons),
        reasons=reasons,
        measure_next=list(standing.measure_next),
        table=advice.prediction_table(fit.model, policy, fit.measured),
        alternatives=[c.as_dict() for c in standing.comparisons],
        source="live",
        tie=list(standing.tie),
        plain_advantage=plain_advantage,
        drafting_pays=drafting_pays,
    )
    recommendations.save(store, rec, {"tune": report.as_dict()})
    return rec


def _plain_live_reason(
    live: PlainLive, answer: int, model: tuple[float, float, float] | None = None
) -> Reason:
    """Whether to draft at all, as measured side by side; where that is unresolved, with the
    model's verdict (model: plain - answer, point and one-sided bounds) beside it."""
    low, high = live.advantage.bounds(settle.CONFIDENCE)
    figures = (
        f"plain (no draft model) against N={live.against}, measured side by side (plain's "
        f"launch beside the drafting launch, in turn at every level, {live.passes} passes): "
        f"{live.advantage.estimate:+.2f} tok/s weighted, one-sided 95 % bounds "
        f"[{low:+.2f}, {high:+.2f}] (df {live.advantage.df:.1f}): {live.verdict}"
    )
    if live.against != answer:
        figures += (
            f"; the tie questions asked after it moved the answer to N={answer}, not measured "
            "against plain in the budget left"
        )
    if live.verdict == AHEAD:
        return Reason(
            ReasonCode.PLAIN_AHEAD,
            f"drafting does not pay for this traffic: {figures}; serve without the draft model "
            f"(N={answer} is the least costly threshold for a server that keeps it)",
        )
    if live.verdict == settle.UNRESOLVED:
        if model is not None:
            point, m_low, m_high = model
            figures += (
                f"; the model, from the profile's separate launches: {point:+.2f} tok/s "
                f"[{m_low:+.2f}, {m_high:+.2f}]"
            )
        return Reason(
            ReasonCode.PLAIN_UNRESOLVED,
            f"whether to draft at all is unresolved side by side: {figures}; the answer "
            "before it stands; more plain passes (`--plain-budget`) narrow it, though a difference "
            "near the tolerance may need more than minutes",
        )
    return Reason(ReasonCode.LIVE_TRIALS, f"drafting pays: {figures}")


def _bounds_text(c: settle.Comparison, answer: int | None = None) -> str:
    low, high = c.advantage.bounds(settle.CONFIDENCE)
    text = f"{c.advantage.estimate:+.2f} tok/s [{low:+.2f}, {high:+.2f}]"
    if c.against is not None and c.against != answer:
        text += f" against N={c.against}, the best estimate"
    return text


def _head_reason(standing: settle.Standing, answer: int, report: TuneReport) -> Reason:
    pairs = sum(d.n for d in report.gains.values())
    how = f"{report.sweeps} sweep(s), {pairs} pairs, {report.seconds:.0f} s, {report.way}"
    if standing.status == settle.SETTLED:
        edge = [standing.question(n) for n in standing.edge]
        return Reason(
            ReasonCode.SETTLED,
            f"N={answer}: every contender shown behind or within +-{standing.tolerance:.2f} "
            f"tok/s (one-sided 95 %) live ({how})"
            + "".join(
                f"; N={q.contender} sits at the tolerance's edge ({_bounds_text(q, answer)}): "
                f"neither equivalent nor clearly beyond, so the better N={answer} stands"
                for q in edge
                if q is not None
            ),
        )
    if standing.status == settle.OPEN:
        parts = []
        if standing.unresolved:
            parts.append(
                "the data show neither a difference nor equivalence for "
                + ", ".join(f"N={c.contender}" for c in standing.unresolved)
            )
        parts += [
            f"N={c.contender} may tie with it: {_bounds_text(c, answer)}, not yet shown within "
            f"+-{standing.tolerance:.2f} or beyond"
            for c in standing.tie_questions
        ]
        return Reason(
            ReasonCode.UNRESOLVED,
            f"N={answer} stands, but "
            + "; ".join(parts)
            + f" ({how}); measure next at "
            + ", ".join(f"{c} streams" for c in standing.measure_next),
        )
    return Reason(ReasonCode.LIVE_TRIALS, f"N={answer}: the answer kept moving ({how})")
