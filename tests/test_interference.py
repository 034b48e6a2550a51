"""A busy machine (tuner.measure.interference): what the rest of the machine did over a round,
who it was, and what the profiler and tune make of a busy round.

This machine is shared while the tests run (other people's builds and tests), so no test here
expects it to be quiet: the verdicts are tested on snapshots the test makes, and the real
/proc is tested by what one process the test starts does to it (a busy loop is named, with its
cores, as the other program it is, and as the server's when it is the server)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from twinthread import four_rounds, twin_in_thread

from tuner.decide.tune import live_gains
from tuner.measure.attach import attach
from tuner.measure.interference import (
    BUSY_CORES,
    SIBLING,
    GpuProcess,
    Proc,
    RoundLoad,
    Snapshot,
    busy_summary,
    gpu_others,
    parse_cpu_line,
    parse_nvidia_apps,
    parse_proc_stat,
    parse_rocm_pids,
    round_load,
    server_pids,
    snapshot,
)
from tuner.measure.plan import ProgressEvent
from tuner.measure.profiler import Profiler
from tuner.storage.orm import Level
from tuner.storage.store import Store
from tuner.twin.server import TwinServer

HZ = 100
SERVER, TUNER, YES = 500, 600, 99

# --- parsing ----------------------------------------------------------------------------------

NVIDIA = """\
4242, /opt/llama/bin/llama-server, 5120 MiB
777, python3, 2048 MiB
"""
ROCM = """\
============================ ROCm System Management Interface ============================
===================================== KFD Processes ======================================
KFD process information:
PID\tPROCESS NAME\tGPU(s)\tVRAM USED\tSDMA USED\tCU OCCUPANCY\t
4242\tllama-server\t1\t5368709120\t0\t4\t
1075718\tkfd_open\t0\t0\t0\t0\t
55573\tgmx_mpi\t1\tUNKNOWN\tUNKNOWN\tUNKNOWN\t
==========================================================================================
================================== End of ROCm SMI Log ===================================
"""


def test_proc_files_parse() -> None:
    assert parse_cpu_line("cpu  120139 7 5924 8862 128 3 124 781 50 0") == (
        120139 + 7 + 5924 + 3 + 124,
        781,
    )
    assert parse_cpu_line("cpu 10 0 5 100") == (15, 0)  # an old kernel: no steal column
    stat = "1234 (my (odd) name) S 1 1234 1234 0 -1 4194304 99 0 0 0 70 30 5 6 20 0 1 0 9016 0 0"
    start, proc = parse_proc_stat(stat)
    assert start == 9016
    assert proc == Proc("my (odd) name", 1, 100, 11)


def test_device_listings_parse() -> None:
    assert parse_nvidia_apps(NVIDIA) == [
        GpuProcess(4242, "llama-server", 5120.0),
        GpuProcess(777, "python3", 2048.0),
    ]
    assert parse_nvidia_apps("No running processes found\n") == []
    rocm = parse_rocm_pids(ROCM)
    # kfd_open opened the driver and uses no device: rocm-smi lists it, it is left out
    assert [(p.pid, p.name) for p in rocm] == [(4242, "llama-server"), (55573, "gmx_mpi")]
    assert rocm[0].memory_mib == 5120.0 and rocm[1].memory_mib is None
    assert parse_rocm_pids("No KFD PIDs currently running\n") == []


def test_other_compute_processes_count_where_they_share_the_servers_device() -> None:
    listed = parse_nvidia_apps(NVIDIA)
    assert gpu_others(listed, {4242}, {4242, 777}) == [listed[1]]
    # the server is not on the device (a CPU server beside a GPU job): nothing competes there
    assert gpu_others(listed, {9}, {4242, 777, 9}) == []
    # another pid namespace (a container): the biggest is taken for the server, the rest count
    assert gpu_others(listed, {9}, {9}) == [listed[1]]


# --- a round from snapshots -------------------------------------------------------------------


def _snap(at: float, busy: int, procs: dict[int, tuple[str, int, int]], steal: int = 0) -> Snapshot:
    """A snapshot: procs {pid: (name, ppid, ticks)}, each started at tick 1."""
    return Snapshot(
        at=at,
        busy=busy,
        steal=steal,
        hz=HZ,
        cores=2,
        processes={
            (pid, 1): Proc(name, ppid, ticks, 0) for pid, (name, ppid, ticks) in procs.items()
        },
    )


def test_others_are_the_machine_less_the_server_and_the_tuner() -> None:
    # 2 s: the server (and a child of its) 3.0 cores-s, the tuner 0.4, yes 1.2, a process
    # started inside the round 0.2, one that came and went unseen 0.2 (machine only)
    start = _snap(0.0, 10_000, {SERVER: ("llama-server", 1, 1000), TUNER: ("tuner", 1, 50),
                                YES: ("yes", 1, 10)})  # fmt: skip
    end = _snap(2.0, 10_000 + 300 + 40 + 120 + 20 + 20, {
        SERVER: ("llama-server", 1, 1250), 501: ("helper", SERVER, 50), TUNER: ("tuner", 1, 90),
        YES: ("yes", 1, 130), 700: ("cc1plus", 1, 20)})  # fmt: skip
    load = round_load(start, end, [SERVER], tuner=TUNER)
    assert load.server == pytest.approx(1.5) and load.tuner == pytest.approx(0.2)
    assert load.others == pytest.approx(0.8)  # yes 0.6, cc1plus 0.1, the unseen one 0.1
    assert [(o.name, o.pid) for o in load.top] == [("yes", YES), ("cc1plus", 700)]
    assert load.busy and "other programs used 0.8 of 2 cores (yes pid 99, cc1plus pid 700)" in (
        load.why()
    )
    # The same round with the busy program as the server's own: nothing else competed.
    as_server = round_load(start, end, [SERVER, YES, 700], tuner=TUNER)
    assert as_server.others == pytest.approx(0.1) and not as_server.busy


def test_a_round_is_busy_from_a_tenth_of_a_core_or_a_stolen_one() -> None:
    def load(others: float, steal: float = 0.0) -> RoundLoad:
        return RoundLoad(2.0, 2, others, 1.8, 0.1, steal)

    assert not load(BUSY_CORES * 0.9).busy
    assert load(BUSY_CORES).busy
    assert load(0.0, steal=0.5).busy and "host gave 0.5 cores" in load(0.0, steal=0.5).why()
    gpu = RoundLoad(2.0, 2, 0.0, 1.8, 0.1, 0.0, gpu=(GpuProcess(777, "python3"),))
    assert gpu.busy and "computed on the GPU (python3 pid 777)" in gpu.why()


def test_the_runs_summary_says_how_many_rounds_with_what_and_what_to_do() -> None:
    def busy(others: float, *top: tuple[str, int, float]) -> RoundLoad:
        from tuner.measure.interference import Other

        return RoundLoad(2.0, 2, others, 1.0, 0.1, 0.0, tuple(Other(*o) for o in top))

    assert busy_summary([], 40) is None
    text = busy_summary(
        [busy(1.0, ("python3", 1234, 0.7), ("yes", 99, 0.3)), busy(0.8, ("yes", 99, 0.6))], 40
    )
    assert text == (
        "2 of 40 rounds ran while other programs used 0.9 of 2 cores (yes pid 99, python3 pid "
        "1234): they were measured again; results may still be off: stop them or rerun on a "
        "quiet machine"
    )


def test_the_other_server_of_a_side_by_side_is_named_and_its_remedy_said() -> None:
    """tune --plain-url: while plain is measured the plain server is the server, and the idle
    drafting server counts only by what it uses, named as what it is; a run whose busy rounds
    came from it names --poll 0."""
    plain, drafting = 300, 400
    start = _snap(0.0, 10_000, {plain: ("llama-server", 1, 1000), drafting: ("llama-server", 1, 0),
                                TUNER: ("tuner", 1, 50)})  # fmt: skip
    end = _snap(2.0, 10_000 + 300 + 20 + 120, {plain: ("llama-server", 1, 1300),
                drafting: ("llama-server", 1, 120), TUNER: ("tuner", 1, 70)})  # fmt: skip
    other = {drafting: f"{SIBLING} http://127.0.0.1:8080"}
    load = round_load(start, end, [plain], tuner=TUNER, siblings=other)
    assert load.server == pytest.approx(1.5) and load.others == pytest.approx(0.6)
    assert load.top[0].name == f"{SIBLING} http://127.0.0.1:8080" and load.top[0].pid == drafting
    said = busy_summary([load], 10)
    assert said is not None and "--poll 0" in said and "two servers on one CPU" in said
    # idle with --poll 0, it uses nothing, and the round is the plain server's alone
    quiet = _snap(2.0, 10_000 + 300 + 20, {plain: ("llama-server", 1, 1300),
                  drafting: ("llama-server", 1, 0), TUNER: ("tuner", 1, 70)})  # fmt: skip
    assert not round_load(start, quiet, [plain], tuner=TUNER, siblings=other).busy


# --- this machine -----------------------------------------------------------------------------


@pytest.fixture
def busy_loop() -> Iterator[subprocess.Popen[bytes]]:
    """A CPU-bound process in a session of its own (as a program started in another terminal
    is: the kernel's autogroups share the CPU between sessions first)."""
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


def test_a_busy_program_is_named_with_its_cores_and_the_servers_is_not(
    busy_loop: subprocess.Popen[bytes],
) -> None:
    time.sleep(0.3)  # started
    start = snapshot(gpu=False)
    time.sleep(1.5)
    end = snapshot(gpu=False)
    other = round_load(start, end, [])
    named = {o.pid: o for o in other.top}
    assert busy_loop.pid in named and named[busy_loop.pid].cores >= 0.05
    assert other.others >= named[busy_loop.pid].cores - 0.02  # inside the machine's figure
    as_server = round_load(start, end, [busy_loop.pid])
    assert busy_loop.pid not in {o.pid for o in as_server.top}
    assert as_server.server == pytest.approx(named[busy_loop.pid].cores, abs=0.02)


def test_a_server_on_this_machine_is_found_by_its_port_and_one_elsewhere_is_not() -> None:
    twin = twin_in_thread()
    try:
        pids, why = server_pids(twin.url)
        assert pids == [os.getpid()] and why is None  # the twin serves from this process
    finally:
        twin.stop_thread()
    pids, why = server_pids("http://192.0.2.1:8080")  # TEST-NET-1: no machine's address here
    assert pids == [] and why is not None and "another machine" in why


# --- the profiler and tune --------------------------------------------------------------------


class Machine:
    """Snapshots the test makes: 2 s a round; while `busy`, `yes` (pid 99) takes 0.9 of the 2
    cores, else nothing but the server (this process, serving the twin from a thread)."""

    def __init__(self) -> None:
        self.at = 0.0
        self.ticks = 0
        self.yes = 0
        self.busy = False

    def __call__(self) -> Snapshot:
        self.at += 2.0
        self.ticks += 300  # the server: 1.5 cores
        if self.busy:
            self.ticks += 180
            self.yes += 180
        procs = {os.getpid(): ("python3", 1, self.ticks - self.yes)}
        if self.yes:
            procs[YES] = ("yes", 1, self.yes)
        return _snap(self.at, self.ticks, procs)


@pytest.fixture
def server() -> Iterator[TwinServer]:
    twin = twin_in_thread(speed=20)
    yield twin
    twin.stop_thread()


def _profile(server: TwinServer, tmp_path: Path, machine: Machine, busy_from: int | None):
    """attach's rounds at 2 streams, the machine watched through `machine`, busy from the
    busy_from-th round measured on; (counted rounds, rounds kept apart, messages)."""
    store = Store(f"sqlite:///{tmp_path / 'busy.db'}")
    said: list[str] = []
    rounds = 0

    def observer(event: ProgressEvent) -> None:
        said.append(event.text)

    def watch(profiler: Profiler, url: str):
        backend = original(profiler, url)
        backend.watch, backend.snapshot = True, counted
        return backend

    def counted() -> Snapshot:
        nonlocal rounds
        rounds += 1  # two snapshots a round
        machine.busy = busy_from is not None and rounds > 2 * busy_from
        return machine()

    original = Profiler.attach_backend
    overrides = four_rounds(16)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Profiler, "attach_backend", watch)
        attach(store, server.url, "watched", "twin", None, tmp_path, observer, overrides=overrides)
    with store.session() as session:
        level = session.scalars(select(Level)).one()
        return level.metrics["repeats"], level.metrics.get("stalled", []), said


