"""A small HTTP/1.1 server side on asyncio streams, as much as the twin needs: requests with a
body (Content-Length or chunked), keep-alive, JSON replies, server-sent events in chunked
transfer encoding, and noticing a client that closed its connection. Standard library only.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any


@dataclass
class HttpRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json; charset=utf-8"


def json_reply(obj: Any, status: int = 200) -> Reply:
    return Reply(status, json.dumps(obj, separators=(",", ":")).encode())


def error_reply(message: str, kind: str, code: int) -> Reply:
    """llama-server's error body (format_error_response)."""
    return json_reply({"error": {"code": code, "message": message, "type": kind}}, code)


def bad_request(message: str) -> Reply:
    return error_reply(message, "invalid_request_error", 400)


class BadRequest(Exception):
    """A request the twin answers with one 400 line."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.body.decode())
        self.reply = reply


class Gone(Exception):
    """The client closed its connection."""


class Connection:
    """One client connection: requests in, replies and event streams out."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.closing = False  # answer this request, then close

    async def read_request(self) -> HttpRequest | None:
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        except asyncio.LimitOverrunError:
            self.closing = True
            return None
        lines = head.decode("latin-1").split("\r\n")
        try:
            method, target, _ = lines[0].split(" ", 2)
        except ValueError:
            return None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                key, value = line.split(":", 1)
                headers[key.strip().lower()] = value.strip()
        try:
            if headers.get("transfer-encoding", "").lower() == "chunked":
                body = await self._chunked_body()
            else:
                body = await self.reader.readexactly(int(headers.get("content-length") or 0))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            return None
        path, _, query = target.partition("?")
        return HttpRequest(method.upper(), path, query, headers, body)

    async def _chunked_body(self) -> bytes:
        parts = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)

    def _head(self, status: int, headers: Mapping[str, str]) -> bytes:
        reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        lines = [f"HTTP/1.1 {status} {reason}", "Server: llama.cpp (tuner twin)"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if self.closing:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def send(self, reply: Reply, extra: Mapping[str, str]) -> None:
        headers = {
            "Content-Type": reply.content_type,
            "Content-Length": str(len(reply.body)),
            "Access-Control-Allow-Origin": "*",
            **extra,
        }
        self.writer.write(self._head(reply.status, headers) + reply.body)
        await self._drain()

    async def start_stream(self, extra: Mapping[str, str]) -> None:
        headers = {
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "Transfer-Encoding": "chunked",
            "Access-Control-Allow-Origin": "*",
            **extra,
        }
        self.writer.write(self._head(200, headers))
        await self._drain()

    async def stream(self, data: bytes) -> None:
        if data:
            self.writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await self._drain()

    async def end_stream(self) -> None:
        self.writer.write(b"0\r\n\r\n")
        await self._drain()

    async def _drain(self) -> None:
        if self.writer.is_closing():
            raise Gone
        try:
            await self.writer.drain()
        except ConnectionError as exc:
            raise Gone from exc

    async def wait_gone(self) -> None:
        """Returns when the client closes its side (anything it sends meanwhile: it will not
        be read, the connection closes after this request)."""
        while True:
            try:
                data = await self.reader.read(1)
            except ConnectionError:
                return
            if not data:
                return
            self.closing = True


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
