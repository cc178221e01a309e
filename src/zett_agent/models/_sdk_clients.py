"""The SDK clients of the models: per model, event loop and configuration, closed with each.

Building an SDK client costs about a millisecond of CPU, and a new client means a new connection
(a TCP connect, and for ``https://`` a TLS handshake, a few milliseconds more), so an adapter
keeps its clients: ``LoopClients.get(config, make)`` returns the client this model made for
``config`` (the endpoint, the timeouts, the proxy variables: whatever the client was built
from) on the running event loop, building it with ``make()`` the first time. A call holds its client
with ``LoopClients.lease(config, make)``: at most ``CALLS_PER_CLIENT`` calls share one client, a
call beyond that gets the next client of that configuration (built the first time), and such an
extra client is closed once its last call ended. The SDKs' HTTP library does work proportional to
its pool's connections each time a call starts or ends (it walks every connection and every
waiting request): one pool for a brokering parent's 1,000 calls at once made that a million steps
in a few loop iterations, stalling the parent's loop for seconds; bounded pools make it about
``CALLS_PER_CLIENT`` steps per call. A client is never
shared across event loops (its connections belong to the loop that opened them) nor across
processes: a forked child starts with none (it keeps its parent's, unused and unclosed), and
pickling a model drops them.

Each client is closed, with its connections:

- by ``LoopClients.aclose()`` (the model's ``aclose()``), for its clients on the running loop;
- when its model is garbage collected: by the next call of any model on the client's loop;
- when its loop shuts down (``asyncio.run``, ``asyncio.Runner``, uvloop: the loop's
  ``shutdown_asyncgens``), whatever is still open: each loop's clients are held by a suspended
  async generator of that loop, whose ``finally`` closes them when the loop finalizes it.

A loop closed without shutting down its async generators leaves its clients to the garbage
collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable
from typing import Any, TypeVar

__all__ = ["CALLS_PER_CLIENT", "LoopClients"]

#: the calls one client (one connection pool) takes at once; more go to another client
CALLS_PER_CLIENT = 16

_tokens = itertools.count()
_Client = TypeVar("_Client")


class _OnLoop:
    """The clients of one event loop, and the generator that closes them when it shuts down."""

    __slots__ = ("__weakref__", "calls", "clients", "holder", "retired")

    def __init__(self) -> None:
        #: (model's token, configuration, which client of that configuration) -> client
        self.clients: dict[tuple[int, Hashable, int], Any] = {}
        #: the calls open on each client of ``clients`` that has any
        self.calls: dict[tuple[int, Hashable, int], int] = {}
        #: clients of models that are gone, still to close
        self.retired: list[Any] = []
        self.holder = self._hold()

    async def _hold(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            self.retired += self.clients.values()
            self.clients.clear()
            self.calls.clear()
            await self.close_retired()

    async def close_retired(self) -> None:
        """Close the retired clients, each once."""
        while self.retired:
            client = self.retired.pop()
            with contextlib.suppress(Exception):  # a broken connection: nothing more is owed
                await client.close()


#: each event loop of this process that has clients
_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _OnLoop] = weakref.WeakKeyDictionary()
#: the loops and clients a forked process inherited, held so that it never closes its parent's
#: connections (nor calls a finalizer of its parent's loop)
_inherited: list[object] = []


def _forget_parent() -> None:
    global _loops
    _inherited.append(list(_loops.items()))
    _loops = weakref.WeakKeyDictionary()


os.register_at_fork(after_in_child=_forget_parent)


def _retire(token: int) -> None:
    """A model is gone (the collector runs this): its clients are to close on their loop.

    Not in a task here, which a loop shutting down would cancel halfway: by the next
    ``get()`` on that loop, or when it shuts down.
    """
    for on_loop in list(_loops.values()):
        for key in [key for key in list(on_loop.clients) if key[0] == token]:
            client = on_loop.clients.pop(key, None)
            on_loop.calls.pop(key, None)
            if client is not None:
                on_loop.retired.append(client)


class LoopClients:
    """A model's SDK clients, one per event loop and configuration (see the module docstring).

    Holds no client when pickled.
    """

    def __init__(self) -> None:
        self._token = next(_tokens)
        finalizer = weakref.finalize(self, _retire, self._token)
        finalizer.atexit = False

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    async def get(self, config: Hashable, make: Callable[[], _Client]) -> _Client:
        """The first client for ``config`` on the running loop, built by ``make()`` the first time.

        A client is anything with an ``async close()``.

        Raises what ``make`` raises.
        """
        on_loop = await self._on_loop()
        return self._client(on_loop, (self._token, config, 0), make)

    @contextlib.asynccontextmanager
    async def lease(self, config: Hashable, make: Callable[[], _Client]) -> AsyncIterator[_Client]:
        """A client for ``config`` held for one call: the first one with room for another call.

        The first client with fewer than ``CALLS_PER_CLIENT`` calls open is chosen.

        Each is built by ``make()`` the first time; a client other than the first is closed
        once the last call it holds ended. Raises what ``make`` raises.
        """
        on_loop = await self._on_loop()
        shard = 0
        while on_loop.calls.get((self._token, config, shard), 0) >= CALLS_PER_CLIENT:
            shard += 1
        key = (self._token, config, shard)
        client = self._client(on_loop, key, make)
        on_loop.calls[key] = on_loop.calls.get(key, 0) + 1
        try:
            yield client
        finally:
            if on_loop.clients.get(key) is client:  # not closed by ``aclose()`` meanwhile
                left = on_loop.calls[key] - 1
                if left:
                    on_loop.calls[key] = left
                else:
                    del on_loop.calls[key]
                    if shard:  # an extra client: closed by the next call on this loop
                        on_loop.retired.append(on_loop.clients.pop(key))

    async def _on_loop(self) -> _OnLoop:
        """The running loop's clients, the retired ones closed."""
        loop = asyncio.get_running_loop()
        on_loop = _loops.get(loop)
        if on_loop is None:
            on_loop = _OnLoop()
            # first iterated here, so this loop finalizes it when it shuts down
            await on_loop.holder.asend(None)
            _loops[loop] = on_loop
        elif on_loop.retired:
            await on_loop.close_retired()
        return on_loop

    @staticmethod
    def _client(
        on_loop: _OnLoop, key: tuple[int, Hashable, int], make: Callable[[], _Client]
    ) -> _Client:
        client: _Client | None = on_loop.clients.get(key)
        if client is None:
            client = on_loop.clients[key] = make()
        return client

    def count(self) -> int:
        """How many clients this model holds on the running loop."""
        on_loop = _loops.get(asyncio.get_running_loop())
        if on_loop is None:
            return 0
        return sum(1 for token, _, _ in on_loop.clients if token == self._token)

    async def aclose(self) -> None:
        """Close this model's clients on the running loop, and their connections. Idempotent.

        Its clients on other loops close when their loop shuts down.
        """
        on_loop = _loops.get(asyncio.get_running_loop())
        if on_loop is None:
            return
        mine = [key for key in on_loop.clients if key[0] == self._token]
        on_loop.retired += [on_loop.clients.pop(key) for key in mine]
        for key in mine:
            on_loop.calls.pop(key, None)
        await on_loop.close_retired()
