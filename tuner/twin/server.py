"""The twin as an HTTP server: a simulated llama-server that the tuner launches, measures,
switches live and observes exactly as it does the real one (issue 25).

`tuner-twin-server` (tuner.twin.command, which answers `--help`, `--version` and
`--list-devices` as llama-server does, the flags --spec-draft-max-slots among them) takes
llama-server's command line (tuner.twin.cmdline), the world file as `--model`, so a profile spec
names it as `server.binary` and the world as `server.model` (example:
profiles/twin/bench-twin.toml); `tuner dev twin serve WORLD` starts the same server by hand.

Endpoints, shaped as llama-server 11434 with the tuner's patch shapes them: /health, GET /props
(total_slots, model_path, default_generation_settings.n_ctx, build_info, endpoint_*,
spec_draft_max_slots) and POST /props (the live threshold; without --props llama-server's own
501; a bad body 400 with one line), /slots (unless --no-slots), /metrics (with --metrics: the
engine's counters), /tokenize, /detokenize, /apply-template (tuner.twin.tokenizer: 4 ASCII
characters a token), /completion and /v1/chat/completions, streamed (one server-sent event per
step that gave the request tokens; `timings` in the final one and, with timings_per_token, in
every one) or not (tuner.twin.answers). With --api-key every endpoint but /health wants it. With
--twin-unpatched it serves as the stock build of the same source: GET /props without
spec_draft_max_slots, POST /props (with --props) answering {"success": true} and changing
nothing.

The twin's clock: every completion chunk and final response carries `t_server` (virtual seconds
of the event) and `t_arrival` (virtual seconds the request arrived), every response the header
X-Twin-Time, /slots entries `t_server`, and GET /props a `twin` object (world, speed, time). The
load generator times tokens by t_server where it is there, so the tuner's figures do not depend
on --speed. Nothing else in a response differs from llama-server's.

Design: an asyncio HTTP/1.1 server (tuner.twin.http, standard library only) on one event loop;
the engine in a thread of its own (tuner.twin.live), reached only through its command queue:
submits, cancels, the threshold. A client that closes its connection cancels its request.
Prompt caching: with cache_prompt (default true) the longest common prefix with one of the last
few prompts is not evaluated again (one token always is), as a slot or llama-server's RAM
prompt cache would keep it. A world with acceptance classes marked by text
([[acceptance.classes]] marker) reads each prompt for its marker (World.marked_class); the
request's acceptance then follows its class, and /metrics counts it as llama-server counts any.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import secrets
import sys
import threading
from collections.abc import Callable
from typing import Any

from tuner.policy import Policy
from tuner.twin import tokenizer
from tuner.twin.answers import MAX_SLOTS_KEY, Answer, parse_max_slots_body
from tuner.twin.cmdline import (
    ServerArgs,
)
from tuner.twin.engine import Engine, Request
from tuner.twin.http import (
    BadRequest,
    Connection,
    Gone,
    HttpRequest,
    Reply,
    bad_request,
    error_reply,
    json_reply,
    sse,
)
from tuner.twin.live import Done, Event, Failed, LiveEngine, Snapshot, Tokens
from tuner.twin.promptcache import PromptCache
from tuner.twin.version import BUILD_INFO
from tuner.twin.world import World

SEED_RANDOM = 0xFFFFFFFF  # llama-server: pick a seed at random
PROMPTS_CACHED = 8  # besides one per slot: prompts whose prefix a new request may reuse
MAX_HEADER_BYTES = 65536
TIME_HEADER = "X-Twin-Time"


# --- the server -------------------------------------------------------------------------------


class TwinServer:
    """One twin llama-server: the engine's thread and the HTTP endpoints (see the docstring)."""

    def __init__(
        self,
        args: ServerArgs,
        world: World,
        policy: Policy,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.args = args
        self.world = world
        self.policy = policy
        self.log = log or (lambda text: print(text, file=sys.stderr, flush=True))
        seed = args.seed if args.seed is not None and args.seed >= 0 else secrets.randbits(32)
        self.seed = seed
        self._rng = random.Random(seed)
        self.engine = Engine(world, policy, seed=seed)
        self.live: LiveEngine | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._listeners: dict[int, asyncio.Queue[Event]] = {}
        self._tickets = itertools.count(1)
        self._cache = PromptCache(world.n_parallel + PROMPTS_CACHED)
        self._classes = any(c.marker for c in world.acceptance.classes)  # prompts to read
        self._server: asyncio.base_events.Server | None = None
        self._closed: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None
        self.model_path = str(args.model)
        self.model_name = args.alias or world.model_name

    # -- life --

    @property
    def url(self) -> str:
        return f"http://{self.args.host}:{self.port}"

    async def open(self) -> None:
        """Bind the port and start the engine's thread."""
        self.loop = asyncio.get_running_loop()
        self._closed = asyncio.Event()
        self._server = await asyncio.start_server(
            self._connection, self.args.host, self.args.port, limit=MAX_HEADER_BYTES
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.live = LiveEngine(self.engine, self._deliver_threadsafe, speed=self.args.speed)
        self.live.start()

    async def serve(self, stop: asyncio.Event) -> None:
        """Serve until stop is set."""
        await self.open()
        self.log(
            f"twin: world {self.world.name} (model {self.world.model_name}), "
            f"{self.policy.describe(self.world.n_parallel)}, {self.world.n_parallel} slots of "
            f"{self.world.slot_context} tokens, speed {self.args.speed:g}, seed {self.seed}"
        )
        if self.args.ignored:
            self.log(f"twin: accepted without effect: {' '.join(self.args.ignored)}")
        self.log(f"main: server is listening on {self.url} - starting the main loop")
        try:
            await stop.wait()
        finally:
            await self.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self.live is not None:
            self.live.stop()
        if self._closed is not None:
            self._closed.set()

    def start_in_thread(self) -> TwinServer:
        """Serve from a thread of its own (tests, embedding); returns once it listens."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            async def main() -> None:
                try:
                    await self.open()
                except BaseException as exc:
                    failure.append(exc)
                    ready.set()
                    return
                ready.set()
                assert self._closed is not None
                await self._closed.wait()

            asyncio.run(main())

        self._thread = threading.Thread(target=run, name="twin-http", daemon=True)
        self._thread.start()
        ready.wait(30)
        if failure:
            raise failure[0]
        return self

    def stop_thread(self) -> None:
        if self.loop is not None and self._thread is not None:
            asyncio.run_coroutine_threadsafe(self.close(), self.loop).result(10)
            self._thread.join(10)

    def __enter__(self) -> TwinServer:
        return self.start_in_thread()

    def __exit__(self, *exc: object) -> None:
        self.stop_thread()

    # -- engine events, on the loop --

    def _deliver_threadsafe(self, events: list[tuple[int, Event]]) -> None:
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        # The loop may close meanwhile (RuntimeError): then nobody is listening.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._deliver, events)

    def _deliver(self, events: list[tuple[int, Event]]) -> None:
        for ticket, event in events:
            q = self._listeners.get(ticket)
            if q is not None:
                q.put_nowait(event)

    # -- connections --

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(reader, writer)
        try:
            while not conn.closing:
                request = await conn.read_request()
                if request is None:
                    break
                if not request.keep_alive:
                    conn.closing = True
                try:
                    await self._handle(conn, request)
                except Gone:
                    break
        except asyncio.CancelledError:  # the server is closing
            pass
        except Exception as exc:  # a handler bug must not take the server down: log it
            self.log(f"twin: request failed: {exc!r}")
        finally:
            writer.close()

    def _extra(self) -> dict[str, str]:
        assert self.live is not None
        return {TIME_HEADER: f"{self.live.now():.6f}"}

    async def _handle(self, conn: Connection, request: HttpRequest) -> None:
        method, path = request.method, request.path
        if method == "OPTIONS":
            await conn.send(Reply(200, b"", "text/plain"), self._extra())
            return
        if self.args.api_key and path not in ("/health", "/v1/health"):
            auth = request.headers.get("authorization", "")
            key = request.headers.get("x-api-key", "")
            if auth != f"Bearer {self.args.api_key}" and key != self.args.api_key:
                reply = error_reply("Invalid API Key", "authentication_error", 401)
                await conn.send(reply, self._extra())
                return
        try:
            if method == "POST" and path in ("/completion", "/completions"):
                await self._completion(conn, request, chat=False)
                return
            if method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
                await self._completion(conn, request, chat=True)
                return
            reply = self._simple(method, path, request)
        except BadRequest as bad:
            reply = bad.reply
        await conn.send(reply, self._extra())

    def _simple(self, method: str, path: str, request: HttpRequest) -> Reply:
        routes: dict[tuple[str, str], Callable[[HttpRequest], Reply]] = {
            ("GET", "/health"): self._health,
            ("GET", "/v1/health"): self._health,
            ("GET", "/props"): self._get_props,
            ("POST", "/props"): self._post_props,
            ("GET", "/slots"): self._slots,
            ("GET", "/metrics"): self._metrics,
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/detokenize"): self._detokenize,
            ("POST", "/apply-template"): self._apply_template,
        }
        handler = routes.get((method, path))
        if handler is None:
            return error_reply("File Not Found", "not_found_error", 404)
        return handler(request)

    # -- simple endpoints --

    def _body(self, request: HttpRequest) -> dict[str, Any]:
        try:
            body = json.loads(request.body or b"{}")
        except ValueError as exc:
            raise BadRequest(bad_request(f"invalid JSON body: {exc}")) from exc
        if not isinstance(body, dict):
            raise BadRequest(bad_request("the request body must be a JSON object"))
        return body

    def _health(self, _: HttpRequest) -> Reply:
        return json_reply({"status": "ok"})

    def _snapshot(self) -> Snapshot:
        assert self.live is not None and self.live.snapshot is not None
        return self.live.snapshot

    def _params(self, served: bool = True) -> dict[str, Any]:
        """A few of llama-server's sampling params (the twin samples nothing). A request's
        (served) carry the server's speculative types, --spec-type appended to the default
        "none"; GET /props's carry a default request's, which copies only the sampling
        settings, so "none" whatever the server drafts (llama-server 11434's get_res_props)."""
        drafting = served and self.policy.drafting
        return {
            "seed": SEED_RANDOM,
            "temperature": 0.8,
            "top_k": 40,
            "top_p": 0.95,
            "max_tokens": -1,
            "n_predict": -1,
            "ignore_eos": False,
            "stream": False,
            "speculative.types": "none,draft-simple" if drafting else "none",
            "timings_per_token": False,
        }

    def props(self) -> dict[str, Any]:
        """GET /props (llama-server's get_res_props, with the patch's field and the twin's)."""
        assert self.live is not None
        props = {
            "default_generation_settings": {
                "params": self._params(served=False),
                "n_ctx": self.world.slot_context,
            },
            "total_slots": self.world.n_parallel,
            "model_alias": self.model_name,
            "model_ftype": "twin",
            "model_path": self.model_path,
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": self.args.slots,
            "endpoint_props": self.args.props,
            "endpoint_metrics": self.args.metrics,
            "ui": False,
            "chat_template": "chatml",
            "bos_token": tokenizer.BOS_TEXT,
            "eos_token": tokenizer.EOS_TEXT,
            "build_info": BUILD_INFO,
            "is_sleeping": False,
            MAX_SLOTS_KEY: self.live.max_slots,
            "twin": {
                "world": self.world.name,
                "model_name": self.world.model_name,
                "policy": self.policy.label,
                "speed": self.args.speed,
                "seed": self.seed,
                "t_server": self.live.now(),
            },
        }
        if self.args.unpatched:  # a stock build has no such field
            del props[MAX_SLOTS_KEY]
        return props

    def _get_props(self, _: HttpRequest) -> Reply:
        return json_reply(self.props())

    def _post_props(self, request: HttpRequest) -> Reply:
        if not self.args.props:
            return error_reply(
                "This server does not support changing global properties. Start it with `--props`",
                "not_supported_error",
                501,
            )
        if self.args.unpatched:
            # The stock build reads the body as JSON, changes nothing and says it succeeded.
            self._body(request)
            return json_reply({"success": True})
        n = parse_max_slots_body(request.body)
        assert self.live is not None
        self.live.set_max_slots(n)
        return json_reply({"success": True, MAX_SLOTS_KEY: n})

    def _slots(self, _: HttpRequest) -> Reply:
        if not self.args.slots:
            return error_reply(
                "This server does not support slots endpoint. Start it with `--slots`",
                "not_supported_error",
                501,
            )
        snap = self._snapshot()
        out = []
        for view, task in zip(snap.slots, snap.tasks, strict=True):
            entry: dict[str, Any] = {
                "id": view.id,
                "n_ctx": self.world.slot_context,
                "speculative": self.policy.drafting,
                "is_processing": view.is_processing,
            }
            if task is not None:
                # A released slot shows its last task, its context (prompt + output - 1) and its
                # counts reset, as llama-server's does.
                busy = view.is_processing
                entry.update(
                    {
                        "id_task": task.ticket,
                        "n_prompt_tokens": task.context,  # llama-server: its context
                        "n_prompt_tokens_processed": task.prompt_done - task.cached if busy else 0,
                        "n_prompt_tokens_cache": task.cached if busy else 0,
                        "params": self._params(),
                        "next_token": [
                            {
                                "has_next_token": busy,
                                "has_new_line": False,
                                "n_remain": task.max_tokens - task.n_decoded if busy else -1,
                                "n_decoded": task.n_decoded if busy else 0,
                            }
                        ],
                    }
                )
            entry["t_server"] = snap.time
            out.append(entry)
        return json_reply(out)

    def _metrics(self, _: HttpRequest) -> Reply:
        if not self.args.metrics:
            return error_reply(
                "This server does not support metrics endpoint. Start it with `--metrics`",
                "not_supported_error",
                501,
            )
        text = self._snapshot().metrics.prometheus()
        return Reply(200, text.encode(), "text/plain; version=0.0.4")

    def _tokenize(self, request: HttpRequest) -> Reply:
        body = self._body(request)
        content = body.get("content", "")
        if not isinstance(content, str):
            raise BadRequest(bad_request('"content" must be a string'))
        tokens = tokenizer.tokenize(content, bool(body.get("add_special", False)))
        if body.get("with_pieces"):
            pieces = [
                {"id": t, "piece": tokenizer.piece_bytes(t).decode("utf-8", errors="replace")}
                for t in tokens
            ]
            return json_reply({"tokens": pieces})
        return json_reply({"tokens": tokens})

    def _detokenize(self, request: HttpRequest) -> Reply:
        tokens = self._body(request).get("tokens", [])
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise BadRequest(bad_request('"tokens" must be a list of token ids'))
        return json_reply({"content": tokenizer.detokenize(tokens)})

    def _apply_template(self, request: HttpRequest) -> Reply:
        messages = self._body(request).get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise BadRequest(bad_request('"messages" must be a list of messages'))
        return json_reply({"prompt": tokenizer.apply_template(messages)})

    # -- completions --

    def _prompt_tokens(self, body: dict[str, Any], chat: bool) -> list[int]:
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest(bad_request("'messages' is required and must be a list"))
            return tokenizer.tokenize(tokenizer.apply_template(messages), True)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return tokenizer.tokenize(prompt, True)
        if isinstance(prompt, list) and prompt and any(isinstance(p, int) for p in prompt):
            tokens: list[int] = []
            for i, piece in enumerate(prompt):
                if isinstance(piece, bool) or not isinstance(piece, int | str):
                    raise BadRequest(bad_request("a prompt holds token ids and strings"))
                if isinstance(piece, int):
                    tokens.append(piece)
                else:
                    tokens += tokenizer.tokenize(piece, i == 0)
            return tokens
        if prompt is None:
            raise BadRequest(bad_request('"prompt" is required'))
        raise BadRequest(bad_request("the twin takes one prompt per request"))

    def _request(self, body: dict[str, Any], tokens: list[int], chat: bool) -> Request:
        n_predict = body.get("n_predict")
        for key in ("max_tokens", "max_completion_tokens") if chat else ("max_tokens",):
            if n_predict is None:
                n_predict = body.get(key)
        if n_predict is None:
            n_predict = -1
        if isinstance(n_predict, bool) or not isinstance(n_predict, int):
            raise BadRequest(bad_request('"n_predict" must be an integer'))
        context = self.world.slot_context
        if not tokens:
            raise BadRequest(bad_request("the prompt is empty"))
        if len(tokens) >= context:
            raise BadRequest(
                error_reply(
                    f"request ({len(tokens)} tokens) exceeds the available context size "
                    f"({context} tokens), try increasing it",
                    "exceed_context_size_error",
                    400,
                )
            )
        # -1: until the context is full (the engine stops there); 0: the twin still samples one
        max_tokens = context if n_predict < 0 else max(1, n_predict)
        seed = body.get("seed")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed in (-1, SEED_RANDOM):
            seed = self._rng.getrandbits(32)
        cached = self._cache.take(tokens) if body.get("cache_prompt", True) else 0
        # an acceptance class is marked by text its prompt holds (none: by its seed)
        marked = self.world.marked_class(tokenizer.detokenize(tokens)) if self._classes else ""
        return Request(
            prompt_tokens=len(tokens),
            max_tokens=max_tokens,
            seed=seed % 2**32,
            cached_tokens=min(cached, len(tokens) - 1),  # one is always evaluated again
            content=marked,
        )

    async def _completion(self, conn: Connection, request: HttpRequest, chat: bool) -> None:
        body = self._body(request)
        tokens = self._prompt_tokens(body, chat)
        twin_request = self._request(body, tokens, chat)
        stream = bool(body.get("stream", False))
        per_token = bool(body.get("timings_per_token", False))
        assert self.live is not None
        ticket = next(self._tickets)
        events: asyncio.Queue[Event] = asyncio.Queue()
        self._listeners[ticket] = events
        self.live.submit(ticket, twin_request)
        gone = asyncio.ensure_future(conn.wait_gone())
        reply = Answer(self, chat, twin_request, body, per_token)
        try:
            first = await self._next(events, gone)
            if isinstance(first, Failed):
                await conn.send(bad_request(first.message), self._extra())
                return
            if not stream:
                event: Event = first
                while not isinstance(event, Done):
                    if isinstance(event, Tokens):
                        reply.add(event)
                    event = await self._next(events, gone)
                await conn.send(json_reply(reply.whole(event)), self._extra())
                return
            await conn.start_stream(self._extra())
            event = first
            while True:
                if isinstance(event, Tokens):
                    await conn.stream(b"".join(sse(c) for c in reply.partial(event)))
                elif isinstance(event, Done):
                    await conn.stream(b"".join(sse(c) for c in reply.final(event)))
                    if chat:
                        await conn.stream(b"data: [DONE]\n\n")
                    await conn.end_stream()
                    return
                event = await self._next(events, gone)
        except Gone:
            self.live.cancel(ticket)
            raise
        finally:
            self._listeners.pop(ticket, None)
            # The watch must be gone before the connection reads its next request.
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone

    async def _next(self, events: asyncio.Queue[Event], gone: asyncio.Future) -> Event:
        """The request's next event; Gone when its client closed the connection first."""
        if not events.empty():
            return events.get_nowait()
        getter = asyncio.ensure_future(events.get())
        await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        getter.cancel()
        raise Gone

    def random_id(self) -> str:
        alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
        return "".join(self._rng.choice(alphabet) for _ in range(32))
