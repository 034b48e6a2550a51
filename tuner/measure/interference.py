"""A busy machine: what the rest of this machine did while a round ran.

A round's figure is the server's speed only while nothing else competes for the machine: on
a 2-core box one CPU-bound process at nice 19 beside the bench widened the spread of rounds to
+-50-80 %, since llama-server's threads meet at a barrier every step and one thread held back
holds back the step. So a backend takes a `snapshot` at a round's start and end:

- /proc/stat's first line: the machine's busy ticks (user, nice, system, irq, softirq; guest
  time is inside user) and the ticks the hypervisor gave other machines (steal);
- /proc/<pid>/stat of every process: its CPU ticks (utime + stime, and for the tuner the
  children it reaped), its name and parent: the server's processes (the pids the backend
  knows, and their descendants), the tuner's own, and everything else, to name the biggest;
- where `nvidia-smi` or `rocm-smi` is installed, the compute processes on the device.

`round_load` (pure) turns two snapshots into a `RoundLoad`: the cores others used over the
round (the machine's busy time less the server's and the tuner's: a process that started and
ended inside the round counts too, unnamed), the server's, the tuner's, steal, the biggest
others by name and pid, and the device's other compute processes. A round is `busy` when
others used BUSY_CORES or more, the hypervisor took as much, or another program computed on the
device the server computes on.

The server's pid: a server the tuner launched has it (ManagedServer); one it did not start is
found from its URL's port when the URL is this machine (`server_pids`: the listening socket's
inode in /proc/net/tcp{,6}, then the /proc/*/fd that holds it); a server elsewhere, or one
whose process this user cannot see, is not watched, and `server_pids` says why. The twin in
this process (virtual time) has no machine to watch, nor has a twin served over HTTP unless a
caller asks: its figures are its virtual clock's, not this machine's speed.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from tuner.measure.launcher import pids_listening_on

# Others' CPU, in cores over a round, from which a round counts as busy. Measured on this
# 2-core virtual machine (USER_HZ 100, 2 s windows, python3 busy loops standing in for the
# server), while other people's builds and tests kept it loaded:
#   - the virtual machine's steal: 0.000-0.016 cores (one window of 0.16);
#   - the kernel (autogroup scheduling is on here, as on most desktop distributions) shares the
#     CPU between sessions before nice values: `nice -n 19 yes > /dev/null` started in a
#     session of its own took 0.18-0.26 cores beside one loop that got 0.17-0.25 (0.23-0.37
#     without it), and 0.22-0.25 beside two loops in the server's session (which got
#     0.22-0.30 together): a "nice" neighbour takes as much as the server does. Started from
#     the server's own session it took under 0.02 cores.
# A tenth of a core is 5 % of a 2-core server's time, several times tune's default tolerance
# (1 % of the objective) when it falls on one half of a pair and not the other, and ten times
# the steal seen here; the nice neighbour above is over it by far wherever it runs.
BUSY_CORES = 0.1
NAME_FLOOR = 0.02  # others below this many cores are not named
NAMED = 4  # the biggest others named in a warning
KEPT = 8  # the biggest others a busy round keeps
GPU_TIMEOUT_S = 10.0


# --- snapshots --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    """One process at a snapshot."""

    name: str
    ppid: int
    ticks: int  # utime + stime
    reaped: int  # cutime + cstime: the children it waited for


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a device, as nvidia-smi / rocm-smi list it."""

    pid: int
    name: str
    memory_mib: float | None = None


@dataclass(frozen=True)
class Snapshot:
    """What this machine had done by one moment."""

    at: float  # time.monotonic()
    busy: int  # the machine's busy ticks (all cores)
    steal: int
    hz: int  # ticks a second (USER_HZ)
    cores: int
    processes: Mapping[tuple[int, int], Proc]  # by (pid, start time): a reused pid is another
    gpu: tuple[GpuProcess, ...] | None = None  # None: no nvidia-smi or rocm-smi here


def parse_cpu_line(line: str) -> tuple[int, int]:
    """(busy, steal) ticks from /proc/stat's `cpu` line: user nice system idle iowait irq
    softirq steal [guest guest_nice], guest time being counted inside user already."""
    v = [int(x) for x in line.split()[1:]]
    v += [0] * (8 - len(v))
    return v[0] + v[1] + v[2] + v[5] + v[6], v[7]


