"""The SDKs' HTTP library on asyncio's own transports: reads, writes, bounds, TLS, errors.

Real sockets on loopback; every test runs under asyncio's loop and under uvloop.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from zett_agent.models import _asyncio_net, _paced_reads
from zett_agent.models._sdk_http import http_client

HANG_GUARD = 30.0
#: the most an event loop reads from a socket at once (asyncio's and uvloop's 256 KiB)
ONE_READ = 256 * 1024
TLS = Path(__file__).resolve().parent.parent / "support" / "tls"

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def backend() -> AsyncIterator[_asyncio_net.AsyncioBackend]:
    """An ``AsyncioBackend`` for the HTTP library of the SDK's default client."""
    client = openai.DefaultAsyncHttpxClient()
    try:
        native = _asyncio_net.for_library(client._transport._pool._network_backend)
        assert native is not None
        yield native
    finally:
        await client.aclose()


@pytest.fixture
def errors(backend: _asyncio_net.AsyncioBackend) -> Any:
    return backend._errors


@contextlib.asynccontextmanager
async def serving(handle: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    """A loopback server running ``handle`` for each connection; yields its port."""
    tasks: set[asyncio.Task[None]] = set()

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await handle(reader, writer)
        finally:
            writer.transport.abort()

    server = await asyncio.start_server(run, "127.0.0.1", 0, ssl=tls)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


@contextlib.asynccontextmanager
async def connected(
    backend: _asyncio_net.AsyncioBackend, handle: Handler
) -> AsyncIterator[_asyncio_net.AsyncioStream]:
    """A stream of ``backend`` to a loopback server running ``handle``, closed at the end."""
    async with serving(handle) as port:
        stream = await backend.connect_tcp("127.0.0.1", port, timeout=HANG_GUARD)
        try:
            yield stream
        finally:
            await stream.aclose()


async def until_closed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A server's side that reads until the client goes away."""
    await reader.read()


def server_tls() -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(TLS / "server.pem", TLS / "server.key")
    return context


def client_tls() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(TLS / "ca.pem"))


