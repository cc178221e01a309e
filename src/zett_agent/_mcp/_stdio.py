"""Serving one client on stdin and stdout: bounded lines, every bad line answered.

The wire is the SDK's (one JSON-RPC message per line, UTF-8), read and written here rather
than by the SDK's ``stdio_server`` for two reasons: a line is read within ``MAX_MESSAGE_BYTES``
(a longer one is skipped to its end, never held whole), and a line that is not a message is
answered: JSON-RPC's parse error (-32700, id null) for what is not JSON, invalid request
(-32600) for JSON that is not a JSON-RPC message, where the SDK's transport drops both in
silence.

While serving, fd 0 reads ``/dev/null`` and fd 1 writes to stderr (the wire moved to private
descriptors), as the SDK's transport does, so children, which inherit both, can neither read
the client's requests nor write into its answers.

One stdio connection is one client and one extension session. Nothing outlives it: when the
client goes away (its end of stdin closes: it exited, crashed or was killed) the extension is
closed, which kills every child's process tree, before the server exits; a SIGTERM, SIGINT or
SIGHUP does the same, then the server dies of that signal. (SIGKILL of the server itself is the
process engine's case: its launcher kills every tree when its host dies.)
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import queue
import signal
import threading
from collections.abc import AsyncIterator
from typing import IO, TYPE_CHECKING, Any

import anyio
from mcp import types
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError
from pydantic import ValidationError

from zett_agent._mcp._client import McpClient
from zett_agent._mcp._server import build_server, child_tools_of
from zett_agent.extensions._subagent import warm_up

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp.server import ServerRequestContext

    from zett_agent._mcp._watch import Bells
    from zett_agent.extensions._async_subagent import AsyncSubAgentExtension

__all__ = ["MAX_MESSAGE_BYTES", "SESSION_ID", "STOP_SIGNALS", "serve_stdio"]

log = logging.getLogger(__name__)

#: the extension session of the (one) client of a stdio server
SESSION_ID = "mcp"

#: the longest message read, as the HTTP transport's longest body (4 MiB)
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

#: the signals that close the server (and every child) before it dies of them
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

#: seconds the last answers may take to leave once the client stopped sending
WRITE_GRACE = 5.0


class _TooLong:
    """What ``_read_line`` returns for a line longer than ``MAX_MESSAGE_BYTES`` (skipped)."""


_TOO_LONG = _TooLong()


class _OneClient:
    """The clients of a stdio server: the one at the other end of the pipes."""

    def __init__(self, client: McpClient) -> None:
        self.client = client

    def client_of(self, ctx: ServerRequestContext[Any, Any]) -> McpClient:
        return self.client


async def serve_stdio(extension: AsyncSubAgentExtension, bells: Bells, *, max_ttl_ms: int) -> None:
    """Serve one client on stdin and stdout until it goes away, then close ``extension``.

    On SIGTERM, SIGINT or SIGHUP: the extension is closed (every child's tree killed), then
    the process dies of that signal. A blocked read of stdin cannot be interrupted, so the
    server does not wait for it.
    """
    loop = asyncio.get_running_loop()
    client = McpClient(
        extension, bells, child_tools_of(extension), SESSION_ID, max_ttl_ms=max_ttl_ms
    )
    server = build_server(extension, _OneClient(client))
    stopping: list[asyncio.Task[None]] = []  # the one task that closes and dies, once started

    def stop(signum: signal.Signals) -> None:
        if not stopping:
            stopping.append(loop.create_task(_die_of(signum, client, extension)))

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop, signum)
    try:
        async with stdio_wire() as (read_stream, write_stream):
            # Boot the process pool now, with fds 0 and 1 moved away: the first child then
            # finds it ready.
            warm_up(extension, None)
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await client.leave(keep_tasks=False)
        await extension.close()
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)


async def _die_of(
    signum: signal.Signals, client: McpClient, extension: AsyncSubAgentExtension
) -> None:
    try:
        await client.leave(keep_tasks=False)
        await extension.close()
    finally:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


@contextlib.asynccontextmanager
async def stdio_wire() -> AsyncIterator[
    tuple[
        MemoryObjectReceiveStream[SessionMessage | Exception],
        MemoryObjectSendStream[SessionMessage],
    ]
]:
    """The client's messages in, the server's out, over the process's stdin and stdout.

    The streams end when stdin does (the client went away) or stdout breaks.
    """
    in_fd = _claim(0, os.open(os.devnull, os.O_RDONLY))
    out_fd = _claim(1, os.dup(2))
    # closefd=False: a reader thread may still block on in_fd after this returns, so it is
    # never closed (and reused) under it; the process ends soon after anyway
    reader = os.fdopen(in_fd, "rb", closefd=False)
    writer = os.fdopen(out_fd, "wb", closefd=False)
    incoming_send, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outgoing, outgoing_receive = anyio.create_memory_object_stream[SessionMessage](0)
    reading = anyio.CancelScope()  # a read waiting for its thread is abandoned
    written = anyio.Event()

    async def read() -> None:
        with reading:
            await _read(reader, incoming_send, outgoing.clone())

    async def write() -> None:
        try:
            await _write(writer, outgoing_receive)
        finally:
            written.set()

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(read)
            group.start_soon(write)
            try:
                yield incoming, outgoing
            finally:
                reading.cancel()
                await outgoing.aclose()
                with anyio.move_on_after(WRITE_GRACE, shield=True):
                    await written.wait()  # the last answers leave
                group.cancel_scope.cancel()
    finally:
        _restore(0, in_fd)
        _restore(1, out_fd)


def _claim(fd: int, diversion: int) -> int:
    """Move ``fd``'s file to a private descriptor (returned); ``fd`` gets ``diversion``."""
    private = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.dup2(diversion, fd)
    os.close(diversion)
    return private


def _restore(fd: int, private: int) -> None:
    with contextlib.suppress(OSError):
        os.dup2(private, fd)


def _read_line(reader: IO[bytes]) -> bytes | _TooLong | None:
    """One line of at most ``MAX_MESSAGE_BYTES`` bytes, or ``None`` at end of file.

    A longer line is read to its end, a bounded piece at a time, and dropped: ``_TOO_LONG``.
    """
    line = reader.readline(MAX_MESSAGE_BYTES + 1)
    if not line:
        return None
    if len(line) <= MAX_MESSAGE_BYTES or line.endswith(b"\n"):
        return line
    while True:  # skip the rest of the line, a bounded piece at a time
        piece = reader.readline(65536)
        if not piece or piece.endswith(b"\n"):
            return _TOO_LONG


class _LinePump:
    """stdin's lines, read by a daemon thread one at a time, ahead by one line at most.

    A daemon thread, not a worker of the event loop's pool: a read blocked on a client that
    keeps stdin open but sends nothing must never keep the process from exiting.
    """

    def __init__(self, reader: IO[bytes]) -> None:
        self._loop = asyncio.get_running_loop()
        self._lines: asyncio.Queue[bytes | _TooLong | None] = asyncio.Queue()
        self._taken = threading.Semaphore(0)
        self._reader = reader
        threading.Thread(target=self._pump, name="zett-agent mcp stdin", daemon=True).start()

    async def next(self) -> bytes | _TooLong | None:
        """The next line (``None`` at end of file)."""
        line = await self._lines.get()
        self._taken.release()
        return line

    def _pump(self) -> None:
        while True:
            try:
                line = _read_line(self._reader)
            except (OSError, ValueError):
                line = None  # stdin broke: as if it ended
            try:
                self._loop.call_soon_threadsafe(self._lines.put_nowait, line)
            except RuntimeError:
                return  # the loop is closed: nobody reads any more
            if line is None:
                return
            self._taken.acquire()  # the line was taken: read the next one


async def _read(
    reader: IO[bytes],
    incoming: MemoryObjectSendStream[SessionMessage | Exception],
    outgoing: MemoryObjectSendStream[SessionMessage],
) -> None:
    lines = _LinePump(reader)
    async with incoming, outgoing:
        while True:
            line = await lines.next()
            if line is None:
                return
            if isinstance(line, _TooLong):
                await _answer_bad_line(
                    outgoing,
                    INVALID_REQUEST,
                    f"Invalid Request: a message of more than {MAX_MESSAGE_BYTES} bytes; it was "
                    "skipped unread (send large inputs in smaller pieces, or as files)",
                    None,
                )
                continue
            if not line.strip():
                continue
            try:
                message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            except ValidationError as exc:
                code, text, request_id = _why_not_a_message(line, exc)
                await _answer_bad_line(outgoing, code, text, request_id)
                continue
            await incoming.send(SessionMessage(message))


def _why_not_a_message(line: bytes, error: ValidationError) -> tuple[int, str, str | int | None]:
    """The error code and message for a line that is not a JSON-RPC message, and its id."""
    try:
        value = json.loads(line)
    except ValueError:
        first = error.errors()[0]["msg"] if error.errors() else "not JSON"
        return PARSE_ERROR, f"Parse error: {first}", None
    if isinstance(value, list):
        return INVALID_REQUEST, "Invalid Request: batches are not supported; send one message", None
    request_id = value.get("id") if isinstance(value, dict) else None
    if not isinstance(request_id, str | int) or isinstance(request_id, bool):
        request_id = None
    return (
        INVALID_REQUEST,
        'Invalid Request: not a JSON-RPC 2.0 message (an object with "jsonrpc": "2.0", a '
        '"method" and, for a request, an "id")',
        request_id,
    )


async def _answer_bad_line(
    outgoing: MemoryObjectSendStream[SessionMessage],
    code: int,
    message: str,
    request_id: str | int | None,
) -> None:
    error = JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=code, message=message))
    await outgoing.send(SessionMessage(error))


