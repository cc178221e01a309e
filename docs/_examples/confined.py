"""Confine each child agent further, inside its own process, before its agent runs."""

import asyncio
import json
import os
import resource

from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.testing import FunctionModel
from zett_agent.tools import tool


class Confined(AsyncSubAgentExtension):
    def _create_child(self, definition, *, model, session_id):
        resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))  # counts the user's processes
        os.umask(0o077)
        # as root only: drop to an unprivileged account, group first
        # os.setgroups([]); os.setgid(65534); os.setuid(65534)
        # or load a seccomp filter (libseccomp's `seccomp` module) or a Landlock ruleset here
        return super()._create_child(definition, model=model, session_id=session_id)


@tool
def confinement() -> str:
    """Say what this process may do: its umask and its process limit."""
    umask = os.umask(0o077)
    return f"umask {umask:04o}, RLIMIT_NPROC {resource.getrlimit(resource.RLIMIT_NPROC)[0]}"


def child(request):  # offline models: the child calls its tool and reports what it said
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    if not results:
        return AssistantMessage(tool_calls=[ToolCall("c", "confinement", {})])
    return results[0].text


def parent(request):  # the parent starts one task and waits for its report
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    if not results:
        start = {"subagent_type": "worker", "description": "look", "prompt": "Look around."}
        return AssistantMessage(tool_calls=[ToolCall("s", "task_start", start)])
    if len(results) == 1:
        read = {"task_id": json.loads(results[0].text)["task_id"], "wait_seconds": 30}
        return AssistantMessage(tool_calls=[ToolCall("o", "task_output", read)])
    return "The child runs with " + json.loads(results[1].text)["content"]


async def main() -> None:
    worker = SubAgentDefinition(
        "worker", "looks around", "You report.", model=FunctionModel(child), tools=[confinement]
    )
    async with Confined([worker]) as tasks:
        client = await create_agent(FunctionModel(parent), extensions=[tasks])
        print((await client.run("What may a child do?")).content)


if __name__ == "__main__":
    asyncio.run(main())
