"""Freeing a large decoded value a piece at a time, across event-loop iterations.

Dropping the last reference to a list of two million dicts frees them all in one C call: tens
of milliseconds during which the event loop does nothing else. The engine drops such values
itself when it gives up on them (a message that broke its budget or the protocol midway, an
unread event dropped to stay within the budget); it hands them here instead, and they are
taken apart a few thousand members per loop iteration.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

__all__ = ["Graveyard"]

#: containers with at most this many members are freed whole (microseconds)
_SMALL = 4096
#: longest stretch of freeing per loop iteration
_SLICE = 0.002


class Graveyard:
    """Takes large values and frees them in slices on ``loop``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._work: list[Any] = []
        self._handle: asyncio.Handle | None = None

    def bury(self, value: Any) -> None:
        """Free ``value`` soon, a slice per loop iteration if it is large.

        The caller must hold no other reference to it.
        """
        if isinstance(value, list | dict) and len(value) > _SMALL:
            self._work.append(value)
            if self._handle is None:
                self._handle = self._loop.call_soon(self._step)

    def _step(self) -> None:
        self._handle = None
        deadline = time.perf_counter() + _SLICE
        work = self._work
        while work and time.perf_counter() < deadline:
            container = work.pop()
            for _ in range(min(_SMALL, len(container))):
                member = container.pop() if type(container) is list else container.popitem()[1]
                if isinstance(member, list | dict) and len(member) > _SMALL:
                    work.append(member)  # large itself: taken apart in turn
            if container:
                work.append(container)
        if work:
            self._handle = self._loop.call_soon(self._step)

    def close(self) -> None:
        """Free what is left at once (the pool is closing)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._work.clear()
