"""A child agent in its own process talks to an OpenAI-compatible server on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from support.openai_chunks import TEXT_STREAM, chunk, usage_chunk
from support.openai_loopback import LoopbackServer, Reply, sse
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension, SubAgentTaskStatus
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.models.openai import OpenAIChatModel
from zett_agent.testing import FunctionModel
from zett_agent.tools import AgentTool

HANG_GUARD = 60


def _pid() -> str:
    """The child's pid, and which third-party HTTP stack it has imported by then (none)."""
    heavy = {"httpx", "httpcore", "h11", "anyio", "sniffio"} & set(sys.modules)
    return json.dumps({"pid": os.getpid(), "heavy": sorted(heavy)})


PID_TOOL = AgentTool("pid", "Return the process id.", {"type": "object", "properties": {}}, _pid)


def parent_step(request: object) -> AssistantMessage:
    results = [m for m in request.messages if isinstance(m, ToolMessage)]  # type: ignore[attr-defined]
    if not results:
        args = {"subagent_type": "remote", "description": "ask", "prompt": "say hello"}
        return AssistantMessage(tool_calls=(ToolCall("s", "task_start", args),))
    if len(results) == 1:
        task_id = json.loads(results[0].text)["task_id"]
        args = {"task_id": task_id, "wait_seconds": 30}
        return AssistantMessage(tool_calls=(ToolCall("o", "task_output", args),))
    return AssistantMessage(json.loads(results[-1].text)["content"])


async def test_child_process_streams_from_the_endpoint_and_uses_a_tool() -> None:
    tool_call = sse(
        chunk(
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call-1",
                        "type": "function",
                        "function": {"name": "pid", "arguments": ""},
                    }
                ],
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
        chunk({}, finish="tool_calls"),
        usage_chunk(20, 5),
    )
    async with LoopbackServer([Reply(chunks=tool_call), Reply(chunks=TEXT_STREAM)]) as server:
        definition = SubAgentDefinition(
            "remote",
            "a child on a real endpoint",
            "You are the remote child.",
            model=OpenAIChatModel("test-model", base_url=server.url),
            tools=(PID_TOOL,),
        )
        async with AsyncSubAgentExtension([definition]) as extension:
            client = await create_agent(
                FunctionModel(parent_step),
                config=AgentRunConfig(session_id="parent"),
                extensions=[extension],
            )
            async with client, asyncio.timeout(HANG_GUARD):
                answer = await client.run("go")
                [task] = extension.tasks("parent")  # closing the client releases it

    assert answer.content == "Hello"
    assert task.status is SubAgentTaskStatus.COMPLETED
    assert (task.turns, task.tool_calls, task.last_tool) == (2, 1, "pid")
    assert (task.input_tokens, task.output_tokens) == (20 + 12, 5 + 3)
    first, second = server.requests
    assert first.body["messages"][0] == {"role": "system", "content": "You are the remote child."}
    assert first.body["messages"][1] == {"role": "user", "content": "say hello"}
    assert [t["function"]["name"] for t in first.body["tools"]] == ["pid"]
    tool_answer = second.body["messages"][-1]
    assert tool_answer["role"] == "tool" and tool_answer["tool_call_id"] == "call-1"
    child = json.loads(tool_answer["content"])
    assert child["pid"] != os.getpid()  # the tool ran in the child's process
    # after a request (and in a launcher that preloaded for OpenAIChatModel): no httpx stack
    assert child["heavy"] == []
