"""The HTTP server's clients: one MCP session each, on the SDK's Streamable HTTP transport.

A session opens with an ``initialize`` request that carries no ``Mcp-Session-Id``: it gets an
unguessable id (256 random bits), its own transport (``StreamableHTTPServerTransport``, the
SDK's), its own message loop (``serve_loop``) and its own ``McpClient``, hence its own session
in the extension: its tasks are its own. Every later request names the session in its
``Mcp-Session-Id`` header; an unknown one is answered 404, as the transport spec says.

A session ends when its client ends it (``DELETE``), when no request of it was in flight for
``idle_timeout`` seconds, or when the server stops. Its client then leaves: every child its
MCP tasks do not run is killed at once (nobody can read it any more); the children of its MCP
tasks run on until each task's lifetime ends, then they are killed too, and the client's
extension session is released.

Why not the SDK's ``StreamableHTTPSessionManager``: it tells no one when a session ends, and
a client's children must be stopped then. This module is its stateful half, on the same public
parts. The 2026-07-28 revision has no sessions (each request stands alone), so it cannot carry
a client's tasks: a request of that revision (its ``MCP-Protocol-Version`` header) is answered
with -32022 naming the revisions served, and the SDK's client then falls back to them.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from mcp import MCPError
from mcp.server.runner import serve_loop
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp_types import INVALID_REQUEST, UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from zett_agent._mcp._client import McpClient
from zett_agent._mcp._server import build_server, child_tools_of

if TYPE_CHECKING:
    from anyio.abc import TaskGroup, TaskStatus
    from mcp.server import ServerRequestContext
    from starlette.types import Message, Receive, Scope, Send

    from zett_agent._mcp._watch import Bells
    from zett_agent.extensions._async_subagent import AsyncSubAgentExtension

__all__ = ["DEFAULT_IDLE_TIMEOUT", "MAX_BODY_BYTES", "MAX_SESSIONS", "HttpSessions"]

log = logging.getLogger(__name__)

#: seconds a session may go without a request in flight before it ends (30 minutes)
DEFAULT_IDLE_TIMEOUT = 30 * 60.0
#: sessions open at once; one more is refused (503) until one ends
MAX_SESSIONS = 1000
#: the largest request body read (413 beyond)
MAX_BODY_BYTES = 4 * 1024 * 1024

_SESSION_HEADER = b"mcp-session-id"
_VERSION_HEADER = b"mcp-protocol-version"


@dataclass(eq=False)
class _Session:
    session_id: str
    transport: StreamableHTTPServerTransport
    client: McpClient


class HttpSessions:
    """The MCP app of an HTTP server: its sessions, each a client of its own.

    Use ``async with sessions.run():`` around serving; leaving it ends every session (the
    caller closes the extension, which kills every child).

    Args:
        extension: The extension every child runs in.
        bells: Rung as children report.
        max_ttl_ms: The longest lifetime an MCP task gets.
        idle_timeout: Seconds without a request in flight after which a session ends.
        max_sessions: Sessions open at once.
    """

    def __init__(
        self,
        extension: AsyncSubAgentExtension,
        bells: Bells,
        *,
        max_ttl_ms: int,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self._extension = extension
        self._bells = bells
        self._max_ttl_ms = max_ttl_ms
        self._idle_timeout = idle_timeout
        self._max_sessions = max_sessions
        self._child_tools = child_tools_of(extension)
        self._server = build_server(extension, self)
        self._sessions: dict[str, _Session] = {}
        self._numbers = itertools.count(1)
        self._group: TaskGroup | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Serve sessions inside this block; every one ends when it is left."""
        async with anyio.create_task_group() as group:
            self._group = group
            try:
                yield
            finally:
                self._group = None
                for session in list(self._sessions.values()):
                    with anyio.CancelScope(shield=True):
                        await session.transport.terminate()
                group.cancel_scope.cancel()

    def client_of(self, ctx: ServerRequestContext[Any, Any]) -> McpClient:
        """The client of the session the request of ``ctx`` names."""
        request = ctx.request
        session_id = request.headers.get("mcp-session-id") if request is not None else None
        session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise MCPError(code=INVALID_REQUEST, message="Session not found")
        return session.client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        replay = await _read_body(scope, receive, send)
        if replay is not None:
            await self._handle(scope, replay, send)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        version = headers.get(_VERSION_HEADER)
        if version is not None and version.decode("latin-1") not in HANDSHAKE_PROTOCOL_VERSIONS:
            await _error(
                send,
                400,
                UNSUPPORTED_PROTOCOL_VERSION,
                f"protocol {version.decode('latin-1')[:40]!r} is not served over HTTP: it has "
                "no sessions to keep a client's tasks in; initialize with one of "
                f"{', '.join(HANDSHAKE_PROTOCOL_VERSIONS)}",
                {
                    "supported": list(HANDSHAKE_PROTOCOL_VERSIONS),
                    "requested": version.decode("latin-1")[:40],
                },
            )
            return
        raw_id = headers.get(_SESSION_HEADER)
        if raw_id is not None:
            session = self._sessions.get(raw_id.decode("latin-1"))
            if session is None:
                await _error(
                    send,
                    404,
                    INVALID_REQUEST,
                    "Session not found: it ended (or never was); initialize a new one",
                )
                return
            await session.transport.handle_request(scope, receive, send)
            if session.transport.is_terminated:
                self._sessions.pop(session.session_id, None)  # DELETE: forget it now
            return
        if len(self._sessions) >= self._max_sessions:
            await _error(
                send,
                503,
                INVALID_REQUEST,
                f"Too many open sessions ({self._max_sessions}); end one (DELETE) or retry later",
            )
            return
        await self._open(scope, receive, send)

    async def _open(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request without a session: it opens one if it is an ``initialize`` that succeeds."""
        group = self._group
        if group is None:
            await _error(send, 503, INVALID_REQUEST, "the server is stopping")
            return
        session_id = secrets.token_urlsafe(32)
        session = _Session(
            session_id,
            StreamableHTTPServerTransport(session_id, idle_timeout=self._idle_timeout),
            McpClient(
                self._extension,
                self._bells,
                self._child_tools,
                f"http-{next(self._numbers)}",
                max_ttl_ms=self._max_ttl_ms,
            ),
        )
        self._sessions[session_id] = session
        established = False
        try:
            await group.start(self._serve, session)
            status = await _status_of(session.transport.handle_request, scope, receive, send)
            established = status is not None and status < 400
        finally:
            if not established:
                self._sessions.pop(session_id, None)
                with anyio.CancelScope(shield=True):
                    await session.transport.terminate()

    async def _serve(self, session: _Session, *, task_status: TaskStatus[None]) -> None:
        """One session's message loop; when it ends, its client leaves."""
        transport = session.transport
        try:
            async with transport.connect() as (read_stream, write_stream):
                task_status.started()
                idle = transport.idle_scope or anyio.CancelScope()
                with idle:
                    await serve_loop(
                        self._server,
                        read_stream,
                        write_stream,
                        lifespan_state={},
                        session_id=session.session_id,
                    )
        except Exception:
            log.exception("HTTP session %s failed", session.client.session_id)
        finally:
            self._sessions.pop(session.session_id, None)
            with anyio.CancelScope(shield=True):
                if not transport.is_terminated:
                    await transport.terminate()
            group = self._group
            if group is not None:
                group.start_soon(functools.partial(session.client.leave, keep_tasks=True))
            else:
                with anyio.CancelScope(shield=True):
                    await session.client.leave(keep_tasks=False)


async def _read_body(scope: Scope, receive: Receive, send: Send) -> Receive | None:
    """Read the request's body within ``MAX_BODY_BYTES``; a ``receive`` that replays it.

    ``None`` once a larger body was refused (413), by its declared length or as it came.
    """
    refusal = (
        f"Request body too large: more than {MAX_BODY_BYTES} bytes; send large inputs in "
        "smaller pieces"
    )
    declared = dict(scope["headers"]).get(b"content-length", b"0")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        await _error(send, 413, INVALID_REQUEST, refusal)
        return None
    chunks: list[bytes] = []
    size = 0
    later: list[Message] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            later.append(message)  # the client went away
            break
        body = message.get("body", b"")
        size += len(body)
        if size > MAX_BODY_BYTES:
            await _error(send, 413, INVALID_REQUEST, refusal)
            return None
        chunks.append(body)
        if not message.get("more_body", False):
            break
    queue: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
    queue.extend(later)

    async def replay() -> Message:
        return queue.pop(0) if queue else await receive()

    return replay


async def _status_of(app: Any, scope: Scope, receive: Receive, send: Send) -> int | None:
    """Run ``app`` for one request and return the HTTP status it answered with."""
    status: int | None = None

    async def watch(message: Any) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    await app(scope, receive, watch)
    return status


async def _error(
    send: Send, status: int, code: int, message: str, data: dict[str, Any] | None = None
) -> None:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