def parse_proc_stat(text: str) -> tuple[int, Proc]:
    """(start time, Proc) from /proc/<pid>/stat; the name is between the first '(' and the
    last ')' (it may hold either)."""
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 of proc(5): state; ppid 4, utime 14, stime 15, cutime 16, cstime 17,
    # starttime 22
    ticks = int(fields[11]) + int(fields[12])
    reaped = int(fields[13]) + int(fields[14])
    return int(fields[19]), Proc(name, int(fields[1]), ticks, reaped)


def _processes(proc: Path) -> dict[tuple[int, int], Proc]:
    out = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            start, p = parse_proc_stat((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # gone between the listing and the read
        out[(int(entry.name), start)] = p
    return out


def snapshot(gpu: bool = True, proc: Path = Path("/proc")) -> Snapshot:
    """This machine now (the device asked first: nvidia-smi's own CPU, a child the tuner
    reaped, counts as the tuner's)."""
    devices = gpu_processes() if gpu else None
    with open(proc / "stat") as f:
        busy, steal = parse_cpu_line(f.readline())
    return Snapshot(
        at=time.monotonic(),
        busy=busy,
        steal=steal,
        hz=os.sysconf("SC_CLK_TCK"),
        cores=os.cpu_count() or 1,
        processes=_processes(proc),
        gpu=devices,
    )


# --- the device -------------------------------------------------------------------------------

NVIDIA_QUERY = ["--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"]
_ROCM_ROW = re.compile(r"^\s*(\d+)\s+(.+?)\s+(\d+|UNKNOWN)\s+(\d+|UNKNOWN)\s+\S+\s+\S+\s*$")


def parse_nvidia_apps(text: str) -> list[GpuProcess]:
    """`nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader`:
    one line a process (`1234, /usr/bin/python3, 512 MiB`); anything else is skipped."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        memory = re.match(r"(\d+(?:\.\d+)?)", parts[-1])
        name = os.path.basename(",".join(parts[1:-1]))
        out.append(GpuProcess(int(parts[0]), name, float(memory.group(1)) if memory else None))
    return out


def parse_rocm_pids(text: str) -> list[GpuProcess]:
    """`rocm-smi --showpids`: the KFD process table (PID, PROCESS NAME, GPU(s), VRAM USED, SDMA
    USED, CU OCCUPANCY). A process that opened the driver and uses no device (GPU(s) 0) is
    left out: rocm-smi lists such processes too."""
    out = []
    for line in text.splitlines():
        m = _ROCM_ROW.match(line.replace("\t", " "))
        if m is None or m.group(3) == "0":
            continue
        vram = m.group(4)
        memory = int(vram) / 2**20 if vram.isdigit() else None
        out.append(GpuProcess(int(m.group(1)), m.group(2).strip(), memory))
    return out


@functools.cache
def _gpu_tool() -> tuple[list[str], Callable[[str], list[GpuProcess]]] | None:
    if (nvidia := shutil.which("nvidia-smi")) is not None:
        return [nvidia, *NVIDIA_QUERY], parse_nvidia_apps
    if (rocm := shutil.which("rocm-smi")) is not None:
        return [rocm, "--showpids"], parse_rocm_pids
    return None


def gpu_processes() -> tuple[GpuProcess, ...] | None:
    """The compute processes on this machine's devices; None where neither tool is installed
    or it does not answer."""
    tool = _gpu_tool()
    if tool is None:
        return None
    command, parse = tool
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=GPU_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return tuple(parse(done.stdout)) if done.returncode == 0 else None


def gpu_others(
    listed: Iterable[GpuProcess], server: Collection[int], visible: Collection[int]
) -> list[GpuProcess]:
    """The device's compute processes that compete with the server there. Where the server is
    listed, every other one; where it is not and every listed pid is a process here, none (the
    server does not compute on the device); where some pid is not (the tool sees another pid
    namespace: a container), the listing cannot be matched to the server: the process with
    the most memory is taken for it and the rest count."""
    listed = list(listed)
    if any(p.pid in server for p in listed):
        return [p for p in listed if p.pid not in server and p.pid != os.getpid()]
    if all(p.pid in visible for p in listed):
        return []
    return sorted(listed, key=lambda p: p.memory_mib or 0.0, reverse=True)[1:]


# --- a round ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Other:
    """A busy program: its name, pid and the cores it used over the round."""

    name: str
    pid: int
    cores: float

    def __str__(self) -> str:
        return f"{self.name} pid {self.pid}"


@dataclass(frozen=True)
class RoundLoad:
    """What the machine did over one round, in cores (1.0: one core all the round)."""

    seconds: float
    cores: int  # the machine's
    others: float
    server: float
    tuner: float
    steal: float
    top: tuple[Other, ...] = ()  # the biggest others, by cores
    gpu: tuple[GpuProcess, ...] = ()  # other compute processes on the server's device

    @property
    def busy(self) -> bool:
        return self.others >= BUSY_CORES or self.steal >= BUSY_CORES or bool(self.gpu)

    def why(self) -> str:
        """What was busy, in words."""
        parts = []
        if self.others >= BUSY_CORES:
            top = self.top[:NAMED]
            named = f" ({', '.join(map(str, top))})" if top else ""
            parts.append(f"other programs used {self.others:.1f} of {self.cores} cores{named}")
        if self.steal >= BUSY_CORES:
            parts.append(
                f"the virtual machine's host gave {self.steal:.1f} cores to other machines"
            )
        if self.gpu:
            names = ", ".join(f"{p.name} pid {p.pid}" for p in self.gpu)
            parts.append(f"other programs computed on the GPU ({names})")
        return "; ".join(parts) or f"other programs used {self.others:.2f} cores"

    def stored(self) -> dict[str, object]:
        """What a round keeps of it: cores by whom, the names where it was busy."""
        out: dict[str, object] = {
            "others": round(self.others, 3),
            "server": round(self.server, 3),
            "tuner": round(self.tuner, 3),
            "steal": round(self.steal, 3),
            "cores": self.cores,
        }
        if self.busy:
            out["top"] = [[o.name, o.pid, round(o.cores, 3)] for o in self.top]
            out["gpu"] = [[p.name, p.pid, p.memory_mib] for p in self.gpu]
        return out


def _unique(processes: Iterable[GpuProcess]) -> list[GpuProcess]:
    seen: dict[int, GpuProcess] = {}
    for p in processes:
        seen.setdefault(p.pid, p)
    return list(seen.values())


def _family(processes: Mapping[tuple[int, int], Proc], roots: Collection[int]) -> set[int]:
    """The roots' pids and their descendants' among processes."""
    family = set(roots)
    children: dict[int, list[int]] = {}
    for (pid, _), p in processes.items():
        children.setdefault(p.ppid, []).append(pid)
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in family:
                family.add(child)
                todo.append(child)
    return family


def round_load(
    start: Snapshot,
    end: Snapshot,
    server: Collection[int],
    tuner: int | None = None,
    siblings: Mapping[int, str] | None = None,
) -> RoundLoad:
    """The round between two snapshots (pure): see the module docstring. server: the server's
    pids (their descendants count as the server's too); tuner: this process (default);
    siblings: other servers the tuner measures (pid: what to call it), which count as others
    by what they use while the round runs elsewhere, named as what they are."""
    siblings = siblings or {}
    seconds = max(end.at - start.at, 1e-9)
    per_core_s = end.hz * seconds  # ticks of one core all the round
    tuner = os.getpid() if tuner is None else tuner
    everyone = {**start.processes, **end.processes}
    servers = _family(everyone, server)
    own = {tuner} - servers

    def used(key: tuple[int, int], p: Proc) -> int:
        before = start.processes.get(key)
        if key[0] in own:  # the tuner's reaped children (a device query) are its own
            return p.ticks + p.reaped - (before.ticks + before.reaped if before else 0)
        return p.ticks - (before.ticks if before else 0)  # started inside the round: all of it

    server_ticks = tuner_ticks = 0
    others: list[Other] = []
    for key, p in end.processes.items():
        ticks = used(key, p)
        if key[0] in servers:
            server_ticks += ticks
        elif key[0] in own:
            tuner_ticks += ticks
        elif ticks > 0:
            others.append(Other(siblings.get(key[0], p.name), key[0], ticks / per_core_s))
    machine = (end.busy - start.busy) / per_core_s
    server_cores, tuner_cores = server_ticks / per_core_s, tuner_ticks / per_core_s
    others.sort(key=lambda o: o.cores, reverse=True)
    visible = {pid for pid, _ in everyone}
    return RoundLoad(
        seconds=seconds,
        cores=end.cores,
        others=max(0.0, machine - server_cores - tuner_cores),
        server=server_cores,
        tuner=tuner_cores,
        steal=(end.steal - start.steal) / per_core_s,
        top=tuple(o for o in others[:KEPT] if o.cores >= NAME_FLOOR),
        gpu=tuple(gpu_others(_unique((*(start.gpu or ()), *(end.gpu or ()))), servers, visible)),
    )


# --- a server the tuner did not start ---------------------------------------------------------


def _local(host: str) -> bool:
    """Whether a URL's host is this machine: a loopback name or address, this machine's name,
    or an address one of its interfaces holds (a socket can bind it)."""
    if host in ("localhost", socket.gethostname(), "0.0.0.0", "::"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:
            address = ipaddress.ip_address(socket.gethostbyname(host))
        except (OSError, ValueError):
            return False
    if address.is_loopback or address.is_unspecified:
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((str(address), 0))
    except OSError:
        return False
    return True


def server_pids(url: str) -> tuple[list[int], str | None]:
    """The pids of the server at url where it runs on this machine and this user can see its
    process; else no pids and why its machine is not watched."""
    parsed = httpx.URL(url)
    host = parsed.host
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if not _local(host):
        return [], f"{url} runs on another machine: its machine's load cannot be watched from here"
    pids = pids_listening_on(port)
    if not pids:
        return [], (
            f"the process serving {url} cannot be seen from here (another user's?), so the "
            "load of other programs beside it cannot be told from its own"
        )
    return pids, None


def idle_cores(pids: Collection[int], seconds: float = 1.0, proc: Path = Path("/proc")) -> float:
    """The cores these processes use over `seconds` (a server with no request should use
    next to none: llama-server's worker threads spin between graphs unless started with
    --poll 0, and then take a second server's or other programs' cores on the same CPU)."""

    def ticks() -> int:
        total = 0
        for pid in pids:
            try:
                total += parse_proc_stat((proc / str(pid) / "stat").read_text())[1].ticks
            except (OSError, ValueError, IndexError):
                continue
        return total

    before, at = ticks(), time.monotonic()
    time.sleep(seconds)
    used = ticks() - before
    return used / (os.sysconf("SC_CLK_TCK") * max(time.monotonic() - at, 1e-9))


SPIN_FIX = (
    "start llama-server with --poll 0 (its idle threads then sleep), or the second server on "
    "another machine"
)


def busy_summary(busy: Sequence[RoundLoad], rounds: int) -> str | None:
    """The end of a run, in words: how many of its rounds were busy, with what, and what to do;
    None where none was."""
    if not busy:
        return None
    causes = []
    loaded = [b for b in busy if b.others >= BUSY_CORES]
    if loaded:
        totals: dict[tuple[str, int], float] = {}
        for b in loaded:
            for o in b.top:
                totals[(o.name, o.pid)] = totals.get((o.name, o.pid), 0.0) + o.cores
        biggest = sorted(totals, key=lambda k: totals[k], reverse=True)[:NAMED]
        named = f" ({', '.join(f'{n} pid {p}' for n, p in biggest)})" if biggest else ""
        mean = sum(b.others for b in loaded) / len(loaded)
        causes.append(f"other programs used {mean:.1f} of {busy[0].cores} cores{named}")
    stolen = [b.steal for b in busy if b.steal >= BUSY_CORES]
    if stolen:
        mean = sum(stolen) / len(stolen)
        causes.append(f"the virtual machine's host gave {mean:.1f} cores to other machines")
    on_gpu = {(p.name, p.pid) for b in busy for p in b.gpu}
    if on_gpu:
        names = ", ".join(f"{n} pid {p}" for n, p in sorted(on_gpu))
        causes.append(f"other programs computed on the GPU ({names})")
    remedy = "stop them or rerun on a quiet machine"
    if any(o.name.startswith(SIBLING) for b in loaded for o in b.top[:1]):
        remedy = f"two servers on one CPU slow each other: {SPIN_FIX}"
    return (
        f"{len(busy)} of {rounds} rounds ran while {' and '.join(causes)}: they were measured "
        f"again; results may still be off: {remedy}"
    )


SIBLING = "the other llama-server"  # how round_load's siblings are named
