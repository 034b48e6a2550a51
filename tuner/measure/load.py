"""The load generator: c concurrent requests that generate together, and their figures.

A request is the synthetic prompt (a fixed number of tokens) or one drawn from the user's prompt
file: text goes to /completion, a chat (`messages`) to /v1/chat/completions so the model's chat
template applies; output lengths are fixed or drawn (tuner.measure.prompts).
One shared async client (tuner.measure.client) per level; every stream is released by one
barrier so all c slots start together; times come from `time.perf_counter`, or from the server's
own clock where its answers carry one (the twin's `t_server`, tuner.twin.server: its virtual time,
so its figures do not depend on its speed); a failed request is recorded, not raised. Every
request carries a sampling `seed` (`request_seed`), which also seeds `--spec-synth-len`'s
synthetic acceptance: the configurations of a pass draw the same.
`summarize` is a pure function from samples to the level's figures.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import statistics
import time
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import httpx

from tuner.errors import LoadError, ServerError
from tuner.measure.client import (
    CHAT_PATH,
    COMPLETION_PATH,
    AsyncLlamaClient,
    auth_headers,
    drafts_so_far,
    server_clock,
    server_speed,
    tokens_so_far,
)
from tuner.measure.client import is_final_chunk as is_final_chunk  # re-exported: tests use it
from tuner.measure.prompts import OutputLengths, Prompt, PromptSet, draw_prompt, draw_rng

PROMPT_TEXT = (
    "The history of computing is a story of machines that grew smaller, faster and cheaper, "
    "from rooms of vacuum tubes to chips that fit in a pocket. Write a long, detailed essay "
    "about it, covering the people, the ideas and the machines, one era after another. "
)


@dataclass
class RequestSample:
    """One request as the client saw it, with the server's own timings when it finished."""

    stream: int
    ok: bool = False
    error: str | None = None
    tokens: int = 0
    prompt_tokens: int = 0
    generation_ms: float | None = None  # server: time spent generating (timings.predicted_ms)
    ttft_ms: float | None = None
    latency_ms: float | None = None
    draft_n: int = 0
    draft_accepted: int = 0
    # perf_counter seconds, or a twin's own clock where its answers carry it (t_server)
    start: float = 0.0
    token_times: list[float] = field(default_factory=list)  # time of every token (stream)
    # the server's draft counter as of every token (stream, from per-token timings), so the
    # drafts made inside the measured window can be counted apart from those around it
    token_drafts: list[int] = field(default_factory=list)

    @property
    def steps(self) -> int | None:
        """Server steps this request took: every step yields one token plus its accepted drafts."""
        if not self.ok or self.tokens <= 0:
            return None
        return max(1, self.tokens - self.draft_accepted)

    @property
    def step_ms(self) -> float | None:
        steps = self.steps
        if steps is None or not self.generation_ms:
            return None
        return self.generation_ms / steps


@dataclass(frozen=True)
class LevelFigures:
    """What one repeat of one level measured."""

    concurrency: int
    ok: int
    failed: int
    tokens_per_second: float | None  # aggregate, while all streams were generating
    per_stream_tps: float | None
    step_ms: float | None  # median over requests
    accept_len: float | None  # tokens per stream per step (1 + accepted drafts per step)
    ttft_ms: float | None
    window_ms: float | None
    window_tokens: int | None
    # draft tokens the server made inside the window (None: no window, or no per-token
    # counters): a threshold that does not draft at this level makes none there
    window_drafted: int | None = None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(samples: list[RequestSample], concurrency: int) -> LevelFigures:
    """Turn one repeat's samples into figures; pure.

    Aggregate tokens/s counts only the window in which every stream was generating (from the
    latest first token to the earliest last token), so a fast stream finishing early or a slow
    prompt does not blur the figure. Without per-token times it falls back to the sum of the
    streams' own rates.
    """
    good = [s for s in samples if s.ok and s.tokens > 0]
    failed = len(samples) - len(good)
    if not good:
        return LevelFigures(concurrency, 0, failed, None, None, None, None, None, None, None)
    window_ms = window_tokens = window_drafted = None
    tps: float | None = None
    if all(len(s.token_times) >= 2 for s in good) and len(good) == concurrency:
        begin = max(s.token_times[0] for s in good)
        end = min(s.token_times[-1] for s in good)
        if end > begin:
            window_tokens = sum(sum(1 for t in s.token_times if begin < t <= end) for s in good)
            window_ms = (end - begin) * 1000
            tps = window_tokens / (end - begin)
            if all(len(s.token_drafts) == len(s.token_times) for s in good):
                window_drafted = sum(_drafts_by(s, end) - _drafts_by(s, begin) for s in good)
    if tps is None:
        rates = [s.tokens / (s.generation_ms / 1000) for s in good if s.generation_ms]
        tps = sum(rates) if rates else None
    step_values = [v for s in good if (v := s.step_ms) is not None]
    steps_total = sum(s.steps or 0 for s in good)
    accept_len = sum(s.tokens for s in good) / steps_total if steps_total else None
    ttfts = [s.ttft_ms for s in good if s.ttft_ms is not None]
    return LevelFigures(
        concurrency=concurrency,
        ok=len(good),
        failed=failed,
        tokens_per_second=tps,
        per_stream_tps=tps / len(good) if tps is not None else None,
        step_ms=_median(step_values),
        accept_len=accept_len,
        ttft_ms=_median(ttfts),
        window_ms=window_ms,
        window_tokens=window_tokens,
        window_drafted=window_drafted,
    )


