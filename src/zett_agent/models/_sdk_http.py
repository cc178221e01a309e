"""The HTTP client of an SDK: the process's TLS context, timeouts, the budget, the key per call.

An adapter builds one SDK client per event loop and configuration (``_sdk_clients``) on an HTTP
client of the SDK's own HTTP library (``DefaultAsyncHttpxClient``, so the adapter names no HTTP
library itself), and sends each call through it with ``post_stream``. What each client is given:

- ``verify``: the process's one verifying TLS context (``tls_context``), built once: the CA
  bundle of ``$SSL_CERT_FILE`` if set, else ``$SSL_CERT_DIR`` if set, else certifi's;
- ``timeout``: seconds allowed to connect (TCP, a proxy tunnel, TLS), to write, and for each
  read (the whole call has the adapter's deadline besides);
- no redirects followed, ``Accept-Encoding: identity`` (a compressed body is refused: see
  ``_budget``), proxies from the environment (``$HTTPS_PROXY``, ``$NO_PROXY``...) as the HTTP
  library reads them when the client is built;
- no bound on connections open at once, ``KEEP_ALIVE`` idle ones kept for the next calls;
- the response hook of ``_budget.guard``, and a request hook that removes the headers holding
  the placeholder key the client was built with (``NO_KEY``: an SDK refuses to be built without
  one). A call with a key puts it in those headers itself (``key_headers``), read at every call;
  a call without one sends no credential header (a local server needs none).

``post_stream`` sends the JSON body the adapter built as it is, and hands back the SDK's stream of
server-sent events as plain JSON values: the SDK builds the request (headers, URL, timeout),
sends it, decodes SSE, and turns an HTTP error or an error event into its typed exception; it
neither transforms the request nor builds a typed object per event (which cost the parent more
than the rest of a call together).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from zett_agent._tracing._base import PROVIDER, SERVER_ADDRESS, SERVER_PORT
from zett_agent.models._budget import guard
from zett_agent.models._paced_reads import pace_reads

__all__ = [
    "KEEP_ALIVE",
    "NO_KEY",
    "PROXY_VARIABLES",
    "KeyedClient",
    "check_key",
    "client_ready",
    "close_quietly",
    "http_client",
    "key_headers",
    "key_places",
    "post_stream",
    "sdk_client",
    "server_attributes",
    "tls_context",
]

#: the key an SDK client is built with: each request puts the call's key in its place
#: (``key_headers``), or, for a call without one, the client's request hook removes its headers
NO_KEY = "zett-agent-no-key"
#: the environment variables the SDKs' HTTP library reads its proxies from (a client is built
#: again when one changes)
PROXY_VARIABLES = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
)
#: idle connections a client keeps for later calls (each an open socket)
KEEP_ALIVE = 32

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


async def client_ready(factory: Callable[..., Any]) -> None:
    """Build the TLS context and a first HTTP client of ``factory`` off the event loop, once.

    Loading a CA bundle takes tens of milliseconds, and the first client of an SDK's HTTP library
    imports its transport (its connection pool, and what that imports) for as long again, more
    on a busy machine: a brokering parent's first call must not stall its loop for either. Done in
    a thread the first time per ``factory``; the client built there is dropped. Raises what
    ``tls_context`` raises.
    """
    if _context is None or factory not in _ready:
        await asyncio.to_thread(_make_ready, factory)


def _make_ready(factory: Callable[..., Any]) -> None:
    http_client(factory, timeout=1.0, json_as_event=False)  # for what its building imports
    _ready.add(factory)


#: the HTTP client factories whose first client was built (``client_ready``)
_ready: set[Callable[..., Any]] = set()


def http_client(factory: Callable[..., Any], *, timeout: float, json_as_event: bool) -> Any:
    """A new HTTP client from the SDK's ``factory`` (its ``DefaultAsyncHttpxClient``).

    No bound on the connections open at once (a brokering parent makes as many calls at once
    as its children do; each call has its deadline), at most ``KEEP_ALIVE`` idle ones kept for
    the next calls. Raises ``OSError`` when the TLS context cannot be built.
    """

    async def drop_placeholder(request: Any) -> None:
        for name, value in list(request.headers.items()):
            if NO_KEY in value:
                del request.headers[name]

    library = _library(factory)
    client = factory(
        verify=tls_context(),
        timeout=timeout,
        follow_redirects=False,
        headers={"Accept-Encoding": "identity"},
        limits=library.Limits(max_connections=None, max_keepalive_connections=KEEP_ALIVE),
        event_hooks={
            "request": [drop_placeholder],
            "response": [guard(json_as_event=json_as_event)],
        },
    )
    pace_reads(client)
    return client


def sdk_client(
    client_class: Callable[..., Any],
    http_factory: Callable[..., Any],
    *,
    base_url: str,
    timeout: float,
    json_as_event: bool,
    **options: Any,
) -> Any:
    """A new SDK client of ``client_class`` on an ``http_client`` of ``http_factory``.

    Built with ``NO_KEY`` and without retries of its own (one retry policy: the runtime's,
    ``RetryOptions``); ``options`` are passed on (``auth_token=None``...). Raises ``OSError``
    when the TLS context cannot be built.
    """
    return client_class(
        api_key=NO_KEY,
        base_url=base_url,
        timeout=timeout,
        max_retries=0,
        http_client=http_client(http_factory, timeout=timeout, json_as_event=json_as_event),
        **options,
    )


def _library(factory: Callable[..., Any]) -> Any:
    """The HTTP library the SDK's client class ``factory`` is built on (its ``Limits``)."""
    for base in getattr(factory, "__mro__", ()):
        module = sys.modules.get(base.__module__.partition(".")[0])
        if module is not None and hasattr(module, "Limits") and hasattr(module, "AsyncClient"):
            return module
    raise TypeError(f"{factory!r} is not a client class of an HTTP library with Limits")


@dataclass(frozen=True, slots=True)
class KeyedClient:
    """An SDK client built with ``NO_KEY``, and where it puts the key (``key_places``)."""

    sdk: Any
    places: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, sdk_client: Any) -> KeyedClient:
        """``sdk_client`` and its ``key_places``."""
        return cls(sdk_client, key_places(sdk_client))

    async def close(self) -> None:
        """Close the SDK client and its connections."""
        await self.sdk.close()


def key_places(client: Any) -> tuple[tuple[str, str], ...]:
    """Where ``client`` (built with ``NO_KEY``) puts its key: each header and its value.

    ``Authorization``, ``X-Api-Key``: by SDK and version. Read once per client.
    """
    sent = {**client.default_headers, **client.auth_headers}
    return tuple(
        (name, value) for name, value in sent.items() if isinstance(value, str) and NO_KEY in value
    )


def key_headers(places: tuple[tuple[str, str], ...], key: str | None) -> dict[str, str]:
    """The headers that carry ``key`` in one request, from its client's ``key_places``.

    None for a call without a key: the client's request hook then removes the placeholder.
    """
    if not key:
        return {}
    return {name: value.replace(NO_KEY, key) for name, value in places}


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


async def post_stream(
    sdk: Any, client: Any, path: str, body: dict[str, Any], headers: dict[str, str]
) -> Any:
    """POST ``body`` to ``path`` with the SDK's ``client``; the stream of its events (JSON values).

    Raises what the SDK raises (its typed errors).
    """
    return await client.post(
        path,
        body=body,
        cast_to=object,
        stream=True,
        stream_cls=sdk.AsyncStream[object],
        options={"headers": headers},
    )


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
