"""A scripted OpenAI-compatible HTTP/1.1 server and an HTTP proxy on loopback, for these tests.

``async with LoopbackServer([reply, ...]) as server:`` works in any event loop and thread; pass
``tls=server_tls()`` for an ``https://`` server whose certificate is signed by the test CA
(``TEST_CA``).

Each accepted connection takes the next scripted ``Reply`` and records what the client sent; the
server answers with ``Connection: close`` so one connection is one request. Everything it opens is
closed by ``__aexit__``, within a bound.

``async with TunnelProxy() as proxy:`` is a forwarding proxy (``proxy.url`` for ``HTTPS_PROXY``
and friends): ``CONNECT host:port`` opens a tunnel to a loopback target and relays bytes both
ways; an absolute-form request (``POST http://host:port/path``) is forwarded in origin form.
Every request it gets is recorded in ``proxy.requests``; a tunnel to anything but loopback is
refused with 403.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

TLS_DIR = Path(__file__).parent / "tls"
#: the test CA that signed the loopback server's certificate (see tls/README.md)
TEST_CA = str(TLS_DIR / "ca.pem")


def server_tls() -> ssl.SSLContext:
    """The loopback server's side of TLS: a certificate for 127.0.0.1 signed by ``TEST_CA``."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(TLS_DIR / "server.pem", TLS_DIR / "server.key")
    return context


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}


@dataclass
class Reply:
    """One scripted answer.

    ``chunks`` are written one by one with chunked transfer encoding (each becomes a separate
    read on the client). ``hold`` keeps the response open after the chunks until the client goes
    away; ``drop`` closes the connection without answering. ``raw`` replaces all of that: those
    bytes are the whole response, written piece by piece (each drained), then the connection
    is closed (or held, with ``hold``). ``flood``, after ``raw``: those bytes written again and
    again (``every`` seconds apart, or as fast as the client reads) until the client goes away,
    as a hostile server would.
    """

    status: int = 200
    chunks: Sequence[bytes] = ()
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "text/event-stream"})
    hold: bool = False
    drop: bool = False
    raw: Sequence[bytes] | None = None
    flood: bytes = b""
    every: float = 0.0


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes = b""  # the body as sent


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


async def read_request_head(
    reader: asyncio.StreamReader,
) -> tuple[str, str, dict[str, str], bytes]:
    """The method, target, headers (names in lower case) and raw head of the request
    ``reader`` holds."""
    head = await reader.readuntil(b"\r\n\r\n")
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    method, target, _ = request_line.split(" ", 2)
    headers = {}
    for line in header_lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return method, target, headers, head


class _Served:
    """A server on 127.0.0.1 whose connection handlers end with it (``async with``)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._tls = tls
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.port = 0

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=self._tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._handle(reader, writer))
        self._handlers.add(task)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class LoopbackServer(_Served):
    def __init__(self, replies: Sequence[Reply], *, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(tls)
        self._replies = list(replies)
        self.requests: list[Received] = []
        self.client_gone = asyncio.Event()

    @property
    def url(self) -> str:
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{self.port}/v1"

    @property
    def unused_replies(self) -> int:
        return len(self._replies)

    async def _until_client_gone(self, reader: asyncio.StreamReader) -> None:
        """Wait for the client to hang up: read() returns b"" at EOF or raises on reset."""
        with contextlib.suppress(ConnectionError):
            while await reader.read(1024):
                pass
        self.client_gone.set()

    async def _flood(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, piece: bytes, every: float
    ) -> None:
        """Write ``piece`` until the client goes away: its end of the connection closes (seen
        by reading) or a write fails, whichever comes first."""
        block = piece if every else piece * max(1, 65536 // len(piece))

        async def write() -> None:
            with contextlib.suppress(ConnectionError):
                while True:
                    writer.write(block)
                    await writer.drain()
                    if every:
                        await asyncio.sleep(every)

        tasks = [
            asyncio.ensure_future(write()),
            asyncio.ensure_future(self._until_client_gone(reader)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.client_gone.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            method, path, headers, _head = await read_request_head(reader)
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            body = json.loads(raw.decode("utf-8")) if raw else None  # strict UTF-8, as a server
            self.requests.append(Received(method, path, headers, body, raw))
            reply = self._replies.pop(0) if self._replies else json_reply(599, "unscripted")
            if reply.drop:
                return
            if reply.raw is not None:
                for piece in reply.raw:
                    writer.write(piece)
                    await writer.drain()
                if reply.flood:
                    await self._flood(reader, writer, reply.flood, reply.every)
                    return
                if reply.hold:
                    await self._until_client_gone(reader)
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
                await self._until_client_gone(reader)
                return
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(OSError):  # ConnectionError, or ssl.SSLError under TLS
                await writer.wait_closed()


@dataclass
class ProxyRequest:
    method: str
    target: str
    headers: dict[str, str]


class TunnelProxy(_Served):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[ProxyRequest] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            method, target, headers, head = await read_request_head(reader)
            self.requests.append(ProxyRequest(method, target, headers))
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
            else:  # absolute form: http://host:port/path
                host, _, port = target.split("/")[2].rpartition(":")
            if host not in ("127.0.0.1", "[::1]", "localhost"):
                writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                return
            up_reader, upstream = await asyncio.open_connection(host.strip("[]"), int(port))
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                path = "/" + target.split("/", 3)[3]
                upstream.write(head.replace(target.encode(), path.encode(), 1))
            await asyncio.gather(_relay(reader, upstream), _relay(up_reader, writer))
        finally:
            sides = [side for side in (upstream, writer) if side is not None]
            for side in sides:
                side.transport.abort()  # a relay may be stuck writing to a gone peer
            await asyncio.gather(*(side.wait_closed() for side in sides), return_exceptions=True)


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [event async for event in stream]


@contextlib.contextmanager
def served_in_thread(
    replies: Sequence[Reply], *, tls: ssl.SSLContext | None = None, guard: float = 60.0
) -> Iterator[LoopbackServer]:
    """A ``LoopbackServer`` on its own event loop in a thread, for a test that blocks (on a
    child interpreter, say) while the server answers; stopped and joined on exit."""
    ready = threading.Event()
    stop: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
    servers: list[LoopbackServer] = []

    async def serve() -> None:
        done = asyncio.Event()
        async with LoopbackServer(replies, tls=tls) as server:
            servers.append(server)
            stop.append((asyncio.get_running_loop(), done))
            ready.set()
            await asyncio.wait_for(done.wait(), guard)

    thread = threading.Thread(target=asyncio.run, args=(serve(),))
    thread.start()
    try:
        assert ready.wait(guard), "the loopback server did not start"
        yield servers[0]
    finally:
        if stop:
            loop, done = stop[0]
            loop.call_soon_threadsafe(done.set)
        thread.join(guard)
        assert not thread.is_alive(), "the loopback server's thread did not end"
