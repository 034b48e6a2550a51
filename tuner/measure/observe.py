"""`tuner observe`: learn a running llama-server's traffic without touching it.

It polls `/slots` (how many slots are generating: processing with at least one token decoded;
a slot still reading its prompt is not generating yet) every SAMPLE_INTERVAL_S over one kept-alive
connection, and adds the time between two polls to the histogram bin of the count seen. Where
`/slots` is off (`--no-slots`) it reads the `requests_processing` gauge from `/metrics` instead,
which counts slots reading their prompt too (said so in the stored profile).

From `/slots` it also records every request seen finishing: when it arrived (first seen), its
prompt (the tokens its slot read plus those it found cached) and its output. The output is the
server's own count: llama-server adds a request's whole output to `tokens_predicted_total`
(/metrics) when the request ends, so the counter's increase since the last settlement, read
between two /slots polls that show no request ending in between, is the sum of the outputs of
the requests seen ending since, split over them within what each had decoded when last seen and
what it was allowed (`split_tokens`: exact when one ended alone or all ran to their limit).
Without /metrics an output is exact when its slot is seen idle before it takes the next request
(the idle slot's context holds prompt + output - 1 tokens), else the decoded count last seen.

The same readings of /metrics carry the server's own acceptance counters (drafts, draft tokens,
accepted tokens in all and per draft position: `counter_reading`), which llama-server adds to
when a request ends: their increases between readings go into the profile's AcceptanceCounts,
one group of whole requests a reading (`counter_step`). A counter that went down (the server
restarted) leaves that interval out, and says so; a server without the counters, or without
the per-position ones, is said once; so are requests waiting for a free slot (requests_deferred:
the server at capacity, its arrival rate the rate it served).

Acceptance by drafting slots: each generating slot's request is credited, poll by poll, with
the number of slots generating then, where new drafts could start (at most the server's
threshold N generating, read from GET /props; any number at N = 0); a reading's increments go
to the count at which the requests that ended since the last reading spent CLEAN_SHARE of their
drafting time or more, and to none where they mixed counts (`DraftingExposure`, into
TrafficProfile.by_drafting; the overall acceptance keeps every reading). The threshold counts
generating slots only, as llama-server's patch does: a slot still reading its prompt neither
drafts nor counts.

It never changes how the server serves; reading /metrics restarts the averaging window of the
server's two rate gauges (prompt and predicted tokens per second) for anyone else scraping them,
so observe reads it only to start and at polls where a request ended. When the server goes away
it says so, keeps what it has, polls until the server is back and goes on; time without an
answer counts nowhere. The profile is written to the database every FLUSH_S, so a kill loses at
most that much.

The pure parts (what a poll's slots and a reading's counters tell: counting, the finished
requests and their outputs, the counters' steps, the drafting exposure) are
tuner.measure.readings'; the poller and the loop (`observe`) here are the parts that do I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from tuner.errors import ConfigError, EndpointMissingError, ServerError
from tuner.measure.client import LlamaClient, model_name
from tuner.measure.hold import recover_left_hold
from tuner.measure.metrics import PER_POSITION, Metrics
from tuner.measure.plan import Observer, ProgressEvent, quiet
from tuner.measure.readings import (
    DRAFTS,
    RESTARTED,
    CounterReading,
    DraftingExposure,
    FinishedRequests,
    TokenLedger,
    counter_reading,
    counter_step,
    generating_slots,
    served_time,
)
from tuner.traffic import (
    SOURCE_METRICS,
    SOURCE_SLOTS,
    ServerView,
    TrafficProfile,
)

SAMPLE_INTERVAL_S = 0.25  # 4 polls a second: slots change at request, not token, rate
FLUSH_S = 10.0
RETRY_S = 2.0


def _client(url: str, api_key: str | None) -> LlamaClient:
    # One connection, kept alive: observing must not load the server.
    return LlamaClient(
        url,
        api_key,
        timeout=5.0,
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
    )


def attach_view(client: LlamaClient) -> ServerView:
    """Check the URL is a llama-server this key may read, and which endpoint tells the slots."""
    url = client.url
    props = client.props()
    n_slots = int(props["total_slots"])
    model = model_name(props)
    build = str(props.get("build_info") or "")
    try:
        threshold = int(props.get("spec_draft_max_slots") or 0)
    except (TypeError, ValueError):
        threshold = 0
    try:
        client.slots()
    except EndpointMissingError as no_slots:
        try:
            client.metrics()
            return ServerView(url, model, n_slots, SOURCE_METRICS, False, build, threshold)
        except EndpointMissingError as no_metrics:
            raise ServerError(
                f"{url} exposes neither /slots (HTTP {no_slots.status}) nor /metrics (HTTP "
                f"{no_metrics.status}): start llama-server with --slots or --metrics"
            ) from no_metrics
    try:
        client.metrics()
        counters = True
    except EndpointMissingError:
        counters = False
    return ServerView(url, model, n_slots, SOURCE_SLOTS, counters, build, threshold)


def poll(client: LlamaClient, view: ServerView) -> tuple[int, list[Mapping[str, Any]]]:
    """Generating slots now (and the slots, from /slots); ServerError when the server is gone."""
    if view.source == SOURCE_SLOTS:
        slots = client.slots()
        return generating_slots(slots), slots
    return int(client.metrics().value("requests_processing")), []


class Poller:
    """One kept-alive connection to a llama-server, polled every interval_s into a profile.

    `step` waits for the next poll and adds what it saw; when the server stops answering it
    says so once, keeps what it has and retries every RETRY_S until the server is back (that
    time counts nowhere). Shared by `tuner observe` and `tuner watch`.
    """

    def __init__(
        self,
        url: str,
        observer: Observer = quiet,
        *,
        api_key: str | None = None,
        interval_s: float = SAMPLE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.url = url.rstrip("/")
        self.observer = observer
        self.interval_s = interval_s
        self.clock, self.sleep, self.wall = clock, sleep, wall
        self.client = _client(self.url, api_key)
        try:
            self.view = attach_view(self.client)
        except BaseException:
            self.client.close()
            raise
        self.finished = FinishedRequests()
        self.ledger = TokenLedger()
        self.counters: CounterReading | None = None  # the last reading of the draft counters
        self.counters_at = clock()
        self.said: set[str] = set()  # the once-only lines already said
        self.gone_since: float | None = None
        self.last = clock()
        # A server that reports its own clock (the twin's virtual time, whatever its speed):
        # time at each count and arrival times are taken on it, as the load generator does.
        self.served_last: float | None = None
        # Called after every poll that answered, with the seconds it added (None: the first
        # poll after the server came back, which adds none) and the slots: watch --experiment's
        # windows count the tokens decoded at each number of generating slots from them.
        self.on_poll: Callable[[float | None, list[Mapping[str, Any]]], None] | None = None
        # The threshold the server runs (0: no limit), for the drafting slots a request saw;
        # read at attach, and set by whoever switches it (watch).
        self.max_slots = self.view.max_slots
        self.exposure = DraftingExposure()
        self.generating: int | None = None  # slots generating at the last poll that answered
        self.polls = 0  # polls that answered

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Poller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def message(self, text: str) -> None:
        self.observer(ProgressEvent("message", text=text))

    def threshold(self) -> int | None:
        """The server's --spec-draft-max-slots now (GET /props); None where it has no such
        field or does not answer: the counts its acceptance counters are read at."""
        try:
            return self.client.max_slots()
        except ServerError:
            return None

    def resume(self) -> None:
        """The time since the last poll was not watched (the caller was busy, deciding): the
        next poll counts from now, not across that gap, so no count is credited with seconds
        nobody saw."""
        self.last = self.clock()
        self.served_last = None

    def step(self, profile: TrafficProfile) -> bool:
        """One poll into profile; False while the server does not answer."""
        self.sleep(max(0.0, self.interval_s - (self.clock() - self.last)))
        try:
            count, slots = poll(self.client, self.view)
        except ServerError as exc:
            if self.gone_since is None:
                self.gone_since = self.clock()
                self.message(
                    f"the server stopped answering ({exc}); keeping "
                    f"{profile.covered_s:.0f} s observed, retrying every {RETRY_S:.0f} s"
                )
            self.sleep(RETRY_S)
            self.last = self.clock()
            return False
        now = self.clock()
        served = served_time(slots)
        dt: float | None = None
        if self.gone_since is not None:
            self.message(f"the server is back after {now - self.gone_since:.0f} s; observing")
            self.gone_since = None
            self.finished = FinishedRequests()  # a restarted server numbers tasks anew
            self.counters = None  # nothing is read across the time it did not answer
            self.exposure = DraftingExposure()
            for request in self.ledger.reset():
                profile.add_finished(request)
        elif served is not None and self.served_last is not None:
            dt = max(0.0, served - self.served_last)
        else:
            dt = now - self.last
        if dt is not None:
            profile.add(count, dt)
        self.generating = count
        self.polls += 1
        self.exposure.poll(slots, dt, self.max_slots)
        if self.on_poll is not None:
            self.on_poll(dt, slots)
        self.served_last = served
        ended = self.finished.update(slots, self._stamp(slots))
        if self.view.counters:
            self.ledger.waiting += ended
            if self.ledger.waiting or self.ledger.base is None:
                self._settle(profile)
        else:
            for request in (e.finished() for e in ended):
                if request.output > 0:  # one only seen reading its prompt: unknown
                    profile.add_finished(request)
        self.last = now
        return True

    def _stamp(self, slots: list[dict[str, Any]]) -> float:
        """When a request seen in these slots is recorded: the server's clock where its /slots
        carry one (the twin's), else the wall's. Every reading of one server on one clock, or a
        replayed trace mixes virtual and Unix times."""
        served = served_time(slots)
        return served if served is not None else self.wall()

    def _settle(self, profile: TrafficProfile) -> None:
        """Read tokens_predicted_total, then /slots again: when no request ended in between,
        the reading holds exactly the outputs of the requests waiting (and those never seen),
        so they are settled; otherwise they wait for a later poll."""
        try:
            scrape = self.client.metrics()
            again = self.client.slots()
        except ServerError:
            return  # the next poll says whether the server is gone
        counter = scrape.value("tokens_predicted_total")
        self.read_counters(scrape, profile, again)
        more = self.finished.update(again, self._stamp(again))
        if more:
            self.ledger.waiting += more
            return
        for request in self.ledger.settle(counter):
            profile.add_finished(request)

    def once(self, key: str, text: str) -> None:
        if key not in self.said:
            self.said.add(key)
            self.message(text)

    def read_counters(
        self,
        scrape: Metrics,
        profile: TrafficProfile,
        slots: list[Mapping[str, Any]] | None = None,
    ) -> None:
        """The draft counters' increase since the last reading into the profile's acceptance
        (and, with the slots seen beside the reading, by the drafting slots the requests that
        ended saw); an interval in which a counter went down (a restart) is left out, and
        said."""
        reading = counter_reading(scrape)
        now = self.clock()
        if reading is None:
            self.once(
                "no-counters",
                f"{self.url}/metrics has no draft counters ({DRAFTS}): no acceptance is "
                "observed, and `recommend --traffic` keeps the profile's",
            )
            return
        profile.readings += 1
        if reading.deferred > 0:
            profile.deferred += 1
            self.once(
                "deferred",
                f"requests waited for a free slot (requests_deferred {reading.deferred:g}): the "
                "server is at its capacity, so the arrival rate observed is the rate it served, "
                "not the rate offered",
            )
        before, self.counters = self.counters, reading
        since, self.counters_at = now - self.counters_at, now
        if before is None:
            return
        step = counter_step(before, reading)
        if step == RESTARTED:
            profile.acceptance.dropped += 1
            self.message(
                f"a draft counter went down between two readings of /metrics (the server "
                f"restarted): the {since:.0f} s between them are left out of the acceptance"
            )
            return
        assert not isinstance(step, str)
        drafts, draft_tokens, accepted, positions, tokens = step
        if positions is None and drafts > 0:
            self.once(
                "no-positions",
                f"the server counts drafts but not accepted tokens per draft position "
                f"({PER_POSITION}: a build without it): acceptance is observed as accepted "
                "tokens per draft, its per-position rates inferred",
            )
        profile.acceptance.add(drafts, draft_tokens, accepted, positions, tokens)
        drafting = self.exposure.ended(slots) if slots is not None else None
        if drafting is not None and drafts > 0:
            profile.add_drafting(drafting, drafts, draft_tokens, accepted)


def observe(
    url: str,
    duration_s: float,
    save: Callable[[ServerView, TrafficProfile, bool], None],
    observer: Observer = quiet,
    *,
    api_key: str | None = None,
    interval_s: float = SAMPLE_INTERVAL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    state_dir: Path | None = None,
) -> tuple[ServerView, TrafficProfile]:
    """Poll the server for duration_s (or until Ctrl-C); save(view, profile, final) every
    FLUSH_S and at the end. With state_dir, a threshold a tuner that died left switched on the
    server is given back first (measure/hold)."""
    if duration_s <= 0:
        raise ConfigError("--duration must be above 0")
    if state_dir is not None:
        recover_left_hold(url, api_key, state_dir, observer)
    with Poller(
        url, observer, api_key=api_key, interval_s=interval_s, clock=clock, sleep=sleep
    ) as poller:
        view = poller.view
        profile = TrafficProfile(view.n_slots, source=view.source)
        profile.max_slots = poller.threshold()
        poller.message(
            f"observing {view.url} ({view.model}, {view.n_slots} slots) from /{view.source}, "
            f"every {interval_s * 1000:.0f} ms for {duration_s:.0f} s"
        )
        start = last_flush = clock()
        try:
            while clock() - start < duration_s:
                if not poller.step(profile):
                    continue
                if clock() - last_flush >= FLUSH_S:
                    save(view, profile, False)
                    last_flush = clock()
                    poller.message(
                        f"{profile.covered_s:.0f} s observed, mean "
                        f"{profile.mean_generating():.2f} slots generating"
                    )
        except KeyboardInterrupt:
            # Ctrl-C (or SIGTERM) is how an open-ended observation ends: keep what it has.
            poller.message("stopped: saving what was observed")
        finally:
            save(view, profile, True)
    return view, profile
