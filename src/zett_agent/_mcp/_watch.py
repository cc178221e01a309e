"""Waking whoever waits on a child (a call, a task's progress) when the child reports.

The extension folds each child's progress events into its task as they arrive, and tells no one.
The MCP server wants to forward progress while a call waits or a task runs, without polling and
without reaching into the extension: it hands the extension a runner that wraps the real one,
whose jobs ring a bell after every event the extension has read (and folded into the task).
Whoever waits on a child's bell then reads the task as the tools show it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from zett_agent.runners._base import WrappedJob

if TYPE_CHECKING:
    from zett_agent.runners import ChildRunner
    from zett_agent.runners._base import ChildJob
    from zett_agent.runners._child import ChildSpec


class Bells:
    """One bell per child session: ``ring`` wakes every current watcher of that child.

    A ring sets an ``asyncio.Event`` per watcher, so rings that come faster than a watcher
    handles them collapse into one wake-up; a ring nobody watches costs a dict lookup. Watchers
    are registered only for as long as their ``with`` block runs.
    """

    def __init__(self) -> None:
        self._watchers: dict[str, set[asyncio.Event]] = {}

    def ring(self, session_id: str) -> None:
        for event in self._watchers.get(session_id, ()):
            event.set()

    @contextlib.contextmanager
    def watch(self, session_id: str) -> Iterator[asyncio.Event]:
        """An event set at the next ring of ``session_id`` (clear it to wait for another)."""
        event = asyncio.Event()
        self._watchers.setdefault(session_id, set()).add(event)
        try:
            yield event
        finally:
            watchers = self._watchers.get(session_id)
            if watchers is not None:
                watchers.discard(event)
                if not watchers:
                    del self._watchers[session_id]


class BellRunner:
    """A ``ChildRunner`` that runs children on ``inner`` and rings ``bells`` as they report.

    Everything else (limits, sandboxes, cancel, close) is ``inner``'s, unchanged.
    """

    def __init__(self, inner: ChildRunner, bells: Bells) -> None:
        self.inner = inner
        self._bells = bells

    def warm_up(self, modules: Iterable[str] = ()) -> None:
        self.inner.warm_up(modules)

    async def submit(self, spec: ChildSpec, **options: Any) -> ChildJob:
        # the caller's options pass through as given: a sandbox only when there is one
        job = await self.inner.submit(spec, **options)
        return _BellJob(job, spec.session_id, self._bells)

    async def close(self) -> None:
        await self.inner.close()


class _BellJob(WrappedJob):
    """``job`` unchanged, except that its events ring the child's bell once read."""

    job: ChildJob

    def __init__(self, job: ChildJob, session_id: str, bells: Bells) -> None:
        self.job = job
        self._session_id = session_id
        self._bells = bells

    async def events(self) -> AsyncIterator[Any]:
        try:
            async for event in self.job.events():
                yield event
                # Here the consumer (the extension's watcher) has folded the event into the
                # task and asked for the next one: the task shows it.
                self._bells.ring(self._session_id)
        finally:
            self._bells.ring(self._session_id)

    async def cancel(self) -> None:
        await self.job.cancel()

    def info(self) -> Mapping[str, Any]:
        return self.job.info()
