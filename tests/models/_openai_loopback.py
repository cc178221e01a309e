"""A scripted OpenAI-compatible HTTP/1.1 server on loopback, written for these tests.

``async with LoopbackServer([reply, ...]) as server:`` works in any event loop and thread.

Each accepted connection takes the next scripted ``Reply`` and records what the client sent; the
server answers with ``Connection: close`` so one connection is one request. Everything it opens is
closed by ``__aexit__``, within a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}


@dataclass
class Reply:
    """One scripted answer.

    ``chunks`` are written one by one with chunked transfer encoding (each becomes a separate
    read on the client). ``hold`` keeps the response open after the chunks until the client goes
    away; ``drop`` closes the connection without answering.
    """

    status: int = 200
    chunks: Sequence[bytes] = ()
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "text/event-stream"})
    hold: bool = False
    drop: bool = False


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


def sse(*chunks: Any, done: bool = True) -> list[bytes]:
    """SSE events for JSON ``chunks`` (str items are sent verbatim as the data), then [DONE]."""
    out = [f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks]
    if done:
        out.append(b"data: [DONE]\n\n")
    return out


def json_reply(status: int, body: Any, headers: dict[str, str] | None = None) -> Reply:
    return Reply(
        status=status,
        chunks=[json.dumps(body).encode()],
        headers={"Content-Type": "application/json", **(headers or {})},
    )


class LoopbackServer:
    def __init__(self, replies: Sequence[Reply]) -> None:
        self._replies = list(replies)
        self.requests: list[Received] = []
        self.client_gone = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.url = ""

    async def __aenter__(self) -> LoopbackServer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    @property
    def unused_replies(self) -> int:
        return len(self._replies)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._handle(reader, writer))
        self._handlers.add(task)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            method, path, _ = request_line.split(" ", 2)
            headers = {}
            for line in header_lines:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append(Received(method, path, headers, json.loads(raw) if raw else None))
            reply = self._replies.pop(0) if self._replies else json_reply(599, "unscripted")
            if reply.drop:
                return
            reason = _REASONS.get(reply.status, "Whatever")
            lines = [f"HTTP/1.1 {reply.status} {reason}"]
            lines += [f"{k}: {v}" for k, v in reply.headers.items()]
            lines += ["Transfer-Encoding: chunked", "Connection: close", "", ""]
            writer.write("\r\n".join(lines).encode("latin-1"))
            for chunk in reply.chunks:
                writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                await writer.drain()
            if reply.hold:
                # Wait for the client to hang up: read() returns b"" at EOF or raises on reset.
                with contextlib.suppress(ConnectionError):
                    while await reader.read(1024):
                        pass
                self.client_gone.set()
                return
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


async def collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [event async for event in stream]
