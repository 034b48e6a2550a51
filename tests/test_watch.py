"""`tuner watch`'s own logic: the env file it owns one line of, the rolling window and its
restart, the drift rule, and what an interval's end does with an answer (the answer itself comes
from a stand-in here; tests/test_watch_bench.py runs the whole service against the bench).
Bad input and protocol faults are one line each (a fake HTTP server stands in for the server
only to produce them)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_observe import fake, one_line_error  # noqa: F401  (fake is a fixture)

from tuner.decide.watch import (
    Decision,
    EnvFile,
    RollingTraffic,
    Watcher,
    WatchOptions,
    decide,
)
from tuner.errors import ConfigError, NothingToDoError
from tuner.policy import Policy
from tuner.recommendation import Reason, ReasonCode, Recommendation
from tuner.storage.store import Store
from tuner.traffic import Finished, ServerView, TrafficProfile


def test_the_env_file_keeps_other_lines_and_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "server.env"
    path.write_text(
        "# the server's settings\nLLAMA_ARG_CTX_SIZE=8192\nLLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=4\n"
    )
    path.chmod(0o640)
    env = EnvFile(path)
    assert env.current_max_slots() == 4
    env.write({"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS": "2"})
    assert path.read_text() == (
        "# the server's settings\nLLAMA_ARG_CTX_SIZE=8192\nLLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=2\n"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["server.env"]  # no temporary left behind
    fresh = EnvFile(tmp_path / "new.env")
    assert fresh.current_max_slots() is None
    fresh.write({"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS": "1"})
    assert (tmp_path / "new.env").read_text() == "LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=1\n"


def test_an_env_file_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot write in"):
        EnvFile(tmp_path / "missing" / "server.env").check_writable()
    with pytest.raises(ConfigError, match="is a directory"):
        EnvFile(tmp_path).check_writable()
    if os.geteuid() != 0:  # root writes anywhere: the mode check is for ordinary users
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ConfigError, match="cannot write in"):
            EnvFile(locked / "server.env").check_writable()


def profile_at(counts: dict[int, float], n_slots: int = 8) -> TrafficProfile:
    profile = TrafficProfile(n_slots)
    for c, seconds in counts.items():
        profile.add(c, seconds)
    return profile


def test_drift_decides_when_to_recommend_again() -> None:
    light = profile_at({0: 10.0, 1: 60.0, 2: 30.0})
    assert decide(light, None, 0.1).recommend  # nothing decided yet
    shares = light.shares(busy_only=True)
    same = decide(profile_at({1: 61.0, 2: 29.0}), shares, 0.1)
    assert not same.recommend and same.drift == pytest.approx(0.011, abs=1e-3)
    moved = decide(profile_at({6: 50.0, 8: 50.0}), shares, 0.1)
    assert moved.recommend and moved.drift == pytest.approx(1.0)
    idle = decide(profile_at({0: 600.0, 1: 2.0}), None, 0.1)
    assert not idle.recommend and "busy time" in idle.why
    # --min-busy moves the gate: 2 s of busy time is enough under a 1 s gate, not under 3 s
    assert decide(profile_at({0: 600.0, 1: 2.0}), None, 0.1, min_busy_s=1.0).recommend
    assert not decide(profile_at({0: 600.0, 1: 2.0}), None, 0.1, min_busy_s=3.0).recommend


def test_the_window_drops_old_intervals_and_a_restart_goes_on(tmp_path: Path) -> None:
    rolling = RollingTraffic(8, "slots", window_s=300.0)
    for k in range(5):
        bucket = rolling.open(1000.0 + 100.0 * k)
        bucket.profile.add(k + 1, 100.0)
        bucket.profile.add_finished(Finished(1000.0 + 100.0 * k, 10, 50))
    assert [b.start for b in rolling.buckets] == [1200.0, 1300.0, 1400.0]  # the last 300 s
    total = rolling.total()
    assert total.seconds == {3: 100.0, 4: 100.0, 5: 100.0} and total.finished == 3
    saved = json.loads(json.dumps(rolling.to_dict()))
    # what recommend --traffic reads: the rolling total
    assert TrafficProfile.from_dict(saved).seconds == total.seconds
    later = RollingTraffic.restore(saved, 8, "slots", 300.0, now=1590.0)
    assert [b.start for b in later.buckets] == [1300.0, 1400.0]
    again = later.total()
    assert again.seconds == {4: 100.0, 5: 100.0} and again.finished == 2
    assert [r.arrival for r in again.requests] == [1300.0, 1400.0]


def answer(n: int, scores: dict[int, float] | None = None) -> Recommendation:
    """A stand-in answer; scores: the model's objective of each N (its study's alternatives),
    the answer's 100 and every other 20 % lower by default."""
    scores = scores or {m: 100.0 if m == n else 80.0 for m in range(1, 7)}
    return Recommendation(
        id=1,
        model="m",
        host="h",
        policy=Policy.of_max_slots(n, 6),
        fit_id=1,
        objective=scores[n],
        reasons=[Reason(ReasonCode.TRAFFIC, "stand-in")],
        alternatives=[{"max_slots": m, "objective": v} for m, v in scores.items()],
    )


