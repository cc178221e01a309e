"""What the soak's children run, and the extension subclass that keeps the soak's ledger.

Every child runs ``ScriptedChild``: its prompt is a JSON script naming the outcome to act out.
This module is imported by the children (pytest put its directory on ``sys.path``, which the
pool's launcher inherits), so it imports only what a child needs.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

from support.children import hog_memory, segfault, spin
from zett_agent.extensions.async_subagent import (
    AsyncSubAgentExtension,
    SubAgentTask,
    SubAgentTaskStatus,
)
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from zett_agent.tools import AgentTool


def send_beacon(path: str, text: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(text.encode(), path)


def _step(n: int) -> str:
    return f"step {n} done"


def _exit7() -> str:
    os._exit(7)


def _tool(name: str, handler: Any, **properties: Any) -> AgentTool:
    return AgentTool(name, name, {"type": "object", "properties": properties}, handler)


TOOLS = (
    _tool("step", _step, n={"type": "integer"}),
    _tool("segfault", segfault),
    _tool("exit7", _exit7),
    _tool("hog", hog_memory, megabytes={"type": "integer"}),
    _tool("spin", spin),
)

#: the tool a crashing kind calls first
CRASH_TOOL = {
    "segfault": ("segfault", {}),
    "exit": ("exit7", {}),
    "memory": ("hog", {"megabytes": 1024}),
    "cpu": ("spin", {}),
}


def big_report(token: str, size: int) -> str:
    return f"{token}:" + "W" * size


class ScriptedChild:
    """A child model that acts out the script in its prompt (JSON)."""

    retry = RetryOptions(max_retries=0)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        prompt = next(m for m in request.messages if isinstance(m, UserMessage))
        script = json.loads(str(prompt.content))
        kind, token = script["kind"], script["token"]
        done = sum(isinstance(m, ToolMessage) for m in request.messages)
        steps = int(script.get("steps", 0))

        def reply(message: AssistantMessage) -> ModelEvent:
            return ModelEvent.completed(ModelResponse(message, Usage(5, 2)))

        if kind in CRASH_TOOL:
            name, args = CRASH_TOOL[kind]
            yield reply(AssistantMessage(tool_calls=(ToolCall("c0", name, args),)))
            return
        if kind == "fail":
            raise RuntimeError(f"boom {token}")
        if kind in ("complete", "cancel_streaming") and done < steps:
            # one progress turn per step: turn_started / turn_finished events stream out
            call = ToolCall(f"c{done}", "step", {"n": done})
            yield reply(AssistantMessage(tool_calls=(call,)))
            return
        if kind == "complete":
            yield reply(AssistantMessage(f"ok:{token}"))
            return
        if kind == "cancel_writing":
            send_beacon(script["beacon"], f"{token} writing")
            yield reply(AssistantMessage(big_report(token, int(script["big"]))))
            return
        if kind == "cancel_streaming":
            send_beacon(script["beacon"], f"{token} streaming")
        # cancel_before, cancel_streaming (after its steps), timeout: work until killed
        await asyncio.Event().wait()
        yield reply(AssistantMessage("unreachable"))


class SoakExtension(AsyncSubAgentExtension):
    """Reports every start, finish and cancel to the soak's ledger.

    The ledger stays in the parent without any help: the extension object never travels to a
    child (it does not override ``_create_child``, so not even its class does).
    """

    def __init__(self, *args: Any, ledger: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ledger = ledger

    async def task_started(self, task: SubAgentTask) -> None:
        self._ledger.started(task)

    async def task_finished(self, task: SubAgentTask) -> None:
        self._ledger.finished(task)

    async def cancel(self, task: SubAgentTask) -> SubAgentTask:
        self._ledger.cancel_requested(task, task.status)
        return await super().cancel(task)


__all__ = ["TOOLS", "ScriptedChild", "SoakExtension", "SubAgentTaskStatus", "big_report"]
