"""A test and benchmark double of the child runner: children as asyncio tasks of this process.

It gives none of the guarantees the process engine exists for (a child that never yields blocks
the parent and cannot be cancelled; a crash takes the parent down). It exists so that the task
registry, the tools and the notices can be tested without processes, and so that benchmarks can
show what the processes cost and buy. Swap it in with ``extension._runner = InProcessRunner()``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from zett_agent.extensions._child import ChildSpec, run_child
from zett_agent.process import JobCancelled, JobFailed, JobUsage

_END = object()


class InProcessJob:
    """Quacks like the ``ProcessJob`` the extension uses, backed by an ``asyncio.Task``.

    Cancellation: ``cancel()`` is ``task.cancel()``; it takes effect only when the child next
    yields to the event loop, so a child that never yields cannot be stopped at all.
    """

    def __init__(self, spec: ChildSpec) -> None:
        self.pid: int | None = os.getpid()
        self._events: asyncio.Queue[Any] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(
            run_child(spec, self._events.put_nowait), name=f"in-process-{spec.session_id}"
        )
        self._task.add_done_callback(lambda _: self._events.put_nowait(_END))
        self._started = time.monotonic()

    async def events(self) -> AsyncIterator[Any]:
        while (event := await self._events.get()) is not _END:
            yield event

    def done(self) -> bool:
        return self._task.done()

    async def wait(self) -> None:
        await asyncio.wait({self._task})

    def exception(self) -> BaseException | None:
        if self._task.cancelled():
            return JobCancelled("the child task was cancelled")
        error = self._task.exception()
        if error is None:
            return None
        return JobFailed(type(error).__qualname__, str(error))

    def result(self) -> Any:
        error = self.exception()
        if error is not None:
            raise error
        return self._task.result()

    async def cancel(self, grace: float | None = None) -> None:
        self._task.cancel()
        await asyncio.wait({self._task})

    def usage(self) -> JobUsage:
        # One process for everything: a child's own CPU time cannot be told apart.
        return JobUsage(0.0, 0, 0, time.monotonic() - self._started)


class InProcessRunner:
    """The child-runner interface the subagent extensions use, with no pool behind it."""

    kill_grace = 0.0

    def warm_up(self) -> None:
        """Nothing to boot: children are asyncio tasks."""

    async def submit(self, spec: ChildSpec) -> InProcessJob:
        return InProcessJob(spec)

    async def close(self) -> None:
        """Nothing to close: the extension cancels running tasks before calling this."""
