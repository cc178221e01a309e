"""An OpenAI-compatible Chat Completions endpoint on loopback whose answers come from a function.

The function gets each request back as the runtime's ``ModelRequest`` (messages, tools, system
prompt) and returns the ``AssistantMessage`` to stream, so an offline model of a program can
stand behind a real HTTP endpoint: the program's real-model path (the adapter in the parent and
in every child process, HTTP, SSE) runs end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from zett_agent.messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolMessage,
    ToolStatus,
    UserMessage,
)
from zett_agent.model import ModelEventKind, ModelRequest, ToolSpec
from zett_agent.testing import FunctionModel

Answer = Callable[[ModelRequest], Any]
"""What a ``FunctionModel`` would take: request -> message, text or response (or awaitable)."""


def to_request(body: dict[str, Any]) -> ModelRequest:
    """The Chat Completions body back into the runtime's request (what offline models read)."""
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
    tools = tuple(
        ToolSpec(
            t["function"]["name"], t["function"].get("description", ""), t["function"]["parameters"]
        )
        for t in body.get("tools") or ()
    )
    return ModelRequest(tuple(messages), tools=tools, system_prompt=system)


async def reply_of(answer: Answer, request: ModelRequest) -> AssistantMessage:
    async for event in FunctionModel(answer).stream(request):
        if event.kind is ModelEventKind.COMPLETED:
            assert event.response is not None
            return event.response.message
    raise AssertionError("the offline model gave no answer")


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


class OfflineEndpoint:
    """``async with OfflineEndpoint(answer) as endpoint:`` serves ``endpoint.url`` (``.../v1``).

    Every request body is kept in ``requests`` and its headers (names in lower case) at the
    same index in ``headers``; one connection carries one request.
    """

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.url = ""
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> OfflineEndpoint:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._handle(reader, writer))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            headers = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.partition(":") for line in head.split("\r\n")[1:])
                if name
            }
            body = json.loads(await reader.readexactly(int(headers["content-length"])))
            self.headers.append(headers)
            self.requests.append(body)
            payload = b"".join(sse_chunks(await reply_of(self.answer, to_request(body))))
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
