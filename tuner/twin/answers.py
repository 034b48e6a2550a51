"""What the twin server answers a completion with: llama-server's chunks, final responses and
`timings`, for /completion and /v1/chat/completions, from the engine's events; and its answer
to POST /props's body.

Every chunk and final response also carries the twin's clock: `t_server` (virtual seconds of
the event: the step's end that brought its tokens) and `t_arrival` (virtual seconds the request
arrived). Timings are llama-server's server_slot_stats in virtual milliseconds: prompt from the
slot taking the request to its first token, predicted from the first token to the last.
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

from tuner.twin import tokenizer
from tuner.twin.engine import Request, RequestResult
from tuner.twin.http import BadRequest, bad_request
from tuner.twin.live import Done, Tokens
from tuner.twin.version import BUILD_INFO

MAX_SLOTS_KEY = "spec_draft_max_slots"
PROPS_EXPECTED = 'expected exactly {"spec_draft_max_slots": N}, N an integer >= 0, 0 = no limit'
INT32_MAX = 2**31 - 1


class Server(Protocol):
    """What an answer needs of the server that gives it (tuner.twin.server.TwinServer), named
    here so that answers, which the server imports, need not import the server back."""

    model_name: str

    def random_id(self) -> str: ...

    def _params(self) -> dict[str, Any]: ...


class Answer:
    """One request's answer as it builds up: its chunks and its final response."""

    def __init__(
        self,
        server: Server,
        chat: bool,
        request: Request,
        body: dict[str, Any],
        per_token: bool,
    ) -> None:
        self.server = server
        self.chat = chat
        self.request = request
        self.body = body
        self.per_token = per_token
        self.n = 0  # tokens so far
        self.ids: list[int] = []
        self.first: float | None = None  # virtual time of the first token
        self.draft_n = 0
        self.draft_accepted = 0
        self.result: RequestResult | None = None
        self.created = int(time.time())
        self.cid = "chatcmpl-" + server.random_id()

    # -- what every answer carries --

    def _clock(self, t: float) -> dict[str, float]:
        arrival = self.result.arrival if self.result is not None else t
        return {"t_server": t, "t_arrival": arrival}

    def timings(self, now: float) -> dict[str, Any]:
        """llama-server's server_slot_stats.to_json for the tokens so far (virtual ms)."""
        result = self.result
        assert result is not None
        start = result.start if result.start is not None else result.arrival
        first = self.first if self.first is not None else now
        prompt_n = self.request.evaluated_tokens
        prompt_ms = (first - start) * 1000.0
        predicted_ms = max(0.001, (now - first) * 1000.0) if self.n else 0.0
        steps = max(0, self.n - 1)
        timings: dict[str, Any] = {
            "cache_n": self.request.cached_tokens,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1000.0 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
            "predicted_n": self.n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / steps if steps else 0.0,
            "predicted_per_second": 1000.0 * steps / predicted_ms if predicted_ms > 0 else 0.0,
        }
        if self.draft_n > 0:
            timings["draft_n"] = self.draft_n
            timings["draft_n_accepted"] = self.draft_accepted
        return timings

    def add(self, event: Tokens) -> list[int]:
        """Take a step's tokens; their ids."""
        self.result = event.result
        if self.first is None:
            self.first = event.time
        ids = tokenizer.generated(self.n, event.count)
        self.n += event.count
        self.ids += ids
        self.draft_n, self.draft_accepted = event.draft_n, event.draft_accepted
        return ids

    def _finish(self, event: Done) -> None:
        result = event.result
        self.result = result
        if result.token_times:
            self.first = result.token_times[0]
        missing = result.tokens - self.n
        if missing > 0:
            self.ids += tokenizer.generated(self.n, missing)
            self.n = result.tokens
        self.draft_n, self.draft_accepted = result.draft_n, result.draft_accepted

    def _slot(self) -> int:
        return self.result.slot if self.result is not None and self.result.slot is not None else -1

    def _end_time(self, event: Done) -> float:
        times = event.result.token_times
        return times[-1] if times else event.time

    # -- /completion --

    def _completion_common(self) -> dict[str, Any]:
        return {
            "index": 0,
            "id_slot": -1,  # as llama-server's partial results (its final ones name the slot)
            "tokens_predicted": self.n,
            "tokens_evaluated": self.request.prompt_tokens,
        }

    def _final_fields(self, end: float, content: str, tokens: list[int]) -> dict[str, Any]:
        return {
            "index": 0,
            "content": content,
            "tokens": tokens,
            "id_slot": self._slot(),
            "stop": True,
            "model": self.server.model_name,
            "tokens_predicted": self.n,
            "tokens_evaluated": self.request.prompt_tokens,
            "generation_settings": {
                **self.server._params(),
                "max_tokens": self.request.max_tokens,
                "n_predict": self.request.max_tokens,
                "stream": bool(self.body.get("stream", False)),
            },
            "prompt": "",
            "has_new_line": False,
            "truncated": False,
            "stop_type": "limit",
            "stopping_word": "",
            "tokens_cached": self.request.prompt_tokens + self.n,
            "timings": self.timings(end),
            **self._clock(end),
        }

    # -- chat --

    def _chat_chunk(self, delta: dict[str, Any], finish: str | None, t: float) -> dict[str, Any]:
        return {
            "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
            "created": self.created,
            "id": self.cid,
            "model": self.server.model_name,
            "system_fingerprint": BUILD_INFO,
            "object": "chat.completion.chunk",
            **self._clock(t),
        }

    def _usage(self) -> dict[str, Any]:
        return {
            "completion_tokens": self.n,
            "prompt_tokens": self.request.prompt_tokens,
            "total_tokens": self.n + self.request.prompt_tokens,
            "prompt_tokens_details": {"cached_tokens": self.request.cached_tokens},
        }

    # -- answers --

    def partial(self, event: Tokens) -> list[dict[str, Any]]:
        """The stream's chunks for one step's tokens."""
        first = self.first is None
        ids = self.add(event)
        text = tokenizer.detokenize(ids)
        if not self.chat:
            chunk = {
                "content": text,
                "tokens": ids,
                "stop": False,
                **self._completion_common(),
                **self._clock(event.time),
            }
            if self.per_token:
                chunk["timings"] = self.timings(event.time)
            return [chunk]
        chunks = []
        if first:
            opening = {"role": "assistant", "content": None}
            chunks.append(self._chat_chunk(opening, None, event.time))
        chunk = self._chat_chunk({"content": text}, None, event.time)
        if self.per_token:
            chunk["timings"] = self.timings(event.time)
        return [*chunks, chunk]

    def final(self, event: Done) -> list[dict[str, Any]]:
        """The stream's last chunks (timings in the last)."""
        self._finish(event)
        end = self._end_time(event)
        if not self.chat:
            return [self._final_fields(end, "", [])]
        chunks = [self._chat_chunk({}, "length", end)]
        options = self.body.get("stream_options") or {}
        if isinstance(options, dict) and options.get("include_usage"):
            usage = self._chat_chunk({}, None, end)
            usage["choices"] = []
            usage["usage"] = self._usage()
            chunks.append(usage)
        chunks[-1]["timings"] = self.timings(end)
        return chunks

    def whole(self, event: Done) -> dict[str, Any]:
        """The response of a request not streamed."""
        self._finish(event)
        end = self._end_time(event)
        text = tokenizer.detokenize(self.ids)
        if not self.chat:
            tokens = self.ids if self.body.get("return_tokens") else []
            return self._final_fields(end, text, tokens)
        return {
            "choices": [
                {
                    "finish_reason": "length",
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                }
            ],
            "created": self.created,
            "model": self.server.model_name,
            "system_fingerprint": BUILD_INFO,
            "object": "chat.completion",
            "usage": self._usage(),
            "id": self.cid,
            "timings": self.timings(end),
            **self._clock(end),
        }


