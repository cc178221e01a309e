"""``close()`` racing children that start, run and end: it returns without an error, once, for
every caller, and leaves nothing behind (the leak guard checks processes, threads and fds)."""

from __future__ import annotations

import asyncio
import random

import _reliability_children as hostile
import pytest

from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AssistantMessage, ToolCall
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions
from zett_agent.process import ProcessPool
from zett_agent.runners import ProcessRunner

ROUNDS = 8
GUARD = 60.0
KINDS = ("answer", "crash", "spawn")


class StartMany:
    """A parent that starts ``n`` children of random kinds, then answers."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.random = random.Random(seed)

    async def stream(self, request: ModelRequest):  # type: ignore[no-untyped-def]
        if any(isinstance(m, AssistantMessage) for m in request.messages):
            yield ModelEvent.completed(ModelResponse(AssistantMessage("started them")))
            return
        calls = tuple(
            ToolCall(
                f"s{i}",
                "task_start",
                {"subagent_type": self.random.choice(KINDS), "description": "d", "prompt": "go"},
            )
            for i in range(self.n)
        )
        yield ModelEvent.completed(ModelResponse(AssistantMessage(tool_calls=calls)))


@pytest.mark.slow
async def test_close_while_children_start_run_and_end(containment: str) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    definitions = [
        SubAgentDefinition(kind, kind, "p", model=hostile.EndsSoon(kind)) for kind in KINDS
    ]
    for _ in range(ROUNDS):
        pool = ProcessPool(8, containment=containment, max_jobs_per_worker=rng.choice([1, 3]))
        extension = AsyncSubAgentExtension(
            definitions, max_concurrent=8, runner=ProcessRunner(pool)
        )
        client = await create_agent(
            StartMany(rng.randint(1, 8), rng.randrange(1 << 30)),
            config=AgentRunConfig(session_id="s"),
            extensions=[extension],
        )
        run = asyncio.ensure_future(client.run("go"))
        await asyncio.sleep(rng.random() * 0.05)
        async with asyncio.timeout(GUARD):
            # two callers at once: both return only once everything is closed
            results = await asyncio.gather(
                extension.close(), extension.close(), run, return_exceptions=True
            )
        errors = [r for r in results[:2] if isinstance(r, BaseException)]
        assert not errors, f"close() raised (seed {seed}): {errors!r}"
        assert all(task.done() for task in extension.tasks("s")), seed
        await client.close()
        async with asyncio.timeout(GUARD):
            await pool.close()