def never_together(samples: list[RequestSample], concurrency: int) -> bool:
    """Whether a streamed round of several streams had no window: every stream streamed two
    tokens or more, yet one started only after another had finished (a client that reached the
    server late). summarize's figure for such a round is the sum of the streams' own rates, a
    figure of streams that did not share the server; pure."""
    good = [s for s in samples if s.ok and s.tokens > 0]
    if concurrency < 2 or len(good) != concurrency:
        return False
    if not all(len(s.token_times) >= 2 for s in good):
        return False  # not streamed, or a one-token output: no window to expect
    return min(s.token_times[-1] for s in good) <= max(s.token_times[0] for s in good)


# A stall: a pause inside the measured window in which no stream got a token, at least this
# long and this share of the window (a machine that stops; a round that only runs slow is
# stats.slow_stall's). A slow spell stretches every step alike; a step of a 128-token round is
# at most a few percent of the window even when five drafted tokens are accepted a step, so a
# single pause of a quarter of it is the machine stopping, not the server working.
STALL_MIN_S = 1.0
STALL_SHARE = 0.25


def pause_in_window(samples: list[RequestSample], concurrency: int) -> tuple[float, float] | None:
    """The longest time (seconds) inside the round's window in which no stream got a token,
    and the window's length; None for a round without a window (not streamed, or streams
    that never generated together); pure."""
    good = [s for s in samples if s.ok and s.tokens > 0]
    if len(good) != concurrency or not all(len(s.token_times) >= 2 for s in good):
        return None
    begin = max(s.token_times[0] for s in good)
    end = min(s.token_times[-1] for s in good)
    if end <= begin:
        return None
    times = sorted(t for s in good for t in s.token_times if begin <= t <= end)
    return max(b - a for a, b in pairwise(times)), end - begin


def is_stall(pause: float, window: float) -> bool:
    """Whether a pause in a window of this length is the machine standing still (at least
    STALL_MIN_S and STALL_SHARE of the window)."""
    return pause >= STALL_MIN_S and pause >= STALL_SHARE * window


def stall_pause(samples: list[RequestSample], concurrency: int) -> float | None:
    """The round's longest pause where it is a stall (is_stall), else None; pure."""
    found = pause_in_window(samples, concurrency)
    return found[0] if found is not None and is_stall(*found) else None


def accept_by_stream(samples: list[RequestSample], concurrency: int) -> list[float | None]:
    """Each stream's tokens a server step (tokens over steps: one token a step plus its
    accepted drafts), None where its request failed or drafted nothing; pure."""
    out: list[float | None] = [None] * concurrency
    for s in samples:
        if 0 <= s.stream < concurrency and s.ok and s.draft_n > 0 and s.steps:
            out[s.stream] = s.tokens / s.steps
    return out


def drafts_in_flight(streams: int, n_max: int) -> int:
    """The most draft tokens a round's window may hold from drafts begun before it, one draft of
    n_max a stream: what a threshold that starts no draft there may still show in
    window_drafted (the profiler's per-round check and the live switch check both allow it)."""
    return streams * n_max


def _drafts_by(sample: RequestSample, t: float) -> int:
    """The sample's draft counter as of its last token at or before time t (0 before its
    first)."""
    index = bisect.bisect_right(sample.token_times, t)
    return sample.token_drafts[index - 1] if index else 0


