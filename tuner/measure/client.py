"""The llama-server HTTP API in one place: every URL the tuner sends to a llama-server is built
here, and every way an answer can be wrong becomes one line from tuner.errors.

`LlamaClient` (sync: server launch, attach, observe, watch, check) and `AsyncLlamaClient` (the
load generator, over one shared connection pool) speak the same API: /health, GET and POST
/props (the live `spec_draft_max_slots` switch), /slots, /metrics (parsed into `Metrics` by
tuner.measure.metrics), /tokenize, /detokenize,
/apply-template, /v1/models (which another OpenAI-compatible server answers too), and
/completion or /v1/chat/completions, streamed (server-sent events read by httpx-sse) or not,
ending in a `Completion` with the server's `timings`. The API key travels as a bearer token and
nowhere else.

Errors: a transport failure, a 401 (ApiKeyError), a URL that is not a llama-server
(NotLlamaServerError: a web page, JSON without total_slots, no /props at all), an endpoint the
server has switched off (404/501: `--no-slots`, no `--metrics`, no `--props`) and a server that
takes POST /props without changing anything each read as one line naming the remedy.
"""

from __future__ import annotations

import functools
import json
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import SSEError, aconnect_sse, connect_sse

from tuner.errors import (
    ApiKeyError,
    ConfigError,
    EndpointMissingError,
    NotLlamaServerError,
    ServerError,
)
from tuner.measure.metrics import Metrics, parse_metrics

COMPLETION_PATH = "/completion"
CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
MAX_SLOTS_FIELD = "spec_draft_max_slots"  # GET /props reports it, POST /props sets it (patch)
DEFAULT_TIMEOUT_S = 10.0

# The flag that turns an endpoint on, for the one-line error when it is off.
_FLAGS = {"/slots": "--slots", "/metrics": "--metrics", "/props": "--props"}

