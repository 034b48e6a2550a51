"""Where a level is measured: a schedule's rounds run through a backend and recorded.

The profiler is the driver between three seams: the pure schedule (measure/schedule.py: which
policy measures which cell in which order), a backend (measure/backend.py: relaunch, live
switch, attached, or the twin) and the run recorder (measure/recorder.py: the run's rows).

Passes: by default the policies are interleaved (see the schedule): pass after pass, the launches
take turns and each policy measures one round at every cell still open, so a drift of the
machine over the minutes of a profile hits every policy alike and the rounds of one pass are
paired neighbours. A policy's cell closes once it has min_repeats and a stable step time, or
max_repeats; the policies beside it there go on only if they are not stable yet. (A round more
of a policy already stable would only move its median: at 192 tokens a round, closing cells
together had the third pass measure always draft at 8 streams, 29 s, because the threshold
beside it had moved 5 % between launches.) With `workload.interleave = false`: one policy
after another, each repeating its cells until they are stable. Before the first round at a
depth in each pass, each launch prefills its streams' padding there (unmeasured).

Each round is committed as soon as it finishes, so a crash or Ctrl-C loses at most the round in
flight, and `resume` finishes only what is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, LoadError, ServerError
from tuner.measure import kernel
from tuner.measure.backend import AttachedBackend, Backend, ServerBackend
from tuner.measure.fingerprint import probe_host
from tuner.measure.load import (
    Workload,
    pause_in_window,
    summarize,
)
from tuner.measure.plan import (
    Observer,
    ProgressEvent,
    Target,
    profile_policies,
    quiet,
)
from tuner.measure.preflight import preflight
from tuner.measure.prompts import PromptSet, load_prompts
from tuner.measure.recorder import (
    N_MAX_SUFFIX,
    Context,
    RunRecorder,
    find_resumable_run,
    gather_context,
)
from tuner.measure.roundmarks import Disturbances, Disturbed, round_marks, stall_of
from tuner.measure.schedule import (
    Arms,
    Cell,
    Step,
    launch_groups,
    plan_pass,
    policies_of,
    with_off_arms,
)
from tuner.measure.spec import ProfileSpec
from tuner.measure.stats import depth_slowdown, stable
from tuner.policy import Policy
from tuner.storage.store import Store

__all__ = [
    "N_MAX_SUFFIX",
    "Cell",
    "Context",
    "Profiler",
    "find_resumable_run",
    "gather_context",
    "profile",
]


STALL_TRIES = 3  # a round that stalls (Profiler._stall) is measured again, at most twice


@dataclass
class Profiler:
    """Runs schedules of policies x cells through a backend and records every round."""

    store: Store
    spec: ProfileSpec
    log_dir: Path
    observer: Observer = quiet
    api_key: str | None = None
    run_id: int | None = None
    backend: Backend | None = None  # default: a relaunching/live ServerBackend (switch)
    switch: str = "auto"
    side_by_side: bool = False  # the default backend keeps plain's launch beside the drafting one
    recorder: RunRecorder = field(init=False)
    _prompt_set: PromptSet | None = None
    # The depth live runs and attach measure at when a caller names concurrencies only: the
    # spec's shallowest. A profile measures (depth, concurrency) cells.
    depth: int = field(init=False)
    reopened: bool = field(init=False, default=False)  # a resumed run (reopen_run)
    # This command's rounds, and those other programs or others' requests disturbed (the
    # summary at its end)
    _others: Disturbances = field(init=False, default_factory=Disturbances)
    # On the backend's clock: past it a disturbed round is not measured again, and once a
    # round was disturbed a pass measures no further round, so a budgeted command on a busy
    # machine (rounds there can take many times as long) still ends near its budget; on a
    # quiet one a pass finishes the pairs it started. None: no deadline.
    deadline: float | None = None
    _disturbed: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.depth = self.spec.workload.context_tokens[0]
        self.recorder = RunRecorder(self.store, self.spec, self.run_id)
        if self.backend is None:
            self.backend = ServerBackend(
                self.spec, self.log_dir, self.observer, self.switch, side_by_side=self.side_by_side
            )

    def past_deadline(self) -> bool:
        assert self.backend is not None
        return self.deadline is not None and self.backend.elapsed >= self.deadline

    @property
    def depths(self) -> list[int]:
        return list(self.spec.workload.context_tokens)

    @property
    def way(self) -> str:
        assert self.backend is not None
        return self.backend.way

    # -- the run (see RunRecorder) --

    def create_run(self, context: Context, kind: str = "profile", label: str | None = None) -> int:
        self.run_id = self.recorder.create_run(context, kind, label, way=self.way)
        self._tell_backend_run()
        return self.run_id

    def reopen_run(self, run_id: int) -> None:
        self.recorder.reopen_run(run_id)
        self.run_id = run_id
        self.reopened = True
        self._tell_backend_run()

    def _tell_backend_run(self) -> None:
        if isinstance(self.backend, ServerBackend):
            self.backend.run_id = self.run_id

    def guarded(self, body: Callable[[], None], resume_hint: str = "tuner profile SPEC") -> int:
        """Run body with the backend closed afterwards; record the run as completed, failed or
        interrupted, and re-raise failures."""

        def closing() -> None:
            try:
                body()
            finally:
                assert self.backend is not None
                self.backend.close()
                for text in self._others.summary():
                    self.observer(ProgressEvent("message", text=f"warning: {text}"))

        return self.recorder.guarded(closing, resume_hint)

    def level_name(self, config: Target) -> str:
        return self.recorder.level_name(config)

    def repeats_by_cell(
        self, policies: list[Policy] | None = None, cell: Cell | None = None, which: str = "repeats"
    ) -> dict:
        """The run's stored rounds by (config, depth, concurrency): the counted ones, or with
        which="stalled" those set aside."""
        return self.recorder.repeats_by_cell(policies, which, cell)  # type: ignore[arg-type]

    def last_pass(self) -> int | None:
        return self.recorder.last_pass()

    def record_level(
        self,
        config: Target,
        concurrency: int,
        repeats: list[tuple[list, dict[str, Any]]],
        depth: int | None = None,
    ) -> int:
        return self.recorder.record_level(
            config, concurrency, repeats, self.depth if depth is None else depth
        )

    def record_kernel(self, points: list[kernel.KernelPoint]) -> None:
        self.recorder.record_kernel(points)

    # -- what a round sends --

    def request_workload(self, depth: int = 0, output_scale: float = 1.0) -> Workload:
        w = self.spec.workload
        if w.prompts is not None and self._prompt_set is None:
            self._prompt_set = load_prompts(w.prompts)
        return Workload(
            prompt_tokens=w.prompt_tokens,
            max_tokens=w.max_tokens,
            stream=w.stream,
            request_timeout_s=w.request_timeout_s,
            prompts=self._prompt_set,
            output=w.output.lengths(w.max_tokens),
            seed=w.seed,
            depth=depth,
            output_scale=output_scale,
            min_tokens=w.depth_min_tokens,
        )

    def output_scale(self, config: Target, depth: int, concurrency: int) -> float:
        """Equal time at depth: a deep cell's outputs shortened by how much slower its steps are
        than at the shallowest depth, as this run measured them so far (1 at the shallowest,
        with `depth_output = "full"`, or before any deep step of the configuration)."""
        shallow = self.depths[0]
        if depth == shallow or self.spec.workload.depth_output != "equal-time":
            return 1.0
        steps = self.recorder.depth_steps(config)
        slowdown = depth_slowdown(steps, shallow, depth, concurrency)
        return 1.0 if slowdown is None or slowdown <= 1.0 else 1.0 / slowdown

    # -- rounds --

    def measure_step(self, step: Step) -> int:
        """One round of the schedule: measured through the backend, stored with its pass, pair
        and round key; returns the level id. A failure marks the level failed and raises."""
        assert self.backend is not None
        policy, (depth, concurrency) = step.policy, step.cell
        level = self.recorder.level_row(policy, step.cell)
        repeat = self.recorder.next_repeat(level)
        workload = self.request_workload(depth, self.output_scale(policy, depth, concurrency))
        for attempt in range(1, STALL_TRIES + 1):
            try:
                measured = self.backend.measure(policy, step.cell, step.round_key, workload)
            except (ServerError, LoadError) as exc:
                self.recorder.fail_level(level.id, str(exc))
                raise
            figures = summarize(measured.samples, concurrency)
            paused = pause_in_window(measured.samples, concurrency)
            marks, disturbed = self._others.mark(measured, figures.tokens_per_second)
            unwatched = getattr(self.backend, "unwatched", None)
            if unwatched and self._others.rounds == 1:
                self.observer(ProgressEvent("message", text=f"note: {unwatched}"))
            stall = disturbed or self._stall(step, paused, figures.tokens_per_second)
            if stall is not None:
                self._disturbed += 1
            if stall is None or attempt == STALL_TRIES or self.past_deadline():
                break
            # Kept, not counted, and the same round (key, prompts, seeds) measured again: a
            # minute the machine stood still is not a figure of the policy.
            self.recorder.store_repeat(
                level.id, repeat, measured.samples, figures, measured.drafting, step,
                {"seconds": measured.seconds, "stall": stall, **marks}, stalled=True,
            )  # fmt: skip
            repeat += 1
            self._warn_stall(policy, concurrency, stall, "measuring the round again")
        extra: dict[str, Any] = {"seconds": measured.seconds, **marks}
        if paused is not None:  # kept for every round: what a stall stands out from
            extra["longest_pause_s"] = paused[0]
        if stall is not None:  # stalled every time: kept as measured, and said so
            extra["stall"] = stall
            why = (
                "the budget is spent"
                if attempt < STALL_TRIES
                else f"it stalled {STALL_TRIES} times in a row"
            )
            self._warn_stall(policy, concurrency, stall, f"{why}, so this one is kept as measured")
        n_max = self.spec.speculative.n_max
        name = self.level_name(policy)
        marks, warnings = round_marks(policy, concurrency, measured, figures, n_max, name)
        extra.update(marks)
        for text in warnings:
            self.observer(ProgressEvent("message", text=text))
        self.recorder.store_repeat(
            level.id, repeat, measured.samples, figures, measured.drafting, step, extra
        )
        if figures.failed:
            error = measured.failure
            if error is None:
                first = next(s.error for s in measured.samples if not s.ok)
                where = f"during {self.level_name(policy)} at concurrency {concurrency}"
                error = f"{figures.failed} of {concurrency} requests failed {where} ({first})"
            self.recorder.fail_level(level.id, error)
            raise LoadError(error)
        self.observer(
            ProgressEvent(
                "repeat",
                advance=1,
                config=self.level_name(policy),
                concurrency=concurrency,
                repeat=repeat,
                figures=figures,
                depth=depth,
            )
        )
        return level.id

    def _stall(
        self, step: Step, paused: tuple[float, float] | None, rate: float | None
    ) -> str | None:
        """Why the round is a stall of the machine (roundmarks.stall_of), or None; the halves of
        its pair it shows up as stalls are set aside (kept, no longer counted)."""
        stall, earlier = stall_of(
            self.level_name(step.policy),
            step,
            paused,
            rate,
            self.repeats_by_cell(cell=step.cell),
        )
        for config, why in earlier.items():
            if self.recorder.set_aside(config, step.cell, step.round_key, why):
                aside = "set aside (kept, no longer counted)"
                self._warn_stall(config, step.concurrency, why, aside)
        return stall

    def _warn_stall(self, policy: Target | str, concurrency: int, stall: str, what: str) -> None:
        name = policy if isinstance(policy, str) else self.level_name(policy)
        said = stall if isinstance(stall, Disturbed) else f"the machine stalled ({stall})"
        text = f"warning: {name} at {concurrency} streams: {said}; {what}"
        self.observer(ProgressEvent("message", text=text))

    def run_steps(self, steps: Sequence[Step]) -> None:
        """A pass's steps in order; each launch prefills a depth's padding (for the widest level
        it measures there in the pass) before its first round at that depth in the pass."""
        assert self.backend is not None
        # the launch that holds a policy's cache: its schedule group, except side by side
        key = getattr(self.backend, "server_key", self.backend.launch_key)
        widest: dict[tuple[Any, int, int], int] = {}
        for s in steps:
            k = (key(s.policy), s.depth, s.pass_index)
            widest[k] = max(widest.get(k, 0), s.concurrency)
        prefilled: set[tuple[Any, int, int]] = set()
        for step in steps:
            if self._disturbed and self.past_deadline():
                text = "budget spent on a disturbed machine: the pass ends here"
                self.observer(ProgressEvent("message", text=text))
                return
            k = (key(step.policy), step.depth, step.pass_index)
            if step.depth > 0 and k not in prefilled:
                self.prefill(step.policy, step.depth, widest[k])
            prefilled.add(k)
            self.measure_step(step)

    def prefill(self, policy: Target, depth: int, streams: int) -> None:
        """A depth's padding prefilled for streams on the policy's launch (not measured)."""
        assert self.backend is not None
        seconds = self.backend.prefill(policy, depth, streams, self.request_workload(depth))
        self.observer(
            ProgressEvent(
                "message",
                text=f"{self.level_name(policy)}: prefilled depth {depth} for {streams} streams "
                f"in {seconds:.1f} s (not measured)",
            )
        )

    # -- passes --

    def _level_done(self, repeats: list[dict]) -> bool:
        w = self.spec.workload
        return len(repeats) >= w.max_repeats or (
            len(repeats) >= w.min_repeats and stable(repeats, w)
        )

    def run_passes(self, arms: Arms, max_passes: int | None = None) -> None:
        """Passes over the arms until every policy's cells have closed (see the module
        docstring): each policy's cell on its own repeats.

        A resumed run starts again at its newest pass: a policy that measured a cell in it
        already is not asked for that cell again."""
        assert self.backend is not None
        w = self.spec.workload
        policies = policies_of(arms)
        self.check_switch(arms)
        state = self.repeats_by_cell(policies)
        last = self.last_pass()
        first = last if last is not None else self.recorder.next_pass()
        open_arms = {cell: list(ps) for cell, ps in arms.items()}
        passes = max_passes or w.max_repeats

        def reps_of(policy: Policy, cell: Cell) -> list[dict]:
            return state.get((self.level_name(policy), *cell), [])

        def set_aside() -> dict[tuple[str, int, int], int]:
            """Rounds measured, then set aside as stalled, by cell: done, for the plan's count."""
            stalled = self.recorder.repeats_by_cell(policies, which="stalled")
            return {k: sum(1 for r in v if r.get("set_aside")) for k, v in stalled.items()}

        aside = set_aside()

        def done(policy: Policy, cell: Cell) -> int:
            key = (self.level_name(policy), *cell)
            return len(state.get(key, [])) + aside.get(key, 0)

        def stored(step: Step) -> bool:
            reps = reps_of(step.policy, step.cell)
            return done(step.policy, step.cell) >= w.max_repeats or any(
                r.get("pass") == step.pass_index and r.get("pair", 0) == step.pair for r in reps
            )

        flip = self.start_on_the_launch_up(open_arms, first)
        for p in range(first, first + passes + 1):
            self.run_steps(plan_pass(open_arms, self.backend.launch_key, p, done=stored, flip=flip))
            state, aside = self.repeats_by_cell(policies), set_aside()
            for cell in list(open_arms):
                closing = [p for p in open_arms[cell] if self._level_done(reps_of(p, cell))]
                if closing:
                    self.recorder.close_levels(closing, cell)
                for policy in closing:
                    self.observer(
                        ProgressEvent(
                            "level",
                            advance=max(0, w.max_repeats - done(policy, cell)),
                            config=self.level_name(policy),
                            concurrency=cell[1],
                        )
                    )
                open_arms[cell] = [p for p in open_arms[cell] if p not in closing]
                if not open_arms[cell]:
                    del open_arms[cell]
            if not open_arms:
                return
        for cell, ps in open_arms.items():  # cannot happen: max_repeats passes fill every cell
            self.recorder.close_levels(ps, cell)

    def check_switch(self, arms: Arms) -> None:
        """Before planning: where the backend has a live switch to check, it checks it on the
        policies that still have rounds to measure in arms, and the run records the way it
        measures. A resumed run with no drafting round left launches no drafting server for the
        check, and keeps the way it recorded."""
        check = getattr(self.backend, "check_switch", None)
        if check is None:
            return
        state = self.repeats_by_cell(policies_of(arms))
        full = self.spec.workload.max_repeats
        needed = [
            p
            for p in policies_of(arms)
            if any(
                p in ps and len(state.get((self.level_name(p), *cell), [])) < full
                for cell, ps in arms.items()
            )
        ]
        if self.reopened and not any(p.drafting for p in needed):
            return
        self.recorder.set_way(check(needed))

    def start_on_the_launch_up(self, arms: Arms, pass_index: int) -> bool:
        """Whether to run this command's passes in the other direction: where the backend has a
        launch up (the drafting launch that checked the live switch) that the pass would
        otherwise meet last, starting there saves stopping it and loading the model again."""
        assert self.backend is not None
        up = getattr(self.backend, "up_key", None)
        if up is None:
            return False
        groups = launch_groups(arms, self.backend.launch_key)
        if pass_index % 2:  # odd passes take the launch groups the other way round
            groups.reverse()
        return len(groups) > 1 and groups[-1] == up

    def run_pass(self, arms: Arms, pairs: int = 1) -> int:
        """One pass of the schedule over the arms, as the run's next pass; returns its index.
        Where a launch holds two policies at a cell they alternate `pairs` times (A B B A for
        two)."""
        assert self.backend is not None
        self.check_switch(arms)
        p = self.recorder.next_pass()
        flip = self.start_on_the_launch_up(arms, p)
        steps = plan_pass(arms, self.backend.launch_key, p, pairs, flip=flip)
        self.observer(ProgressEvent("plan", total=len(steps)))
        self.run_steps(steps)
        return p

    def arms(self, policies: list[Policy], cells: list[Cell]) -> dict[Cell, list[Policy]]:
        """Every policy at every cell, and the off arms the backend's launches measure
        (schedule.with_off_arms)."""
        assert self.backend is not None
        return with_off_arms(policies, cells, self.backend.launch_key)

    def execute(
        self, policies: list[Policy], kernel_level: bool = True, levels: list[int] | None = None
    ) -> int:
        """Measure every pending cell of every policy (interleaved unless the spec says
        otherwise), record the outcome; return the run id."""
        cells = [(d, c) for d in self.depths for c in (levels or self.spec.levels)]

        def open_arms_now() -> Arms:
            arms = self.arms(policies, cells)
            todo = self.recorder.pending(policies_of(arms), cells)
            open_arms = {
                cell: [p for p in ps if cell in todo[self.level_name(p)]]
                for cell, ps in arms.items()
            }
            return {cell: ps for cell, ps in open_arms.items() if ps}

        def body() -> None:
            # The way decides which launch holds which policy: the arms are planned again
            # after the check.
            self.check_switch(open_arms_now())
            open_arms = open_arms_now()
            rounds = sum(map(len, open_arms.values()))
            self.observer(ProgressEvent("plan", total=rounds * self.spec.workload.max_repeats))
            if self.spec.workload.interleave:
                if open_arms:
                    self.run_passes(open_arms)
            else:
                for policy in policies_of(open_arms):
                    alone = {c: [policy] for c, ps in open_arms.items() if policy in ps}
                    self.run_passes(alone)
            if kernel_level:
                self.run_kernel()

        return self.guarded(body)

    def run_config(
        self, policy: Policy, levels: Sequence[int | Cell], pass_index: int | None = None
    ) -> None:
        """One policy's rounds at the levels (concurrencies at the profiler's depth, or cells),
        as one pass of the schedule."""
        cells = [(self.depth, c) if isinstance(c, int) else c for c in levels]
        p = pass_index if pass_index is not None else self.recorder.next_pass()
        self.run_steps([Step(policy, cell, p) for cell in cells])

    # -- attached servers (measure/attach.py) --

    def attach_backend(self, url: str) -> AttachedBackend:
        backend = AttachedBackend(url, self.api_key)
        self.backend = backend
        return backend

    # -- kernel rows --

    def run_kernel(self) -> None:
        if self.recorder.has_kernel_rows():
            return

        def say(kind: str, text: str) -> None:
            self.observer(ProgressEvent(kind, text=text))

        points = kernel.measure_spec(self.spec, self.log_dir / f"run-{self.run_id}", say)
        if points is not None:
            self.record_kernel(points)


