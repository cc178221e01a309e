"""A network backend for the SDKs' HTTP library on asyncio's own transports.

The HTTP library the SDKs use (``httpcore``, or its fork ``httpcore2``) reaches the network
through a backend that goes through ``anyio`` on asyncio: each read and each write enters and
leaves cancel scopes, asks which event loop runs (``sniffio``) and yields to the loop once more,
and each connection starts a task group for its "happy eyeballs". Profiled in a parent making
one streamed call after another to a loopback endpoint, that was about a fifth of the parent's
CPU per call. This backend does the same work with one ``asyncio.Protocol`` per connection:
a read takes what the connection holds, or waits for it once; a write hands its bytes to the
transport and waits only while the transport's buffer is full.

A connection reads its socket while a read waits for it, as the ``anyio`` backend does: what
arrives while none does (a call waiting for its turn, ``_pacing``) is held, one chunk of it, and
the rest stays in the socket until the next read. So a thousand streams that their servers write
to at once cost the loop nothing outside their calls' turns, and a connection never holds more
than the loop's one read of its socket (256 KiB) beyond what the library asked for. A read or
write with a timeout ends at it (the library's ``ReadTimeout``, ``WriteTimeout``), and closing
a connection drops it at once (no flush, no TLS close alert to wait for), as ``anyio``'s does.
Bytes a server sent before a TLS handshake the library asks for (a proxy's ``CONNECT`` tunnel)
are never taken for what comes through the tunnel: the handshake is refused.

A second backend was tried here before (see docs/performance.md, "What moved the stall"):
reading every socket as data came, it cost the loop a callback per delta outside any turn, and
it was left out; this one reads as that one did only once it had to.

The library's exceptions are raised (``ConnectError``, ``ReadError``...), from the module of
the library whose default backend this one replaces (``for_library``).
"""

from __future__ import annotations

import asyncio
import select
import socket
import ssl
import sys
from collections.abc import Coroutine, Iterable
from types import ModuleType
from typing import Any, cast

__all__ = ["AsyncioBackend", "for_library"]

#: the delay before the next address of a host is tried while one still connects (RFC 8305)
_HAPPY_EYEBALLS_DELAY = 0.25


