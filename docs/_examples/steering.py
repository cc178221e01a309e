"""Steer running children: wait on several, send one a message, cap what one spends, and find
the tasks again after a restart."""

import asyncio
import json
import os
import tempfile

from zett_agent import (
    AgentRunConfig,
    AssistantMessage,
    AsyncSubAgentExtension,
    FunctionModel,
    ScriptedModel,
    SubAgentDefinition,
    ToolCall,
    ToolMessage,
    UserMessage,
    create_agent,
    tool,
)
from zett_agent.model import ModelResponse, Usage


def parent(request):
    """The parent's offline model: start two tasks, steer one, wait for both, sum up."""
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    if not results:
        survey = {"subagent_type": "survey", "description": "logging", "prompt": "Survey logging"}
        spend = {"subagent_type": "costly", "description": "big read", "prompt": "Read it all"}
        calls = (ToolCall("1", "task_start", survey), ToolCall("2", "task_start", spend))
        return AssistantMessage(tool_calls=calls)
    if len(results) == 2:
        steer = {
            "task_id": json.loads(results[0].text)["task_id"],
            "message": "Focus on the retry path only",
            "interrupt": True,  # stop what it is doing now; it reads this before its next call
        }
        return AssistantMessage(tool_calls=(ToolCall("3", "task_message", steer),))
    if len(results) == 3:
        ids = [json.loads(r.text)["task_id"] for r in results[:2]]
        wait = {"task_ids": ids, "mode": "all", "wait_seconds": 30}
        return AssistantMessage(tool_calls=(ToolCall("4", "task_wait", wait),))
    waited = json.loads(results[-1].text)
    lines = [f"{t['task_id']} {t['status']}: {t.get('content') or t['error']}" for t in waited["finished"]]
    return "\n".join(lines)


@tool
async def survey_code() -> str:
    """Survey the whole code base (long: it runs until the parent steers the child)."""
    await asyncio.Event().wait()
    return "unreachable"


def surveyor(request):
    """The child's model: survey everything, until told what to focus on."""
    told = [m.content for m in request.messages if isinstance(m, UserMessage)][1:]
    if not told:
        return AssistantMessage(tool_calls=(ToolCall("s", "survey_code", {}),))
    return f"Surveyed as asked ({told[-1]!r}): retries back off 1, 2, 4 s"


definitions = [
    SubAgentDefinition(
        name="survey",
        description="survey a code area",
        system_prompt="You survey code.",
        model=FunctionModel(surveyor),
        tools=(survey_code,),
    ),
    SubAgentDefinition(
        name="costly",
        description="read a lot",
        system_prompt="You read.",
        # one response that reports 6,000 tokens: past this profile's budget
        model=ScriptedModel([ModelResponse(AssistantMessage("all read"), Usage(5000, 1000))]),
        token_budget=1000,
    ),
]


async def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        store = os.path.join(directory, "tasks.sqlite")
        async with AsyncSubAgentExtension(
            definitions, extra_tools=("task_wait", "task_message"), store=store
        ) as tasks:
            client = await create_agent(
                FunctionModel(parent), config=AgentRunConfig(session_id="alice"), extensions=[tasks]
            )
            async with client:
                print((await client.run("Look into our logging")).content)
                survey, _ = tasks.tasks("alice")
                print("messages:", tasks.task_info(survey)["messages"])

        # The host restarted: a new extension on the same store has the tasks and their reports.
        async with AsyncSubAgentExtension(definitions, store=store) as restarted:
            for task in restarted.tasks("alice"):
                print("restored:", task.task_id, task.status.value, "-", task.output or task.error)


if __name__ == "__main__":
    asyncio.run(main())
