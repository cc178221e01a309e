"""The HTTP client of one SDK call: the process's TLS context, timeouts, and the response budget.

Each ``stream()`` of an adapter builds its SDK client on a fresh HTTP client of the SDK's own
HTTP library (``DefaultAsyncHttpxClient``, so the adapter names no HTTP library itself), and
closes both when the call ends: nothing outlives a call or is bound to an event loop, so a model
object is plain configuration that pickles and runs in any loop. What each client is given:

- ``verify``: the process's one verifying TLS context (``tls_context``), built once: the CA
  bundle of ``$SSL_CERT_FILE`` if set, else ``$SSL_CERT_DIR`` if set, else certifi's;
- ``timeout``: seconds allowed to connect (TCP, a proxy tunnel, TLS), to write, and for each
  read (the whole call has the adapter's deadline besides);
- no redirects followed, ``Accept-Encoding: identity`` (a compressed body is refused: see
  ``_budget``), proxies from the environment (``$HTTPS_PROXY``, ``$NO_PROXY``...) as the HTTP
  library reads them;
- the response hook of ``_budget.guard``, and, for a call without a key, a request hook that
  removes the placeholder key the SDK was given (an SDK refuses to be built without one; a local
  server needs none, and gets no credential header).
"""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from zett_agent._tracing._base import PROVIDER, SERVER_ADDRESS, SERVER_PORT
from zett_agent.models._budget import guard

__all__ = [
    "NO_KEY",
    "check_key",
    "close_quietly",
    "http_client",
    "server_attributes",
    "tls_context",
]

#: what an SDK is given for a call without a key; its header is removed before it is sent
NO_KEY = "zett-agent-no-key"

_context: ssl.SSLContext | None = None


def tls_context() -> ssl.SSLContext:
    """The process's one verifying TLS context, built on first use (tens of milliseconds).

    The CA bundle is ``$SSL_CERT_FILE`` if set, else ``$SSL_CERT_DIR`` if set, else certifi's;
    the variables are read once, when the context is built (in a process pool's launcher when an
    adapter's preload module runs there, so direct children share it). Raises ``OSError`` naming
    the bundle when it cannot be loaded.
    """
    global _context
    if _context is None:
        if cafile := os.environ.get("SSL_CERT_FILE"):
            where, capath = f"$SSL_CERT_FILE ({cafile})", None
        elif capath := os.environ.get("SSL_CERT_DIR"):
            where, cafile = f"$SSL_CERT_DIR ({capath})", None
        else:
            import certifi

            cafile, capath = certifi.where(), None
            where = f"certifi's CA bundle ({cafile})"
        try:
            context = ssl.create_default_context(cafile=cafile, capath=capath)
        except OSError as exc:  # ssl.SSLError too
            raise OSError(f"{where} could not be loaded: {exc}") from exc
        _context = context
    return _context


def http_client(
    factory: Callable[..., Any],
    *,
    timeout: float,
    json_as_event: bool,
    key_headers: Sequence[str] = (),
) -> Any:
    """A new HTTP client from the SDK's ``factory`` (its ``DefaultAsyncHttpxClient``).

    ``key_headers``: headers to remove from every request (where the SDK puts the placeholder
    key of a call without one). Raises ``OSError`` when the TLS context cannot be built.
    """
    hooks: dict[str, list[Any]] = {"response": [guard(json_as_event=json_as_event)]}
    if key_headers:
        names = tuple(key_headers)

        async def drop_key(request: Any) -> None:
            for name in names:
                request.headers.pop(name, None)

        hooks["request"] = [drop_key]
    return factory(
        verify=tls_context(),
        timeout=timeout,
        follow_redirects=False,
        headers={"Accept-Encoding": "identity"},
        event_hooks=hooks,
    )


def server_attributes(base_url: str, provider: str) -> dict[str, str | int]:
    """``gen_ai.provider.name``, ``server.address`` and ``server.port`` of ``base_url``."""
    url = urlsplit(base_url)
    attributes: dict[str, str | int] = {PROVIDER: provider}
    if url.hostname:
        attributes[SERVER_ADDRESS] = url.hostname
    try:
        port = url.port
    except ValueError:  # not a port number: the request names the problem
        port = None
    attributes[SERVER_PORT] = port or (443 if url.scheme == "https" else 80)
    return attributes


async def close_quietly(*closeables: Any) -> None:
    """Close each (an SDK stream, then its client), whatever state it is in."""
    for closeable in closeables:
        if closeable is not None:
            with contextlib.suppress(Exception):  # a broken connection: nothing more is owed
                await closeable.close()


def check_key(key: str, where: str) -> None:
    """Refuse a key a header cannot carry (a line break, a control byte, non-ASCII).

    Raises ``ValueError`` naming ``where`` (the argument or variable) and never the key.
    """
    if not key.isascii() or not key.isprintable():
        raise ValueError(
            f"the API key in {where} holds a line break, a control character or a non-ASCII "
            "character, which no header can carry: check how it was set"
        )
