"""A child agent in its own process on a real adapter, against a server on loopback.

By default (``ProcessRunner()``) the child's calls are brokered: the parent makes them with the
real adapter and its SDK, and the child, which holds a keyless stand-in, imports no HTTP client,
no SDK and builds no TLS context. With ``ProcessRunner(broker=False)`` the child calls the SDK
itself. Both wire formats: Chat Completions and Messages.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from support import anthropic_events as ant
from support.openai_chunks import TEXT_STREAM, chunk, usage_chunk
from support.openai_loopback import LoopbackServer, Reply, sse
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension, SubAgentTaskStatus
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.model import Model
from zett_agent.models.anthropic import AnthropicModel
from zett_agent.models.openai import OpenAIChatModel
from zett_agent.runners import ProcessRunner
from zett_agent.testing import FunctionModel
from zett_agent.tools import AgentTool

HANG_GUARD = 60

#: what an HTTP client or an SDK would bring into a process, had it one
HTTP_MODULES = (
    "ssl",
    "_ssl",
    "http.client",
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "h11",
    "anyio",
    "openai",
    "anthropic",
    "certifi",
    "truststore",
)


def _pid() -> str:
    """The child's pid, and which of the HTTP modules it has imported by then."""
    return json.dumps({"pid": os.getpid(), "modules": sorted(set(HTTP_MODULES) & set(sys.modules))})


PID_TOOL = AgentTool("pid", "Return the process id.", {"type": "object", "properties": {}}, _pid)


def asyncio_imports() -> set[str]:
    """The HTTP modules ``import asyncio`` alone brings into a fresh interpreter (its own
    ``ssl``: ``asyncio.base_events``, ``selector_events`` and ``sslproto`` import it)."""
    code = f"import asyncio, sys; print(' '.join(set({HTTP_MODULES!r}) & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, text=True)
    return set(out.stdout.split())


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


def openai_tool_call() -> list[bytes]:
    call = {"index": 0, "id": "call-1", "type": "function", "function": {"name": "pid"}}
    return sse(
        chunk(
            {
                "role": "assistant",
                "tool_calls": [{**call, "function": {"name": "pid", "arguments": ""}}],
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
        chunk({}, finish="tool_calls"),
        usage_chunk(20, 5),
    )


async def run_child_on(
    model: Model, replies: list[Reply], server: LoopbackServer, **runner: Any
) -> tuple[str, Any]:
    definition = SubAgentDefinition(
        "remote", "a child on a real endpoint", "You are the remote child.", model=model,
        tools=(PID_TOOL,),
    )  # fmt: skip
    async with AsyncSubAgentExtension([definition], runner=ProcessRunner(**runner)) as extension:
        client = await create_agent(
            FunctionModel(parent_step),
            config=AgentRunConfig(session_id="parent"),
            extensions=[extension],
        )
        async with client, asyncio.timeout(HANG_GUARD):
            answer = await client.run("go")
            [task] = extension.tasks("parent")  # closing the client releases it
            info = extension.task_info(task)
    return answer.content, (task, info)


@pytest.mark.parametrize("brokered", [True, False], ids=["brokered-default", "direct"])
async def test_a_child_on_openai_streams_uses_a_tool_and_imports_no_http_when_brokered(
    brokered: bool,
) -> None:
    replies = [Reply(chunks=openai_tool_call()), Reply(chunks=TEXT_STREAM)]
    async with LoopbackServer(replies) as server:
        model = OpenAIChatModel("test-model", base_url=server.url)
        options = {} if brokered else {"broker": False}
        answer, (task, info) = await run_child_on(model, replies, server, **options)
    assert answer == "Hello"
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
    modules = set(child["modules"])
    if brokered:
        assert info["broker"]["calls"] == 2
        # a running brokered child holds no HTTP client, no SDK, no CA bundle: only the ssl
        # module asyncio imports for itself in every process
        assert modules <= asyncio_imports(), modules
        assert not modules & {"http.client", "httpx", "httpx2", "openai", "anthropic", "certifi"}
    else:
        assert "broker" not in info
        assert {"openai", "httpx2" if "httpx2" in sys.modules else "httpx"} <= modules


async def test_a_child_on_anthropic_is_brokered_like_the_openai_one() -> None:
    replies = [
        Reply(chunks=ant.tool_message("toolu_1", "pid", {})),
        Reply(chunks=ant.text_message("Hel", "lo")),
    ]
    async with LoopbackServer(replies) as server:
        model = AnthropicModel("claude-test", base_url=server.url.removesuffix("/v1"), api_key="k")
        answer, (task, info) = await run_child_on(model, replies, server)
    assert answer == "Hello"
    assert task.status is SubAgentTaskStatus.COMPLETED, task.error
    assert (task.turns, task.tool_calls, task.last_tool) == (2, 1, "pid")
    assert (task.input_tokens, task.output_tokens) == (20 + 12, 5 + 3)
    assert info["broker"]["calls"] == 2
    first, second = server.requests
    assert first.body["system"] == "You are the remote child."
    [result] = second.body["messages"][-1]["content"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_1"
    child = json.loads(result["content"])
    assert child["pid"] != os.getpid()
    assert set(child["modules"]) <= asyncio_imports()
