"""Backends: how a schedule's rounds reach a server, one interface for every way of switching.

The schedule (measure/schedule.py) says which policy measures which cell in which order; a
backend makes the server behave as that policy and measures one round there:

- `relaunch`: one llama-server launch per policy (any build, a stock one too). The launch that
  ends a pass is kept for the next (the schedule arranges that), every other change of policy
  starts a fresh launch: warm-up, and prefill of deep context, again.
- `live`: every drafting policy shares one launch, started with `--props`; the threshold is
  switched between rounds through `POST /props` and read back through `GET /props`. The switch
  is trusted only once it reads back and the draft counters follow it (a stock llama-server
  with `--props` answers the POST with 200 and changes nothing; `check_live_switch`, which
  `tuner check` runs on any URL too); otherwise the backend falls back to relaunching and says
  so, unless the user forced live. Plain (no draft model) keeps
  launches of its own: only "load a draft at all?" compares across launches.
- `attached`: a server the tuner did not start, measured as its operator configured it.

With `side_by_side`, a launch is not stopped when a round needs another: the last two stay up,
each on its own port, and every policy is in one group for the schedule, so plain (its own
launch) and a drafting policy alternate at a cell round by round (A B B A) as the live switch's
policies do: the halves of a pair are seconds apart and share the machine's spell, where
alternating launches put minutes and a model load between them. An idle llama-server waits on
its queue and takes no CPU; it costs a second model's memory, so only a judge that compares
"load a draft at all?" uses it (benchmarks/regret.py).

The twin's in-process backend (tuner/twin/inprocess.py) speaks the same interface in virtual time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuner.errors import ConfigError, LoadError, ServerError
from tuner.measure import client, interference, metrics
from tuner.measure.client import LlamaClient
from tuner.measure.foreign import Foreign, foreign_requests
from tuner.measure.interference import RoundLoad, Snapshot
from tuner.measure.launcher import ManagedServer
from tuner.measure.load import (
    LoadGenerator,
    RequestSample,
    Workload,
    drafts_in_flight,
    never_together,
    summarize,
)
from tuner.measure.plan import Observer, ProgressEvent, Target, launch_config, quiet
from tuner.measure.schedule import Cell
from tuner.measure.spec import ProfileSpec
from tuner.policy import Policy

EXIT_GRACE_S = 2.0  # how long a failing server may take to be seen exited before it counts as hung
RELAUNCH, LIVE, ATTACHED = "relaunch", "live", "attached"
ATTACHED_LIVE = "attached-live"  # a running server the tuner did not start, switched live
LIVE_WAYS = (LIVE, ATTACHED_LIVE, "twin")  # ways whose drafting policies share one server
SWITCH_WAYS = ("auto", RELAUNCH, LIVE)  # what a user may ask for
SIDE_BY_SIDE = ("side-by-side",)  # the one launch group of a side-by-side backend's policies
# Tokens per stream of the two streamed rounds that check the live switch. The check counts the
# draft tokens made while both streams generated (the window of summarize, from the server's
# per-token draft counters), so the drafts a threshold of 1 lets through while the second
# stream's prompt is processed, which made a whole-round count need 64 tokens a stream, do not
# count. At 32 the bench drafted 44-47 tokens in that window at threshold 0 and 0-3 at 1 (the
# allowance in flight: 12); longer drafts accept more a step and take fewer steps, so the rounds
# grow with n_max (5 tokens a draft position) to keep several steps in the window.
CHECK_TOKENS = 32
# Rounds the check may take at a threshold until its 2 streams generate together: on a busy
# machine the second stream's request can reach the server after the first has finished.
CHECK_TRIES = 3


@dataclass
class Measured:
    """One round as a backend measured it."""

    samples: list[RequestSample]
    drafting: dict[str, Any]  # /metrics deltas over the round (drafts, tokens, accepted...)
    seconds: float  # what the round took on the backend's clock (virtual time for the twin)
    max_slots: int | None = None  # live: the threshold /props reported for the round
    # Where requests failed: what the backend makes of it (the server's death named, or a hang),
    # for the level's error; None where it knows nothing more than the requests' own errors.
    failure: str | None = None
    machine: RoundLoad | None = None  # what the rest of the machine did (None: not watched)
    foreign: Foreign | None = None  # others' requests the round overlapped


def switch_problem(name: str, drafted: dict[int, int | None], n_max: int) -> str | None:
    """The live switch check's verdict, pure: drafted holds the draft tokens a server made while
    both of 2 streams generated, at threshold 1 and at 0 (None: no per-token counters). Threshold
    1 may finish the drafts in flight when the second stream started (load.drafts_in_flight, the
    profiler's allowance too) and start none; threshold 0 must draft past that allowance, or
    nothing shows that the switch works. None where both hold, else why not."""
    in_flight = drafts_in_flight(2, n_max)
    at_one, at_zero = drafted.get(1), drafted.get(0)
    if at_one is None or at_zero is None:
        return (
            f"{name} gives no per-token draft counters (timings_per_token), so the switch "
            "cannot be seen to work"
        )
    if at_zero <= in_flight:
        return (
            f"{name} drafted {at_zero} tokens while 2 streams generated with the threshold at 0 "
            f"(no more than the {in_flight} that may be in flight), so the switch cannot be "
            "seen to work"
        )
    if at_one > in_flight:
        return (
            f"the draft counters of {name} did not follow the switch ({at_one} draft tokens while "
            f"2 streams generated at threshold 1, more than the {in_flight} that may be in "
            f"flight; {at_zero} at 0)"
        )
    return None


@dataclass(frozen=True)
class SwitchCheck:
    """What check_live_switch saw: why the switch cannot be trusted (None: it can), the draft
    tokens made while both streams generated by threshold, and the draft length judged at."""

    problem: str | None
    drafted: dict[int, int | None]
    n_max: int | None


def check_live_switch(
    url: str,
    n_max: int | None,
    *,
    api_key: str | None = None,
    name: str | None = None,
    set_threshold: Callable[[int], None] | None = None,
) -> SwitchCheck:
    """The live switch check on any llama-server: a streamed round of 2 streams at threshold 1,
    then at 0, each set through POST /props and read back (set_threshold, by default
    client.set_max_slots), judged by switch_problem. It leaves the threshold at 0: a caller
    that must not change the server sets it back. n_max None (a server not yet seen drafting)
    is read from /metrics after the rounds, which then take CHECK_TOKENS a stream. Server and
    load errors become the problem's one line."""
    name = name or url

    def read_back(n: int) -> None:
        client.set_max_slots(url, n, api_key)

    switch = set_threshold or read_back
    drafted: dict[int, int | None] = {}
    try:
        if client.max_slots(url, api_key) is None:
            return SwitchCheck(
                f"{name} does not report spec_draft_max_slots in GET /props", drafted, n_max
            )
        tokens = max(CHECK_TOKENS, 5 * (n_max or 0))
        check = Workload(prompt_tokens=8, max_tokens=tokens, stream=True)
        for n in (1, 0):
            switch(n)
            samples = _check_round(LoadGenerator(url, check, api_key=api_key), name, n)
            if isinstance(samples, str):
                return SwitchCheck(samples, drafted, n_max)
            drafted[n] = summarize(samples, 2).window_drafted
        if n_max is None:
            with LlamaClient(url, api_key) as api:
                n_max = metrics.draft_length(api.metrics())
    except (ServerError, LoadError) as exc:
        return SwitchCheck(str(exc).splitlines()[0], drafted, n_max)
    if n_max is None:
        problem = f"{name} drafted nothing its /metrics counted, so the switch cannot be judged"
        return SwitchCheck(problem, drafted, None)
    return SwitchCheck(switch_problem(name, drafted, n_max), drafted, n_max)


def _check_round(generator: LoadGenerator, name: str, n: int) -> list[RequestSample] | str:
    """One round of the live switch check at threshold n whose 2 streams generated together
    (run again, up to CHECK_TRIES rounds, where they never met); why not, where none did."""
    for _ in range(CHECK_TRIES):
        samples = generator.run(2, round_key=0)
        failed = [s for s in samples if not s.ok]
        if failed:
            return f"a check round at threshold {n} failed ({failed[0].error})"
        if not never_together(samples, 2):
            return samples
    return (
        f"the check's 2 streams on {name} never generated together at threshold {n} in "
        f"{CHECK_TRIES} rounds (one reached the server after the other ended: a busy machine?), "
        "so the switch cannot be judged"
    )


class Backend(Protocol):
    """What a schedule's driver needs from a way of running policies."""

    way: str  # relaunch | live | attached | twin: recorded with the run

    def launch_key(self, policy: Target) -> Hashable:
        """Policies with the same key share one launch; changing the key costs a launch."""
        ...

    def prefill(self, policy: Target, depth: int, streams: int, workload: Workload) -> float:
        """Bring streams' padding at depth into the server's cache, unmeasured; returns the
        seconds it took (on the backend's clock)."""
        ...

    def measure(self, policy: Target, cell: Cell, round_key: int, workload: Workload) -> Measured:
        """One round of cell's concurrency under policy; raises ServerError/LoadError with the
        reason when the server died or requests failed."""
        ...

    def arrivals(
        self,
        policy: Target,
        offsets: list[float],
        round_key: int,
        lengths: list[int] | None,
        workload: Workload,
    ) -> Measured:
        """Open loop: request i released offsets[i] seconds after the start, whatever the
        earlier ones are doing; failures are in the samples."""
        ...

    @property
    def elapsed(self) -> float:
        """Seconds spent on the backend's clock so far (launches, prefill, rounds)."""
        ...

    def close(self) -> None: ...


@dataclass
class _Up:
    key: Hashable
    server: ManagedServer
    max_slots: int | None = None  # the live threshold set now (live launches)
    speed: float = 1.0  # how fast its clock runs against the wall (a twin server's --speed)
    twin: bool | None = None  # a twin server (its /props says so): asked when first needed


@dataclass
class ServerBackend:
    """llama-server launches this process starts: relaunch, or live switch among drafting
    policies (see the module docstring)."""

    spec: ProfileSpec
    log_dir: Path
    observer: Observer = quiet
    switch: str = "auto"  # auto | relaunch | live
    way: str = RELAUNCH
    run_id: int | None = None
    side_by_side: bool = False  # keep the last two launches up (see the module docstring)
    # The machine watched around each round (measure/interference.py); None: unless the server
    # is a twin, whose figures are its virtual clock's. snapshot: tests give their own.
    watch: bool | None = None
    snapshot: Callable[[], Snapshot] = interference.snapshot
    _up: _Up | None = None
    _parked: _Up | None = None  # side by side: the other launch, up and idle
    _launches: int = 0
    _checked: bool = False
    notes: list[str] = field(default_factory=list)
    _mark: float = field(default_factory=time.perf_counter)
    _spent: float = 0.0  # seconds on the servers' clocks so far (a twin's run at its --speed)
    _speed: float = 1.0  # how fast the server up now runs its clock against the wall

    def __post_init__(self) -> None:
        if self.switch not in SWITCH_WAYS:
            raise ConfigError(f"--switch: expected one of {', '.join(SWITCH_WAYS)}")
        self.way = RELAUNCH if self.switch == RELAUNCH else LIVE

    # -- which launch --

    def launch_key(self, policy: Target) -> Hashable:
        if self.side_by_side and isinstance(policy, Policy):
            return SIDE_BY_SIDE  # one group: the schedule alternates every policy at a cell
        return self.server_key(policy)

    def server_key(self, policy: Target) -> Hashable:
        """The launch that holds the policy (its cache, for prefill): launch_key, except side by
        side, where the schedule's one group spans two launches."""
        if not isinstance(policy, Policy):
            return ("attached", policy.config_name)
        if self.way == LIVE and policy.drafting:
            return ("drafting", policy.n_max or self.spec.speculative.n_max)
        return ("policy", policy.config_name, policy.n_max)

    def check_switch(self, policies: list[Policy]) -> str:
        """Before planning: with live switching asked for (or auto) and drafting policies to
        measure, launch the drafting server and check that the threshold reads back and the
        draft counters follow it. Returns the way the run measures."""
        if self._checked or self.way != LIVE:
            return self.way
        drafting = [p for p in policies if p.drafting]
        if not drafting:
            return self.way  # checked when a drafting policy first needs the server
        self._checked = True
        try:
            server = self._serve(drafting[0], check=False)
        except ServerError as exc:
            if self._up is None:  # the launch failed: not the switch's doing
                raise
            # Up, but setting its threshold did not read back (a stock build with --props).
            problem: str | None = str(exc).splitlines()[0]
        else:
            problem = self._switch_problem(server, drafting[0].n_max or self.spec.speculative.n_max)
        if problem is None:
            self.observer(
                ProgressEvent(
                    "message",
                    text=f"live switch: {server.name} reads the threshold back and its draft "
                    "counters follow it; every drafting policy is measured on this launch",
                )
            )
            return self.way
        if self.switch == LIVE:
            raise ServerError(f"--switch live: {problem}")
        self._stop()
        self.way = RELAUNCH
        note = f"{problem}: measuring by relaunching the server for every policy instead"
        self.notes.append(note)
        self.observer(ProgressEvent("message", text=note))
        return self.way

    def _switch_problem(self, server: ManagedServer, n_max: int) -> str | None:
        """Why the live switch cannot be trusted on this launch, or None (check_live_switch,
        the launch's threshold kept as it sets it)."""
        return check_live_switch(
            server.url, n_max, name=server.name, set_threshold=lambda n: self._set(server, n)
        ).problem

    @property
    def up_key(self) -> Hashable | None:
        """The launch key of the server up now (the drafting launch a switch check left up, say),
        or None."""
        if self._up is None:
            return None
        return SIDE_BY_SIDE if self.side_by_side else self._up.key

    def _set(self, server: ManagedServer, n: int) -> None:
        client.set_max_slots(server.url, n)
        assert self._up is not None
        self._up.max_slots = n

    # -- launches --

    def _launch_name(self, policy: Policy) -> str:
        if self.way == LIVE and policy.drafting:
            n_max = policy.n_max or self.spec.speculative.n_max
            return f"drafting-n{n_max}"
        return policy.config_name + (
            f"@n{policy.n_max}"
            if policy.drafting and policy.n_max not in (None, self.spec.speculative.n_max)
            else ""
        )

    def serve(self, policy: Policy) -> str:
        """Make the server behave as the policy now (launch or switch); its URL, for a caller
        that watches it while rounds run (observe during open-loop rounds)."""
        return self._serve(policy).url

    def _serve(self, policy: Policy, check: bool = True) -> ManagedServer:
        """The server for policy: the one up when its launch fits, else a fresh launch; on a live
        launch the threshold set to the policy's."""
        if check:
            self.check_switch([policy])
        key = self.server_key(policy)
        if self._up is None or self._up.key != key:
            if self.side_by_side and self._up is not None:
                self._account()
                if self._parked is not None and self._parked.key != key:
                    self._parked.server.stop()
                    self._parked = None
                self._up, self._parked = self._parked, self._up
                self._speed = 1.0 if self._up is None else self._up.speed
            else:
                self._stop()
            if self._up is None:
                self._up = _Up(key, self._launch(policy), speed=self._speed)
        if self.way == LIVE and policy.drafting:
            wanted = policy.max_slots or 0
            if self._up.max_slots != wanted:
                self._set(self._up.server, wanted)
        return self._up.server

    def _launch(self, policy: Policy) -> ManagedServer:
        name = self._launch_name(policy)
        folder = self.log_dir / (f"run-{self.run_id}" if self.run_id is not None else "runs")
        log = folder / f"{name}.log"
        n = 1
        while log.exists():  # a new log per launch: earlier launches stay readable
            n += 1
            log = log.with_name(f"{name}.{n}.log")
        live = self.way == LIVE and policy.drafting
        self.observer(
            ProgressEvent(
                "server",
                config=name,
                text=f"starting llama-server ({name}{', live switch' if live else ''}), log {log}",
            )
        )
        config = launch_config(self.spec, policy if not live else Policy.always(policy.n_max))
        if live:
            config.args = [*config.args, "--props"]
        server = ManagedServer(
            config,
            log,
            start_timeout_s=self.spec.server.start_timeout_s,
            name=f"llama-server ({name})",
        )
        server.start()
        self._launches += 1
        try:
            props = server.props()
            self._check_props(props)
            self._account()
            self._speed = client.server_speed(props)
            warm_up(self.spec, server.url, lambda where, d: self.explain(server, where, d))
        except BaseException:
            server.stop()
            raise
        return server

    def _check_props(self, props: dict[str, Any]) -> None:
        slots = props.get("total_slots")
        if slots is not None and slots < max(self.spec.levels):
            raise ConfigError(f"server has {slots} slots, fewer than level {max(self.spec.levels)}")

    def _stop(self) -> None:
        if self._up is not None:
            self._account()
            self._speed = 1.0
            self._up.server.stop()
            self._up = None

    def close(self) -> None:
        self._stop()
        if self._parked is not None:
            self._parked.server.stop()
            self._parked = None

    @property
    def launches(self) -> int:
        return self._launches

    @property
    def elapsed(self) -> float:
        self._account()
        return self._spent

    def _account(self) -> None:
        now = time.perf_counter()
        self._spent += (now - self._mark) * self._speed
        self._mark = now

    # -- rounds --

    def explain(self, server: ManagedServer | None, where: str, detail: str) -> str:
        """Why a round failed: the server's exit named (signal, likely cause) when it died, a
        hang when it is still there."""
        if server is None:
            return f"the server stopped answering {where}: {detail}"
        if server.exited_within(EXIT_GRACE_S):
            return str(server.died(where, detail))
        return f"{server.name} stopped answering {where}: {detail}"

    def prefill(self, policy: Target, depth: int, streams: int, workload: Workload) -> float:
        assert isinstance(policy, Policy)
        server = self._serve(policy)
        return prefill_server(
            server.url, depth, streams, workload, lambda w, d: self.explain(server, w, d)
        )

    def measure(self, policy: Target, cell: Cell, round_key: int, workload: Workload) -> Measured:
        assert isinstance(policy, Policy)
        server = self._serve(policy)
        where = f"during {policy.config_name} at concurrency {cell[1]}" + (
            f", depth {cell[0]}" if cell[0] else ""
        )

        def explain(at: str, detail: str) -> str:
            return self.explain(server, at, detail)

        measured = watched(
            lambda: measure_round(server.url, cell, round_key, workload, explain, where),
            self._watcher(),
            lambda: [u.server.pid for u in (self._up, self._parked) if u and u.server.pid],
        )
        if self.way == LIVE and policy.drafting and self._up is not None:
            measured.max_slots = self._up.max_slots
        return measured

    def _watcher(self) -> Callable[[], Snapshot] | None:
        """The snapshots to take around the round on the server up now; None: not watched."""
        up = self._up
        if up is None or self.watch is False:
            return None
        if self.watch is None:
            if up.twin is None:
                up.twin = "twin" in up.server.props()
            if up.twin:
                return None
        return self.snapshot

    def arrivals(
        self,
        policy: Target,
        offsets: list[float],
        round_key: int,
        lengths: list[int] | None,
        workload: Workload,
    ) -> Measured:
        assert isinstance(policy, Policy)
        server = self._serve(policy)
        measured = arrivals_round(server.url, offsets, round_key, lengths, workload)
        if self.way == LIVE and policy.drafting and self._up is not None:
            measured.max_slots = self._up.max_slots
        return measured


@dataclass
class AttachedBackend:
    """A running server the tuner did not start: measured as it is, never restarted."""

    url: str
    api_key: str | None = None
    way: str = ATTACHED
    watch: bool | None = None  # as ServerBackend's; a server elsewhere is never watched
    snapshot: Callable[[], Snapshot] = interference.snapshot
    unwatched: str | None = None  # why its machine is not watched, where it is not
    _pids: list[int] | None = None  # the server's processes here, once looked for
    _started: float = field(default_factory=time.perf_counter)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self._started

    def launch_key(self, policy: Target) -> Hashable:
        return ("attached",)

    def explain(self, where: str, detail: str) -> str:
        return f"the server stopped answering {where}: {detail}"

    def serve(self, policy: Target) -> tuple[str, str | None]:
        """The URL (and its API key) that measures the policy: the one server, as it is."""
        return self.url, self.api_key

    def prefill(self, policy: Target, depth: int, streams: int, workload: Workload) -> float:
        url, key = self.serve(policy)
        return prefill_server(url, depth, streams, workload, self.explain, key)

    def measure(self, policy: Target, cell: Cell, round_key: int, workload: Workload) -> Measured:
        where = f"during {policy.config_name} at concurrency {cell[1]}" + (
            f", depth {cell[0]}" if cell[0] else ""
        )
        url, key = self.serve(policy)
        return watched(
            lambda: measure_round(url, cell, round_key, workload, self.explain, where, key),
            self._watcher(),
            lambda: self._pids_of(url),
            self._siblings(url),
        )

    def _pids_of(self, url: str) -> list[int]:
        """The processes of the server at url (this backend's one server)."""
        return self._pids or []

    def _siblings(self, url: str) -> dict[int, str]:
        """Other servers this backend measures, by pid, while a round runs on url: none here."""
        return {}

    def arrivals(
        self,
        policy: Target,
        offsets: list[float],
        round_key: int,
        lengths: list[int] | None,
        workload: Workload,
    ) -> Measured:
        url, key = self.serve(policy)
        return arrivals_round(url, offsets, round_key, lengths, workload, key)

    def _watcher(self) -> Callable[[], Snapshot] | None:
        if self.watch is False:
            return None
        if self._pids is None:
            self._pids = []
            with LlamaClient(self.url, self.api_key) as api:
                twin = "twin" in api.props()
            if self.watch or not twin:
                self._pids, self.unwatched = interference.server_pids(self.url)
        return self.snapshot if self._pids else None

    def warm_up(self, spec: ProfileSpec) -> None:
        warm_up(spec, self.url, self.explain, self.api_key)

    def close(self) -> None:
        return None


@dataclass
class RunningBackend(AttachedBackend):
    """A running patched llama-server the tuner did not start (`tune --url`): every drafting
    policy on it, the threshold switched live between rounds through `switch` (a ServerHold's,
    which records the threshold found before the first switch and gives it back on the way
    out), and checked after each round (`check`: a server that restarted is back at its command
    line's threshold and must not be measured as another). Plain, which has no draft model,
    only on a second running server started without one (`plain_url`, `--plain-url`). Both
    servers are up all along: every policy is in one launch group, so the schedule alternates
    them round by round at a cell, as the live switch's policies do on a launch of the tuner's.
    """

    switch: Callable[[int], None] | None = None
    check: Callable[[int], None] | None = None
    plain_url: str | None = None
    plain_api_key: str | None = None
    way: str = ATTACHED_LIVE
    _set: int | None = None  # the threshold switched to last
    _pids_by_url: dict[str, list[int]] = field(default_factory=dict)

    def launch_key(self, policy: Target) -> Hashable:
        return ("running",)

    def check_switch(self, policies: list[Policy]) -> str:
        """`tuner check` judged the switch before the tune began (doctor.check)."""
        return self.way

    def serve(self, policy: Target) -> tuple[str, str | None]:
        """Plain on the plain server; a drafting policy on the drafting one, its threshold
        switched there first where it is not what was set last."""
        if not isinstance(policy, Policy):
            return self.url, self.api_key
        if policy.is_plain:
            if self.plain_url is None:
                raise ConfigError(
                    "plain (no draft model) needs a second server started without a draft "
                    "model: --plain-url URL"
                )
            return self.plain_url, self.plain_api_key
        wanted = policy.max_slots or 0
        if self._set != wanted:
            assert self.switch is not None, "a running server is switched through its hold"
            self.switch(wanted)
            self._set = wanted
        return self.url, self.api_key

    def measure(self, policy: Target, cell: Cell, round_key: int, workload: Workload) -> Measured:
        return self._checked(policy, super().measure(policy, cell, round_key, workload))

    def arrivals(
        self,
        policy: Target,
        offsets: list[float],
        round_key: int,
        lengths: list[int] | None,
        workload: Workload,
    ) -> Measured:
        measured = super().arrivals(policy, offsets, round_key, lengths, workload)
        return self._checked(policy, measured)

    def _pids_of(self, url: str) -> list[int]:
        """The processes of the server a round runs on: the drafting server's, or while plain
        is measured the plain server's (not the drafting server's, whose round it is not)."""
        if url == self.url or not self._pids:
            return super()._pids_of(url)
        if url not in self._pids_by_url:
            self._pids_by_url[url] = interference.server_pids(url)[0]
        return self._pids_by_url[url]

    def _siblings(self, url: str) -> dict[int, str]:
        """While one of the two servers measures, the other is another program on this machine,
        by what it uses (next to nothing when idle with --poll 0), and named as what it is."""
        other = self.plain_url if url == self.url else self.url
        if other is None or not self._pids:
            return {}
        return {pid: f"{interference.SIBLING} {other}" for pid in self._pids_of(other)}

    def _checked(self, policy: Target, measured: Measured) -> Measured:
        """A drafting policy's round: the threshold it ran at, and the server still at it."""
        if isinstance(policy, Policy) and policy.drafting and self._set is not None:
            measured.max_slots = self._set
            if self.check is not None:
                self.check(self._set)
        return measured


# --- what a round does on any llama-server ---------------------------------------------------


Explain = Callable[[str, str], str]  # (where, detail) -> the message a failure raises with


def watched(
    measure: Callable[[], Measured],
    snapshot: Callable[[], Snapshot] | None,
    server_pids: Callable[[], Collection[int]],
    siblings: Mapping[int, str] | None = None,
) -> Measured:
    """A round measured between two snapshots of the machine (none: not watched)."""
    start = snapshot() if snapshot is not None else None
    measured = measure()
    if start is not None and snapshot is not None:
        measured.machine = interference.round_load(
            start, snapshot(), server_pids(), siblings=siblings
        )
    return measured


def measure_round(
    url: str,
    cell: Cell,
    round_key: int,
    workload: Workload,
    explain: Explain,
    where: str,
    api_key: str | None = None,
) -> Measured:
    """One round of cell's concurrency: the requests, and the /metrics deltas around them."""
    generator = LoadGenerator(url, workload, api_key=api_key)
    started = time.perf_counter()
    try:
        with LlamaClient(url, api_key) as api:
            before = api.metrics()
            samples = generator.run(cell[1], round_key)
            # When requests failed the server may be gone or hung: their errors say more than
            # a failed /metrics scrape would.
            failed = any(not s.ok for s in samples)
            after = before if failed else api.metrics()
    except (ServerError, LoadError) as exc:
        raise ServerError(explain(where, str(exc))) from exc
    seconds = time.perf_counter() - started
    failure = None
    if failed:
        bad = [s for s in samples if not s.ok]
        failure = explain(where, f"{len(bad)} of {cell[1]} requests failed ({bad[0].error})")
    own = sum(s.tokens for s in samples)
    return Measured(
        samples,
        metrics.drafting_summary(after.since(before)),
        seconds,
        failure=failure,
        foreign=None if failed else foreign_requests(before, after, own),
    )


def arrivals_round(
    url: str,
    offsets: list[float],
    round_key: int,
    lengths: list[int] | None,
    workload: Workload,
    api_key: str | None = None,
) -> Measured:
    """An open-loop round on a running server, with the /metrics deltas around it."""
    generator = LoadGenerator(url, workload, api_key=api_key)
    with LlamaClient(url, api_key) as api:
        before = api.metrics()
        started = time.perf_counter()
        _, samples = generator.run_arrivals(offsets, round_key, lengths)
        seconds = time.perf_counter() - started
        after = api.metrics()
    return Measured(samples, metrics.drafting_summary(after.since(before)), seconds)


def prefill_server(
    url: str,
    depth: int,
    streams: int,
    workload: Workload,
    explain: Explain,
    api_key: str | None = None,
) -> float:
    """Every stream's padding at a depth brought into the server's cache outside any
    measurement (see LoadGenerator.prefill_async); returns its seconds."""
    if depth <= 0:
        return 0.0
    started = time.perf_counter()
    generator = LoadGenerator(url, workload, api_key=api_key)
    where = f"while prefilling depth {depth}"
    try:
        samples = generator.prefill(streams)
    except (ServerError, LoadError) as exc:
        raise ServerError(explain(where, str(exc))) from exc
    failed = [s for s in samples if not s.ok]
    if failed:
        detail = f"{len(failed)} of {streams} requests failed ({failed[0].error})"
        raise LoadError(explain(where, detail))
    return time.perf_counter() - started


def warm_up(spec: ProfileSpec, url: str, explain: Explain, api_key: str | None = None) -> None:
    """The spec's warm-up rounds at its widest level, after a launch."""
    w = spec.workload
    if not w.warmup:
        return
    warm = Workload(
        prompt_tokens=w.prompt_tokens,
        max_tokens=16,
        stream=False,
        request_timeout_s=w.request_timeout_s,
    )
    generator = LoadGenerator(url, warm, api_key=api_key)
    for _ in range(w.warmup):
        try:
            samples = generator.run(max(spec.levels))
            failure = None if any(s.ok for s in samples) else samples[0].error
        except (LoadError, ServerError) as exc:
            failure = str(exc)
        if failure is not None:
            raise ServerError(explain("during warm-up", f"warm-up requests failed: {failure}"))
