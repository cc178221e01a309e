"""``zett-agent demo --model openai:NAME --base-url URL``: parent and children on an endpoint.

The endpoint is an OpenAI-compatible server on loopback, started by the test, whose answers come
from the demo's own scripted models applied to the conversation each request carries. So the
whole path is real: the CLI, the adapter in the parent and in every child process, HTTP, SSE.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from zett_agent._demo._models import DemoChildModel, DemoParentModel
from zett_agent._demo._scenario import PARENT_PROMPT
from zett_agent.messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolMessage,
    ToolStatus,
    UserMessage,
)
from zett_agent.model import ModelEventKind, ModelRequest

HANG_GUARD = 120


def to_request(body: dict[str, Any]) -> ModelRequest:
    """The Chat Completions body back into the runtime's request (what the scripted models read)."""
    system: str | None = None
    names: dict[str, str] = {}
    messages: list[Message] = []
    for item in body["messages"]:
        role = item["role"]
        if role == "system":
            system = item["content"]
        elif role == "user":
            messages.append(UserMessage(item["content"]))
        elif role == "assistant":
            calls = tuple(
                ToolCall(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in item.get("tool_calls") or ()
            )
            names.update((c.id, c.name) for c in calls)
            messages.append(AssistantMessage(item.get("content") or "", calls))
        elif role == "tool":
            text = item["content"]
            try:
                json.loads(text)
                status = ToolStatus.OK
            except ValueError:
                status = ToolStatus.FAILED
            messages.append(
                ToolMessage(item["tool_call_id"], names[item["tool_call_id"]], text, status)
            )
    return ModelRequest(tuple(messages), system_prompt=system)


async def answer(body: dict[str, Any]) -> AssistantMessage:
    request = to_request(body)
    first = request.messages[0]
    if isinstance(first, UserMessage) and first.content.startswith(PARENT_PROMPT):
        model: Any = DemoParentModel(json.loads(first.content[len(PARENT_PROMPT) :]))
    else:
        model = DemoChildModel()
    async for event in model.stream(request):
        if event.kind is ModelEventKind.COMPLETED:
            assert event.response is not None
            return event.response.message
    raise AssertionError("the scripted model gave no answer")


def sse_chunks(message: AssistantMessage) -> list[bytes]:
    delta: dict[str, Any] = {"role": "assistant", "content": message.content or None}
    if message.tool_calls:
        delta["tool_calls"] = [
            {
                "index": i,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(dict(call.arguments))},
            }
            for i, call in enumerate(message.tool_calls)
        ]
    finish = "tool_calls" if message.tool_calls else "stop"
    chunks = [
        {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
        {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 2}},
    ]
    return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]


class ScriptedEndpoint:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.handlers: set[asyncio.Task[None]] = set()

    def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self.handle(reader, writer))
        self.handlers.add(task)
        task.add_done_callback(self.handlers.discard)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            length = next(
                int(line.split(":", 1)[1])
                for line in head.split("\r\n")
                if line.lower().startswith("content-length:")
            )
            body = json.loads(await reader.readexactly(length))
            self.requests.append(body)
            payload = b"".join(sse_chunks(await answer(body)))
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
                + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


async def test_demo_runs_parent_and_children_on_an_openai_compatible_endpoint(
    tmp_path: Path,
) -> None:
    for i in range(4):
        (tmp_path / f"f{i}.txt").write_text(f"data {i}\n")
    endpoint = ScriptedEndpoint()
    server = await asyncio.start_server(endpoint.accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "zett_agent.cli",
            "demo",
            str(tmp_path),
            "--json",
            "--rounds",
            "100",
            "--hashers",
            "2",
            "--model",
            "openai:scripted",
            "--base-url",
            f"http://127.0.0.1:{port}/v1",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "NO_PROXY": "*"},
        )
        async with asyncio.timeout(HANG_GUARD):
            out, err = await process.communicate()
    finally:
        server.close()
        await asyncio.gather(*endpoint.handlers, return_exceptions=True)
        await server.wait_closed()
    assert process.returncode == 0, err.decode()
    result = json.loads(out)
    statuses = sorted((t["subagent_type"], t["status"]) for t in result["tasks"])
    assert statuses == [
        ("crasher", "failed"),
        ("hasher", "completed"),
        ("hasher", "completed"),
        ("spinner", "cancelled"),
    ]
    assert all(t["input_tokens"] > 0 for t in result["tasks"])  # usage came through the children
    models = {r["model"] for r in endpoint.requests}
    assert models == {"scripted"}
    child_calls = [
        r for r in endpoint.requests if r["messages"][0]["content"].startswith("You are a worker")
    ]
    assert len(child_calls) >= 2 * 2 + 2  # each hasher twice, spinner and crasher once
