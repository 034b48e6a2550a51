"""The collapse alarm on twin worlds calibrated to llama.cpp's known failures: issue 27117
(DFlash: acceptance 0.51-0.66 with 4 drafting sequences, 0.0018 with 16; 17-21 tok/s against
37 without speculation) and issue 27572 (MTP: acceptance 0.0 once several sequences draft).

The worlds hold the issues' figures in their own truth; a profile of each (in-process, virtual
time) and its fit make `tune`'s alarm name the slots where acceptance collapses and the N that
protects the server; and `watch --apply live` on the 27572 world served over HTTP, started at
always draft, reads the collapse off the server's own counters and sets the protective N live."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from lab.method import HOST, twin_spec
from lab.traffic import offer_cycle
from test_watch import answer
from twinthread import twin_in_thread
from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.decide.adaptive import profile_adaptively
from tuner.decide.alarm import fit_floors, profile_collapse, tune_alarm
from tuner.decide.watch import EnvFile, WatchOptions, watch
from tuner.measure.client import LlamaClient
from tuner.policy import Policy
from tuner.storage.store import Store
from tuner.twin.inprocess import TwinBackend
from tuner.twin.truth import closed_truth
from tuner.twin.world import World, load_world

REPO = Path(__file__).resolve().parent.parent
DFLASH = REPO / "profiles" / "twin" / "collapse-dflash-27117.toml"
MTP = REPO / "profiles" / "twin" / "collapse-mtp-27572.toml"


def acceptance_rate(world: World, drafting: int) -> float:
    """Accepted over drafted tokens with this many drafting together (llama-server's figure)."""
    return (world.mean_accept_len(factor=world.drafting_factor(drafting)) - 1.0) / world.n_max


def test_the_worlds_hold_the_issues_figures() -> None:
    dflash = load_world(DFLASH)
    assert 0.51 <= acceptance_rate(dflash, 4) <= 0.66
    assert acceptance_rate(dflash, 16) == pytest.approx(0.0018, abs=2e-4)
    truth = closed_truth(dflash, concurrency=[1, 16])
    assert truth.tps(Policy.plain(), 16) == pytest.approx(37.0, abs=0.5)
    assert 17.0 <= truth.tps(Policy.always(), 16) <= 21.0
    assert truth.gain(1) > 0.5  # alone, drafting pays
    mtp = load_world(MTP)
    assert acceptance_rate(mtp, 1) > 0.5 and acceptance_rate(mtp, 2) == 0.0


def profiled(world: World, tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'tuner.db'}")
    profile_adaptively(
        store, twin_spec(world), tmp_path, host_name=HOST,
        backend=TwinBackend(world, switch="live"), switch="live", budget_s=0.0,
    )  # fmt: skip
    return store


@pytest.mark.parametrize(
    ("path", "slots", "protective"),
    [(DFLASH, 16, 8), (MTP, 2, 1)],
    ids=["27117", "27572"],
)
def test_tune_says_where_the_profile_collapses(
    tmp_path: Path, path: Path, slots: int, protective: int
) -> None:
    """The profile's levels (1, 2, 4, 8[, 16]) drafting always: 27117 collapses at 16 (8 still
    pays), 27572 at 2. The line names the slots, the build and the protective N."""
    world = load_world(path)
    store = profiled(world, tmp_path)
    floors = fit_floors(store, world.model_name, HOST)
    assert floors is not None
    collapse = profile_collapse(floors, standing=0)
    line = tune_alarm(store, world.model_name, HOST, None, standing=0)
    store.dispose()
    print(f"tune's alarm on {world.name}: {line}")
    assert collapse is not None and line == collapse.line()
    assert collapse.slots == slots and collapse.protective == protective, line
    assert f"collapses at {slots} drafting slots" in line and floors.build in line
    assert f"protect the server with N={protective}" in line
    # the floor is the fit's: drafting at the collapse needs far more than what it accepts
    assert collapse.seen.high < collapse.floor.lower
    # a standing N already below it: said, not an alarm to act on
    held = profile_collapse(floors, standing=protective)
    assert held is not None and held.protected


def test_watch_applies_the_protective_n_from_the_servers_counters(tmp_path: Path) -> None:
    world = load_world(MTP)
    store = profiled(world, tmp_path)
    env = tmp_path / "server.env"
    env.write_text("LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=0\n")  # always draft: what the server runs
    twin = served(MTP, world, speed=10.0)  # a poll every 0.5 s of the twin's time
    said: list[str] = []
    stop = threading.Event()
    try:
        # rounds of one stream and of three together: drafting alone pays, with three it does not
        traffic = threading.Thread(
            target=offer_cycle, args=(twin.url, [(1, 128), (3, 48)], stop, []), daemon=True
        )
        traffic.start()
        summary = watch(
            store, world.model_name, HOST, twin.url, env,
            WatchOptions(every_s=3.0, window_s=9.0, drift=0.5, apply="live", min_busy_s=0.5,
                         recommend={"host_explicit": True}),
            lambda e: said.append(e.text or ""), name="mtp", duration_s=10.0, interval_s=0.05,
            recommender=lambda _: answer(0, {m: 100.0 if m == 0 else 80.0 for m in range(9)}),
        )  # fmt: skip
        with LlamaClient(twin.url) as api:
            live = api.max_slots()
    finally:
        stop.set()
        twin.stop_thread()
        store.dispose()
    assert summary.alarms, said
    line = summary.alarms[0]
    print(f"watch's alarm on {world.name}: {line}")
    assert "collapses at 3 drafting slots" in line and "by the server's counters" in line, line
    assert "protect the server with N=1" in line and "; 2 drafting slots not seen" in line
    assert live == 1 and EnvFile(env).current_max_slots() == 1, said
    assert any("acceptance collapsed: N=1" in s for s in said), said


def served(path: Path, world: World, *extra: str, speed: float = 40.0):
    return twin_in_thread(
        "--alias", world.model_name, "--spec-draft-n-max", str(world.n_max), *extra,
        speed=speed, world=path, parallel=world.n_parallel,
    )  # fmt: skip


def test_observe_says_it_from_the_servers_counters(tmp_path: Path) -> None:
    """`tuner observe` on the 27572 world: rounds of one stream and of three; the fit of the
    profile (stored under another host: the model's only data) sets the floor."""
    world = load_world(MTP)
    profiled(world, tmp_path).dispose()
    # observe polls four times a second of the wall: at 5x a poll is 1.25 s of the twin's time,
    # finer than a round (a server's requests last seconds between its polls, too)
    twin = served(MTP, world, speed=5.0)
    stop = threading.Event()
    traffic = threading.Thread(
        target=offer_cycle, args=(twin.url, [(1, 128), (3, 48)], stop, []), daemon=True
    )
    try:
        traffic.start()
        result = CliRunner().invoke(app, ["observe", "--url", twin.url, "--duration", "8"])
    finally:
        stop.set()
        twin.stop_thread()
    assert result.exit_code == 0, result.output
    print("observe's alarm:", *[x for x in result.stdout.splitlines() if "collapses" in x])
    assert "acceptance collapses at 3 drafting slots" in result.stdout, result.stdout
    assert "by the server's counters" in result.stdout and "N=1" in result.stdout


def test_check_says_drafting_cannot_pay_where_nothing_is_accepted(tmp_path: Path) -> None:
    """`tuner check` reads the counters once, since the server started: on a world whose
    acceptance is near zero at every count (the bench's --spec-synth-rates 0.01 as a twin), the
    line says drafting cannot pay at any count: plain."""
    from tuner.measure.load import LoadGenerator, Workload

    world = load_world(MTP)
    profiled(world, tmp_path).dispose()
    twin = served(MTP, world, "--spec-synth-rates", "0.01,0.01,0.01")
    try:
        LoadGenerator(twin.url, Workload(prompt_tokens=32, max_tokens=96)).run(1, 0)
        result = CliRunner().invoke(app, ["check", "--url", twin.url])
    finally:
        twin.stop_thread()
    line = next((x for x in result.stdout.splitlines() if "acceptance" in x), "")
    print(f"check's alarm: {line}")
    assert "collapses at 1 drafting slot" in line and "since it started" in line, result.stdout
    assert "protect the server with plain" in line and "twin" in line
