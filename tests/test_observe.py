"""`tuner observe`'s pure parts (counting generating slots, the traffic histogram and its
weights, finished requests) and its protocol errors against a fake HTTP server (a URL that is not
a llama-server, a wrong key, a server without /slots and /metrics). What it measures is tested
against the real bench in tests/test_observe_bench.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.errors import EndpointMissingError
from tuner.measure import observe as observe_module
from tuner.measure.metrics import parse_metrics
from tuner.measure.observe import Poller
from tuner.measure.readings import (
    Ended,
    FinishedRequests,
    TokenLedger,
    generating_histogram,
    generating_slots,
    split_tokens,
)
from tuner.storage.traffic_profiles import merged
from tuner.traffic import LENGTHS_KEPT, Finished, TrafficProfile, total_variation


def slot(
    i: int,
    processing: bool,
    decoded: int,
    task: int | None = None,
    prompt: int = 40,
    limit: int | None = None,
    drafting: int = 0,
) -> dict:
    """A slot as /slots shows it (as the bench's server does): a generating slot's context is its
    prompt, what it decoded and any draft being verified (drafting); an idle one keeps
    prompt + output - 1 (passed as prompt) with its counts reset."""
    context = prompt + decoded + drafting if processing else prompt
    remain = limit - decoded if limit is not None and processing else -1
    cached = min(prompt, 8) if processing else 0
    return {
        "id": i,
        "is_processing": processing,
        "id_task": task,
        "n_prompt_tokens": context,
        "n_prompt_tokens_processed": prompt - cached if processing else 0,
        "n_prompt_tokens_cache": cached,
        "next_token": [{"n_decoded": decoded if processing else 0, "n_remain": remain}],
    }


def idle(i: int, task: int, prompt: int, output: int) -> dict:
    return slot(i, False, 0, task=task, prompt=prompt + output - 1)


def test_a_slot_generates_once_it_has_decoded_a_token() -> None:
    slots = [slot(0, True, 5), slot(1, True, 0), slot(2, False, 80), slot(3, True, 1)]
    assert generating_slots(slots) == 2  # slot 1 still reads its prompt; slot 2 is idle


def test_the_histogram_gives_shares_weights_and_distances() -> None:
    profile = TrafficProfile(8)
    for count, dt in [(0, 10.0), (1, 30.0), (2, 30.0), (4, 30.0)]:
        profile.add(count, dt)
    assert profile.covered_s == 100.0
    assert profile.shares()[0] == pytest.approx(0.1)
    weights = profile.weights(8)
    assert weights[1] == pytest.approx(1 / 3) and weights[3] == 0.0 and sum(weights.values()) == 1
    assert profile.mean_generating() == pytest.approx(2.1)
    assert total_variation({1: 0.5, 2: 0.5}, {1: 0.5, 2: 0.5}) == 0
    assert total_variation({1: 1.0}, {2: 1.0}) == 1
    assert total_variation({1: 0.6, 2: 0.4}, {1: 0.5, 2: 0.5}) == pytest.approx(0.1)
    again = TrafficProfile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again.seconds == profile.seconds and again.n_slots == 8
    both = merged(again, profile)
    assert both.seconds[4] == 60.0 and both.covered_s == 200.0


def test_the_offered_histogram_counts_overlapping_streams() -> None:
    intervals = [(0.0, 4.0), (1.0, 3.0), (2.0, 6.0)]
    assert generating_histogram(intervals, 0.0, 8.0) == {1: 3.0, 2: 2.0, 3: 1.0, 0: 2.0}
    # only the window counts
    assert generating_histogram(intervals, 2.5, 3.5) == {3: 0.5, 2: 0.5}


def test_finished_requests_are_seen_when_they_leave_their_slot() -> None:
    seen = FinishedRequests()
    assert seen.update([slot(0, True, 3, task=7, prompt=50), slot(1, False, 0)], 100.0) == []
    # Mid-step, a draft being verified sits in the context: the prompt is what was read.
    assert seen.update([slot(0, True, 9, task=7, prompt=50, limit=12, drafting=3)], 100.25) == []
    # Ended between polls and seen idle: its context gives the output exactly; it arrived
    # when first seen, and its prompt is the context less what it had decoded.
    ended = seen.update([idle(0, 7, prompt=50, output=12)], 100.5)
    assert ended == [Ended(100.0, 50, 9, 12, 12)]
    assert ended[0].finished() == Finished(100.0, 50, 12)
    assert seen.update([idle(0, 7, prompt=50, output=12)], 100.75) == []  # counted once
    seen.update([slot(1, True, 4, task=8, prompt=20, limit=30)], 101.0)
    # The slot took another request before the next poll: the first ended after its last
    # sight, within what it was allowed.
    ended = seen.update([slot(1, True, 2, task=9, prompt=30)], 101.25)
    assert ended == [Ended(101.0, 20, 4, 30)]
    assert ended[0].finished() == Finished(101.0, 20, 4)  # without counters: as last seen
    assert seen.update([idle(1, 9, prompt=30, output=3)], 101.5) == [Ended(101.25, 30, 2, None, 3)]
    # An idle context that cannot be the request's (its cache changed): no exact output.
    seen.update([slot(2, True, 5, task=10, prompt=20, limit=8)], 102.0)
    assert seen.update([idle(2, 10, prompt=20, output=40)], 102.25)[0].exact is None


def test_split_tokens_keeps_each_request_within_its_bounds() -> None:
    assert split_tokens(48, [(40, 48)]) == [48]
    assert split_tokens(45, [(40, 48)]) == [45]  # ended early (end of text): still exact
    assert split_tokens(144, [(40, 48), (44, 48), (47, 48)]) == [48, 48, 48]
    # One ended early (4 tokens short in all): each gained the same since last seen until its
    # limit, so the one furthest from its limit is the one that stopped short.
    assert split_tokens(140, [(40, 48), (44, 48), (47, 48)]) == [44, 48, 48]
    assert split_tokens(20, [(3, None), (5, 6)]) == [14, 6]
    assert split_tokens(30, [(10, 12), (10, 12)]) == [12, 12]  # left over: requests never seen
    assert split_tokens(5, [(4, 8), (3, 8)]) == [4, 3]  # less than seen: never below a low


def test_the_ledger_settles_a_counter_increase_over_the_requests_waiting() -> None:
    ledger = TokenLedger()
    ledger.waiting = [Ended(1.0, 30, 44, 48)]
    assert ledger.settle(500.0) == [Finished(1.0, 30, 44)]  # no base yet: as last seen
    ledger.waiting = [Ended(2.0, 30, 44, 48), Ended(2.5, 20, 40, 48, 47)]
    # The counter decides (an idle slot's context only stands in without it).
    assert ledger.settle(596.0) == [Finished(2.0, 30, 48), Finished(2.5, 20, 48)]
    ledger.waiting = [Ended(3.0, 30, 5, None)]
    assert ledger.settle(10.0) == [Finished(3.0, 30, 5)]  # the counter went back: a restart
    assert ledger.base == 10.0


def test_a_profile_counts_every_request_but_keeps_only_the_newest() -> None:
    profile = TrafficProfile(4)
    profile.add(1, 100.0)
    for i in range(LENGTHS_KEPT + 10):
        profile.add_finished(Finished(float(i), 10, 100 + (i % 2)))
    assert profile.finished == LENGTHS_KEPT + 10
    assert len(profile.requests) == LENGTHS_KEPT  # memory stays flat
    assert profile.requests[0].arrival == 10.0
    assert profile.arrival_rate == pytest.approx((LENGTHS_KEPT + 10) / 100.0)
    assert profile.mean_output_tokens == pytest.approx(100.5, abs=0.01)
    again = TrafficProfile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again.finished == profile.finished and again.output_total == profile.output_total
    assert list(again.requests) == list(profile.requests)
    both = again.plus(profile)
    assert both.finished == 2 * profile.finished and len(both.requests) == LENGTHS_KEPT


class Scripted:
    """A stand-in for the client: each /slots and /metrics call answers the next state."""

    url = "http://scripted"

    def __init__(self, states: list[tuple[str, object]]) -> None:
        self.states = list(states)
        self.calls: list[str] = []

    def props(self) -> dict:
        return {"total_slots": 2, "model_path": "/m/x.gguf"}

    def _next(self, kind: str) -> object:
        self.calls.append(kind)
        want, answer = self.states.pop(0)
        assert want == kind, (want, kind, self.calls)
        return answer

    def slots(self) -> list[dict]:
        return self._next("slots")  # type: ignore[return-value]

    def metrics(self):
        return parse_metrics(f"llamacpp:tokens_predicted_total {self._next('metrics')}\n")

    def close(self) -> None:
        pass


def test_the_poller_settles_outputs_only_when_no_request_ended_around_the_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = 7, 8  # two requests of 48 tokens, prompts 30 and 20
    states: list[tuple[str, object]] = [
        ("slots", []),  # attach: /slots answers
        ("metrics", 100),  # attach: and /metrics, so outputs come from the counter
        # poll 1: both generating; the base is read (nothing ended around it)
        ("slots", [slot(0, True, 10, a, 30, 48), slot(1, True, 12, b, 20, 48)]),
        ("metrics", 100),
        ("slots", [slot(0, True, 11, a, 30, 48), slot(1, True, 13, b, 20, 48)]),
        # poll 2: a's slot took another request; b ends between /slots and the reading
        ("slots", [slot(0, True, 2, 9, 25, 48), slot(1, True, 47, b, 20, 48)]),
        ("metrics", 196),
        ("slots", [slot(0, True, 3, 9, 25, 48), slot(1, True, 1, 10, 20, 48)]),
        # poll 3: nothing ended around this reading: a and b are settled
        ("slots", [slot(0, True, 20, 9, 25, 48), slot(1, True, 18, 10, 20, 48)]),
        ("metrics", 196),
        ("slots", [slot(0, True, 21, 9, 25, 48), slot(1, True, 19, 10, 20, 48)]),
    ]
    client = Scripted(states)
    monkeypatch.setattr(observe_module, "_client", lambda url, key: client)
    poller = Poller("http://scripted", sleep=lambda s: None, wall=lambda: 1000.0)
    assert poller.view.counters
    profile = TrafficProfile(2)
    for _ in range(3):
        assert poller.step(profile)
    assert not client.states
    # a was last seen at 11 of 48 and b at 47: the counter says 96 for the two, so 48 each.
    assert sorted(profile.requests) == [Finished(1000.0, 20, 48), Finished(1000.0, 30, 48)]
    assert poller.ledger.base == 196 and not poller.ledger.waiting


def test_every_request_is_stamped_on_the_servers_clock_where_it_reports_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The twin's /slots carry its clock: a request first seen in a poll's /slots and one first
    seen in the second /slots read that settles the counter both arrive on it (a replayed trace
    of Unix and virtual times mixed would be nonsense)."""
    a, b = 7, 8

    def at(t: float, slots: list[dict]) -> list[dict]:
        return [{**s, "t_server": t} for s in slots]

    states: list[tuple[str, object]] = [
        ("slots", []),
        ("metrics", 100),
        ("slots", at(10.0, [slot(0, True, 10, a, 30, 48), slot(1, True, 12, b, 20, 48)])),
        ("metrics", 100),
        ("slots", at(10.5, [slot(0, True, 11, a, 30, 48), slot(1, True, 13, b, 20, 48)])),
        # a ended before this poll's /slots; b between it and the counter's reading
        ("slots", at(20.0, [slot(0, True, 2, 9, 25, 48), slot(1, True, 47, b, 20, 48)])),
        ("metrics", 196),
        ("slots", at(20.5, [slot(0, True, 3, 9, 25, 48), slot(1, True, 1, 10, 20, 48)])),
        ("slots", at(30.0, [slot(0, True, 20, 9, 25, 48), slot(1, True, 18, 10, 20, 48)])),
        ("metrics", 196),
        ("slots", at(30.5, [slot(0, True, 21, 9, 25, 48), slot(1, True, 19, 10, 20, 48)])),
    ]
    client = Scripted(states)
    monkeypatch.setattr(observe_module, "_client", lambda url, key: client)
    poller = Poller("http://scripted", sleep=lambda s: None, wall=lambda: 1_800_000_000.0)
    profile = TrafficProfile(2)
    for _ in range(3):
        assert poller.step(profile)
    assert sorted(profile.requests) == [Finished(10.0, 20, 48), Finished(10.0, 30, 48)]
    # 10 was first seen in the read that settles the counter, 9 in a poll's own /slots
    assert {f.task: f.arrival for f in poller.finished.current.values()} == {9: 20.0, 10: 20.5}


def test_without_metrics_an_idle_slot_gives_the_output(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoMetrics(Scripted):
        def metrics(self):
            self.calls.append("metrics")
            raise EndpointMissingError("no /metrics", path="/metrics", status=501)

    states: list[tuple[str, object]] = [
        ("slots", []),  # attach
        ("slots", [slot(0, True, 10, 7, 30, 48), slot(1, True, 0, 8, 12, 48)]),
        # 7 ended and its slot is seen idle: exact; 8 ended while still reading its prompt, and
        # its slot took 9 at once: unknown, not recorded
        ("slots", [idle(0, 7, prompt=30, output=48), slot(1, True, 5, 9, 20, 64)]),
        # 9's slot took another request before it was seen idle: as last seen
        ("slots", [idle(0, 7, prompt=30, output=48), slot(1, True, 1, 10, 20, 64)]),
    ]
    client = NoMetrics(states)
    monkeypatch.setattr(observe_module, "_client", lambda url, key: client)
    poller = Poller("http://scripted", sleep=lambda s: None, wall=lambda: 1000.0)
    assert not poller.view.counters
    profile = TrafficProfile(2)
    for _ in range(3):
        assert poller.step(profile)
    assert list(profile.requests) == [Finished(1000.0, 30, 48), Finished(1000.0, 20, 5)]
    assert client.calls.count("metrics") == 1  # only the attach's probe


class _Fake(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[int, str]]] = {}

    def do_GET(self) -> None:
        status, body = self.routes.get(self.path, (404, "not found"))
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake() -> Iterator[tuple[str, dict[str, tuple[int, str]]]]:
    routes: dict[str, tuple[int, str]] = {}
    handler = type("Handler", (_Fake,), {"routes": routes})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", routes
    server.shutdown()


def one_line_error(args: list[str], *fragments: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip() and "━" not in line]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_a_url_that_is_not_a_llama_server(fake: tuple[str, dict]) -> None:
    url, routes = fake
    routes["/props"] = (200, json.dumps({"hello": "world"}))
    one_line_error(["observe", "--url", url, "--duration", "1"], "is not a llama-server")


def test_a_wrong_api_key(fake: tuple[str, dict]) -> None:
    url, routes = fake
    routes["/props"] = (401, "unauthorized")
    one_line_error(
        ["observe", "--url", url, "--duration", "1", "--api-key", "nope"], "rejected the API key"
    )


def test_a_server_without_slots_or_metrics(fake: tuple[str, dict]) -> None:
    url, routes = fake
    routes["/props"] = (200, json.dumps({"total_slots": 4, "model_path": "/m/x.gguf"}))
    routes["/slots"] = (501, "disabled")
    one_line_error(
        ["observe", "--url", url, "--duration", "1"], "neither /slots", "--slots or --metrics"
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--url", "localhost:8080"], "must be an http"),
        (["--url", "http://127.0.0.1:9", "--duration", "0"], "--duration must be above 0"),
        (["--url", "http://127.0.0.1:9", "--duration", "ten"], "expected a duration"),
    ],
)
def test_bad_observe_options(args: list[str], fragment: str) -> None:
    result = CliRunner().invoke(app, ["observe", *args])
    assert result.exit_code == 2 and fragment in result.output + result.stderr, result.output


