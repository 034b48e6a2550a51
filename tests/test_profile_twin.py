"""A profile run through the schedule, a backend and the recorder, on the twin (in-process,
virtual time): what it stores, how it says which way it measured, progress that adds up, and
a one-level profile that keeps what it measured. The real bench runs the same code in
test_profile.py; here nothing depends on the machine's speed."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select
from twinworlds import world

from tuner.decide.adaptive import profile_adaptively
from tuner.measure.plan import ProgressEvent
from tuner.storage.engine import Store
from tuner.storage.orm import Level, Run
from tuner.twin.backend import TwinBackend
from tuner.twin.method import HOST, twin_spec


def _profile(tmp_path: Path, switch: str, levels: tuple[int, ...], events: list | None = None):
    w = world("seed")
    store = Store(f"sqlite:///{tmp_path / f'{switch}.db'}")
    spec = twin_spec(w, levels=levels, max_tokens=48)
    backend = TwinBackend(w, switch=switch, seed=1)
    observer = events.append if events is not None else (lambda _: None)
    report = profile_adaptively(
        store, spec, tmp_path, observer, host_name=HOST, backend=backend, budget_s=0.0
    )
    return store, report


def test_a_live_profile_measures_the_threshold_server_beside_always_draft(tmp_path: Path) -> None:
    store, report = _profile(tmp_path, "live", (1, 2, 4))
    with store.session() as session:
        run = session.get(Run, report.run_id)
        assert run.way == "twin" and run.status == "completed"
        levels = {(lv.config, lv.concurrency) for lv in session.scalars(select(Level))}
        rounds = {
            (lv.config, lv.concurrency): lv.metrics["repeats"]
            for lv in session.scalars(select(Level))
        }
    # plain and always draft everywhere; the threshold just below each level above one
    assert levels == {
        *(("plain", c) for c in (1, 2, 4)),
        *(("spec", c) for c in (1, 2, 4)),
        ("max-slots-1", 2),
        ("max-slots-3", 4),
    }
    # the off arm and always draft of a pass share their round key: a pair
    for c, off in ((2, "max-slots-1"), (4, "max-slots-3")):
        spec_keys = {r["round_key"] for r in rounds[("spec", c)]}
        assert spec_keys == {r["round_key"] for r in rounds[(off, c)]}
        # and the off arm drafted nothing inside its rounds
        assert all(r["metrics"]["drafts"] == 0 for r in rounds[(off, c)])
    store.dispose()


def test_a_relaunching_profile_measures_plain_and_always_draft_only(tmp_path: Path) -> None:
    store, _ = _profile(tmp_path, "relaunch", (1, 2, 4))
    with store.session() as session:
        configs = {lv.config for lv in session.scalars(select(Level))}
    assert configs == {"plain", "spec"}
    store.dispose()


def test_progress_counts_add_up_to_what_was_planned(tmp_path: Path) -> None:
    events: list[ProgressEvent] = []
    _profile(tmp_path, "live", (1, 2, 4), events)
    plans = [e.total for e in events if e.kind == "plan"]
    done = sum(e.advance for e in events if e.kind in ("repeat", "level"))
    assert len(plans) == 1 and done == plans[0], (plans, done)


def test_a_one_level_profile_keeps_what_it_measured_and_says_why_nothing_was_added(
    tmp_path: Path,
) -> None:
    store, report = _profile(tmp_path, "live", (1,))
    assert report.outcome == "one-level"
    assert "two or more concurrency levels" in report.summary()
    with store.session() as session:
        assert session.get(Run, report.run_id).status == "completed"
        assert {lv.config for lv in session.scalars(select(Level))} == {"plain", "spec"}
    store.dispose()


class _LateStream(TwinBackend):
    """The twin, with one stream of every 4-stream round moved to start after the others ended
    (what a client that reaches the server late gives): no window in those rounds."""

    def measure(self, policy, cell, round_key, workload):  # type: ignore[no-untyped-def]
        measured = super().measure(policy, cell, round_key, workload)
        if cell[1] == 4:
            late = measured.samples[-1]
            shift = max(s.token_times[-1] for s in measured.samples) + 1.0 - late.token_times[0]
            late.token_times = [t + shift for t in late.token_times]
        return measured


def test_a_round_whose_streams_never_generated_together_is_marked_and_said(
    tmp_path: Path,
) -> None:
    w = world("seed")
    store = Store(f"sqlite:///{tmp_path / 'late.db'}")
    events: list[ProgressEvent] = []
    backend = _LateStream(w, switch="live", seed=1)
    spec = twin_spec(w, levels=(1, 2, 4), max_tokens=48)
    profile_adaptively(
        store, spec, tmp_path, events.append, host_name=HOST, backend=backend, budget_s=0.0
    )
    with store.session() as session:
        marks = {
            (lv.config, lv.concurrency): {r.get("apart") for r in lv.metrics["repeats"]}
            for lv in session.scalars(select(Level))
        }
    assert marks[("spec", 4)] == marks[("max-slots-3", 4)] == {True}, marks
    assert marks[("spec", 2)] == {None}, marks
    said = [e.text for e in events if e.kind == "message" and "never all generated" in e.text]
    assert said and all("at 4 streams" in text for text in said), said
    store.dispose()
