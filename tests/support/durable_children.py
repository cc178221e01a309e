"""Children of the durable-task tests, in an importable module so child processes load them.

``Steps`` is a model that asks for one ``work`` call per step, then answers with a report;
``work`` does a step's effect. Both write what they did, one line each, to a log file the test
reads (``Log``): ``model <step> <pid>`` for each model call, ``tool <step> <key> <pid>`` for
each tool run (``key``: its ``tool_context().idempotency_key``). Where a child dies is set by
marker files the test creates in the log's directory (``die_at``): the child removes the
marker, then SIGKILLs its own process, so the resumed child goes on (``always`` leaves it:
every try dies there).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from support.children import announce
from zett_agent.agent import AgentRunContext
from zett_agent.extensions import Extension
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from zett_agent.tools import AgentTool, tool_context

#: where a child may die
BEFORE_EFFECT = "before"  # in the tool, before its effect: its response is done, it is not
AFTER_EFFECT = "after"  # in the tool, after its effect, before it returns: it runs again
IN_MODEL = "model"  # in the model call of the step, before it answers: it is asked again


def die_at(directory: Path, step: int, where: str, *, always: bool = False) -> Path:
    """Make a child of ``directory`` die at ``step``, ``where`` (once, or every try)."""
    marker = directory / f"die-{step}-{where}{'-always' if always else ''}"
    marker.touch()
    return marker


def _maybe_die(directory: str, step: int, where: str) -> None:
    once = os.path.join(directory, f"die-{step}-{where}")
    if os.path.exists(once):
        os.unlink(once)
        os.kill(os.getpid(), signal.SIGKILL)
    if os.path.exists(once + "-always"):
        os.kill(os.getpid(), signal.SIGKILL)


def _log(directory: str, line: str) -> None:
    fd = os.open(os.path.join(directory, "log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _step(request: ModelRequest) -> int:
    """The step a request is at: one after the last result (``did <n>``), else 0."""
    for message in reversed(request.messages):
        if isinstance(message, ToolMessage) and message.text.startswith("did "):
            return int(message.text.split()[1]) + 1
    return 0


class Steps:
    """Asks for ``work(step=n)`` for n in 0..steps-1, one per turn, then answers.

    The answer: ``report: <steps> steps, results <the tool results, joined>`` and, for each
    prompt after the first (a follow-up), `` | <that prompt>``. ``block_at``: the step whose
    tool call waits for ever, once (its marker ``block-<n>`` in the directory), announcing
    ``blocked`` to ``beacons`` first.
    """

    retry = RetryOptions(max_retries=0)

    def __init__(self, directory: str, steps: int, beacons: str = "") -> None:
        self.directory = directory
        self.steps = steps
        self.beacons = beacons

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        step = _step(request)
        _maybe_die(self.directory, step, IN_MODEL)
        _log(self.directory, f"model {step} {os.getpid()}")
        prompts = [m.content for m in request.messages if isinstance(m, UserMessage)]
        if step < self.steps and len(prompts) == 1:
            call = ToolCall(f"call-{step}", "work", {"step": step, "beacons": self.beacons})
            message = AssistantMessage(tool_calls=(call,))
        else:
            results = ",".join(m.text for m in request.messages if isinstance(m, ToolMessage))
            follow = "".join(f" | {p}" for p in prompts[1:])
            message = AssistantMessage(f"report: {step} steps, results {results}{follow}")
        yield ModelEvent.completed(ModelResponse(message, Usage(10, 5)))


async def _work(directory: str, step: int, beacons: str) -> str:
    context = tool_context()
    _maybe_die(directory, step, BEFORE_EFFECT)
    _log(directory, f"tool {step} {context.idempotency_key} {os.getpid()}")
    _maybe_die(directory, step, AFTER_EFFECT)
    block = os.path.join(directory, f"block-{step}")
    if os.path.exists(block):  # noqa: ASYNC240 (a quick check of the test's marker)
        os.unlink(block)
        announce(beacons, "blocked")
        await asyncio.Event().wait()  # until the test kills this child (or its host)
    return f"did {step}"


@dataclass
class Log:
    """What the children of one test did, read from their log."""

    model: list[tuple[int, int]]  # (step, pid) per model call
    tool: list[tuple[int, str, int]]  # (step, key, pid) per tool run

    @classmethod
    def read(cls, directory: Path) -> Log:
        model, tool = [], []
        path = directory / "log"
        for line in path.read_text().splitlines() if path.exists() else ():
            kind, *rest = line.split()
            if kind == "model":
                model.append((int(rest[0]), int(rest[1])))
            else:
                tool.append((int(rest[0]), rest[1], int(rest[2])))
        return cls(model, tool)

    def model_steps(self) -> list[int]:
        return [step for step, _ in self.model]

    def tool_steps(self) -> list[int]:
        return [step for step, _, _ in self.tool]


def work_tool(directory: str) -> AgentTool:
    """The ``work`` tool of children whose log is in ``directory``."""

    async def work(step: int, beacons: str = "") -> str:
        return await _work(directory, step, beacons)

    return AgentTool(
        "work",
        "Do one step of the work.",
        {
            "type": "object",
            "properties": {"step": {"type": "integer"}, "beacons": {"type": "string"}},
            "required": ["step"],
        },
        work,
    )


class Compacts(Extension):
    """Replaces the conversation with its input and the last ``keep`` messages, each turn
    after ``after`` turns (a child that compacts its history)."""

    def __init__(self, after: int, keep: int = 2) -> None:
        super().__init__()
        self.after = after
        self.keep = keep

    async def before_turn(self, context: AgentRunContext) -> None:
        messages = context.messages
        if context.turn > self.after and len(messages) > self.keep + 1:
            summary = UserMessage(f"{messages[0].content} (earlier steps compacted)")  # type: ignore[union-attr]
            context.replace_messages([summary, *messages[-self.keep :]])


class BrokeredSteps(Steps):
    """``Steps`` as a brokerable model: a brokered child's parent makes its calls."""

    brokerable = True
    model = "brokered-steps"
