"""A fake HTTP server that stands in for llama-server only to produce protocol cases a real one
never gives (a wrong key, a web page, another OpenAI-compatible server, a switch that does not
read back, server-sent events split anywhere): what it answers is set per path, what it was sent
is kept. Shared by tests/test_client.py and tests/test_check.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def llama_error(code: int, message: str, kind: str) -> tuple[int, str]:
    """llama-server's error body."""
    return code, json.dumps({"error": {"code": code, "message": message, "type": kind}})


@dataclass
class Fake:
    """What the fake server answers, and what it was sent. An answer is (status, body) or
    (status, body, content type); JSON by default."""

    url: str = ""
    key: str | None = None
    get: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    post: dict[str, Callable[[dict[str, Any]], tuple[int, str]]] = field(default_factory=dict)
    events: dict[str, Callable[[dict[str, Any]], list[bytes]]] = field(default_factory=dict)
    bodies: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(fake: Fake) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _authorised(self) -> bool:
            if fake.key is None or self.headers.get("Authorization") == f"Bearer {fake.key}":
                return True
            self._send(*llama_error(401, "Invalid API Key", "authentication_error"))
            return False

        def _send(self, status: int, body: str, content_type: str = "application/json") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self._authorised():
                self._send(*fake.get.get(self.path, (404, "File Not Found")))

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            with fake.lock:
                fake.bodies.append((self.path, body))
            if not self._authorised():
                return
            if body.get("stream") and self.path in fake.events:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for piece in fake.events[self.path](body):
                    self.wfile.write(piece)
                    self.wfile.flush()
                self.close_connection = True
                return
            answer = fake.post.get(self.path)
            self._send(*(answer(body) if answer else (404, "File Not Found")))

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextmanager
def fake_server() -> Iterator[Fake]:
    """A fake server on a free port of 127.0.0.1, for the block's length."""
    state = Fake()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_port}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