async def test_the_sdks_default_backend_is_replaced_and_a_chosen_one_kept() -> None:
    client = http_client(openai.DefaultAsyncHttpxClient, timeout=5.0, json_as_event=False)
    try:
        paced = client._transport._pool._network_backend
        assert isinstance(paced, _paced_reads._PacedBackend)
        assert isinstance(paced._inner, _asyncio_net.AsyncioBackend)
    finally:
        await client.aclose()

    class Chosen:
        async def connect_tcp(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    assert _asyncio_net.for_library(Chosen()) is None
    chosen = openai.DefaultAsyncHttpxClient()
    chosen._transport._pool._network_backend = Chosen()
    try:
        assert _paced_reads.pace_reads(chosen) == 1
        assert isinstance(chosen._transport._pool._network_backend._inner, Chosen)
    finally:
        await chosen.aclose()


async def test_bytes_arrive_whole_and_in_order_and_the_end_reads_empty(
    backend: _asyncio_net.AsyncioBackend,
) -> None:
    sent = bytes(range(256)) * 4096  # 1 MiB

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readexactly(5)
        writer.write(request + sent)
        await writer.drain()
        writer.write_eof()
        await reader.read()

    async with connected(backend, handle) as stream:
        await stream.write(b"hello", timeout=HANG_GUARD)
        got = bytearray()
        while chunk := await stream.read(65536, timeout=HANG_GUARD):
            assert len(chunk) <= 65536
            got += chunk
        assert bytes(got) == b"hello" + sent
        assert await stream.read(65536, timeout=HANG_GUARD) == b""
        assert stream.get_extra_info("is_readable")  # ended: not to be reused
        assert stream.get_extra_info("server_addr")[0] == "127.0.0.1"


async def test_a_connection_holds_a_bounded_amount_while_the_library_does_not_read(
    backend: _asyncio_net.AsyncioBackend,
) -> None:
    total = 32 * 1024 * 1024  # more than the kernel's socket buffers hold on loopback
    blocked = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.set_write_buffer_limits(high=1 << 20)
        chunk = b"x" * 65536
        for _ in range(total // len(chunk)):
            writer.write(chunk)
            if writer.transport.get_write_buffer_size() > 1 << 20:
                blocked.set()  # the kernel's buffers are full: the client stopped reading
            await writer.drain()  # (returns at once while the transport takes more, 3.12 on)
            await asyncio.sleep(0)  # the loop's turn: the client reads as it would
        writer.write_eof()
        await reader.read()

    async with connected(backend, handle) as stream:
        await asyncio.wait_for(blocked.wait(), HANG_GUARD)
        held = len(stream._conn.buffer)
        assert 0 < held <= ONE_READ  # the first chunk; the rest waits in the socket
        got = 0
        while chunk := await stream.read(1 << 20, timeout=HANG_GUARD):
            got += len(chunk)
        assert got == total  # reading resumed, nothing lost


async def test_an_idle_connection_whose_server_left_is_not_reused(
    backend: _asyncio_net.AsyncioBackend,
) -> None:
    async with connected(backend, lambda reader, writer: reader.readexactly(1)) as stream:
        conn = stream._conn
        assert conn.transport is not None
        # as after a chunk that came while no read waited (``data_received``): not reading
        conn.transport.pause_reading()
        conn._reading_paused = True
        assert not stream.get_extra_info("is_readable")  # idle: it could take a request
        await stream.write(b"!", timeout=HANG_GUARD)  # the server reads it and leaves
        sock = stream.get_extra_info("socket")
        readable = await asyncio.get_running_loop().run_in_executor(
            None, select.select, [sock.fileno()], [], [], HANG_GUARD
        )
        assert readable[0]  # the server's end is in the socket, unread
        assert not conn.eof
        assert stream.get_extra_info("is_readable")  # so the pool drops it


async def test_a_read_from_a_silent_server_times_out(
    backend: _asyncio_net.AsyncioBackend, errors: Any
) -> None:
    async with connected(backend, until_closed) as stream:
        with pytest.raises(errors.ReadTimeout):
            await stream.read(100, timeout=0.05)
        assert not stream.get_extra_info("is_readable")  # idle, still open


async def test_a_write_to_a_server_that_never_reads_times_out(
    backend: _asyncio_net.AsyncioBackend, errors: Any
) -> None:
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.pause_reading()  # nothing read: the client's writes back up
        await release.wait()

    try:
        async with connected(backend, handle) as stream:
            with pytest.raises(errors.WriteTimeout):
                for _ in range(1024):  # at most 1 GiB: the buffers fill long before
                    await stream.write(b"y" * (1 << 20), timeout=0.2)
    finally:
        release.set()


async def test_a_refused_connection_and_a_reset_one_raise_the_librarys_errors(
    backend: _asyncio_net.AsyncioBackend, errors: Any
) -> None:
    async with serving(lambda r, w: asyncio.sleep(0)) as port:
        pass  # closed: nothing listens on the port any more
    with pytest.raises(errors.ConnectError):
        await backend.connect_tcp("127.0.0.1", port, timeout=HANG_GUARD)

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(1)
        # a linger of zero: the close (``serving``'s) sends a reset
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )

    async with connected(backend, reset) as stream:
        await stream.write(b"?", timeout=HANG_GUARD)
        with pytest.raises(errors.ReadError):
            while await stream.read(100, timeout=HANG_GUARD):
                pass


async def test_a_closed_stream_neither_reads_nor_writes(
    backend: _asyncio_net.AsyncioBackend, errors: Any
) -> None:
    async with connected(backend, until_closed) as stream:
        await stream.aclose()
        with pytest.raises(errors.ReadError):
            await stream.read(100, timeout=HANG_GUARD)
        with pytest.raises(errors.WriteError):
            await stream.write(b"late", timeout=HANG_GUARD)


async def test_tls_is_verified_and_carries_the_bytes(
    backend: _asyncio_net.AsyncioBackend, errors: Any
) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"secret:" + await reader.readexactly(4))
        await writer.drain()
        await reader.read()

    async with serving(handle, tls=server_tls()) as port:
        plain = await backend.connect_tcp("127.0.0.1", port, timeout=HANG_GUARD)
        stream = await plain.start_tls(client_tls(), "localhost", timeout=HANG_GUARD)
        try:
            assert stream.get_extra_info("ssl_object") is not None
            await stream.write(b"ping", timeout=HANG_GUARD)
            got = b""
            while len(got) < 11:
                got += await stream.read(100, timeout=HANG_GUARD)
            assert got == b"secret:ping"
        finally:
            await stream.aclose()
        # a client that does not trust the server's CA refuses it
        plain = await backend.connect_tcp("127.0.0.1", port, timeout=HANG_GUARD)
        with pytest.raises(errors.ConnectError):
            await plain.start_tls(ssl.create_default_context(), "localhost", timeout=HANG_GUARD)


async def test_bytes_before_the_tls_handshake_are_refused_never_read_as_tunnelled(
    backend: _asyncio_net.AsyncioBackend, errors: Any
) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n\r\n")  # as if from inside the tunnel, in clear
        await writer.drain()
        await reader.read()

    async with serving(handle) as port:
        stream = await backend.connect_tcp("127.0.0.1", port, timeout=HANG_GUARD)
        if not stream._conn.buffer:
            await asyncio.wait_for(stream._conn.readable(), HANG_GUARD)  # the bytes arrived
        assert stream.get_extra_info("is_readable")
        with pytest.raises(errors.ConnectError, match="before the TLS handshake"):
            await stream.start_tls(client_tls(), "localhost", timeout=HANG_GUARD)
        with pytest.raises(errors.ReadError):
            await stream.read(100, timeout=HANG_GUARD)


async def test_a_tls_handshake_that_never_completes_times_out(
    backend: _asyncio_net.AsyncioBackend, errors: Any
) -> None:
    # the server takes the client's hello and never answers
    async with connected(backend, until_closed) as stream:
        with pytest.raises(errors.ConnectTimeout):
            await stream.start_tls(client_tls(), "localhost", timeout=0.1)


def test_only_a_name_races_its_addresses() -> None:
    assert _asyncio_net._is_address("127.0.0.1")
    assert _asyncio_net._is_address("::1")
    assert not _asyncio_net._is_address("localhost")
    assert not _asyncio_net._is_address("api.example.com")
    assert not _asyncio_net._is_address("1.2.3")  # not an address: resolved as a name


async def test_a_name_connects_too(backend: _asyncio_net.AsyncioBackend) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readexactly(2))
        await writer.drain()
        await reader.read()

    async with serving(handle) as port:
        stream = await backend.connect_tcp("localhost", port, timeout=HANG_GUARD)
        try:
            await stream.write(b"ok", timeout=HANG_GUARD)
            assert await stream.read(10, timeout=HANG_GUARD) == b"ok"
        finally:
            await stream.aclose()
