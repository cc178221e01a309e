"""What the runtime tests watch an agent with: ``Recorder`` (every hook call), ``EventLog``
(every event), the ``echo`` tool, and ``cancelled_once`` (a run cancelled at a moment)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from zett_agent.agent import Agent, AgentRunContext
from zett_agent.events import AgentEvent
from zett_agent.extensions import Extension
from zett_agent.messages import AssistantMessage, ToolCall
from zett_agent.tools import ToolResult, tool


@tool
def echo(text: str) -> str:
    """Return the text unchanged.

    Args:
        text: What to echo.
    """
    return text


class Recorder(Extension):
    """Records every hook call as (hook name, detail) into a shared log."""

    def __init__(self, log: list[tuple[str, str]], name: str | None = None) -> None:
        self.log = log
        if name is not None:
            self.name = name

    def _add(self, hook: str, detail: Any = "") -> None:
        self.log.append((f"{self.name}.{hook}", str(detail)))

    async def on_tool(self, context: AgentRunContext) -> None:
        self._add("on_tool")

    async def on_state(self, context: AgentRunContext) -> None:
        self._add("on_state")

    async def on_message(self, context: AgentRunContext) -> None:
        self._add("on_message", len(context.messages))

    async def before_run(self, context: AgentRunContext) -> None:
        self._add("before_run", len(context.messages))

    async def before_turn(self, context: AgentRunContext) -> None:
        self._add("before_turn", context.turn)

    async def before_model(self, context: AgentRunContext, request: Any) -> None:
        self._add("before_model", context.turn)

    async def after_model(self, context: AgentRunContext, response: Any) -> None:
        self._add("after_model", len(context.messages))

    async def before_tool(self, context: AgentRunContext, call: ToolCall) -> None:
        self._add("before_tool", call.id)

    async def after_tool(
        self, context: AgentRunContext, call: ToolCall, result: ToolResult, error: Any
    ) -> None:
        self._add("after_tool", call.id)

    async def after_turn(self, context: AgentRunContext, result: AssistantMessage) -> None:
        self._add("after_turn", context.turn)

    async def after_run(self, context: AgentRunContext, result: AssistantMessage) -> None:
        self._add("after_run", result.content)

    async def on_success(self, context: AgentRunContext, result: AssistantMessage) -> None:
        self._add("on_success", result.content)

    async def on_error(self, context: AgentRunContext, error: BaseException) -> None:
        self._add("on_error", type(error).__name__)

    async def on_compact(self, context: AgentRunContext) -> None:
        self._add("on_compact")


class EventLog(Extension):
    """Keeps every published event."""

    def __init__(self) -> None:
        self.events: list[AgentEvent] = []

    async def on_event(self, context: AgentRunContext, event: AgentEvent) -> None:
        self.events.append(event)

    def types(self) -> list[str]:
        return [e.type.name for e in self.events]


async def cancelled_once(agent: Agent, started: asyncio.Event) -> None:
    """Run ``agent`` and cancel the run once ``started`` is set; the run must end in
    ``CancelledError``."""
    run = asyncio.create_task(agent.run("go"))
    await started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
