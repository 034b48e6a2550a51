"""watch's guard against thrash and its collapse alarm, at an interval's end (a stand-in
recommender, a clock the test moves): N changes at most once per --dwell and only past
--margin, an answer the dwell held back is applied once it has passed unless a later one
replaced it; acceptance below the fitted floor at some drafting count moves N below it at once
(the dwell does not hold protection back) and caps later answers. How often N changes on a twin
world at the edge of two answers under bursts, with and without the guard, is
benchmarks/watch_thrash.py's figure."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from test_watch import answer

from tuner.decide.alarm import Floors
from tuner.decide.watch import EnvFile, Watcher, WatchOptions
from tuner.model.collapse import Floor
from tuner.storage.store import Store
from tuner.traffic import ServerView


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def guarded(tmp_path: Path, answers: list, *, floors=None, **over: float) -> Watcher:
    view = ServerView("http://127.0.0.1:1", "m", 8, "slots", build="b4242-test")
    clock = Clock()
    options = WatchOptions(every_s=60.0, window_s=60.0, drift=0.01, **over)  # type: ignore[arg-type]
    feed = iter(answers)
    return Watcher(
        Store(f"sqlite:///{tmp_path / 'tuner.db'}"), SimpleNamespace(view=view, interval_s=0.25),
        EnvFile(tmp_path / "server.env"), "guard", options, lambda name: next(feed),
        clock=clock, wall=clock, floors=floors,
    )  # type: ignore[arg-type]  # fmt: skip


def interval(w: Watcher, traffic: dict[int, float], drafting: dict[int, float] | None = None):
    """One interval of this traffic (and accepted tokens a draft by drafting slots), 60 s on."""
    w.clock.now += 60.0  # type: ignore[attr-defined]
    profile = w.rolling.open(w.clock()).profile
    for c, s in traffic.items():
        profile.add(c, s)
    for slots, accepted in (drafting or {}).items():
        for k in range(6):
            profile.add_drafting(slots, 100.0, 400.0, 100.0 * accepted * (1.1 if k % 2 else 0.9))
    return w.end_of_interval()


LIGHT, HEAVY = {1: 40.0, 2: 20.0}, {6: 30.0, 8: 30.0}


def test_n_changes_at_most_once_per_dwell_and_a_held_answer_waits_for_it(tmp_path: Path) -> None:
    w = guarded(tmp_path, [answer(3), answer(1), answer(1), answer(3)], dwell_s=300.0)
    assert interval(w, LIGHT).changed and w.current == 3  # the first answer: nothing stood
    held = interval(w, HEAVY)  # 60 s later: 20 % ahead, past the margin, but within the dwell
    assert held.kind == "held_dwell" and not held.changed and w.current == 3
    assert w.pending is not None and w.pending[0] == 1
    # the traffic stays put (no new answer asked): the dwell passes and the held answer is applied
    for _ in range(3):
        assert interval(w, HEAVY).kind in ("steady", "")
        assert w.current == 3
    applied = interval(w, HEAVY)  # 300 s after the change
    assert applied.changed and applied.kind == "changed" and w.current == 1
    assert w.summary.changes == 2
    # a held answer that a later one replaces is not applied
    w.clock.now += 10.0  # type: ignore[attr-defined]
    back = interval(w, LIGHT)  # answer 1 again: stands; nothing pending
    assert back.kind == "stands" and w.pending is None


def test_a_later_answer_back_at_the_standing_n_drops_the_held_one(tmp_path: Path) -> None:
    w = guarded(tmp_path, [answer(3), answer(1), answer(3)], dwell_s=300.0)
    interval(w, LIGHT)
    interval(w, HEAVY)  # N=1 held by the dwell
    assert w.pending is not None
    assert interval(w, LIGHT).kind == "stands" and w.pending is None  # back at N=3
    for _ in range(6):
        interval(w, LIGHT)
    assert w.current == 3 and w.summary.changes == 1


def test_without_the_guard_every_answer_that_differs_moves_n(tmp_path: Path) -> None:
    answers = [answer(3), answer(1)] * 4
    w = guarded(tmp_path, answers, dwell_s=0.0, margin=0.0)
    for k in range(8):
        interval(w, HEAVY if k % 2 else LIGHT)
    assert w.summary.changes == 8  # one a minute: thrash
    (tmp_path / "g").mkdir()
    g = guarded(tmp_path / "g", answers, dwell_s=300.0)
    for k in range(8):
        interval(g, HEAVY if k % 2 else LIGHT)
    assert g.summary.changes <= 2  # the first answer, then at most one per 300 s


def floors_at(value: float) -> Floors:
    return Floors(7, "m", {c: Floor(c, value, value, "plain" if c == 1 else "off") for c in
                           range(1, 9)}, build="b4242-profiled")  # fmt: skip


def test_a_collapse_moves_n_below_it_at_once_and_caps_later_answers(tmp_path: Path) -> None:
    said: list[str] = []
    always = answer(0, {m: 100.0 if m == 0 else 80.0 for m in range(7)})  # drafts at every count
    w = guarded(
        tmp_path, [always, answer(6), answer(2)], floors=lambda fit, n: floors_at(0.5),
        dwell_s=3600.0,
    )  # fmt: skip
    w.observer = lambda e: said.append(e.text or "")
    assert interval(w, LIGHT, {1: 2.0, 2: 1.9}).changed and w.current == 0  # drafts always
    # the counters show acceptance collapsing at 6 drafting slots: within the dwell, it acts
    event = interval(w, HEAVY, {1: 2.0, 2: 1.9, 4: 1.2, 5: 1.0, 6: 0.01})
    assert event.kind == "collapse" and event.changed and w.current == 5 and w.ceiling == 5
    line = next(s for s in said if "collapses at 6 drafting slots" in s)
    assert "b4242-test" in line and "protect the server with N=5" in line
    assert w.summary.alarms and w.metrics.snapshot().collapse_slots == 6
    # later answers above the ceiling (6, or always draft) are capped at it; below it they stand
    w.clock.now += 3600.0  # type: ignore[attr-defined]
    capped = interval(w, HEAVY)  # no drafting seen now: answer 6, capped at 5
    assert w.current == 5 and not capped.changed
    assert any("capped at N=5" in s for s in said), said
    interval(w, LIGHT)  # answer 2: below the ceiling, 20 % ahead: taken
    assert w.current == 2


def test_a_collapse_at_one_slot_says_plain_and_drafts_least(tmp_path: Path) -> None:
    said: list[str] = []
    w = guarded(tmp_path, [answer(4)], floors=lambda fit, n: floors_at(0.5))
    w.observer = lambda e: said.append(e.text or "")
    event = interval(w, LIGHT, {1: 0.02, 2: 0.01})
    assert event.kind == "collapse" and w.current == 1
    assert any("protect the server with plain" in s and "restart" in s for s in said), said
