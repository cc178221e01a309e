"""Child models of the seed-contract tests, in an importable module (children load it cheaply).

Children report moments to the test through a datagram socket (``Beacons`` in the tests):
``"<label> <pid>"``, so a test waits on what children did instead of sleeping.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from collections.abc import AsyncIterator

from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions


def beacon(path: str, label: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(f"{label} {os.getpid()}".encode(), path)


def _reply(message: AssistantMessage) -> ModelEvent:
    return ModelEvent.completed(ModelResponse(message))


class AnnounceAndBlock:
    """A child that says it runs (``label``) and then waits until its process is killed."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, path: str, label: str) -> None:
        self.path = path
        self.label = label

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        beacon(self.path, self.label)
        await asyncio.Event().wait()
        yield _reply(AssistantMessage("unreachable"))


class AnnounceAndGate:
    """A child that says it runs, then answers once the test writes to the FIFO ``gate``."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, path: str, label: str, gate: str, answer: str = "released") -> None:
        self.path = path
        self.label = label
        self.gate = gate
        self.answer = answer

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        beacon(self.path, self.label)

        def read() -> bytes:
            with open(self.gate, "rb") as fifo:
                return fifo.read()

        await asyncio.to_thread(read)
        yield _reply(AssistantMessage(self.answer))


class Orchestrator:
    """A child that starts a child of its own (``subagent_type``) and waits for its report.

    It announces ``label`` at its first model call, in its own process.
    """

    retry = RetryOptions(max_retries=0)

    def __init__(self, path: str, label: str, subagent_type: str) -> None:
        self.path = path
        self.label = label
        self.subagent_type = subagent_type

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        results = [m for m in request.messages if isinstance(m, ToolMessage)]
        if not results:
            beacon(self.path, self.label)
            args = {"subagent_type": self.subagent_type, "description": "deeper", "prompt": "go"}
            yield _reply(AssistantMessage(tool_calls=(ToolCall("s", "task_start", args),)))
        elif len(results) == 1:
            task_id = json.loads(results[0].text)["task_id"]
            args = {"task_id": task_id, "wait_seconds": 600}
            yield _reply(AssistantMessage(tool_calls=(ToolCall("o", "task_output", args),)))
        else:
            yield _reply(AssistantMessage(f"{self.label}: {json.loads(results[-1].text)}"))


class Metrics:
    """The guide's ``metrics`` object: real state, a lock, nothing a child could receive."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[tuple[str, float]] = []

    def record(self, subagent_type: str, elapsed: float) -> None:
        with self.lock:
            self.records.append((subagent_type, elapsed))


metrics = Metrics()