def test_recommend_with_an_unknown_traffic_profile_names_the_known(tmp_path) -> None:
    from benchdata import store_profile

    from tuner.storage.store import Store

    store_profile(Store(f"sqlite:///{tmp_path / 'tuner.db'}"))
    one_line_error(
        ["recommend", "--model", "smollm2-bench", "--host", "bench-host", "--traffic", "nope"],
        "no traffic profile named 'nope'",
        "tuner observe",
    )


def test_a_server_that_reports_its_clock_is_timed_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A twin at --speed 10 says in /slots what time it is on its own clock: observe adds that
    time, not the client's (which ran ten times slower), so rates and shares do not depend on
    the speed."""

    class NoMetrics(Scripted):
        def metrics(self):
            self.calls.append("metrics")
            raise EndpointMissingError("no /metrics", path="/metrics", status=501)

    def at(t: float, slots: list[dict]) -> list[dict]:
        return [{**s, "t_server": t} for s in slots]

    states: list[tuple[str, object]] = [
        ("slots", []),  # attach
        ("slots", at(100.0, [slot(0, True, 10, 7, 30, 48), slot(1, False, 0, 8, 0, 48)])),
        ("slots", at(110.0, [slot(0, True, 20, 7, 30, 48), slot(1, True, 5, 8, 20, 48)])),
        ("slots", at(115.0, [slot(0, True, 25, 7, 30, 48), slot(1, True, 9, 8, 20, 48)])),
    ]
    client = NoMetrics(states)
    monkeypatch.setattr(observe_module, "_client", lambda url, key: client)
    wall = iter(range(0, 1000))  # the client's clock: 1 s a poll
    poller = Poller(
        "http://scripted", sleep=lambda s: None, wall=lambda: 1000.0, clock=lambda: next(wall)
    )
    profile = TrafficProfile(2)
    for _ in range(3):
        assert poller.step(profile)
    # the first poll has no earlier server time: the client's 2 s; then the server's 10 s and
    # 5 s (the client counted 2 s each), each added to the count seen at the poll
    assert profile.seconds == pytest.approx({1: 2.0, 2: 15.0})


def test_seconds_the_caller_spent_elsewhere_count_nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """watch decides between intervals, seconds in which nobody polls: after `resume` the next
    poll counts from then, so those seconds are not credited to the count it happens to see
    (here 8 s of a decision would have gone to 2 slots generating)."""

    class NoMetrics(Scripted):
        def metrics(self):
            raise EndpointMissingError("no /metrics", path="/metrics", status=501)

    one = [slot(0, True, 10, 7, 30, 48), slot(1, False, 0, 8, 0, 48)]
    two = [slot(0, True, 20, 7, 30, 48), slot(1, True, 5, 8, 20, 48)]
    states: list[tuple[str, object]] = [("slots", [])] + [("slots", one)] * 2
    states += [("slots", two)] * 2
    client = NoMetrics(states)
    monkeypatch.setattr(observe_module, "_client", lambda url, key: client)
    now = [0.0]
    poller = Poller(
        "http://scripted", sleep=lambda s: None, wall=lambda: 1000.0, clock=lambda: now[0]
    )
    profile = TrafficProfile(2)
    for t in (1.0, 2.0):  # two polls a second apart at 1 slot generating
        now[0] = t
        assert poller.step(profile)
    now[0] = 10.0  # 8 s deciding
    poller.resume()
    for t in (11.0, 12.0):
        now[0] = t
        assert poller.step(profile)
    assert profile.seconds == pytest.approx({1: 2.0, 2: 2.0})
