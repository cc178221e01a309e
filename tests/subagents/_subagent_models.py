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
from collections.abc import AsyncIterator
from typing import Any

from _scripted_models import ToolsThenAnswer
from zett_agent.messages import AssistantMessage, ToolCall
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions
from zett_agent.tools import AgentTool

ChildModel = ToolsThenAnswer


def call(name: str, **arguments: Any) -> AssistantMessage:
    call_id = f"call-{name}-{os.urandom(3).hex()}"
    return AssistantMessage(tool_calls=(ToolCall(call_id, name, arguments),))


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


def _burn_timed(seconds: float) -> str:
    """Burn CPU; return when it started and ended (wall clock), as JSON."""
    start = time.time()
    _burn(seconds)
    return json.dumps({"start": start, "end": time.time()})


BURN_TIMED = AgentTool(
    "burn",
    "Burn CPU, say when.",
    {"type": "object", "properties": {"seconds": {"type": "number"}}},
    _burn_timed,
)


def _report_progress() -> str:
    from zett_agent.process import emit

    emit({"kind": "progress", "done": 1, "total": 3})
    emit({"kind": "progress", "done": 2, "total": 3})
    # Not counts: each is ignored, and the last good report stands.
    for bad in ({"done": -1}, {"done": True}, {"done": "3"}, {"done": 3, "total": 2.5}, {}):
        emit({"kind": "progress", **bad})
    return "reported"


PROGRESS = AgentTool(
    "progress", "Report progress.", {"type": "object", "properties": {}}, _report_progress
)


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
