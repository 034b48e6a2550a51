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
from tuner.measure.observe import (
    LENGTHS_KEPT,
    Finished,
    FinishedRequests,
    TrafficProfile,
    generating_histogram,
    generating_slots,
    total_variation,
)
from tuner.storage.traffic import merged


def slot(i: int, processing: bool, decoded: int, task: int | None = None, prompt: int = 40) -> dict:
    return {
        "id": i,
        "is_processing": processing,
        "id_task": task,
        "n_prompt_tokens": prompt,
        "next_token": [{"n_decoded": decoded}],
    }


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
    assert seen.update([slot(0, True, 9, task=7, prompt=50)], 100.25) == []
    # finished between polls: the idle slot still shows the request's final counts, and it
    # arrived when first seen
    assert seen.update([slot(0, False, 12, task=7, prompt=50)], 100.5) == [Finished(100.0, 50, 12)]
    assert seen.update([slot(0, False, 12, task=7, prompt=50)], 100.75) == []  # counted once
    seen.update([slot(1, True, 4, task=8, prompt=20)], 101.0)
    # the slot took another request before the next poll: the first ended at its last sight
    assert seen.update([slot(1, True, 2, task=9, prompt=30)], 101.25) == [Finished(101.0, 20, 4)]
    assert seen.update([slot(1, False, 2, task=9, prompt=30)], 101.5) == [Finished(101.25, 30, 2)]


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

    from tuner.storage.engine import Store

    store_profile(Store(f"sqlite:///{tmp_path / 'tuner.db'}"))
    one_line_error(
        ["recommend", "--model", "smollm2-bench", "--host", "bench-host", "--traffic", "nope"],
        "no traffic profile named 'nope'",
        "tuner observe",
    )
