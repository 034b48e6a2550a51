"""Backends: how a schedule's rounds reach a server, one interface for every way of switching.

The schedule (measure/schedule.py) says which policy measures which cell in which order; a
backend makes the server behave as that policy and measures one round there:

- `relaunch`: one llama-server launch per policy (any build, a stock one too). The launch that
  ends a pass is kept for the next (the schedule arranges that), every other change of policy
  starts a fresh launch: warm-up, and prefill of deep context, again.
- `live`: every drafting policy shares one launch, started with `--props`; the threshold is
  switched between rounds through `POST /props` and read back through `GET /props`. The switch
  is trusted only once it reads back and the draft counters follow it (a stock llama-server
  with `--props` answers the POST with 200 and changes nothing: tuner.measure.switchcheck, which
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
What a round does once the server is switched is tuner.measure.rounds'.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuner.errors import ConfigError, ServerError
from tuner.measure import client, interference
from tuner.measure.client import LlamaClient
from tuner.measure.interference import Snapshot
from tuner.measure.launcher import ManagedServer
from tuner.measure.load import (
    Workload,
)
from tuner.measure.plan import Observer, ProgressEvent, Target, launch_config, quiet
from tuner.measure.rounds import (
    Measured,
    arrivals_round,
    measure_round,
    prefill_server,
    warm_up,
    watched,
)
from tuner.measure.schedule import Cell
from tuner.measure.spec import ProfileSpec
from tuner.measure.switchcheck import check_live_switch
from tuner.policy import Policy

EXIT_GRACE_S = 2.0  # how long a failing server may take to be seen exited before it counts as hung
RELAUNCH, LIVE, ATTACHED = "relaunch", "live", "attached"
ATTACHED_LIVE = "attached-live"  # a running server the tuner did not start, switched live
LIVE_WAYS = (LIVE, ATTACHED_LIVE, "twin")  # ways whose drafting policies share one server
SWITCH_WAYS = ("auto", RELAUNCH, LIVE)  # what a user may ask for
SIDE_BY_SIDE = ("side-by-side",)  # the one launch group of a side-by-side backend's policies


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
