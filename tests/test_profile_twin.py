"""A profile run through the schedule, a backend and the recorder, on the twin (in-process,
virtual time): what it stores, how it says which way it measured, progress that adds up, and
a one-level profile that keeps what it measured. The real bench runs the same code in
test_profile.py; here nothing depends on the machine's speed."""

from __future__ import annotations

from pathlib import Path

import pytest
from lab.method import HOST, twin_spec
from sqlalchemy import select
from twinworlds import world

from tuner.decide.adaptive import profile_adaptively, where_to_measure
from tuner.measure.load import Workload
from tuner.measure.plan import ProgressEvent, Target
from tuner.measure.rounds import Measured
from tuner.measure.schedule import Cell
from tuner.policy import Policy
from tuner.storage.orm import Level, Run, Sample
from tuner.storage.probes import is_probe
from tuner.storage.store import Store
from tuner.twin.inprocess import TwinBackend


class StallingTwin(TwinBackend):
    """The twin, but the first `stalls` rounds of one policy at one level stall, as this
    machine once stalled a bench server: "pause", every token after the middle of the round
    30 s late; "slow", the whole round ten times slower; or ("fast") run six times faster, as
    a strong draft can outrun plain at few streams."""

    def __init__(
        self, *args, stall_at: tuple[str, int], stalls: int, how: str = "pause", **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.stall_at, self.stalls, self.how = stall_at, stalls, how

    def measure(self, policy: Target, cell: Cell, round_key: int, workload: Workload) -> Measured:
        measured = super().measure(policy, cell, round_key, workload)
        assert isinstance(policy, Policy)
        if (policy.config_name, cell[1]) == self.stall_at and self.stalls > 0:
            self.stalls -= 1
            times = sorted(t for s in measured.samples for t in s.token_times)
            middle, first = times[len(times) // 2], times[0]
            for s in measured.samples:
                if self.how == "pause":
                    s.token_times = [t + 30.0 if t > middle else t for t in s.token_times]
                else:
                    factor = 10 if self.how == "slow" else 1 / 6
                    s.token_times = [first + (t - first) * factor for t in s.token_times]
        return measured


def _profile(
    tmp_path: Path,
    switch: str,
    levels: tuple[int, ...],
    events: list | None = None,
    backend: TwinBackend | None = None,
):
    w = world("seed")
    store = Store(f"sqlite:///{tmp_path / f'{switch}.db'}")
    spec = twin_spec(w, levels=levels, max_tokens=48)
    backend = backend or TwinBackend(w, switch=switch, seed=1)
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
        levels = {
            (lv.config, lv.concurrency) for lv in session.scalars(select(Level)) if not is_probe(lv)
        }
        rounds = {
            (lv.config, lv.concurrency): lv.metrics["repeats"]
            for lv in session.scalars(select(Level))
        }
        probes = {lv.config for lv in session.scalars(select(Level)) if is_probe(lv)}
    # the arrival probes beside the levels: joins, and a threshold's catch-up on the twin
    assert probes == {"probe:join", "probe:catch-up"}
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
        # the drafting half keeps each request's tokens a step (tune scales it to the mean);
        # the off arm and plain have nothing to keep
        assert all(len(r["accept_by_stream"]) == c for r in rounds[("spec", c)])
        assert all(a > 1.0 for r in rounds[("spec", c)] for a in r["accept_by_stream"])
        assert not any("accept_by_stream" in r for r in rounds[(off, c)] + rounds[("plain", c)])
    store.dispose()


def test_a_relaunching_profile_measures_plain_and_always_draft_only(tmp_path: Path) -> None:
    store, _ = _profile(tmp_path, "relaunch", (1, 2, 4))
    with store.session() as session:
        configs = {lv.config for lv in session.scalars(select(Level)) if not is_probe(lv)}
    assert configs == {"plain", "spec"}
    store.dispose()


def test_progress_counts_add_up_to_what_was_planned(tmp_path: Path) -> None:
    events: list[ProgressEvent] = []
    _profile(tmp_path, "live", (1, 2, 4), events)
    plans = [e.total for e in events if e.kind == "plan"]
    done = sum(e.advance for e in events if e.kind in ("repeat", "level"))
    assert len(plans) == 1 and done == plans[0], (plans, done)


def _stalled_profile(tmp_path: Path, config: str, how: str):
    events: list[ProgressEvent] = []
    backend = StallingTwin(
        world("seed"), switch="live", seed=1, stall_at=(config, 4), stalls=1, how=how
    )
    store, _ = _profile(tmp_path, "live", (1, 2, 4), events, backend)
    with store.session() as session:
        levels = {(lv.config, lv.concurrency): lv for lv in session.scalars(select(Level))}
        metrics = {key: lv.metrics for key, lv in levels.items()}
        samples = session.scalars(
            select(Sample).where(Sample.level_id == levels[(config, 4)].id)
        ).all()
    store.dispose()
    said = [e.text for e in events if e.kind == "message" and "stalled" in (e.text or "")]
    plans = [e.total for e in events if e.kind == "plan"]
    assert sum(e.advance for e in events if e.kind in ("repeat", "level")) == plans[0]
    return metrics, samples, said


def test_a_round_that_stalls_is_kept_apart_and_measured_again(tmp_path: Path) -> None:
    metrics, samples, said = _stalled_profile(tmp_path, "spec", "pause")
    spec4, off4 = metrics[("spec", 4)], metrics[("max-slots-3", 4)]
    # the stalled round is kept (samples and figures), apart from the repeats
    [stalled] = spec4["stalled"]
    assert "no stream got a token for 30." in stalled["stall"]
    assert stalled["tokens_per_second"] < min(r["tokens_per_second"] for r in spec4["repeats"])
    assert {s.repeat for s in samples} == {r["repeat"] for r in spec4["repeats"]} | {
        stalled["repeat"]
    }
    # measured again as the same round: every repeat still has its pair half in the off arm
    assert stalled["round_key"] in {r["round_key"] for r in spec4["repeats"]}
    assert {r["round_key"] for r in spec4["repeats"]} == {r["round_key"] for r in off4["repeats"]}
    assert all("stall" not in r for r in spec4["repeats"])
    [text] = said
    assert "spec at 4 streams" in text and "measuring the round again" in text


@pytest.mark.parametrize(("config", "what"), [("max-slots-3", "again"), ("plain", "aside")])
def test_a_round_ten_times_slower_than_its_pair_is_not_counted(
    tmp_path: Path, config: str, what: str
) -> None:
    """Whichever half of the pair ran slow: measured after its other half (the threshold, on
    the drafting launch after plain's), it is measured again; measured first (plain, whose
    launch comes first in the pass), it is set aside once the other half shows it."""
    metrics, _, said = _stalled_profile(tmp_path, config, "slow")
    level = metrics[(config, 4)]
    [stalled] = level["stalled"]
    assert "for the other half of its pair" in stalled["stall"]
    assert all(r["tokens_per_second"] > 3 * stalled["tokens_per_second"] for r in level["repeats"])
    assert all("stall" not in r for r in level["repeats"])
    [text] = said
    assert f"{config} at 4 streams" in text
    assert ("measuring the round again" if what == "again" else "set aside") in text
    # nothing else was taken for a stall
    others = [m for key, m in metrics.items() if key != (config, 4)]
    assert not any(m.get("stalled") for m in others)


def test_a_drafting_round_far_faster_than_plain_is_no_stall_of_plain(tmp_path: Path) -> None:
    """Always draft six times faster than plain and the off arm at 4 streams, every round: a
    pair's halves are compared for a stall only where both draft or neither does, so plain
    (and the threshold that does not draft there) are not set aside for it."""
    backend = StallingTwin(
        world("seed"), switch="live", seed=1, stall_at=("spec", 4), stalls=100, how="fast"
    )
    events: list[ProgressEvent] = []
    store, _ = _profile(tmp_path, "live", (1, 2, 4), events, backend)
    with store.session() as session:
        metrics = {(lv.config, lv.concurrency): lv.metrics for lv in session.scalars(select(Level))}
    store.dispose()
    spec4, plain4 = metrics[("spec", 4)], metrics[("plain", 4)]
    assert min(r["tokens_per_second"] for r in spec4["repeats"]) > 5 * max(
        r["tokens_per_second"] for r in plain4["repeats"]
    )
    assert not any(m.get("stalled") for m in metrics.values())
    assert not [e for e in events if e.kind == "message" and "stalled" in (e.text or "")]


def test_a_one_level_profile_keeps_what_it_measured_and_says_why_nothing_was_added(
    tmp_path: Path,
) -> None:
    store, report = _profile(tmp_path, "live", (1,))
    assert report.outcome == "one-level"
    assert "two or more concurrency levels" in report.summary()
    with store.session() as session:
        assert session.get(Run, report.run_id).status == "completed"
        kept = {lv.config for lv in session.scalars(select(Level)) if not is_probe(lv)}
        assert kept == {"plain", "spec"}
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


def test_the_adaptive_step_measures_where_the_traffic_weighs(tmp_path: Path) -> None:
    """Traffic peaked at 3 streams: the profile measures 3 itself (the open-loop answer rests on
    it), and no level the traffic never reaches."""
    w = world("seed")
    weights = {2: 0.3, 3: 0.5, 4: 0.2}
    store = Store(f"sqlite:///{tmp_path / 'weighted.db'}")
    report = profile_adaptively(
        store,
        twin_spec(w, weights, max_tokens=48),
        tmp_path,
        host_name=HOST,
        backend=TwinBackend(w, switch="live", seed=1),
        switch="live",
        budget_s=600.0,
    )
    added = [a.concurrency for a in report.added]
    assert 3 in added
    assert all(c in weights for c in added), added
    assert "weight 0.50" in next(a.why for a in report.added if a.concurrency == 3)
    store.dispose()


def test_where_to_measure_goes_heaviest_first_and_never_to_a_weightless_level() -> None:
    weights = (0.0, 0.2, 0.5, 0.3, 0.0, 0.0, 0.0, 0.0)
    tried = {1, 2, 4, 8}
    # the choice rests on 5, 6 and 7, which no traffic reaches; 3 carries the most weight
    assert where_to_measure([5, 6, 7], weights, tried, weighted=True) == [3]
    assert where_to_measure([3, 7], weights, tried, weighted=False) == [3]
    uniform = (0.125,) * 8
    # without weights of its own a workload adds only what the choice rests on
    assert where_to_measure([5, 6], uniform, tried, weighted=False) == [5, 6]


class _SlowLaunch(TwinBackend):
    """The twin, but one policy's second round at one level delivers its tokens 25 % slower:
    tok/s unstable past the spec's 5 % (this machine's drafting launches differ by 5-7 % from
    one launch to the next)."""

    def __init__(self, *args, slow_at: tuple[str, int], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.slow_at, self.rounds = slow_at, 0

    def measure(self, policy: Target, cell: Cell, round_key: int, workload: Workload) -> Measured:
        measured = super().measure(policy, cell, round_key, workload)
        assert isinstance(policy, Policy)
        if (policy.config_name, cell[1]) == self.slow_at:
            self.rounds += 1
            if self.rounds == 2:
                first = min(t for s in measured.samples for t in s.token_times)
                for s in measured.samples:
                    s.token_times = [first + (t - first) * 1.25 for t in s.token_times]
        return measured


def test_a_later_pass_measures_only_the_policies_not_yet_stable_at_a_level(
    tmp_path: Path,
) -> None:
    """On a world without noise every round of plain and of the off arm repeats the one
    before; the off arm's second round at 4 streams runs 25 % slow, so only it needs a third
    round there: plain beside it closes after two (closing the level for all its policies
    together measured plain a third time), and so does the off arm at 2 streams."""
    w = world("seed").with_updates(noise={"preset": "off"})
    backend = _SlowLaunch(w, switch="live", seed=1, slow_at=("max-slots-3", 4))
    store = Store(f"sqlite:///{tmp_path / 'slow.db'}")
    events: list[ProgressEvent] = []
    profile_adaptively(
        store, twin_spec(w, levels=(1, 2, 4), max_tokens=48), tmp_path, events.append,
        host_name=HOST, backend=backend, budget_s=0.0,
    )  # fmt: skip
    with store.session() as session:
        levels = {
            (lv.config, lv.concurrency): lv for lv in session.scalars(select(Level))
            if not is_probe(lv)
        }  # fmt: skip
        repeats = {key: lv.repeats for key, lv in levels.items()}
        assert all(lv.status == "completed" for lv in levels.values())
    store.dispose()
    assert repeats[("max-slots-3", 4)] == 3, repeats
    assert repeats[("plain", 4)] == repeats[("plain", 2)] == repeats[("max-slots-1", 2)] == 2
    plans = [e.total for e in events if e.kind == "plan"]
    assert sum(e.advance for e in events if e.kind in ("repeat", "level")) == plans[0]