class Answers:
    """A stand-in recommender: the answer for light traffic, another for heavy."""

    def __init__(self) -> None:
        self.asked = 0
        self.heavy = False

    def __call__(self, name: str) -> Recommendation:
        self.asked += 1
        return answer(1 if self.heavy else 3)


def watcher(tmp_path: Path, recommender, on_change: str | None = None) -> Watcher:
    view = ServerView("http://127.0.0.1:1", "m", 8, "slots")
    poller = SimpleNamespace(view=view, interval_s=0.25)
    # no dwell: these intervals pass in milliseconds (tests/test_watch_guard.py times it)
    options = WatchOptions(every_s=60.0, window_s=60.0, drift=0.2, on_change=on_change, dwell_s=0.0)
    store = Store(f"sqlite:///{tmp_path / 'tuner.db'}")
    return Watcher(
        store, poller, EnvFile(tmp_path / "server.env"), "watch-test", options, recommender
    )  # type: ignore[arg-type]


def test_an_interval_end_writes_and_runs_the_command_only_on_a_change(tmp_path: Path) -> None:
    answers = Answers()
    marker = tmp_path / "reloads"
    w = watcher(tmp_path, answers, on_change=f"echo reload >> {marker}")
    bucket = w.rolling.open(0.0)
    bucket.profile.add(1, 60.0)
    first = w.end_of_interval()
    assert first.changed and first.max_slots == 3 and first.command_exit == 0
    assert w.env.current_max_slots() == 3 and marker.read_text() == "reload\n"
    # same traffic: no recommend, nothing written, no command
    w.rolling.open(60.0).profile.add(1, 60.0)
    second = w.end_of_interval()
    assert not second.decision.recommend and answers.asked == 1
    # the traffic moves: recommend again; a new answer is written once and reloaded once
    answers.heavy = True
    w.rolling.open(120.0).profile.add(8, 60.0)
    third = w.end_of_interval()
    assert third.changed and w.env.current_max_slots() == 1
    assert marker.read_text() == "reload\nreload\n"
    assert (w.summary.changes, w.summary.writes) == (2, 2)
    # the traffic profile it decided on is stored under its name for `recommend --traffic`
    w.save()
    from tuner.storage.traffic_profiles import load

    assert load(w.store, "watch-test").seconds == {8: 60.0}


def test_a_failing_recommend_or_command_keeps_the_service_going(tmp_path: Path) -> None:
    def broken(name: str) -> Recommendation:
        raise NothingToDoError("no profile for model 'm'")

    w = watcher(tmp_path, broken)
    w.rolling.open(0.0).profile.add(2, 60.0)
    event = w.end_of_interval()
    assert not event.changed and w.env.current_max_slots() is None
    assert event.decision == Decision(True, "no answer made from this traffic yet")
    w2 = watcher(tmp_path, Answers(), on_change="exit 3")
    w2.rolling.open(0.0).profile.add(2, 60.0)
    assert w2.end_of_interval().command_exit == 3
    assert w2.env.current_max_slots() == 3  # written before the command ran