# --- entry points ----------------------------------------------------------------------------


def profile(
    store: Store,
    spec: ProfileSpec,
    log_dir: Path,
    observer: Observer = quiet,
    resume: bool = False,
    host_name: str | None = None,
    skip_preflight: bool = False,
    switch: str = "auto",
    backend: Backend | None = None,
    plain: bool = True,
) -> int:
    """`tuner profile`: measure plain, spec (and a threshold) at every level; returns the run id.

    switch: how drafting policies are switched (auto: live where the server reads the threshold
    back, else relaunch; relaunch; live: fail when the live switch does not work). backend:
    measure on it (the twin's) instead of launching the spec's server: nothing is probed or
    preflighted; plain false: no plain (a running server tuned without a plain server)."""
    if backend is not None:
        context = Context(spec.model_name, None, None, probe_host(None, host_name))
    else:
        context = gather_context(spec, host_name, store)
        has_switch = bool(context.build and context.build.has_max_slots)
        if spec.speculative.threshold and not has_switch:
            raise ConfigError(
                f"speculative.threshold needs a llama-server with --spec-draft-max-slots; "
                f"{spec.server.binary} does not list it in --help"
            )
        if not has_switch:
            if switch == "live":
                raise ConfigError(
                    f"--switch live needs a llama-server with --spec-draft-max-slots; "
                    f"{spec.server.binary} does not list it in --help"
                )
            switch = "relaunch"
    policies = profile_policies(spec, plain)
    if not skip_preflight and backend is None:
        preflight(spec, policies, log_dir, observer)
    profiler = Profiler(store, spec, log_dir, observer, switch=switch, backend=backend)
    run_id = find_resumable_run(store, spec, host_name=context.host.name) if resume else None
    if run_id is not None:
        profiler.reopen_run(run_id)
        observer(ProgressEvent("message", text=f"resuming run {run_id}"))
    else:
        if resume:
            observer(ProgressEvent("message", text="no unfinished run of this spec: starting anew"))
        profiler.create_run(context)
    return profiler.execute(policies, kernel_level=backend is None)
