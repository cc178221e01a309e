"""Child models of the runner contract tests, in an importable module (children load it
cheaply); the behaviours every test shares are in ``support.children``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator

from support.children import announce, reply
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.model import ModelEvent, ModelRequest, RetryOptions


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
            announce(self.path, self.label)
            args = {"subagent_type": self.subagent_type, "description": "deeper", "prompt": "go"}
            yield reply(AssistantMessage(tool_calls=(ToolCall("s", "task_start", args),)))
        elif len(results) == 1:
            task_id = json.loads(results[0].text)["task_id"]
            args = {"task_id": task_id, "wait_seconds": 600}
            yield reply(AssistantMessage(tool_calls=(ToolCall("o", "task_output", args),)))
        else:
            yield reply(AssistantMessage(f"{self.label}: {json.loads(results[-1].text)}"))


class Metrics:
    """A ``metrics`` object: real state, a lock, nothing a child could receive."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[tuple[str, float]] = []

    def record(self, subagent_type: str, elapsed: float) -> None:
        with self.lock:
            self.records.append((subagent_type, elapsed))


metrics = Metrics()