def test_bad_watch_options_are_one_line(tmp_path: Path) -> None:
    base = ["watch", "--model", "m", "--url", "http://127.0.0.1:9"]
    one_line_error([*base, "--env-file", str(tmp_path / "no" / "x.env")], "cannot write in")
    one_line_error([*base, "--env-file", str(tmp_path / "x.env"), "--every", "0"], "--every")
    one_line_error(
        [*base, "--env-file", str(tmp_path / "x.env"), "--every", "1h", "--window", "10m"],
        "--window",
    )
    one_line_error([*base, "--env-file", str(tmp_path / "x.env"), "--drift", "0"], "--drift")
    one_line_error(
        [*base, "--env-file", str(tmp_path / "x.env"), "--every", "1m", "--min-busy", "5m"],
        "--min-busy",
    )
    one_line_error(
        ["watch", "--model", "m", "--url", "localhost:1", "--env-file", "x.env"], "http://"
    )


def test_watch_refuses_what_is_not_a_llama_server(fake: tuple[str, dict], tmp_path: Path) -> None:  # noqa: F811
    url, routes = fake
    env = tmp_path / "x.env"
    routes["/props"] = (200, json.dumps({"hello": "world"}))
    one_line_error(
        ["watch", "--model", "m", "--url", url, "--env-file", str(tmp_path / "x.env")],
        "is not a llama-server",
    )
    routes["/props"] = (401, "unauthorized")
    one_line_error(
        ["watch", "--model", "m", "--url", url, "--env-file", str(tmp_path / "x.env")],
        "wants an API key",
    )
    one_line_error(
        ["watch", "--model", "m", "--url", url, "--api-key", "nope", "--env-file", str(env)],
        "rejected the API key",
    )


def test_an_env_file_that_cannot_be_written_later_is_tried_again(tmp_path: Path) -> None:
    said: list[str] = []
    w = watcher(tmp_path, Answers())
    w.observer = lambda event: said.append(event.text or "")
    w.env = EnvFile(tmp_path / "gone" / "server.env")  # its folder is not there (any more)
    w.rolling.open(0.0).profile.add(2, 60.0)
    first = w.end_of_interval()
    assert not first.changed and w.summary.writes == 0 and "could not be written" in said[-1]
    (tmp_path / "gone").mkdir()
    w.rolling.open(60.0).profile.add(2, 60.0)  # the same traffic: it tries again all the same
    again = w.end_of_interval()
    assert again.changed and w.env.current_max_slots() == 3


def test_the_standing_answer_is_applied_at_start_where_the_env_file_has_none(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "reloads"
    w = watcher(tmp_path, Answers(), on_change=f"echo reload >> {marker}")
    w.adopt(None)  # nothing stored yet: nothing written
    assert w.env.current_max_slots() is None and not marker.exists()
    w.adopt(answer(4))
    assert w.env.current_max_slots() == 4 and w.current == 4
    assert marker.read_text() == "reload\n" and w.summary.writes == 1
    # a restarted watcher keeps what its env file holds: the last N it applied
    again = watcher(tmp_path, Answers())
    again.adopt(answer(2))
    assert again.env.current_max_slots() == 4 and again.current == 4
    # an answer without a threshold (plain) has no N to write
    (tmp_path / "other").mkdir()
    fresh = watcher(tmp_path / "other", Answers())
    plain = answer(4)
    plain.policy = Policy.plain()
    fresh.adopt(plain)
    assert fresh.env.current_max_slots() is None


def test_the_margin_reads_an_open_loop_answers_alternatives() -> None:
    """The open loop's alternatives name policies (plain, N=0, N=k), the closed study's N:
    both are scored, plain left out, and the margin rule reads them alike."""
    from tuner.decide.watch import replaces

    rec = answer(3)
    rec.alternatives = [
        {"policy": "plain", "objective": 120.0, "difference_from_chosen": -20.0},
        {"policy": "N=0", "objective": 90.0, "difference_from_chosen": 10.0},
        {"policy": "N=2", "objective": 99.5, "difference_from_chosen": 0.5},
        {"policy": "N=3", "objective": 100.0, "difference_from_chosen": 0.0},
    ]
    assert rec.scored() == {0: 90.0, 2: 99.5, 3: 100.0}
    assert replaces(rec, 2, 0.01)[0] is False  # 0.5 % ahead: N=2 stands
    assert replaces(rec, 0, 0.01)[0] is True  # 10 % ahead
    assert replaces(rec, 5, 0.01)[0] is None  # not scored: two decisions in a row decide