ChunkHandler = Callable[[dict[str, Any]], None]


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context per process, shared by every client: httpx builds a new one per client
    by default, reading the whole CA bundle each time (about 30 ms of CPU), and a profile makes
    dozens of clients (health polls, the switch, every round's pool). Built as httpx builds it
    (certifi's bundle, SSL_CERT_FILE or SSL_CERT_DIR honoured); an SSLContext is safe to share
    across threads."""
    return httpx.create_ssl_context()


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The API key as a bearer token (llama-server's --api-key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


# --- completions ------------------------------------------------------------------------------


def tokens_so_far(chunk: Mapping[str, Any]) -> int:
    """Tokens generated so far, by a streamed chunk: /completion counts them in every chunk,
    the chat endpoint in its timings (asked for per token with `timings_per_token`)."""
    if "tokens_predicted" in chunk:
        return int(chunk["tokens_predicted"] or 0)
    return int((chunk.get("timings") or {}).get("predicted_n") or 0)


def drafts_so_far(chunk: Mapping[str, Any]) -> int:
    """Draft tokens the server has made for the request so far, by a streamed chunk's timings
    (sent in every chunk with `timings_per_token`; absent until it first drafts)."""
    return int((chunk.get("timings") or {}).get("draft_n") or 0)


def server_clock(answer: Mapping[str, Any]) -> tuple[float, float] | None:
    """(time of this chunk or response, arrival of its request) on the server's own clock, in
    seconds, where the server says (the twin, tuner.twin.server: its virtual time, whatever
    its speed); None from a llama-server, whose times are the client's."""
    if answer.get("t_server") is None:
        return None
    t = float(answer["t_server"])
    return t, float(answer.get("t_arrival", t))


def model_name(props: Mapping[str, Any]) -> str:
    """The name a running server's data are stored under: its alias (`--alias`), else its model
    file's stem. llama-server without --alias reports the model's path as its alias (11434:
    tools/server/server.cpp sets the alias to `params.model.get_name()`, the path), and a path
    is no name: `/models/qwen-q4.gguf` is stored as `qwen-q4`."""
    path = str(props.get("model_path") or "")
    alias = str(props.get("model_alias") or "")
    if alias and alias != path and not alias.endswith(".gguf"):
        return alias
    return model_stem(alias or path) or "unknown"


def model_stem(name: str) -> str:
    """A model name given as a GGUF path (`--model /models/qwen-q4.gguf`) as its stem; any other
    name as it is."""
    if name.endswith(".gguf") or ("/" in name and Path(name).suffix == ".gguf"):
        return Path(name).stem
    return name


def server_speed(props: Mapping[str, Any]) -> float:
    """How many times faster than the wall the server's clock runs (a twin's --speed; 1 for a
    llama-server), from GET /props."""
    return float((props.get("twin") or {}).get("speed") or 1.0)


def is_final_chunk(chunk: Mapping[str, Any]) -> bool:
    """/completion ends with stop: true; the chat endpoint with a finish_reason (whose chunk
    carries the request's timings)."""
    if "stop" in chunk:
        return bool(chunk["stop"])
    choices = chunk.get("choices") or []
    return bool(choices and choices[0].get("finish_reason")) and "timings" in chunk


@dataclass(frozen=True)
class Completion:
    """A finished request: the final response (or the stream's final chunk) and its timings."""

    final: dict[str, Any] = field(default_factory=dict)

    @property
    def timings(self) -> dict[str, Any]:
        return dict(self.final.get("timings") or {})

    @property
    def tokens(self) -> int:
        """Tokens generated (the server's own count)."""
        return int(self.timings.get("predicted_n", self.final.get("tokens_predicted", 0)) or 0)

    @property
    def prompt_tokens(self) -> int:
        return int(self.timings.get("prompt_n") or 0)

    @property
    def generation_ms(self) -> float | None:
        return self.timings.get("predicted_ms")

    @property
    def draft_n(self) -> int:
        return int(self.timings.get("draft_n") or 0)

    @property
    def draft_accepted(self) -> int:
        return int(self.timings.get("draft_n_accepted") or 0)


# --- what an answer means ---------------------------------------------------------------------


def _detail(response: httpx.Response, limit: int = 200) -> str:
    """The server's own error message (llama-server: {"error": {"message": ...}}), one line."""
    try:
        body = response.json()
    except ValueError:
        text = response.text
    else:
        error = body.get("error") if isinstance(body, dict) else None
        text = str(error.get("message") if isinstance(error, dict) else error or body)
    return " ".join(text.split())[:limit]


class _Api:
    """What both clients share: the base URL, the key, and what each answer means."""

    def __init__(self, url: str, api_key: str | None) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key

    def _unreachable(self, method: str, path: str, exc: Exception) -> ServerError:
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            return ServerError(f"cannot reach {self.url}: {_exc_text(exc)}")
        return ServerError(f"{method} {path} on {self.url} got no answer: {_exc_text(exc)}")

    def _check(self, method: str, path: str, response: httpx.Response) -> httpx.Response:
        """The response if it is a 200; otherwise the one-line error it stands for."""
        status = response.status_code
        if status == 200:
            return response
        if status == 401:
            if self.api_key:
                raise ApiKeyError(f"{self.url} rejected the API key (HTTP 401): check --api-key")
            raise ApiKeyError(f"{self.url} wants an API key: pass --api-key or set TUNER_API_KEY")
        if path == "/props" and method == "GET":
            raise self._not_llama(response)
        if status in (404, 501) and path in _FLAGS:
            flag = _FLAGS[path]
            what = (
                "does not allow changing its settings live"
                if method == "POST"
                else f"does not expose {path}"
            )
            raise EndpointMissingError(
                f"{self.url} {what}: {method} {path} answered HTTP {status} "
                f"({_detail(response)}); start llama-server with {flag}",
                path=path,
                status=status,
            )
        raise ServerError(
            f"{method} {path} on {self.url} answered HTTP {status}: {_detail(response)}"
        )

    def _not_llama(self, response: httpx.Response) -> NotLlamaServerError:
        """What answered instead of a llama-server, in a few words: a web page, JSON without
        total_slots, or an HTTP error (another OpenAI-compatible server has no /props)."""
        status = response.status_code
        kind = response.headers.get("content-type", "")
        if "html" in kind or response.text.lstrip()[:1] == "<":
            what = "with a web page (HTML), not llama-server's JSON"
        elif status == 200:
            what = "without total_slots"
        else:
            what = f"({_detail(response, 80) or 'no body'})"
        return NotLlamaServerError(
            f"{self.url} is not a llama-server (GET /props answered HTTP {status} {what})"
        )

    def _json(self, method: str, path: str, response: httpx.Response) -> Any:
        try:
            return self._check(method, path, response).json()
        except ValueError as exc:
            if path == "/props":
                raise self._not_llama(response) from exc
            raise ServerError(
                f"{method} {path} on {self.url} answered with malformed JSON: {exc}"
            ) from exc

    def _field(self, path: str, response: httpx.Response, key: str) -> Any:
        """One field of a POST endpoint's JSON answer."""
        answer = self._json("POST", path, response)
        if not isinstance(answer, dict) or key not in answer:
            raise ServerError(f"POST {path} on {self.url} answered without {key!r}")
        return answer[key]

    def _props(self, response: httpx.Response) -> dict[str, Any]:
        props = self._json("GET", "/props", response)
        if not isinstance(props, dict) or "total_slots" not in props:
            raise self._not_llama(response)
        return props

    def _set_props_answer(self, body: Mapping[str, Any], response: httpx.Response) -> None:
        if response.status_code == 400:
            raise ServerError(
                f"{self.url} refused POST /props {json.dumps(dict(body))}: {_detail(response)}"
            )
        self._check("POST", "/props", response)

    def _switch_read_back(self, n: int, props: Mapping[str, Any]) -> None:
        seen = props.get(MAX_SLOTS_FIELD)
        if seen is None:
            raise ServerError(
                f"{self.url} does not support the live switch: it accepted "
                f"{MAX_SLOTS_FIELD}={n} on POST /props but GET /props then reported no such "
                "field; it needs a llama-server built with the tuner's patch (`tuner bench setup`)"
            )
        if seen != n:
            # The patch's field is there but did not follow: a server that is not the patched
            # llama-server it claims to be, or a second client switching it meanwhile.
            raise ServerError(
                f"{self.url} did not take the live switch: it accepted {MAX_SLOTS_FIELD}={n} on "
                f"POST /props but GET /props then reported {MAX_SLOTS_FIELD}={seen}"
            )

    def _stream_failed(self, path: str, exc: Exception) -> ServerError:
        return ServerError(f"POST {path} on {self.url}: the stream broke off: {_exc_text(exc)}")

    def _take(self, path: str, data: str, on_chunk: ChunkHandler | None) -> dict[str, Any] | None:
        """One streamed event, handed to on_chunk; returned when it is the final chunk."""
        if data.strip() == "[DONE]":  # the chat endpoint's end marker
            return None
        try:
            chunk = json.loads(data)
        except ValueError as exc:
            raise ServerError(f"POST {path} on {self.url} sent a malformed chunk: {exc}") from exc
        if not isinstance(chunk, dict):
            return None
        if "error" in chunk:
            raise ServerError(f"POST {path} failed mid-stream: {str(chunk['error'])[:300]}")
        if on_chunk is not None:
            on_chunk(chunk)
        return chunk if is_final_chunk(chunk) else None

    def _no_final(self, path: str) -> ServerError:
        return ServerError(f"POST {path} on {self.url}: the stream ended without a final chunk")

    def _stream_start(self, path: str, response: httpx.Response, body: str) -> None:
        if response.status_code != 200:
            raise ServerError(
                f"POST {path} on {self.url} answered HTTP {response.status_code}: "
                f"{' '.join(body.split())[:200]}"
            )


def _exc_text(exc: Exception) -> str:
    return f"{exc.__class__.__name__}: {exc}" if str(exc) else exc.__class__.__name__


def _max_slots(props: Mapping[str, Any]) -> int | None:
    value = props.get(MAX_SLOTS_FIELD)
    return int(value) if value is not None else None


def _check_n(n: int) -> None:
    if n < 0:
        raise ConfigError(f"{MAX_SLOTS_FIELD} must be 0 (no limit) or more, not {n}")


class LlamaClient(_Api):
    """A llama-server, spoken to synchronously over one httpx.Client (kept alive)."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT_S,
        limits: httpx.Limits | None = None,
    ) -> None:
        super().__init__(url, api_key)
        self.http = httpx.Client(
            headers=auth_headers(api_key),
            timeout=timeout,
            limits=limits or httpx.Limits(),
            verify=_tls(),
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> LlamaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self.http.request(method, self.url + path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._unreachable(method, path, exc) from exc

    def health(self) -> bool:
        """Whether the server is up and its model loaded (False while loading or unreachable)."""
        try:
            return self.http.get(self.url + "/health").status_code == 200
        except httpx.TransportError:
            return False

    def props(self) -> dict[str, Any]:
        """GET /props, checked to come from a llama-server (it has total_slots)."""
        return self._props(self._send("GET", "/props"))

    def set_props(self, body: Mapping[str, Any]) -> None:
        """POST /props (a server started with --props)."""
        self._set_props_answer(body, self._send("POST", "/props", json=dict(body)))

    def max_slots(self) -> int | None:
        """The server's spec_draft_max_slots now; None where /props has no such field (a
        server without the tuner's patch)."""
        return _max_slots(self.props())

    def set_max_slots(self, n: int) -> None:
        """Switch spec_draft_max_slots to n live and read it back: returns only once GET /props
        reports n (a stock server with --props answers 200 and changes nothing)."""
        _check_n(n)
        self.set_props({MAX_SLOTS_FIELD: n})
        self._switch_read_back(n, self.props())

    def models(self) -> list[str]:
        """GET /v1/models: the ids an OpenAI-compatible server serves (llama-server too)."""
        answer = self._json("GET", MODELS_PATH, self._send("GET", MODELS_PATH))
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list):
            raise ServerError(f"GET {MODELS_PATH} on {self.url} answered without a model list")
        return [str(m.get("id")) for m in data if isinstance(m, dict)]

    def slots(self) -> list[dict[str, Any]]:
        """GET /slots: every slot's state (EndpointMissingError when the server has it off)."""
        return list(self._json("GET", "/slots", self._send("GET", "/slots")))

    def metrics(self) -> Metrics:
        """GET /metrics (EndpointMissingError without --metrics)."""
        return parse_metrics(self._check("GET", "/metrics", self._send("GET", "/metrics")).text)

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        body = {"content": text, "add_special": add_special}
        return list(self._field("/tokenize", self._send("POST", "/tokenize", json=body), "tokens"))

    def detokenize(self, tokens: Iterable[int]) -> str:
        response = self._send("POST", "/detokenize", json={"tokens": list(tokens)})
        return str(self._field("/detokenize", response, "content"))

    def apply_template(self, messages: Iterable[Mapping[str, Any]]) -> str:
        """A chat rendered by the model's template, as the prompt text the server would use."""
        response = self._send("POST", "/apply-template", json={"messages": list(messages)})
        return str(self._field("/apply-template", response, "prompt"))

    def complete(self, body: Mapping[str, Any], path: str = COMPLETION_PATH) -> Completion:
        """One request, not streamed: the whole response, timings included."""
        payload = {**body, "stream": False}
        return Completion(dict(self._json("POST", path, self._send("POST", path, json=payload))))

    def stream(
        self,
        body: Mapping[str, Any],
        path: str = COMPLETION_PATH,
        on_chunk: ChunkHandler | None = None,
    ) -> Completion:
        """One request, streamed: on_chunk sees every chunk as it arrives; the final chunk (with
        the timings) is returned."""
        payload = {**body, "stream": True}
        final: dict[str, Any] = {}
        try:
            with connect_sse(self.http, "POST", self.url + path, json=payload) as source:
                response = source.response
                if response.status_code != 200:
                    self._stream_start(path, response, response.read().decode(errors="replace"))
                for event in source.iter_sse():
                    final = self._take(path, event.data, on_chunk) or final
        except (httpx.HTTPError, SSEError) as exc:
            raise self._stream_failed(path, exc) from exc
        if not final:
            raise self._no_final(path)
        return Completion(final)


class AsyncLlamaClient(_Api):
    """A llama-server, spoken to from asyncio over one shared httpx.AsyncClient (the load
    generator's concurrent streams share its pool)."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT_S,
        limits: httpx.Limits | None = None,
    ) -> None:
        super().__init__(url, api_key)
        self.http = httpx.AsyncClient(
            headers=auth_headers(api_key),
            timeout=timeout,
            limits=limits or httpx.Limits(),
            verify=_tls(),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncLlamaClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self.http.request(method, self.url + path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._unreachable(method, path, exc) from exc

    async def props(self) -> dict[str, Any]:
        return self._props(await self._send("GET", "/props"))

    async def metrics(self) -> Metrics:
        response = await self._send("GET", "/metrics")
        return parse_metrics(self._check("GET", "/metrics", response).text)

    async def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        body = {"content": text, "add_special": add_special}
        response = await self._send("POST", "/tokenize", json=body)
        return list(self._field("/tokenize", response, "tokens"))

    async def detokenize(self, tokens: Iterable[int]) -> str:
        response = await self._send("POST", "/detokenize", json={"tokens": list(tokens)})
        return str(self._field("/detokenize", response, "content"))

    async def apply_template(self, messages: Iterable[Mapping[str, Any]]) -> str:
        response = await self._send("POST", "/apply-template", json={"messages": list(messages)})
        return str(self._field("/apply-template", response, "prompt"))

    async def complete(self, body: Mapping[str, Any], path: str = COMPLETION_PATH) -> Completion:
        response = await self._send("POST", path, json={**body, "stream": False})
        return Completion(dict(self._json("POST", path, response)))

    async def stream(
        self,
        body: Mapping[str, Any],
        path: str = COMPLETION_PATH,
        on_chunk: ChunkHandler | None = None,
    ) -> Completion:
        """As LlamaClient.stream. With httpx's `read` timeout, a server silent for that long
        between two events fails the request without cutting a long, healthy one short."""
        payload = {**body, "stream": True}
        final: dict[str, Any] = {}
        try:
            async with aconnect_sse(self.http, "POST", self.url + path, json=payload) as source:
                response = source.response
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    self._stream_start(path, response, text)
                async for event in source.aiter_sse():
                    final = self._take(path, event.data, on_chunk) or final
        except (httpx.HTTPError, SSEError) as exc:
            raise self._stream_failed(path, exc) from exc
        if not final:
            raise self._no_final(path)
        return Completion(final)


# --- one call, one connection -----------------------------------------------------------------


def max_slots(url: str, api_key: str | None = None) -> int | None:
    """LlamaClient.max_slots on a connection of its own."""
    with LlamaClient(url, api_key) as api:
        return api.max_slots()


def set_max_slots(url: str, n: int, api_key: str | None = None) -> None:
    """LlamaClient.set_max_slots on a connection of its own."""
    with LlamaClient(url, api_key) as api:
        api.set_max_slots(n)
