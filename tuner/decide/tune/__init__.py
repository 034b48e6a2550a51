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
   levels unresolved comparisons rest on, and while some of those hold fewer than two pairs,
   only those (for two sweeps at most: sweeps.thin_first). An answer it left may come back:
   the data then hold every pair the step away saw and more, so the move back is followed
   once; a second return stops with the latest answer, unresolved, and the levels between the
   two to measure next.
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
   `plain_budget_s` (150 s by default: on the bench's twin three passes, where 90 s gave
   two; a comparison over levels of the same passes has the passes less one degrees of
   freedom, and two passes are one). Where a tie then moves the answer, plain is measured
   against the new one with what is left of that budget (one plain budget a tune, whatever
   answers it is spent on); until that resolves, the verdict against the earlier answer
   stands and says which N it was. Without
   it, or while it is unresolved, the cost model over plain's separate launches says
   (choice.plain_verdict).

Every evaluated N is a trial of an Optuna study in the tuner's database (`tuner:live:run<ID>`):
its parameters are N (and n_max), its value the answer's model objective plus the measured
advantage, its user attributes the advantage, bounds, verdict and levels; contenders shown
behind are pruned. The answer is stored as the recommendation that stands (source "live"), so
`recommend` and `report` give the same N while the data stay the same.

The package, a module a job: gains.py (what the stored rounds say), sweeps.py (the plan of
the next sweep), machine.py (the decision loop as a state machine), persist.py (the study
and the recommendation stored), describe.py (the words), outcome.py (the report).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.decide import advice, settle, validate
from tuner.decide.tune.describe import question_text, sweep_text
from tuner.decide.tune.gains import MIN_BLOCKS, MIN_SEEDS, acceptance_pool, live_gains, plain_gains
from tuner.decide.tune.machine import MAX_MOVES, Limits, Tuning
from tuner.decide.tune.outcome import PlainLive, TuneReport
from tuner.decide.tune.persist import open_study, store_live, tell
from tuner.decide.tune.sweeps import SWEEP_PAIRS, model_objective, sweep_arms
from tuner.errors import ConfigError
from tuner.measure.backend import Backend
from tuner.measure.plan import Observer, quiet
from tuner.policy import Policy
from tuner.storage.fits import current_fit
from tuner.storage.store import Store

__all__ = [
    "DEFAULT_BUDGET_S",
    "DEFAULT_PLAIN_BUDGET_S",
    "DEFAULT_TIE_BUDGET_S",
    "MAX_MOVES",
    "MIN_BLOCKS",
    "MIN_SEEDS",
    "SWEEP_PAIRS",
    "PlainLive",
    "TuneReport",
    "acceptance_pool",
    "live_gains",
    "model_objective",
    "plain_gains",
    "question_text",
    "sweep_arms",
    "sweep_text",
    "tune",
]

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
DEFAULT_PLAIN_BUDGET_S = 150.0


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
    """`tuner tune`: settle N live (see the package docstring); returns its report.

    budget_s: seconds of measuring before it stops unresolved; tie_budget_s: seconds of
    measuring after which tie questions are named, not measured on; plain_budget_s: seconds of
    measuring plain against the answer may take (plain_live); tolerance: the share of the
    objective a contender may be ahead by and the answer still hold; tune_n_max: the model's
    study over (N, n_max) picks the draft length the answer is settled at; backend: measure on
    this backend (the twin's) instead of launching the profile's llama-server; plain_live:
    settle whether to draft at all side by side (step 5 above)."""
    limits = Limits(budget_s, tie_budget_s, plain_budget_s, tolerance, plain_live)
    _check(limits)
    fit = current_fit(store, model_name, host, seed=seed)  # once: the data the answer starts from
    rec = advice.standing(store, model_name, host, seed=seed, fit=fit)
    study_now = advice.model_study(
        store, model_name, host, seed=seed, tune_n_max=tune_n_max, fit=fit
    )
    cm, weights = study_now.fit.model, study_now.weights
    n_max = (rec.n_max or cm.n_max) if tune_n_max else cm.n_max
    answer = rec.policy.effective(cm.n_parallel)

    stored_spec = validate.profile_spec_of(store, model_name, host, launching=backend is None)
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
    workload_now = spec.model_dump(mode="json")["workload"]
    started = profiler.backend.elapsed
    t = Tuning(
        store, model_name, host, observer, profiler, report, cm, weights, n_max, workload_now,
        limits, answer, started,
    )  # fmt: skip
    profiler.guarded(t.run, resume_hint=f"tuner tune --model {model_name}")
    report.way = profiler.way
    report.seconds = profiler.backend.elapsed - started
    assert report.settled is not None
    study = open_study(store, name, seed)
    tell(study, report.settled, t.answer, n_max, t.objective, tune_n_max)
    report.standing = store_live(
        store, model_name, host, t.answer, n_max, t.objective, report, rec, tune_n_max, weights
    )
    return report


def _check(limits: Limits) -> None:
    if limits.budget_s <= 0:
        raise ConfigError("--budget must be above 0")
    if limits.tie_budget_s < 0 or limits.plain_budget_s < 0:
        raise ConfigError("--tie-budget and --plain-budget must be 0 or more")
    if not 0 < limits.tolerance < 1:
        raise ConfigError("--tolerance is a share of the objective between 0 and 1, e.g. 0.01")
