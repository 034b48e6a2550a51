"""`tuner watch` re-deciding on acceptance as on traffic, and the margin that keeps N from
flapping: the rules themselves (pure), an interval's end with a stand-in recommender, and on a
twin world whose truth sits on a tie, recommend run at every interval on the traffic the world
serves (in-process): its answers go back and forth between the tied values, N does not."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_watch import answer

from tuner.decide.watch import (
    EnvFile,
    Watcher,
    WatchOptions,
    acceptance_drift,
    replaces,
)
from tuner.model.acceptance import observed_acceptance
from tuner.policy import Policy
from tuner.storage.store import Store
from tuner.traffic import AcceptanceCounts, ServerView, TrafficProfile


def counts(mean_accepted: float, readings: int = 30, drafts: float = 100.0) -> AcceptanceCounts:
    """Readings whose accepted tokens per draft alternate around mean_accepted (spread 0.1)."""
    out = AcceptanceCounts()
    for i in range(readings):
        m = mean_accepted + (0.1 if i % 2 else -0.1)
        out.add(drafts, 3 * drafts, m * drafts, [m * drafts * 0.6, m * drafts * 0.4])
    return out


def test_acceptance_drift_needs_enough_beyond_the_interval_and_the_threshold() -> None:
    now = observed_acceptance(counts(1.5))
    assert now is not None and now.enough() is None
    assert "now observed enough" in (acceptance_drift(now, None, 0.1) or "")
    assert acceptance_drift(now, 2.5, 0.1) is None  # the same: no drift
    assert acceptance_drift(now, 2.5 * 1.05, 0.1) is None  # beyond the interval, not 10 %
    moved = acceptance_drift(now, 2.5 * 1.2, 0.1)
    assert moved is not None and "drifted" in moved and "-17%" in moved
    few = observed_acceptance(counts(1.5, readings=3))
    assert acceptance_drift(few, 5.0, 0.1) is None  # not enough seen: nothing to go on
    assert acceptance_drift(None, 2.5, 0.1) is None  # nothing drafted


def test_a_new_answer_must_clear_the_margin() -> None:
    tied = answer(3, {1: 90.0, 2: 99.6, 3: 100.0, 4: 97.0})
    held, why = replaces(tied, 2, 0.01)
    assert held is False and "within 1%" in why and "N=2 stands" in why
    assert replaces(tied, 1, 0.01)[0] is True  # 10 % ahead of N=1
    assert replaces(tied, None, 0.01)[0] is True  # nothing stood
    unscored = answer(3, {3: 100.0})
    assert replaces(unscored, 2, 0.01)[0] is None  # two decisions in a row then


def watcher(tmp_path: Path, answers: list, **over: float) -> Watcher:
    view = ServerView("http://127.0.0.1:1", "m", 4, "slots")
    poller = SimpleNamespace(view=view, interval_s=0.25)
    # no dwell: these intervals pass in milliseconds (tests/test_watch_guard.py times it)
    options = WatchOptions(every_s=60.0, window_s=60.0, drift=0.2, dwell_s=0.0, **over)  # type: ignore[arg-type]
    store = Store(f"sqlite:///{tmp_path / 'tuner.db'}")
    feed = iter(answers)
    return Watcher(
        store, poller, EnvFile(tmp_path / "server.env"), "w", options, lambda name: next(feed)
    )  # type: ignore[arg-type]


def test_acceptance_that_drifts_recommends_again_and_a_clear_gain_moves_n(tmp_path: Path) -> None:
    w = watcher(
        tmp_path,
        [
            answer(2),
            answer(3, {1: 80.0, 2: 99.7, 3: 100.0}),  # within the margin: N=2 stands
            answer(3, {1: 80.0, 2: 90.0, 3: 100.0}),  # 10 % ahead: N=3
        ],
    )
    traffic = {1: 30.0, 2: 30.0}

    def interval(start: float, accepted: float) -> None:
        profile = w.rolling.open(start).profile
        for c, s in traffic.items():
            profile.add(c, s)
        profile.acceptance = counts(accepted)

    interval(0.0, 1.5)
    first = w.end_of_interval()
    assert first.changed and w.current == 2
    interval(60.0, 1.5)  # same traffic, same acceptance: nothing asked
    assert not w.end_of_interval().decision.recommend
    interval(120.0, 2.1)  # acceptance 1 + 2.1 against 1 + 1.5: +24 %
    second = w.end_of_interval()
    assert second.decision.recommend and "acceptance drifted" in second.decision.why
    assert not second.changed and w.current == 2  # the model's 0.3 % is within the margin
    interval(180.0, 1.5)  # drifted back: asked again; now 10 % ahead
    third = w.end_of_interval()
    assert third.decision.recommend and third.changed and w.current == 3


@pytest.mark.slow
def test_on_a_tie_the_answers_go_back_and_forth_and_n_does_not(tmp_path: Path) -> None:
    """The bench world at a mean accepted length of 3.0, where drafting at two or three slots
    gains little: the closed truth at the traffic's weights has more than one N within 1 % of
    its best. watch recommends at every interval (a drift of 0.001), each time on the traffic
    and acceptance the world served in the last three intervals: the answers change, N changes
    once (the first answer)."""
    from lab.experiment import arrival_rate
    from lab.method import HOST, twin_spec
    from twinworlds import world

    from tuner.decide import advice
    from tuner.decide.adaptive import profile_adaptively
    from tuner.decide.settle import TOLERANCE
    from tuner.twin.inprocess import TwinBackend
    from tuner.twin.production import ServedTraffic, arrivals
    from tuner.twin.truth import closed_truth

    tie = world("bench").with_updates(acceptance={"synth_len": 3.0}, noise={"preset": "quiet"})
    store = Store(f"sqlite:///{tmp_path / 'tuner.db'}")
    profile_adaptively(
        store, twin_spec(tie), tmp_path, host_name=HOST,
        backend=TwinBackend(tie, switch="live"), switch="live", budget_s=600.0,
    )  # fmt: skip
    served = ServedTraffic(tie, arrivals("poisson", arrival_rate(tie, 0.35), 0), 0, seed=0)
    view = ServerView("http://twin", tie.model_name, tie.n_parallel, "slots", True)
    answers: list[int] = []

    def recommend(name: str):
        # the closed-loop study: its answers on this tie go back and forth
        rec = advice.recommend(store, tie.model_name, HOST, traffic=name, closed_loop=True)
        answers.append(rec.max_slots)
        return rec

    options = WatchOptions(every_s=120.0, window_s=360.0, drift=0.001, min_busy_s=1.0, dwell_s=0.0)
    w = Watcher(
        store, SimpleNamespace(view=view, interval_s=0.25), EnvFile(tmp_path / "server.env"),
        "tie", options, recommend,
    )  # type: ignore[arg-type]  # fmt: skip
    seen = TrafficProfile(tie.n_parallel)
    for k in range(8):
        bucket = w.rolling.open(120.0 * k)
        served.switch(w.current or 0)
        served.window(120.0, bucket.profile)
        seen = seen.plus(bucket.profile)
        w.end_of_interval()
    store.dispose()
    weights = {c: v for c, v in seen.weights(tie.n_parallel).items() if v > 0}
    truth = closed_truth(tie).best(weights)
    near = [
        n
        for n in range(1, tie.n_parallel + 1)
        if truth.regret(Policy.threshold(n, tie.n_max)) <= TOLERANCE
    ]
    assert len(near) >= 2, (near, truth.best)  # the truth sits on a tie
    flips = sum(a != b for a, b in itertools.pairwise(answers))
    assert flips >= 2, answers  # replacing whenever the answer differs would flap
    assert w.summary.changes == 1, (answers, w.summary.changes)
    assert w.current in near
