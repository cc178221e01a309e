"""The in-process baseline of ``bench_subagents.py``.

``InProcessSubAgentExtension`` is ``AsyncSubAgentExtension`` with one thing swapped: its child
runner starts each child agent as ``asyncio.create_task(agent.run(prompt))`` in the parent's own
event loop instead of a job of the process pool, and cancels it with ``task.cancel()``. The five
tools, the registry, the notices, ``_create_child`` and the progress folding are the extension's
own code, so both variants run the very same parent program and child agents.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from zett_agent.agent import AgentRunConfig
from zett_agent.extensions._child import ChildSpec, ProgressModel
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
from zett_agent.process import JobCancelled, JobFailed, JobUsage

# -- the in-process baseline ------------------------------------------------------------------

_END = object()


class InProcessJob:
    """Quacks like the ``ProcessJob`` the extension expects, backed by an ``asyncio.Task``.

    Cancellation: ``cancel()`` is ``task.cancel()``; it takes effect only when the child next
    yields to the event loop, so a child that never yields cannot be stopped at all.
    """

    def __init__(self, spec: ChildSpec, kill_grace: float) -> None:
        self.pid: int | None = os.getpid()
        self._events: asyncio.Queue[Any] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(
            self._run(spec), name=f"in-process-{spec.session_id}"
        )
        self._task.add_done_callback(lambda _: self._events.put_nowait(_END))
        self._started = time.monotonic()

    async def _run(self, spec: ChildSpec) -> dict[str, Any]:
        # The same steps as zett_agent.extensions._child.run_child, minus the process.
        model = ProgressModel(spec.model, self._events.put_nowait)
        agent = spec.factory._create_child(spec.definition, model=model, session_id=spec.session_id)
        config = AgentRunConfig(session_id=spec.session_id)
        if spec.definition.max_turns is not None:
            config = AgentRunConfig(session_id=spec.session_id, max_turns=spec.definition.max_turns)
        self._events.put_nowait({"kind": "started"})
        try:
            result = await agent.run(spec.prompt, config=config)
        finally:
            await agent.close()
        return {"content": result.content}

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
    """The ``ChildRunner`` interface the extension uses, with no pool behind it."""

    kill_grace = 0.0

    def warm_up(self) -> None:
        """Nothing to boot: children are asyncio tasks."""

    async def submit(self, spec: ChildSpec) -> InProcessJob:
        return InProcessJob(spec, self.kill_grace)

    async def close(self) -> None:
        """Nothing to close: the extension cancels running tasks before calling this."""


class InProcessSubAgentExtension(AsyncSubAgentExtension):
    """``AsyncSubAgentExtension`` whose children run as asyncio tasks in the parent process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._runner = InProcessRunner()  # type: ignore[assignment]