def parse_max_slots_body(raw: bytes) -> int:
    """POST /props: exactly {"spec_draft_max_slots": N}, N an integer 0..2^31-1; anything else
    is a BadRequest whose one line says what is wrong, in the patch's own words (its
    parse_post_props: keys in nlohmann's sorted order, values as it dumps them, 40 characters
    at most)."""

    def shown(value: Any) -> str:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        return text[:40] + "..." if len(text) > 40 else text

    def refuse(reason: str) -> BadRequest:
        return BadRequest(bad_request(f"invalid POST /props body ({reason}): {PROPS_EXPECTED}"))

    try:
        body = json.loads(raw)
    except ValueError:
        raise refuse("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise refuse(f"the body is not a JSON object: {shown(body)}")
    for key in sorted(body):
        if key != MAX_SLOTS_KEY:
            raise refuse(f"unknown key {shown(key)}")
    if MAX_SLOTS_KEY not in body:
        raise refuse(f'no key "{MAX_SLOTS_KEY}"')
    value = body[MAX_SLOTS_KEY]
    if isinstance(value, bool) or not isinstance(value, int):
        raise refuse(f"{MAX_SLOTS_KEY} is not an integer: {shown(value)}")
    if value < 0:
        raise refuse(f"{MAX_SLOTS_KEY} is negative: {shown(value)}")
    if value > INT32_MAX:
        raise refuse(f"{MAX_SLOTS_KEY} is too large: {shown(value)}")
    return value
