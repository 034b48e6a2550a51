"""`tuner watch --experiment` against a server over HTTP: the twin in a thread (--props, the
live switch, virtual time) under tuner's own Poisson load. It runs windows, switches N between
them through POST /props, leaves the server at the standing N (the hold gives it back on the
way out, Ctrl-C included), logs verdicts with their bounds and the cost to users, and stores the
experiment with the watch's traffic. The answers come from a stand-in here: what the experiment
decides is tested in-process on twin worlds (tests/test_experiment.py); the real bench server is
benchmarks/watch_experiment.py --bench's."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_watch import answer
from twinthread import twin_in_thread

from tuner.decide.experiment import ExperimentOptions
from tuner.decide.watch import EnvFile, WatchOptions, WatchSummary, watch
from tuner.measure.arrivals import poisson_offsets
from tuner.measure.client import LlamaClient
from tuner.measure.hold import ServerHold, hold_paths
from tuner.measure.load import LoadGenerator, Workload
from tuner.measure.observe import Poller
from tuner.measure.windows import LiveWindows
from tuner.storage.store import Store
from tuner.storage.traffic_profiles import stored_dict
from tuner.traffic import TrafficProfile

SPEED = 40.0


def offered(url: str, rate: float, span_s: float, stop: threading.Event) -> threading.Thread:
    """Poisson arrivals on the twin's clock, in a thread, until span_s or stop."""

    def offer() -> None:
        generator = LoadGenerator(url, Workload(prompt_tokens=32, max_tokens=96))
        key = 0
        while not stop.is_set():
            generator.run_arrivals(poisson_offsets(rate, 60.0, seed=key), round_key=key)
            key += 1

    thread = threading.Thread(target=offer, daemon=True)
    thread.start()
    return thread


def options(budget_s: float) -> WatchOptions:
    return WatchOptions(
        every_s=2.0,
        window_s=6.0,
        drift=0.5,
        apply="live",
        min_busy_s=1.0,
        experiment=ExperimentOptions(budget_s=budget_s, min_window_s=10.0, max_window_s=20.0),
    )


def watched(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    standing: int,
    on_switch: Callable[[int], None],
    duration_s: float,
) -> tuple[WatchSummary, int | None, list[str], Store]:
    """watch --experiment on the twin under Poisson load, the env file at N=standing, the
    answers a stand-in's (standing); on_switch(n) after every switch the hold made. The
    summary, the server's threshold afterwards, the log and the store."""
    twin = twin_in_thread(speed=SPEED)
    stop = threading.Event()
    env = tmp_path / "server.env"
    env.write_text(f"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS={standing}\n")
    store = Store(f"sqlite:///{tmp_path / 'tuner.db'}")
    said: list[str] = []
    real_switch = ServerHold.switch

    def switch(self: ServerHold, n: int) -> None:
        real_switch(self, n)
        on_switch(n)

    monkeypatch.setattr(ServerHold, "switch", switch)
    try:
        offered(twin.url, 0.3, 600.0, stop)
        summary = watch(
            store, "m", "h", twin.url, env, options(240.0),
            lambda e: said.append(e.text), name="exp", duration_s=duration_s, interval_s=0.02,
            recommender=lambda name: answer(standing), state_dir=tmp_path / "state",
        )  # fmt: skip
        with LlamaClient(twin.url) as api:
            after = api.max_slots()
    finally:
        stop.set()
        twin.stop_thread()
    assert not hold_paths(twin.url, tmp_path / "state")[1].exists()  # no hold left behind
    return summary, after, said, store


def test_watch_experiment_switches_restores_and_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    switched: list[int] = []
    summary, after, said, store = watched(tmp_path, monkeypatch, 2, switched.append, 14.0)
    assert summary.experiments, said
    report = summary.experiments[0]
    # it switched: windows at a contender (1 or 3) between windows at N=2
    assert {1, 3} & set(switched) and 2 in switched, (switched, said)
    assert any(p.contender for p, _ in report.windows), said
    assert all(f.seconds > 0 and f.levels for _, f in report.windows)
    # and left the server at the standing N: the env file's, which the watch writes as it
    # applies each answer (a second experiment may have moved N after the first, or the dwell
    # held a move back)
    written = EnvFile(tmp_path / "server.env").current_max_slots()
    assert after == written, (after, written, said)
    if len(summary.experiments) == 1 and not summary.changes:
        assert after == report.answer, (after, report.answer)
    # its verdicts carry their bounds, and the cost to users is said
    verdicts = [s for s in said if s.startswith("experiment: N=") and " against N=" in s]
    assert verdicts, said
    assert all("one-sided" in v or "not measured enough" in v for v in verdicts), verdicts
    assert any("cost to users" in s for s in said)
    stored = stored_dict(store, "exp")
    store.dispose()
    assert stored is not None and stored["experiments"][0]["windows"]
    assert stored["experiments"][0]["cost"]["seconds"] > 0