async def _write(writer: IO[bytes], outgoing: MemoryObjectReceiveStream[SessionMessage]) -> None:
    """Write every message until the senders are done; after a broken pipe, drop them."""
    pump = _WritePump(writer)
    broken = False
    try:
        async with outgoing:
            async for message in outgoing:
                if broken:
                    continue  # the client went away: nobody reads what is still answered
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                try:
                    await pump.write(data.encode())
                except OSError:  # a broken pipe, a reset: the client's end is closed
                    log.debug("the client went away", exc_info=True)
                    broken = True
    finally:
        pump.close()


class _WritePump:
    """Writes to stdout in a daemon thread, one message at a time, each awaited.

    A daemon thread, for the reason ``_LinePump`` is one: a write blocked on a client that
    reads nothing must never keep the process from exiting.
    """

    def __init__(self, writer: IO[bytes]) -> None:
        self._loop = asyncio.get_running_loop()
        self._writer = writer
        self._work: queue.SimpleQueue[tuple[bytes, asyncio.Future[None]] | None] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._pump, name="zett-agent mcp stdout", daemon=True).start()

    async def write(self, data: bytes) -> None:
        """Write ``data`` whole; raises the ``OSError`` the write met."""
        done: asyncio.Future[None] = self._loop.create_future()
        self._work.put((data, done))
        await done

    def close(self) -> None:
        self._work.put(None)

    def _pump(self) -> None:
        while (item := self._work.get()) is not None:
            data, done = item
            error: OSError | None = None
            try:
                self._writer.write(data)
                self._writer.flush()
            except OSError as exc:
                error = exc
            try:
                self._loop.call_soon_threadsafe(_settle, done, error)
            except RuntimeError:
                return  # the loop is closed


def _settle(done: asyncio.Future[None], error: OSError | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
