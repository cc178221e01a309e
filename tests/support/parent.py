"""The parent's side of a subagent test: a worker definition and one run of a scripted parent.

``worker`` builds the ``SubAgentDefinition`` the tests start tasks of; ``run_parent`` runs a
parent agent whose model says ``steps`` (a ``StepModel``) with an extension, and leaves the
client open: closing it would release the session's tasks, which the tests go on with (the
extension's ``close()`` ends whatever still runs). ``parent_answer`` runs a parent on a model
of the test's own and closes its client after the test's block.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from support.scripted_models import Step, StepModel
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.model import Model
from zett_agent.tools import AgentTool

#: hang guard of one parent run (children in fresh processes or Ray workers)
HANG_GUARD = 60.0


def worker(model: Model | None, name: str = "worker", **fields: Any) -> SubAgentDefinition:
    """A test child profile ``name`` with ``model`` and any other definition ``fields``."""
    return SubAgentDefinition(
        name, f"{name} profile for tests", "You are a test child.", model, **fields
    )


async def run_parent(
    extension: Any,
    steps: list[Step],
    *,
    session_id: str = "parent",
    prompt: str = "go",
    extra_extensions: tuple[Any, ...] = (),
    tools: tuple[AgentTool, ...] = (),
) -> tuple[str, StepModel]:
    """Run the parent once with ``prompt``; return its answer and its model (whose
    ``requests`` the tests read). ``TimeoutError`` after the hang guard."""
    model = StepModel(steps)
    client = await create_agent(
        model,
        config=AgentRunConfig(session_id=session_id),
        extensions=[extension, *extra_extensions],
        tools=tools,
    )
    async with asyncio.timeout(HANG_GUARD):
        result = await client.run(prompt)
    return result.content, model


@contextlib.asynccontextmanager
async def parent_answer(
    model: Model,
    extension: Any,
    *,
    session_id: str = "parent",
    tools: tuple[AgentTool, ...] = (),
    within: float = HANG_GUARD,
) -> AsyncIterator[str]:
    """Run a parent on ``model`` (any model, its requests kept by the caller) with
    ``extension`` once, prompted "go"; yield its answer while its client is still open, so the
    block can read the session's tasks (closing the client releases them). The run and the
    block share the hang guard ``within``: ``TimeoutError`` after it."""
    client = await create_agent(
        model, config=AgentRunConfig(session_id=session_id), extensions=[extension], tools=tools
    )
    async with client, asyncio.timeout(within):
        yield (await client.run("go")).content


async def until_running(*tasks: Any, guard: float = 30.0) -> None:
    """Wait until each task reads ``running``.

    A task turns running when the parent's watcher takes the child's first event; a signal
    the child sends past the parent (a beacon) can arrive before that. There is no event for
    the change, so this looks again at each loop turn, for ``guard`` seconds at most.
    """
    from zett_agent.extensions.async_subagent import SubAgentTaskStatus

    async with asyncio.timeout(guard):
        while any(task.status is SubAgentTaskStatus.PENDING for task in tasks):  # noqa: ASYNC110 - no event for it
            await asyncio.sleep(0.001)
