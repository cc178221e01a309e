"""The SDK clients of the models: one per model, event loop and configuration, closed with each.

Building an SDK client costs about a millisecond of CPU, and a new client means a new connection
(a TCP connect, and for ``https://`` a TLS handshake, a few milliseconds more), so an adapter
keeps its clients: ``LoopClients.get(config, make)`` returns the client this model made for
``config`` (the endpoint, the timeouts, the proxy variables: whatever the client was built
from) on the running event loop, building it with ``make()`` the first time. A client is never
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
from collections.abc import AsyncGenerator, Callable, Hashable
from typing import Any, TypeVar

__all__ = ["LoopClients"]

_tokens = itertools.count()
_Client = TypeVar("_Client")


class _OnLoop:
    """The clients of one event loop, and the generator that closes them when it shuts down."""

    __slots__ = ("__weakref__", "clients", "holder", "retired")

    def __init__(self) -> None:
        #: (model's token, configuration) -> client
        self.clients: dict[tuple[int, Hashable], Any] = {}
        #: clients of models that are gone, still to close
        self.retired: list[Any] = []
        self.holder = self._hold()

    async def _hold(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            self.retired += self.clients.values()
            self.clients.clear()
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
        """The client for ``config`` on the running loop, built by ``make()`` the first time.

        A client is anything with an ``async close()``.

        Raises what ``make`` raises.
        """
        loop = asyncio.get_running_loop()
        on_loop = _loops.get(loop)
        if on_loop is None:
            on_loop = _OnLoop()
            # first iterated here, so this loop finalizes it when it shuts down
            await on_loop.holder.asend(None)
            _loops[loop] = on_loop
        elif on_loop.retired:
            await on_loop.close_retired()
        key = (self._token, config)
        client = on_loop.clients.get(key)
        if client is None:
            client = on_loop.clients[key] = make()
        return client

    def count(self) -> int:
        """How many clients this model holds on the running loop."""
        on_loop = _loops.get(asyncio.get_running_loop())
        if on_loop is None:
            return 0
        return sum(1 for token, _ in on_loop.clients if token == self._token)

    async def aclose(self) -> None:
        """Close this model's clients on the running loop, and their connections. Idempotent.

        Its clients on other loops close when their loop shuts down.
        """
        on_loop = _loops.get(asyncio.get_running_loop())
        if on_loop is None:
            return
        mine = [key for key in on_loop.clients if key[0] == self._token]
        on_loop.retired += [on_loop.clients.pop(key) for key in mine]
        await on_loop.close_retired()
