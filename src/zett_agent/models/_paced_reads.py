"""Each read of a model call's connection takes its turn (``_pacing``) as soon as it returns.

The turns of ``_pacing`` bound what the parent does per event-loop iteration for the calls that
ask for one, but a call asks only once its HTTP library has done its own part of a read: a
thousand responses streaming at once wake a thousand calls, and each woken call parsed HTTP
(about 60 microseconds of the parent's CPU) before it reached a turn. When the endpoint wrote to
many connections together, one loop iteration ran thirty to fifty such wakeups (two to three
milliseconds) before the parent's timers could run.

So the network streams of an SDK client's HTTP library are wrapped: a read that returns data
waits for the loop's current turn before it hands the data up. A call woken by its socket does
a few microseconds of work before it waits, and the parsing, the budget and the relaying
happen within its turn. A read that waits keeps its data, in order, and a call cancelled while
it waits closes its connection as it would in any read.

The HTTP library's connection pool takes its network backend as an option the SDKs' clients do
not pass on, so ``pace_reads`` replaces the backend of a client's pools after they are built
(each pool's private ``_network_backend``, where the library and its fork the SDKs now use
keep it). A client whose pools do not have one (another HTTP library, a custom transport) is
left as it is: its calls still take turns after the library's part of each read. The
library's default backend is replaced by one on asyncio's own transports (``_asyncio_net``),
which costs the parent less per call; a backend someone chose is kept, paced.
"""

from __future__ import annotations

from typing import Any

from zett_agent.models._asyncio_net import for_library
from zett_agent.models._pacing import pace

__all__ = ["pace_reads"]


class _PacedStream:
    """A network stream whose reads wait for their turn once they have data."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    # the HTTP library's stream interface: it passes its own read and write timeouts
    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        data: bytes = await self._inner.read(max_bytes, timeout)
        await pace()
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(self, *args: Any, **kwargs: Any) -> _PacedStream:
        return _PacedStream(await self._inner.start_tls(*args, **kwargs))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _PacedBackend:
    """A network backend whose streams are ``_PacedStream``."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> _PacedStream:
        return _PacedStream(await self._inner.connect_tcp(*args, **kwargs))

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> _PacedStream:
        return _PacedStream(await self._inner.connect_unix_socket(*args, **kwargs))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def pace_reads(client: Any) -> int:
    """Make the reads of ``client``'s connection pools take turns; how many pools were changed.

    ``client`` is an HTTP client of the SDKs' HTTP library, before its first request: its
    transport and the transports it mounts (proxies), each with a connection pool
    (``_pool``) holding its network backend. Anything else is left alone.
    """
    changed = 0
    transports = [getattr(client, "_transport", None), *getattr(client, "_mounts", {}).values()]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if backend is None or isinstance(backend, _PacedBackend):
            continue
        if not callable(getattr(backend, "connect_tcp", None)):
            continue
        # the library's default backend goes through anyio: asyncio's own transports instead
        native = for_library(backend)
        pool._network_backend = _PacedBackend(native or backend)  # type: ignore[union-attr]
        changed += 1
    return changed
