"""What ``OpenAIChatModel`` needs at its first request, imported ahead in a process pool's launcher.

``httpx`` imports its transport stack (``httpcore``, ``h11``, ``anyio``) and loads the CA bundle
only when the first client is built. A child agent doing that itself spends about 170 ms and
7 MiB of memory of its own; done once in the launcher before it forks, every child shares it.
``OpenAIChatModel.child_preload`` names this module, so the subagent extensions preload it
whenever a child will run on ``OpenAIChatModel``.
"""

from __future__ import annotations

import ssl

import anyio._backends._asyncio
import anyio.streams.tls
import anyio.to_thread  # noqa: F401
import certifi  # noqa: F401
import h11  # noqa: F401
import httpcore
import httpcore._async
import httpcore._backends.anyio  # noqa: F401
import httpx

__all__ = ["default_ssl_context"]

_context: ssl.SSLContext | None = None


def default_ssl_context() -> ssl.SSLContext:
    """The process's one verifying SSL context (CA bundle loaded once, tens of ms).

    Shared by every ``OpenAIChatModel`` of the process; built here at import when this module
    is preloaded (a launcher), else on first use.
    """
    global _context
    if _context is None:
        _context = httpx.create_ssl_context()
    return _context


default_ssl_context()
