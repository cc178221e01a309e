"""Offline scripted models shared by the tests that drive a parent agent and child processes.

Kept in an importable module (pytest puts ``tests/`` on ``sys.path``; the process pool's launcher
inherits it), so child processes load these classes by reference, cheaply.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage

Step = AssistantMessage | Callable[[ModelRequest], AssistantMessage | Awaitable[AssistantMessage]]


def tool_results(request: ModelRequest) -> list[ToolMessage]:
    return [m for m in request.messages if isinstance(m, ToolMessage)]


def last_json(request: ModelRequest) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(tool_results(request)[-1].text)
    return result


class StepModel:
    """Answers model call ``n`` of a session with ``steps[n]`` (counting assistant messages;
    the last step repeats). A step is a message or a function of the request returning one,
    or an awaitable of one: a step may wait on what a child did before it answers."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = list(steps)
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        index = sum(isinstance(m, AssistantMessage) for m in request.messages)
        step = self.steps[min(index, len(self.steps) - 1)]
        message = step(request) if callable(step) else step
        if inspect.isawaitable(message):
            message = await message
        yield ModelEvent.completed(ModelResponse(message, Usage(10, 5)))


class ToolsThenAnswer:
    """A child that calls ``tools`` in order (one per turn), then answers ``answer``.

    ``answer`` may use ``{last}`` (the last tool result), ``{pid}`` and ``{system}`` (the
    system prompt it was given).
    """

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
            text = self.answer.format(last=last, pid=os.getpid(), system=request.system_prompt)
            message = AssistantMessage(content=text)
        yield ModelEvent.completed(ModelResponse(message, Usage(7, 3)))