@dataclass(frozen=True)
class Workload:
    """What the requests of a level ask for."""

    prompt_tokens: int = 32
    max_tokens: int = 128
    stream: bool = True
    request_timeout_s: float = 120.0
    prompts: PromptSet | None = None  # None: the synthetic prompt of prompt_tokens tokens
    output: OutputLengths | None = None  # None: max_tokens for every request
    seed: int = 0
    depth: int = 0  # context tokens each stream holds when it starts decoding (0: the prompt)
    # A deep level's outputs shortened by this factor (equal-time at depth), to no fewer than
    # min_tokens (nor more than drawn).
    output_scale: float = 1.0
    min_tokens: int = 1


SEED_VALUES = 2**32 - 1  # llama-server's seed is a uint32; 0xFFFFFFFF means "pick one at random"
PREFILL_ROUND = -1  # the round key of prefill requests (never a pass's or a repeat's number)


def request_seed(workload_seed: int, round_key: int, index: int) -> int:
    """The sampling seed of one request: the same for the same (workload seed, round key,
    stream or, open loop, request index), different from round to round and stream to stream.

    Both halves of a pair are sent with the same round key, so they draw the same synthetic
    acceptance; a hash, not a generator, so no draw depends on how many came before."""
    text = f"seed:{workload_seed}:{round_key}:{index}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") % SEED_VALUES


def draw_request(
    workload: Workload, concurrency: int, round_key: int, stream: int, length: int | None = None
) -> tuple[Prompt | None, int, int]:
    """What stream i of a round asks for, the same for every configuration measured with the
    same round key: its prompt (None: the synthetic one), its output tokens (length, where
    given, instead of the draw) and its sampling seed. Pure: the twin draws the same."""
    w = workload
    rng = draw_rng(w.seed, concurrency, round_key, stream)
    prompt: Prompt | None = draw_prompt(w.prompts, rng) if w.prompts is not None else None
    max_tokens = w.output.draw(rng, prompt) if w.output is not None else w.max_tokens
    if w.output_scale < 1.0:
        max_tokens = max(min(w.min_tokens, max_tokens), round(max_tokens * w.output_scale))
    if length is not None:
        max_tokens = length
    return prompt, max_tokens, request_seed(w.seed, round_key, stream)


@dataclass(frozen=True)
class Request:
    """One stream's request: where it goes and what it sends."""

    path: str  # /completion or /v1/chat/completions
    body: dict[str, Any]

    @property
    def is_chat(self) -> bool:
        return self.path == CHAT_PATH


def _prompt(stream: int) -> str:
    # A different opening per stream keeps slots from sharing a cached prefix.
    return f"Essay number {stream}. " + PROMPT_TEXT * 8


