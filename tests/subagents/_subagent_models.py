"""Offline models and tools shipped to child processes by the subagent tests.

They live in an importable module (not in the test files) so child processes load them cheaply.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from zett_agent.tools import AgentTool

Step = AssistantMessage | Callable[[ModelRequest], AssistantMessage]


def call(name: str, **arguments: Any) -> AssistantMessage:
    return AssistantMessage(
        tool_calls=(ToolCall(f"call-{name}-{os.urandom(3).hex()}", name, arguments),)
    )


def tool_results(request: ModelRequest) -> list[ToolMessage]:
    return [m for m in request.messages if isinstance(m, ToolMessage)]


def last_json(request: ModelRequest) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(tool_results(request)[-1].text)
    return result


class StepModel:
    """Answers model call ``n`` of a session with ``steps[n]`` (counting assistant messages)."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = list(steps)
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        index = sum(isinstance(m, AssistantMessage) for m in request.messages)
        step = self.steps[min(index, len(self.steps) - 1)]
        message = step(request) if callable(step) else step
        yield ModelEvent.completed(ModelResponse(message, Usage(10, 5)))


class ChildModel:
    """A child that calls ``tools`` in order (one per turn), then answers ``answer``."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, answer: str = "done", tools: Sequence[tuple[str, dict[str, Any]]] = ()):
        self.answer = answer
        self.tools = list(tools)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        done = len(tool_results(request))
        if done < len(self.tools):
            name, args = self.tools[done]
            message = AssistantMessage(tool_calls=(ToolCall(f"c{done}", name, args),))
        else:
            last = tool_results(request)[-1].text if done else ""
            message = AssistantMessage(
                content=self.answer.format(last=last, pid=os.getpid(), system=request.system_prompt)
            )
        yield ModelEvent.completed(ModelResponse(message, Usage(7, 3)))


class BlockingModel:
    """A child whose model never answers (until its process is killed)."""

    retry = RetryOptions(max_retries=0)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        await asyncio.Event().wait()
        yield ModelEvent.completed(ModelResponse(AssistantMessage("unreachable")))


def _spin(ready_fifo: str = "") -> str:
    if ready_fifo:
        with open(ready_fifo, "wb") as fifo:  # tell the test which process now spins
            fifo.write(str(os.getpid()).encode())
    while True:  # pure Python, never yields to the event loop
        pass


def _segfault() -> str:
    ctypes.string_at(0)
    return "unreachable"


def _hog_memory(megabytes: int) -> str:
    chunks = [bytearray(1024 * 1024) for _ in range(megabytes)]
    return f"allocated {len(chunks)} MiB"


def _burn(seconds: float) -> str:
    end = time.process_time() + seconds
    digest = b""
    while time.process_time() < end:
        for _ in range(1000):
            digest = hashlib.sha256(digest).digest()
    return digest.hex()[:8]


def _whoami() -> str:
    return str(os.getpid())


SPIN = AgentTool(
    "spin",
    "Spin forever.",
    {"type": "object", "properties": {"ready_fifo": {"type": "string"}}},
    _spin,
)
SEGFAULT = AgentTool("segfault", "Crash.", {"type": "object", "properties": {}}, _segfault)
HOG = AgentTool(
    "hog",
    "Allocate memory.",
    {"type": "object", "properties": {"megabytes": {"type": "integer"}}},
    _hog_memory,
)
BURN = AgentTool(
    "burn",
    "Burn CPU.",
    {"type": "object", "properties": {"seconds": {"type": "number"}}},
    _burn,
)
WHOAMI = AgentTool("whoami", "Return the pid.", {"type": "object", "properties": {}}, _whoami)


class GateModel:
    """A child that answers only once the test writes to the FIFO at ``path`` (no sleeping)."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, path: str, answer: str = "released") -> None:
        self.path = path
        self.answer = answer

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        def read() -> bytes:
            with open(self.path, "rb") as fifo:
                return fifo.read()

        await asyncio.to_thread(read)
        yield ModelEvent.completed(ModelResponse(AssistantMessage(self.answer)))