class _Connection(asyncio.Protocol):
    """One connection's received bytes, its end, and whether it may be written to now."""

    __slots__ = (
        "_reader",
        "_reading_paused",
        "_writable",
        "aborted",
        "buffer",
        "closed",
        "eof",
        "error",
        "transport",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.eof = False
        #: why the connection ended, when it was not a clean end of the stream
        self.error: BaseException | None = None
        self.closed = False
        #: closed by the library (``aclose``): reads and writes fail from then on
        self.aborted = False
        self._reader: asyncio.Future[None] | None = None
        #: set while the transport takes more bytes (``None``: it does)
        self._writable: asyncio.Future[None] | None = None
        self._reading_paused = False

    # -- the transport's calls --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's are not ``asyncio.Transport`` instances)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        reader = self._reader
        if reader is not None and not reader.done():
            reader.set_result(None)  # a read waits: it takes this
        elif not self._reading_paused and self.transport is not None:
            # none waits: the socket keeps what comes next until a read asks for it
            self._reading_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake_reader()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if exc is not None:
            self.error = exc
        else:
            self.eof = True
        self._wake_reader()
        writable = self._writable
        if writable is not None and not writable.done():
            writable.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        writable = self._writable
        if writable is not None and not writable.done():
            writable.set_result(None)

    # -- the stream's ------------------------------------------------------------------------

    def _wake_reader(self) -> None:
        reader = self._reader
        if reader is not None and not reader.done():
            reader.set_result(None)

    async def readable(self) -> None:
        """Until there are bytes to take, or the connection ended (at once if so now)."""
        if self.buffer or self.eof or self.closed or self.error is not None:
            return
        if self._reader is not None:
            raise RuntimeError("two reads of one connection at once")
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        self._reader = asyncio.get_running_loop().create_future()
        try:
            await self._reader
        finally:
            self._reader = None

    def take(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` of what was received (``b""`` when nothing is held)."""
        buffer = self.buffer
        if len(buffer) <= max_bytes:
            data = bytes(buffer)
            buffer.clear()
        else:
            data = bytes(buffer[:max_bytes])
            del buffer[:max_bytes]
        return data

    async def writable(self) -> None:
        """Until the transport takes more bytes (at once when it does)."""
        writable = self._writable
        if writable is not None and not writable.done():
            await asyncio.shield(writable)


async def _within(
    waiting: Coroutine[Any, Any, None],
    timeout: float | None,  # noqa: ASYNC109 - the library's argument, passed on
    error: type[Exception],
    what: str,
) -> None:
    """Await ``waiting``, for at most ``timeout`` seconds (``None``: as long as it takes).

    Raises ``error`` (the library's timeout) when the time is up.
    """
    try:
        if timeout is None:
            await waiting
        else:
            async with asyncio.timeout(timeout):
                await waiting
    except TimeoutError as exc:
        raise error(f"{what} timed out") from exc


class AsyncioStream:
    """One connection, as the HTTP library's ``AsyncNetworkStream``."""

    __slots__ = ("_conn", "_errors")

    def __init__(self, conn: _Connection, errors: ModuleType) -> None:
        self._conn = conn
        self._errors = errors

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        conn = self._conn
        if conn.aborted:
            raise self._errors.ReadError("the connection is closed")
        if not conn.buffer:
            await _within(conn.readable(), timeout, self._errors.ReadTimeout, "the read")
        if conn.buffer:
            return conn.take(max_bytes)
        if conn.error is not None:
            raise self._errors.ReadError(str(conn.error) or type(conn.error).__name__)
        return b""  # the server ended its stream

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        if not buffer:
            return
        conn = self._conn
        transport = conn.transport
        if transport is None or conn.closed or conn.aborted or transport.is_closing():
            raise self._errors.WriteError(
                str(conn.error) if conn.error is not None else "the connection is closed"
            )
        transport.write(buffer)
        await _within(conn.writable(), timeout, self._errors.WriteTimeout, "the write")
        if conn.error is not None:
            raise self._errors.WriteError(str(conn.error) or type(conn.error).__name__)

    async def aclose(self) -> None:
        conn = self._conn
        conn.aborted = True
        if conn.transport is not None:
            conn.transport.abort()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> AsyncioStream:
        conn = self._conn
        errors = self._errors
        transport = conn.transport
        if conn.buffer or conn.eof or conn.closed or transport is None:
            # what came before the handshake must never pass for what comes through it
            await self.aclose()
            raise errors.ConnectError(
                "the server sent bytes before the TLS handshake"
                if conn.buffer
                else "the connection ended before the TLS handshake"
            )
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                tls = await loop.start_tls(
                    transport, conn, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError as exc:
            await self.aclose()
            raise errors.ConnectTimeout("the TLS handshake timed out") from exc
        except OSError as exc:  # ssl.SSLError among them
            await self.aclose()
            raise errors.ConnectError(str(exc) or type(exc).__name__) from exc
        except BaseException:
            await self.aclose()
            raise
        if tls is None:  # the connection ended meanwhile
            await self.aclose()
            raise errors.ConnectError("the connection ended during the TLS handshake")
        conn.transport = tls
        return AsyncioStream(conn, errors)

    def get_extra_info(self, info: str) -> Any:
        conn = self._conn
        transport = conn.transport
        if info == "is_readable":
            # an idle connection reads nothing: anything received, or its end, means it cannot
            # take another request; the socket is asked too (its reading may be paused, or the
            # loop not have run since it became readable), as the library's backends ask it
            if conn.buffer or conn.eof or conn.closed or conn.error is not None:
                return True
            sock = transport.get_extra_info("socket") if transport is not None else None
            return sock is None or _socket_readable(sock.fileno())
        if transport is None:
            return None
        if info == "ssl_object":
            return transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return transport.get_extra_info("sockname")
        if info == "server_addr":
            return transport.get_extra_info("peername")
        if info == "socket":
            return transport.get_extra_info("socket")
        return None


class AsyncioBackend:
    """The HTTP library's ``AsyncNetworkBackend`` on asyncio's transports (see the module)."""

    __slots__ = ("_errors",)

    def __init__(self, errors: ModuleType) -> None:
        self._errors = errors

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> AsyncioStream:
        loop = asyncio.get_running_loop()
        options: dict[str, Any] = {}
        if local_address:
            options["local_addr"] = (local_address, 0)
        if isinstance(loop, asyncio.BaseEventLoop) and not _is_address(host):
            # asyncio's own loop tries a name's addresses staggered (an address has one: the
            # race's task and timer would cost a connection 0.1 ms for nothing); uvloop tries
            # them one after another
            options["happy_eyeballs_delay"] = _HAPPY_EYEBALLS_DELAY
        return await self._connect(
            loop.create_connection(_Connection, host, port, **options), timeout, socket_options
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109
        socket_options: Iterable[Any] | None = None,
    ) -> AsyncioStream:
        loop = asyncio.get_running_loop()
        return await self._connect(
            loop.create_unix_connection(_Connection, path), timeout, socket_options
        )

    async def _connect(
        self,
        connecting: Any,
        timeout: float | None,  # noqa: ASYNC109 - the library's argument, passed on
        socket_options: Iterable[Any] | None,
    ) -> AsyncioStream:
        errors = self._errors
        try:
            async with asyncio.timeout(timeout):
                transport, conn = await connecting
        except TimeoutError as exc:
            raise errors.ConnectTimeout("the connection timed out") from exc
        except OSError as exc:
            raise errors.ConnectError(str(exc) or type(exc).__name__) from exc
        try:
            sock = transport.get_extra_info("socket")
            for option in socket_options or ():
                sock.setsockopt(*option)
        except OSError as exc:
            transport.abort()
            raise errors.ConnectError(str(exc)) from exc
        return AsyncioStream(conn, errors)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _socket_readable(fd: int) -> bool:
    """Whether a read of ``fd`` would return at once (data, its end, or an error)."""
    if fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _is_address(host: str) -> bool:
    """Whether ``host`` is an IPv4 or IPv6 address rather than a name."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except (OSError, ValueError):
            continue
        return True
    return False


def for_library(backend: Any) -> AsyncioBackend | None:
    """An ``AsyncioBackend`` in place of ``backend``, a library's default one; else ``None``.

    Only the default (``AutoBackend``, which picks ``anyio`` or ``trio`` at its first use) is
    replaced: a backend someone chose, or a library this module does not know, is kept. The
    clients it goes into are the models' own, used on asyncio event loops only.
    """
    kind = type(backend)
    module = kind.__module__
    library, _, rest = module.partition(".")
    if kind.__name__ != "AutoBackend" or rest != "_backends.auto":
        return None
    errors = sys.modules.get(library)
    names = ("ConnectError", "ConnectTimeout", "ReadError", "ReadTimeout", "WriteError")
    if errors is None or not all(hasattr(errors, name) for name in (*names, "WriteTimeout")):
        return None
    return AsyncioBackend(errors)
