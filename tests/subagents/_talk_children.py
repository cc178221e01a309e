"""Children of the talk tests (``task_wait``, ``task_message``, stalls, budgets, the store), in
an importable module so child processes load them cheaply.

The behaviours every test shares (announcing, gates, marks, hanging) are in
``support.children``; these are the talk tests' own.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator

from support.children import announce, reply, schema
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.model import ModelEvent, ModelRequest, RetryOptions, Usage
from zett_agent.tools import AgentTool


class Costly:
    """Answers at once with ``answer``, reporting ``tokens`` (input, output)."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, tokens: tuple[int, int], answer: str = "costly answer") -> None:
        self.tokens = tokens
        self.answer = answer

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        yield reply(AssistantMessage(self.answer), Usage(*self.tokens))


class SpawnThenSpend:
    """Call 1: start a grandchild (``sleep``), beacon its pid as ``label``, then answer with a
    ``hang`` tool call reporting ``tokens``. The tool never returns: only a kill ends it."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, path: str, label: str, tokens: tuple[int, int]) -> None:
        self.path = path
        self.label = label
        self.tokens = tokens

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        grandchild = subprocess.Popen(["sleep", "600"])  # noqa: ASYNC220 (returns at once)
        announce(self.path, f"{self.label}-{grandchild.pid}")
        call = ToolCall("h", "hang", {})
        yield reply(AssistantMessage(tool_calls=(call,)), Usage(*self.tokens))


class BrokeredCostly:
    """A brokerable model (its calls run in the parent): answers with a ``hang`` tool call
    reporting ``tokens``."""

    brokerable = True
    retry = RetryOptions(max_retries=0)
    model = "brokered-costly"

    def __init__(self, tokens: tuple[int, int]) -> None:
        self.tokens = tokens

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        call = ToolCall("h", "hang", {})
        yield reply(AssistantMessage(tool_calls=(call,)), Usage(*self.tokens))


def _report_one_of_three() -> str:
    from zett_agent.process import emit

    emit({"kind": "progress", "done": 1, "total": 3})
    return "one of three done"


PROGRESS_ONE = AgentTool(
    "progress",
    "Do a third of the work.",
    schema(),
    _report_one_of_three,
)


class ProgressThenBlock:
    """Call 1: the ``progress`` tool (one of three done). Call 2: beacon ``label``, then wait
    until the process is killed."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, path: str, label: str) -> None:
        self.path = path
        self.label = label

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if not any(isinstance(m, ToolMessage) for m in request.messages):
            yield reply(AssistantMessage(tool_calls=(ToolCall("p", "progress", {}),)), Usage(4, 2))
            return
        announce(self.path, self.label)
        await asyncio.Event().wait()
        yield reply(AssistantMessage("unreachable"))
