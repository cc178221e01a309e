"""Parent side of running a child agent in the process engine: the pool and failure reasons."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from typing import Any

from zett_agent.extensions._child import ChildSpec, run_child
from zett_agent.process import (
    JobCancelled,
    JobFailed,
    JobTimeout,
    LimitExceeded,
    PoolClosed,
    ProcessError,
    ProcessJob,
    ProcessLimits,
    ProcessPool,
    ProtocolError,
    WorkerCrashed,
)

log = logging.getLogger(__name__)

# Imported once in the pool's launcher, so each forked child starts with the runtime warm.
# The extension's own modules are in it because the extension object travels with each child.
CHILD_PRELOAD: tuple[str, ...] = (
    "zett_agent.agent",
    "zett_agent.extensions._child",
    "zett_agent.extensions._file_tools",
    "zett_agent.extensions._subagent",
    "zett_agent.extensions._async_subagent",
)


class ChildRunner:
    """Starts child agents as jobs of a ``ProcessPool``.

    The pool is either shared (given by the application, never closed here) or created on first
    use in the running event loop and closed by ``close()``.
    """

    def __init__(
        self,
        pool: ProcessPool | None = None,
        *,
        max_workers: int | None = None,
        limits: ProcessLimits | None = None,
        kill_grace: float = 0.0,
        preload: Sequence[str] = (),
    ) -> None:
        self._shared = pool
        self._own: ProcessPool | None = None
        self._max_workers = max_workers
        self._preload = (*CHILD_PRELOAD, *preload)
        self.limits = limits
        self.kill_grace = kill_grace
        self._lock: asyncio.Lock | None = None
        self._warming: asyncio.Task[None] | None = None
        self._closed = False

    def warm_up(self) -> None:
        """Start the pool in the background, so the first child does not wait for it to boot."""
        idle = self._shared is None and self._own is None and self._warming is None
        if idle and not self._closed:
            self._warming = asyncio.get_running_loop().create_task(self._warm())

    async def _warm(self) -> None:
        try:
            await self.pool()
        except Exception:
            # The first real submit starts the pool again and reports the error to its caller.
            log.debug("warming up the process pool failed", exc_info=True)

    async def pool(self) -> ProcessPool:
        if self._shared is not None:
            await self._shared.start()  # no-op once started; the application still closes it
            return self._shared
        if self._closed:
            raise RuntimeError("this extension is closed; create a new one to start tasks")
        if self._own is None:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if self._closed:
                    raise RuntimeError("this extension is closed; create a new one to start tasks")
                if self._own is None:
                    workers = self._max_workers or max(2, os.cpu_count() or 2)
                    pool = ProcessPool(
                        max_workers=workers,
                        spare_workers=min(2, workers),
                        kill_grace=self.kill_grace,
                        preload=self._preload,
                    )
                    await pool.start()
                    self._own = pool
        assert self._own is not None
        return self._own

    async def submit(self, spec: ChildSpec) -> ProcessJob:
        """Submit one child; raises ``TypeError`` if the spec cannot be shipped to a process."""
        pool = await self.pool()
        limits = spec.definition.limits or self.limits
        return pool.submit(run_child, spec, limits=limits)

    async def close(self) -> None:
        """Close the pool this runner created (a shared pool stays open). Idempotent.

        A pool still starting is waited for, then closed, so nothing outlives this call.
        """
        self._closed = True
        if self._warming is not None:
            await asyncio.gather(self._warming, return_exceptions=True)
        if self._lock is not None:
            async with self._lock:
                pass  # a start in progress has finished (or failed) once the lock is free
        if self._own is not None:
            pool, self._own = self._own, None
            await pool.close()


def failure_reason(error: BaseException) -> str:
    """One line the parent model can act on, for a child that did not complete."""
    match error:
        case JobFailed():
            return f"the child agent raised {error.type_name}: {error.message}"[:500]
        case WorkerCrashed():
            if error.signal_name:
                return f"the child process was killed by {error.signal_name}"
            return f"the child process exited with code {error.exitcode} before reporting"
        case JobTimeout():
            return f"the child ran out of time (timeout={error.timeout:g}s)"
        case LimitExceeded():
            return f"the child hit its {error.limit} limit ({error.value})"
        case ProtocolError():
            return f"the child sent invalid data and was killed: {error}"
        case PoolClosed():
            return "the extension was closed before the child finished"
        case JobCancelled():
            return "cancelled"
        case ProcessError():
            return str(error)
        case _:
            return f"{type(error).__name__}: {error}"


def report_content(result: Any) -> str:
    if isinstance(result, dict) and isinstance(result.get("content"), str):
        return str(result["content"])
    return str(result)
