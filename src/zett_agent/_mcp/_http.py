"""Serving Streamable HTTP: the listening socket, uvicorn, and stopping with every child dead.

``zett-agent mcp MODULE:ATTR --http 127.0.0.1:PORT`` serves many clients at once, each in a
session of its own (``_http_sessions``), behind the token, Origin and Host checks
(``_http_guard``). uvicorn (which the ``mcp`` SDK itself requires) runs in this event loop on a
socket bound before anything else starts, so a busy port is an error on the command line.

On SIGTERM, SIGINT or SIGHUP: the extension is closed first (every child's tree killed), then
uvicorn stops (every connection closed, the sessions ended), then the process dies of that
signal. uvicorn's own signal handling is off, so no signal is taken before the children are
dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable, Generator, Iterable
from typing import TYPE_CHECKING

import uvicorn

from zett_agent._mcp._http_guard import MCP_PATH, HttpGuard
from zett_agent._mcp._http_sessions import DEFAULT_IDLE_TIMEOUT, HttpSessions
from zett_agent.extensions._subagent import warm_up

if TYPE_CHECKING:
    from zett_agent._mcp._watch import Bells
    from zett_agent.extensions._async_subagent import AsyncSubAgentExtension

__all__ = ["STOP_SIGNALS", "listen", "serve_http", "url_of"]

log = logging.getLogger(__name__)

#: the signals that close the server (and every child) before it dies of them
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

#: seconds uvicorn waits for open responses once the server stops (SSE streams end sooner:
#: their sessions are ended)
GRACEFUL_SECONDS = 2


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (port 0: a free one).

    Raises:
        OSError: the address cannot be bound (in use, not this machine's, no permission).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket) -> str:
    """The URL of the MCP endpoint a client connects to on ``sock``."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{MCP_PATH}"


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: the server's own close the children first."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve_http(
    extension: AsyncSubAgentExtension,
    bells: Bells,
    sock: socket.socket,
    *,
    token: str,
    max_ttl_ms: int,
    origins: Iterable[str] = (),
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    ready: Callable[[], None] = lambda: None,
) -> None:
    """Serve on ``sock`` until a stop signal; then close ``extension`` and die of the signal.

    ``ready`` is called once clients may connect.
    """
    loop = asyncio.get_running_loop()
    host, port = sock.getsockname()[:2]
    sessions = HttpSessions(extension, bells, max_ttl_ms=max_ttl_ms, idle_timeout=idle_timeout)
    app = HttpGuard(sessions, token=token, host=host, port=port, origins=origins)
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SECONDS,
    )
    server = _Uvicorn(config)
    stopping: list[asyncio.Task[None]] = []
    caught: list[signal.Signals] = []

    async def stop(signum: signal.Signals) -> None:
        caught.append(signum)
        try:
            await extension.close()  # every child's tree dead before anything else
        finally:
            server.should_exit = True

    def on_signal(signum: signal.Signals) -> None:
        if not stopping:
            stopping.append(loop.create_task(stop(signum)))

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        async with sessions.run():
            warm_up(extension, None)
            # the socket listens already: a client that connects now waits in its backlog
            # until uvicorn accepts it
            ready()
            await server.serve(sockets=[sock])
    finally:
        for task in stopping:
            await task
        await extension.close()
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
        sock.close()
    if caught:
        signal.signal(caught[0], signal.SIG_DFL)
        os.kill(os.getpid(), caught[0])
