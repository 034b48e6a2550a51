"""Someone else's requests (tuner.measure.foreign): a round that overlapped requests the tuner
did not send is seen from the /metrics scrapes around it and left out; a tune waits for a quiet
server, says so, and gives up with one line.

The server is a twin in a thread of this process; the "others" are a second client sending
requests from a thread while the tuner measures."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from twinthread import four_rounds, twin_in_thread

from tuner.errors import ServerError
from tuner.measure.attach import attach
from tuner.measure.foreign import foreign_requests, wait_for_quiet
from tuner.measure.load import Workload
from tuner.measure.metrics import Metrics, MetricSample
from tuner.measure.plan import ProgressEvent
from tuner.measure.rounds import measure_round
from tuner.storage.orm import Level
from tuner.storage.store import Store
from tuner.twin.server import TwinServer

ROUND = Workload(prompt_tokens=16, max_tokens=32, stream=True)


@pytest.fixture
def server() -> Iterator[TwinServer]:
    twin = twin_in_thread(speed=5)
    yield twin
    twin.stop_thread()


class Others:
    """A client that is not the tuner: one request at a time, from a thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.threads: list[threading.Thread] = []
        self.errors: list[Exception] = []  # a request cut off by the server's end, say

    def send(self, tokens: int, after_s: float = 0.0) -> None:
        def run() -> None:
            time.sleep(after_s)
            body = {"prompt": "someone else's prompt", "n_predict": tokens}
            try:
                httpx.post(f"{self.url}/completion", json=body, timeout=120).raise_for_status()
            except httpx.HTTPError as exc:
                self.errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def busy_until_seen(self) -> None:
        """Returns once the server shows a slot processing (the request reached it)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            slots = httpx.get(f"{self.url}/slots", timeout=10).json()
            if any(s["is_processing"] for s in slots):
                return
            time.sleep(0.02)
        raise AssertionError("the other client's request never reached the server")

    def join(self) -> None:
        """Once every request ended; they must have succeeded."""
        for thread in self.threads:
            thread.join(120)
        assert not self.errors


def _round(url: str, key: int, workload: Workload = ROUND):
    return measure_round(url, (0, 2), key, workload, lambda _, detail: detail, "in a test")


def _scrape(processing: int, predicted: int) -> Metrics:
    return Metrics(
        (
            MetricSample("requests_processing", {}, processing, gauge=True),
            MetricSample("tokens_predicted_total", {}, predicted),
        )
    )


def test_the_counters_account_for_the_rounds_own_tokens_exactly() -> None:
    assert foreign_requests(_scrape(0, 100), _scrape(0, 164), 64) is None
    one = foreign_requests(_scrape(0, 100), _scrape(0, 165), 64)  # a 1-token request of others
    assert one is not None and one.tokens == 1
    spanning = foreign_requests(_scrape(1, 100), _scrape(1, 164), 64)
    assert spanning is not None and (spanning.processing_before, spanning.tokens) == (1, 0)


def test_quiet_rounds_are_not_foreign(server: TwinServer) -> None:
    for key in range(3):
        measured = _round(server.url, key)
        assert measured.drafting["tokens_predicted"] == sum(s.tokens for s in measured.samples)
        assert measured.foreign is None


def test_a_request_of_others_spanning_a_round_is_seen(server: TwinServer) -> None:
    others = Others(server.url)
    others.send(2000)
    others.busy_until_seen()
    measured = _round(server.url, 0)
    assert measured.foreign is not None
    assert measured.foreign.processing_before == 1 and measured.foreign.processing_after == 1
    assert "requests the tuner did not send" in measured.foreign.why()


def test_a_request_of_others_inside_a_round_is_seen(server: TwinServer) -> None:
    others = Others(server.url)
    others.send(5, after_s=0.3)  # the round below lasts seconds: the request falls inside it
    measured = _round(server.url, 0, Workload(prompt_tokens=16, max_tokens=300, stream=True))
    others.join()
    assert measured.foreign is not None
    # ended inside the round (its 5 tokens counted) or, on a slow machine, still running at its end
    assert measured.foreign.tokens == 5 or measured.foreign.processing_after == 1


def test_a_profile_leaves_out_and_measures_again_the_rounds_others_shared(
    server: TwinServer, tmp_path: Path
) -> None:
    store = Store(f"sqlite:///{tmp_path / 'foreign.db'}")
    others = Others(server.url)
    said: list[str] = []

    def observer(event: ProgressEvent) -> None:
        said.append(event.text)
        if event.kind == "repeat" and not others.threads:
            others.send(300)  # after the first round: it runs through the next ones
            others.busy_until_seen()

    overrides = four_rounds(32)
    attach(store, server.url, "shared", "twin", None, tmp_path, observer, overrides=overrides)
    others.join()
    with store.session() as session:
        level = session.scalars(select(Level)).one()
        counted, kept_apart = level.metrics["repeats"], level.metrics.get("stalled", [])
    assert not counted[0].get("foreign")  # the first round, before the others came
    assert kept_apart and all(r["foreign"] for r in kept_apart)
    assert any(not r.get("foreign") for r in counted[1:])  # measured again once they left
    warnings = [s for s in said if "requests the tuner did not send" in s]
    assert any("measuring the round again" in s for s in warnings)
    rounds = len(counted) + len(kept_apart)
    assert (
        f"{len(kept_apart) + sum(bool(r.get('foreign')) for r in counted)} of {rounds} rounds"
        in (said[-1])
    )


def test_waiting_for_a_quiet_server(server: TwinServer) -> None:
    said: list[str] = []

    def observer(event: ProgressEvent) -> None:
        said.append(event.text)

    assert wait_for_quiet(server.url, None, 5.0, observer, settle_s=0.2, poll_s=0.05) < 5.0
    assert said == []  # quiet already: nothing to say

    others = Others(server.url)
    others.send(100)  # some seconds of others' work, then quiet
    others.busy_until_seen()
    waited = wait_for_quiet(server.url, None, 120.0, observer, settle_s=0.2, poll_s=0.05)
    others.join()
    assert waited > 0.2
    assert len(said) == 1 and "1 of 4 slots busy; waiting up to" in said[0]


@pytest.mark.parametrize("slots", ["--slots", "--no-slots"])
def test_giving_up_on_a_server_that_stays_busy(slots: str) -> None:
    twin = twin_in_thread(slots, speed=1)
    try:
        others = Others(twin.url)
        others.send(5000)  # minutes at speed 1
        others.busy_until_seen() if slots == "--slots" else time.sleep(0.5)
        said: list[str] = []
        with pytest.raises(ServerError, match="still serving others' requests") as gave_up:
            wait_for_quiet(twin.url, None, 1.0, lambda e: said.append(e.text), poll_s=0.1)
        assert len(str(gave_up.value).splitlines()) == 1 and "--wait" in str(gave_up.value)
        assert said and "waiting up to 1 s" in said[0]
    finally:
        twin.stop_thread()