def test_rounds_on_a_quiet_machine_blame_nobody(server: TwinServer, tmp_path: Path) -> None:
    counted, apart, said = _profile(server, tmp_path, Machine(), busy_from=None)
    assert len(counted) == 4 and apart == []
    assert all(r["machine"]["others"] == 0.0 and not r.get("busy") for r in counted)
    assert all(r["machine"]["server"] == pytest.approx(1.5) for r in counted)
    assert not any("other programs" in s for s in said)


def test_rounds_a_busy_program_touched_are_kept_apart_and_measured_again(
    server: TwinServer, tmp_path: Path
) -> None:
    counted, apart, said = _profile(server, tmp_path, Machine(), busy_from=2)
    # the first two rounds are counted as measured; every later one was busy: measured three
    # times, the third kept as measured, marked busy
    assert [bool(r.get("busy")) for r in counted] == [False, False, True, True]
    assert len(apart) == 4 and all(r["busy"] for r in apart)
    assert all(r["machine"]["top"] == [["yes", YES, 0.9]] for r in apart)
    warning = next(s for s in said if "measuring the round again" in s)
    assert "tok/s while other programs used 0.9 of 2 cores (yes pid 99)" in warning
    assert said[-1] == (
        "warning: 6 of 8 rounds ran while other programs used 0.9 of 2 cores (yes pid 99): they "
        "were measured again; results may still be off: stop them or rerun on a quiet machine"
    )


def test_tune_leaves_out_busy_and_foreign_rounds() -> None:
    def rep(tps: float, key: int, **marks: object) -> dict:
        return {"tokens_per_second": tps, "round_key": key, **marks}

    shared = rep(50.0, 2000, foreign={"before": 1, "after": 0, "tokens": 0})
    repeats = {
        (1, "spec", 4): [rep(100.0, 0), rep(60.0, 1000, busy=True), rep(100.0, 2000)],
        (1, "max-slots-3", 4): [rep(98.0, 0), rep(97.0, 1000), shared],
    }
    assert live_gains(repeats)[4].diffs == (2.0,)