def test_ctrl_c_in_a_contender_window_gives_n_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    switched: list[int] = []

    def pressed(n: int) -> None:
        switched.append(n)
        if n != 3:  # the first contender window: the user presses Ctrl-C in it
            raise KeyboardInterrupt

    summary, after, said, store = watched(tmp_path, monkeypatch, 3, pressed, 30.0)
    store.dispose()
    assert switched and switched[-1] != 3, switched
    assert after == 3, (after, said)
    assert any("back to 3, as found" in s for s in said), said
    assert not summary.experiments


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--experiment"], "needs --apply live"),
        (["--experiment", "--apply", "live", "--experiment-share", "0.5"], "flanked"),
    ],
)
def test_bad_experiment_options_are_one_line(
    tmp_path: Path, extra: list[str], fragment: str
) -> None:
    from test_observe import one_line_error

    base = ["watch", "--model", "m", "--url", "http://127.0.0.1:9"]
    one_line_error([*base, "--env-file", str(tmp_path / "x.env"), *extra], fragment)


def test_an_unpatched_server_is_refused_before_anything_runs(tmp_path: Path) -> None:
    twin = twin_in_thread("--twin-unpatched", speed=SPEED)
    said: list[str] = []
    try:
        with pytest.raises(Exception, match="no spec_draft_max_slots"):
            watch(
                Store(f"sqlite:///{tmp_path / 'tuner.db'}"), "m", "h", twin.url,
                tmp_path / "x.env", options(60.0), lambda e: said.append(e.text),
                duration_s=1.0, recommender=lambda name: answer(2), state_dir=tmp_path,
            )  # fmt: skip
    finally:
        twin.stop_thread()


class _Hold:
    """A hold that switches nothing and finds the threshold always as set."""

    def switch(self, n: int) -> None:
        pass

    def check(self, expected: int | None = None) -> None:
        pass


def scripted_windows(
    monkeypatch: pytest.MonkeyPatch, states: list[tuple[str, object]], **options: Any
) -> tuple[LiveWindows, Any]:
    """LiveWindows over a scripted server answering `states` in order (test_observe's
    scripted client, /metrics as whole texts), its poller built with these keywords, and the
    client (its states left)."""
    from test_acceptance_observed import Full

    from tuner.measure import observe as observe_module

    client = Full(states)
    monkeypatch.setattr(observe_module, "_client", lambda url, key: client)
    poller = Poller("http://scripted", wall=lambda: 0.0, **options)
    profile = TrafficProfile(2)
    return LiveWindows(poller, _Hold(), lambda: profile), client  # type: ignore[arg-type]


def test_a_window_across_a_restart_counts_for_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """LiveWindows reads the draft counters at a window's two ends: a counter that went down
    between them (the server restarted inside the window, back at its command line's
    threshold) marks the window unreadable, with why; so does the threshold read back."""
    from test_acceptance_observed import scrape

    def polled(t: float, decoded: int) -> list[dict]:
        return [{"id": 0, "id_task": 1, "is_processing": True, "t_server": t,
                 "next_token": [{"n_decoded": decoded}], "n_prompt_tokens": 40}]  # fmt: skip

    states: list[tuple[str, object]] = [
        ("slots", []),
        ("metrics", scrape(0, [0])),  # attach
        ("metrics", scrape(100, [60], tokens=900)),  # the window's first reading
        ("slots", polled(0.0, 5)),
        ("metrics", scrape(100, [60], tokens=900)),  # observe's first settling reading
        ("slots", polled(0.0, 5)),
        ("slots", polled(6.0, 65)),
        ("slots", polled(12.0, 125)),
        ("metrics", scrape(4, [2], tokens=30)),  # the last: counters began again
    ]
    windows, client = scripted_windows(monkeypatch, states, sleep=lambda s: None)
    windows.switch(1)
    figures = windows.window(10.0)
    assert not client.states
    assert figures.seconds == pytest.approx(12.0, abs=0.01) and figures.at(1) == (12.0, 120.0)
    assert figures.problem is not None and "restarted" in figures.problem


def test_the_seconds_between_windows_count_in_neither(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between two windows the experiment reads /metrics, decides and switches N: seconds in
    which nobody polls, spent partly at the old N. The next window counts from its own start, so
    none of them is credited to the first count it sees (here 8 s would have gone to N=2's
    window at one slot generating, ending it after one poll)."""
    from test_acceptance_observed import scrape

    def one_slot(decoded: int) -> list[dict]:
        return [{"id": 0, "id_task": 1, "is_processing": True,
                 "next_token": [{"n_decoded": decoded}], "n_prompt_tokens": 40}]  # fmt: skip

    reading = ("metrics", scrape(100, [60], tokens=900))
    states: list[tuple[str, object]] = [("slots", []), ("metrics", scrape(0, [0]))]  # attach
    # the first poll settles observe's counters: /metrics, then /slots again
    states += [reading, ("slots", one_slot(5)), reading, ("slots", one_slot(5))]
    states += [("slots", one_slot(25)), reading]
    states += [reading, ("slots", one_slot(105)), ("slots", one_slot(125)), reading]
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    windows, client = scripted_windows(
        monkeypatch, states, interval_s=1.0, sleep=sleep, clock=lambda: now[0]
    )
    windows.switch(1)
    first = windows.window(2.0)  # polls at 1 and 2 s
    now[0] = 10.0  # 8 s reading, deciding and switching
    windows.switch(2)
    second = windows.window(2.0)  # polls at 11 and 12 s
    assert not client.states
    assert first.seconds == pytest.approx(2.0) and second.seconds == pytest.approx(2.0)
    assert second.at(1) == (1.0, 20.0)  # counted from its second poll, as every window