class LoadGenerator:
    """Sends levels of concurrent requests to one server over one shared client."""

    def __init__(self, url: str, workload: Workload, api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.workload = workload
        self.api_key = api_key
        self.headers = auth_headers(api_key)
        self._prompts: dict[int, list[int]] = {}

    async def _prompt_tokens(
        self, client: AsyncLlamaClient, stream: int, length: int | None = None
    ) -> list[int]:
        """Exactly `length` (default workload.prompt_tokens) tokens of the stream's synthetic
        text, found through the server's own tokenizer."""
        length = length or self.workload.prompt_tokens
        if stream not in self._prompts:
            self._prompts[stream] = await client.tokenize(_prompt(stream), False)
        tokens = self._prompts[stream]
        return (tokens * (length // len(tokens) + 1))[:length]

    async def _at_depth(
        self, client: AsyncLlamaClient, prompt: Prompt | None, stream: int
    ) -> list[int]:
        """The stream's request as exactly workload.depth tokens: the stream's own synthetic
        text in front, the prompt (a chat rendered by the server's template) at the end; a
        prompt longer than the depth keeps its end."""
        depth = self.workload.depth
        if prompt is None:
            return await self._prompt_tokens(client, stream, depth)
        if prompt.messages is not None:
            text = await client.apply_template(prompt.messages)
            tokens = await client.tokenize(text, False)
        else:
            tokens = await client.tokenize(prompt.text or "", True)
        if len(tokens) >= depth:
            return tokens[-depth:]
        return await self._prompt_tokens(client, stream, depth - len(tokens)) + tokens

    async def _request(
        self,
        client: AsyncLlamaClient,
        concurrency: int,
        round_key: int,
        stream: int,
        length: int | None = None,
    ) -> Request:
        """Stream i's request in this round: the same for every configuration measured here,
        sampling seed included (length: its output tokens, instead of the workload's draw)."""
        w = self.workload
        prompt, max_tokens, seed = draw_request(w, concurrency, round_key, stream, length)
        common = {
            "ignore_eos": True,  # every request generates its drawn length
            "temperature": 0.0,
            # At depth the stream's padding is the same every round: the server keeps it cached,
            # so a deep level pays its prefill once per launch, not once per repeat. Prefill is
            # outside the measured window either way.
            "cache_prompt": w.depth > 0,
            "stream": w.stream,
            "seed": seed,
            # every chunk carries the draft counters (and, for chat, the tokens so far)
            "timings_per_token": w.stream,
        }
        if w.depth > 0:
            # Rendered and padded here, so every request holds exactly `depth` tokens.
            tokens = await self._at_depth(client, prompt, stream)
            return Request(COMPLETION_PATH, {"prompt": tokens, "n_predict": max_tokens, **common})
        if prompt is not None and prompt.messages is not None:
            body = {"messages": list(prompt.messages), "max_tokens": max_tokens, **common}
            return Request(CHAT_PATH, body)
        text: str | list[int] = (
            prompt.text
            if prompt is not None and prompt.text is not None
            else await self._prompt_tokens(client, stream)
        )
        return Request(COMPLETION_PATH, {"prompt": text, "n_predict": max_tokens, **common})

    async def _one(
        self,
        client: AsyncLlamaClient,
        stream: int,
        request: Request,
        barrier: asyncio.Barrier | None,
        at: float | None = None,
    ) -> RequestSample:
        """One request, released by the barrier (closed loop) or at perf_counter time `at`
        (open loop)."""
        sample = RequestSample(stream=stream)
        if barrier is not None:
            await barrier.wait()
        if at is not None:
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
        sample.start = wall_start = time.perf_counter()

        def clock(answer: dict[str, Any]) -> float:
            # A twin's answers carry its own (virtual) clock: then every time of the sample is
            # on it, the request's start being its arrival there, whatever the twin's speed.
            own = server_clock(answer)
            if own is None:
                return time.perf_counter()
            sample.start = own[1]
            return own[0]

        def on_chunk(chunk: dict[str, Any]) -> None:
            # One time per generated token; the count, not the text, says how many (a piece of
            # a multi-byte character arrives with empty content).
            now = clock(chunk)
            new = tokens_so_far(chunk) - len(sample.token_times)
            sample.token_times.extend([now] * new)
            sample.token_drafts.extend([drafts_so_far(chunk)] * new)

        try:
            if request.body.get("stream"):
                done = await client.stream(request.body, request.path, on_chunk)
            else:
                done = await client.complete(request.body, request.path)
            end = clock(done.final)
            sample.tokens = done.tokens
            sample.prompt_tokens = done.prompt_tokens
            sample.generation_ms = done.generation_ms
            sample.draft_n = done.draft_n
            sample.draft_accepted = done.draft_accepted
            sample.latency_ms = (end - sample.start) * 1000
            if sample.token_times:
                sample.ttft_ms = (sample.token_times[0] - sample.start) * 1000
            sample.ok = sample.tokens > 0
            if not sample.ok:
                sample.error = "no tokens generated"
        except ServerError as exc:
            sample.ok = False
            sample.error = str(exc)[:500]
            sample.latency_ms = (time.perf_counter() - wall_start) * 1000
        return sample

    def _client(
        self, connections: int, pool_timeout: float | None, keep_alive: bool = True
    ) -> AsyncLlamaClient:
        # With streaming, `read` bounds the silence between two tokens, so a hung server is
        # noticed after request_timeout_s without cutting short a long, healthy generation.
        timeout = httpx.Timeout(
            connect=10.0, read=self.workload.request_timeout_s, write=10.0, pool=pool_timeout
        )
        limits = httpx.Limits(
            max_connections=connections, max_keepalive_connections=None if keep_alive else 0
        )
        return AsyncLlamaClient(self.url, self.api_key, timeout=timeout, limits=limits)

    async def _requests(
        self,
        client: AsyncLlamaClient,
        concurrency: int,
        round_key: int,
        n: int,
        lengths: list[int] | None = None,
    ) -> list[Request]:
        try:
            return [
                await self._request(
                    client, concurrency, round_key, i, lengths[i] if lengths else None
                )
                for i in range(n)
            ]
        except ServerError as exc:
            raise LoadError(f"cannot prepare the prompts on {self.url}: {exc}") from exc

    async def run_level(self, concurrency: int, round_key: int = 0) -> list[RequestSample]:
        """Start `concurrency` requests together and wait for all; failures are in the samples."""
        async with self._client(concurrency + 2, pool_timeout=10.0) as client:
            requests = await self._requests(client, concurrency, round_key, concurrency)
            barrier = asyncio.Barrier(concurrency)
            return list(
                await asyncio.gather(
                    *(self._one(client, i, requests[i], barrier) for i in range(concurrency))
                )
            )

    async def prefill_async(self, streams: int) -> list[RequestSample]:
        """Load streams 0..streams-1's padding at workload.depth into the server's prompt cache,
        one stream after another, one generated token each; failures are in the samples.

        A level's later requests at this depth start with the same padding, so they find it
        cached: without this, the streams new to a depth would prefill thousands of tokens
        while the others decode, and those steps (many times slower) would land in the level's
        step time and shrink its decode window. One at a time because with a unified KV cache
        every prompt token attends over all the cells in use: a server that parks idle slots in
        its RAM prompt cache (llama-server's default) then prefills each stream over its own
        cells only, not over every other stream's too."""
        w = self.workload
        # No keep-alive: a connection left idle while a long prefill ran may be closed by the
        # server just as the next request goes out on it.
        async with self._client(2, pool_timeout=10.0, keep_alive=False) as client:
            try:
                paddings = [await self._prompt_tokens(client, i, w.depth) for i in range(streams)]
            except ServerError as exc:
                raise LoadError(f"cannot prepare the prompts on {self.url}: {exc}") from exc
            body = {"n_predict": 1, "temperature": 0.0, "cache_prompt": True, "stream": w.stream}
            samples = []
            for i, padding in enumerate(paddings):
                seed = request_seed(w.seed, PREFILL_ROUND, i)
                request = Request(COMPLETION_PATH, {"prompt": padding, "seed": seed, **body})
                samples.append(await self._one(client, i, request, None))
            return samples

    def prefill(self, streams: int) -> list[RequestSample]:
        return asyncio.run(self.prefill_async(streams))

    async def _speed(self, client: AsyncLlamaClient) -> float:
        try:
            return server_speed(await client.props())
        except ServerError:  # no /props to ask: a llama-server's clock is the wall's
            return 1.0

    async def run_arrivals_async(
        self,
        offsets: list[float],
        round_key: int = 0,
        max_connections: int = 64,
        lengths: list[int] | None = None,
    ) -> tuple[float, list[RequestSample]]:
        """Open loop: request i starts offsets[i] seconds after the start, whether or not the
        earlier ones finished (one shared client), generating lengths[i] tokens where given.
        Returns the start (perf_counter) and the samples; failures are in the samples."""
        # A request waiting for a free connection is late, not failed: no pool timeout. No
        # keep-alive either: a connection idle between arrivals may be closed by the server
        # just as the next request goes out on it ("disconnected without a response"); on
        # loopback a fresh connection per request costs nothing measurable.
        async with self._client(max_connections, pool_timeout=None, keep_alive=False) as client:
            # Prompts and lengths are drawn per request, keyed by its index in the schedule.
            requests = await self._requests(client, 0, round_key, len(offsets), lengths)
            # A twin running X times faster than the wall gets its arrivals X times closer
            # together: they arrive at the offsets on its clock.
            speed = await self._speed(client)
            offsets = [off / speed for off in offsets]
            start = time.perf_counter() + 0.05
            samples = await asyncio.gather(
                *(
                    self._one(client, i, requests[i], None, start + off)
                    for i, off in enumerate(offsets)
                )
            )
            return start, list(samples)

    def run_arrivals(
        self, offsets: list[float], round_key: int = 0, lengths: list[int] | None = None
    ) -> tuple[float, list[RequestSample]]:
        return asyncio.run(self.run_arrivals_async(offsets, round_key, lengths=lengths))

    def run(self, concurrency: int, round_key: int = 0) -> list[RequestSample]:
        """One round at a concurrency; round_key picks the round's prompts and lengths."""
        return asyncio.run(self.run_level(concurrency, round_key))
