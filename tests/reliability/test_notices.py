"""Found by the soak: a finished task must be announced even when more than ``max_retained``
tasks finish between two model calls (eviction used to drop notices still due). Since then
``max_retained`` is a bound at all times: a task forgotten before its notice went out is
announced with its report in the notice, since ``task_output`` can no longer read it."""

from __future__ import annotations

import asyncio

from support.calls import call, starts
from support.scripted_models import StepModel, ToolsThenAnswer
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AgentMessage, AssistantMessage
from zett_agent.tools import AgentTool

GUARD = 60


async def test_notices_survive_eviction_between_two_model_calls() -> None:
    definition = SubAgentDefinition("w", "finishes at once", "p", model=ToolsThenAnswer("ok"))
    extension = AsyncSubAgentExtension([definition], max_retained=1)

    async def until_all_finished() -> str:
        # waits outside the model's view: the tasks are not read, so each must be announced
        await asyncio.gather(*(t.settled.wait() for t in extension.tasks("s")))
        return "all finished"

    model = StepModel(
        [
            starts(3, "w"),
            call("until_all_finished"),
            AssistantMessage("done"),
        ]
    )
    tool = AgentTool("until_all_finished", "", {"type": "object"}, until_all_finished)
    async with extension:
        client = await create_agent(
            model, config=AgentRunConfig(session_id="s"), extensions=[extension], tools=(tool,)
        )
        async with client, asyncio.timeout(GUARD):
            assert (await client.run("go")).content == "done"
            retained = [t.task_id for t in extension.tasks("s")]  # closing releases them
    notices = [m.content for m in model.requests[-1].messages if isinstance(m, AgentMessage)]
    assert sorted(n.split()[2] for n in notices) == ["task-1", "task-2", "task-3"], notices
    # the registry never held more than max_retained finished tasks: the last to finish stays
    [kept] = retained
    for notice in notices:
        if notice.split()[2] == kept:
            assert notice.endswith("Read its report with task_output.")
        else:  # forgotten before the notice went out: the notice carries the report
            assert "evicted" in notice and "can no longer be read" in notice
            assert notice.endswith(":\nok")
