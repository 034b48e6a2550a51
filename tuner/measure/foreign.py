"""Someone else's requests: a server that serves others while the tuner measures it.

A round's figure is the tuner's own streams sharing the server with nobody. On a server that
others use, two things tell that they did:

- before the tuner starts: `wait_for_quiet` polls `/slots` (or the `requests_processing` gauge
  of `/metrics` where /slots is off) until no slot has processed anything for SETTLE_S, says
  that it waits and for how long, and gives up with one line after `wait_s`;
- after each round: `foreign_requests` reads the two /metrics scrapes the round takes around
  its requests anyway (rounds.measure_round). `requests_processing` before the round's
  requests start and after they all ended counts only others' requests; and a request that
  began and ended inside the round shows in `tokens_predicted_total`, which llama-server
  raises by a request's whole output (`n_decoded`) when it releases the slot: the same count
  its answer reports as `timings.predicted_n`, which the tuner's own requests bring back. So
  the counter moves by the round's own tokens exactly; FOREIGN_TOKENS (zero) allows nothing
  more, and a foreign request of a single token shows. (The /metrics scrape is a task of the
  server's main loop, so it runs after the loop step that released the last slot.)

A round that overlapped foreign requests is marked `foreign` and left out as a busy round is
(profiler).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tuner.errors import EndpointMissingError, ServerError
from tuner.measure.client import LlamaClient
from tuner.measure.metrics import Metrics
from tuner.measure.plan import Observer, ProgressEvent, quiet

SETTLE_S = 2.0  # no slot processing for this long: the server is quiet
POLL_S = 0.5
TELL_EVERY_S = 30.0  # how often a wait says it still waits
DEFAULT_WAIT_S = 300.0
FOREIGN_TOKENS = 0  # tokens beyond the round's own allowed in tokens_predicted_total (above)


@dataclass(frozen=True)
class Foreign:
    """What of others' requests a round overlapped."""

    processing_before: int  # slots processing when the round's requests had not started
    processing_after: int  # slots processing once they had all ended
    tokens: int  # tokens others' requests that ended inside the round produced

    def why(self) -> str:
        parts = []
        if self.processing_before:
            parts.append(f"{self.processing_before} busy when it began")
        if self.processing_after:
            parts.append(f"{self.processing_after} busy when it ended")
        if self.tokens:
            parts.append(f"{self.tokens} tokens of other requests finished during it")
        return "the server served requests the tuner did not send (" + ", ".join(parts) + ")"

    def stored(self) -> dict[str, int]:
        return {
            "before": self.processing_before,
            "after": self.processing_after,
            "tokens": self.tokens,
        }


def foreign_requests(before: Metrics, after: Metrics, own_tokens: int) -> Foreign | None:
    """From the /metrics scrapes around a round (before its requests started, after they all
    ended) and the tokens its own requests were answered with: what others' requests did
    meanwhile, or None where nothing shows them."""
    processing_before = int(before.value("requests_processing"))
    processing_after = int(after.value("requests_processing"))
    moved = after.value("tokens_predicted_total") - before.value("tokens_predicted_total")
    extra = int(moved) - own_tokens
    tokens = extra if extra > FOREIGN_TOKENS else 0
    if not (processing_before or processing_after or tokens):
        return None
    return Foreign(processing_before, processing_after, tokens)


def busy_slots(api: LlamaClient) -> tuple[int, int]:
    """(slots processing a request, slots in all): from /slots, else /metrics'
    requests_processing (all slots unknown: 0)."""
    try:
        slots = api.slots()
    except EndpointMissingError:
        return int(api.metrics().value("requests_processing")), 0
    return sum(1 for s in slots if s.get("is_processing")), len(slots)


def wait_for_quiet(
    url: str,
    api_key: str | None,
    wait_s: float = DEFAULT_WAIT_S,
    observer: Observer = quiet,
    *,
    settle_s: float = SETTLE_S,
    poll_s: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Wait until no slot of the server has processed a request for settle_s; returns the
    seconds waited. Says once that it waits (how many slots are busy, for how long at most),
    again every TELL_EVERY_S, and raises a one-line ServerError after wait_s. A server with
    neither /slots nor /metrics cannot be watched: a ServerError naming the flags."""
    started = clock()
    quiet_since: float | None = None
    told: float | None = None
    with LlamaClient(url, api_key) as api:
        while True:
            try:
                busy, total = busy_slots(api)
            except EndpointMissingError as exc:
                raise ServerError(
                    f"{url} shows neither /slots nor /metrics, so whether others are using it "
                    "cannot be seen: start it with --slots or --metrics"
                ) from exc
            now = clock()
            if busy:
                quiet_since = None
                if told is None or now - told >= TELL_EVERY_S:
                    of = f" of {total}" if total else ""
                    left = wait_s - (now - started)
                    observer(
                        ProgressEvent(
                            "message",
                            text=f"{url} is serving others: {busy}{of} slots busy; waiting up "
                            f"to {left:.0f} s more for it to be quiet",
                        )
                    )
                    told = now
            elif quiet_since is None:
                quiet_since = now
            if quiet_since is not None and now - quiet_since >= settle_s:
                return now - started
            if busy and now - started >= wait_s:
                raise ServerError(
                    f"{url} was still serving others' requests ({busy} slots busy) after "
                    f"waiting {wait_s:.0f} s: tune it when it is quiet, or wait longer (--wait)"
                )
            sleep(poll_s)


def foreign_summary(foreign: int, rounds: int) -> str | None:
    """The end of a run, in words: how many rounds overlapped others' requests; None where none
    did."""
    if not foreign:
        return None
    return (
        f"{foreign} of {rounds} rounds overlapped requests the tuner did not send: they were "
        "measured again; results may still be off: tune the server while nobody else uses it"
    )
