"""``InProcessRunner``: each child agent as an asyncio task of the parent's own process.

For development where the process engine cannot run (macOS, Windows, a sandbox without
``pidfd_open``), for tests of the registry and the tools without processes, and as the
baseline the subagent benchmark compares processes against.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from zett_agent.process import (
    JobCancelled,
    JobFailed,
    JobTimeout,
    JobUsage,
    ProcessLimits,
    Sandbox,
    SandboxUnavailable,
)
from zett_agent.runners._child import ChildSpec, run_child, unpicklable_part
from zett_agent.runners._refused import RefusedJob, unenforced

__all__ = ["InProcessJob", "InProcessRunner"]

_END = object()


class InProcessJob:
    """A child running as an ``asyncio.Task`` of this process (the ``ChildJob`` interface).

    Cancellation: ``cancel()`` is ``task.cancel()``: it takes effect when the child next yields
    to the event loop, so a child stuck in a loop or a blocking call that never yields cannot
    be stopped at all (and blocks the parent meanwhile).
    """

    def __init__(self, spec: ChildSpec, limits: ProcessLimits | None) -> None:
        self.pid: int | None = os.getpid()
        self._events: asyncio.Queue[Any] = asyncio.Queue()
        #: the parent's messages, until the child's inbox takes them
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self._timeout = limits.timeout if limits is not None else None
        self._task = asyncio.get_running_loop().create_task(
            self._run(spec), name=f"in-process-{spec.session_id}"
        )
        self._task.add_done_callback(self._ended)
        self._started = time.monotonic()
        self._ended_at: float | None = None
        #: the task info's ``sandbox`` entry when a sandbox was asked for and not enforced
        self.sandbox_note: dict[str, Any] | None = None

    async def _run(self, spec: ChildSpec) -> dict[str, Any]:
        if self._timeout is None:
            return await run_child(spec, self._events.put_nowait, self._inbox.get)
        try:
            async with asyncio.timeout(self._timeout):
                return await run_child(spec, self._events.put_nowait, self._inbox.get)
        except TimeoutError as exc:
            raise JobTimeout(self._timeout) from exc

    def _ended(self, _: asyncio.Task[Any]) -> None:
        self._ended_at = time.monotonic()
        self.pid = None
        self._events.put_nowait(_END)

    def __repr__(self) -> str:
        return f"<InProcessJob {self._task.get_name()} done={self._task.done()}>"

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
        if error is None or isinstance(error, JobTimeout):
            return error
        failed = JobFailed(type(error).__qualname__, str(error))
        failed.__cause__ = error
        return failed

    def result(self) -> Any:
        error = self.exception()
        if error is not None:
            raise error
        return self._task.result()

    async def send(self, message: Mapping[str, Any]) -> None:
        """Queue ``message`` for the child (it may not have started yet).

        Raises ``RuntimeError`` once it ended.
        """
        if self._task.done():
            raise RuntimeError(f"cannot send to {self!r}: it ended")
        self._inbox.put_nowait(dict(message))

    async def cancel(self) -> None:
        self._task.cancel()
        await asyncio.wait({self._task})

    def usage(self) -> JobUsage:
        # One process for everything: a child's own CPU time and memory cannot be told apart.
        end = self._ended_at if self._ended_at is not None else time.monotonic()
        return JobUsage(0.0, 0, 0, end - self._started)

    def info(self) -> Mapping[str, Any]:
        return {} if self.sandbox_note is None else {"sandbox": self.sandbox_note}


class InProcessRunner:
    """Runs each child agent as an asyncio task in the parent's own event loop.

    The choice for development on a machine that cannot run the process engine (it needs
    Linux), and for tests of what the extension does without what processes cost. The tools,
    the registry, the notices, ``_create_child`` and the progress are the extension's own
    code, so an application moves to ``ProcessRunner`` (the default) without changes.

    What it does not give, by design of running in one process:

    - **no hard kill**: ``task_cancel`` cancels the child's task, which stops it only when it
      next yields to the event loop; a child in a pure-Python loop or a blocking call can
      neither be cancelled nor timed out, and blocks the parent (and every other child)
      meanwhile;
    - **no isolation**: a child shares the parent's memory, CPU, open files and environment;
      a crash (a segfault, ``os._exit``) takes the parent down with every task; a memory
      leak is the parent's;
    - **limits**: only ``ProcessLimits.timeout`` applies (as an ``asyncio.timeout``, with the
      caveat above); ``memory_bytes``, ``cpu_seconds``, ``max_open_files``, ``env`` and
      ``cwd`` are ignored;
    - **no parallelism**: children share the parent's one thread, so CPU-bound children run
      one at a time;
    - **no sandbox**: a child with a required ``Sandbox`` fails with ``SandboxUnavailable``
      before it starts; with ``Sandbox(required=False)`` it runs unconfined, and its task info
      says so (``"sandbox": {"enforced": false, ...}``).

    Args:
        copy: Give each child its own copy of its definition and model, made with cloudpickle
            as for a process (default), so children behave as they do under ``ProcessRunner``:
            no state shared with the parent or each other, and a definition that cannot be
            pickled fails ``task_start`` the same way. ``copy=False`` shares the objects
            (a little faster; a stateful model is then shared by every child).
    """

    def __init__(self, *, copy: bool = True) -> None:
        self.copy = copy
        self._closed = False

    def __repr__(self) -> str:
        return f"<InProcessRunner copy={self.copy}{' closed' if self._closed else ''}>"

    def warm_up(self, modules: Iterable[str] = ()) -> None:
        """Nothing to boot: children are asyncio tasks, and their modules are imported."""

    async def submit(
        self,
        spec: ChildSpec,
        *,
        limits: ProcessLimits | None = None,
        sandbox: Sandbox | None = None,
    ) -> InProcessJob | RefusedJob:
        """Start ``run_child(spec)`` as a task of the running loop and return its job.

        A required ``sandbox`` cannot be enforced here: the job fails at once with
        ``SandboxUnavailable`` (the child never starts).

        Raises ``TypeError`` naming what cannot be pickled (with ``copy=True``), and
        ``RuntimeError`` once closed.
        """
        if self._closed:
            raise RuntimeError("this extension is closed; create a new one to start tasks")
        note = None
        if sandbox is not None:
            reason = (
                "InProcessRunner runs children as asyncio tasks inside the parent: it cannot "
                "enforce a sandbox; use ProcessRunner (the default)"
            )
            if sandbox.required:
                error = SandboxUnavailable(reason + ", or Sandbox(required=False)", ("runner",))
                return RefusedJob(error, {"sandbox": unenforced(reason, refused=True)})
            note = unenforced(reason, refused=False)
        if self.copy:
            import cloudpickle

            try:
                spec = cloudpickle.loads(cloudpickle.dumps(spec))
            except Exception as exc:
                part = unpicklable_part(spec) or str(exc)
                raise TypeError(
                    f"cannot start a child of {spec.definition.name!r}: {part}. Children get "
                    "their own copy of the definition, as in a process; keep locks, clients and "
                    "event loops out of it, or use InProcessRunner(copy=False)"
                ) from exc
        job = InProcessJob(spec, limits)
        if note is not None:
            job.sandbox_note = note
        return job

    async def close(self) -> None:
        """Nothing to release: the extension cancels running children before calling this."""
        self._closed = True

    async def __aenter__(self) -> InProcessRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
