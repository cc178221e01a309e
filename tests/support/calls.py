"""What a scripted parent model says: tool calls, task starts and a final answer.

The one way the tests build a parent's (or a scripted child's) assistant messages: ``call`` for
one tool call, ``calls`` for several at once, ``task_start``/``start``/``starts`` for the
``task_start`` tool, ``final`` for the answer that ends a run, ``tool_call`` for a bare
``ToolCall`` (any arguments, also malformed ones), ``one_task_reported`` for a whole script
that starts one task and answers with its report.
"""

from __future__ import annotations

import os
from typing import Any

from support.scripted_models import Step, last_json
from zett_agent.messages import AssistantMessage, ToolCall
from zett_agent.model import ModelRequest

Pair = tuple[str, dict[str, Any]]


def tool_call(
    name: str, arguments: Any = None, /, *, call_id: str | None = None, **kwargs: Any
) -> ToolCall:
    """One call of tool ``name``: its arguments are ``arguments`` when given (anything, for bad
    input), else the keyword arguments; its id is ``call_id``, else a fresh
    ``call-<name>-<hex>``."""
    args = kwargs if arguments is None else arguments
    return ToolCall(call_id or f"call-{name}-{os.urandom(3).hex()}", name, args)


def call(name: str, /, *, call_id: str | None = None, **arguments: Any) -> AssistantMessage:
    """An assistant message with one call of tool ``name`` (see ``tool_call``)."""
    return AssistantMessage(tool_calls=(tool_call(name, arguments, call_id=call_id),))


def calls(*items: Pair | ToolCall) -> AssistantMessage:
    """An assistant message with several tool calls at once, in order: ``(name, arguments)``
    pairs (ids ``c<i>-<name>``) or ready ``ToolCall``s (their own ids)."""
    return AssistantMessage(
        tool_calls=tuple(
            item if isinstance(item, ToolCall) else ToolCall(f"c{i}-{item[0]}", *item)
            for i, item in enumerate(items)
        )
    )


def task_start(subagent_type: str = "worker", description: str = "t", prompt: str = "p") -> Pair:
    """A ``task_start`` call as a ``(name, arguments)`` pair, for ``calls``."""
    return (
        "task_start",
        {"subagent_type": subagent_type, "description": description, "prompt": prompt},
    )


def start(*types: str, prompt: str = "go") -> AssistantMessage:
    """One assistant message starting a task of each type, each described by its type and
    prompted with ``prompt``."""
    return calls(*(task_start(kind, kind, prompt) for kind in types))


def starts(n: int, subagent_type: str = "worker") -> AssistantMessage:
    """One assistant message starting ``n`` tasks of one type (described ``t0``, ``t1``, ...)."""
    return calls(*(task_start(subagent_type, f"t{i}") for i in range(n)))


def read_output(request: ModelRequest) -> AssistantMessage:
    """A step after a ``task_start``: read the started task's output, waiting up to 30 s."""
    return call("task_output", task_id=last_json(request)["task_id"], wait_seconds=30)


def answer_output(request: ModelRequest) -> AssistantMessage:
    """A step after a ``task_output``: answer with the child's report."""
    return final(last_json(request)["content"])


def one_task_reported(description: str = "d", prompt: str = "p") -> list[Step]:
    """A parent's whole script: start one ``worker`` task, read its output (``read_output``),
    answer with its report (``answer_output``)."""
    return [
        call("task_start", subagent_type="worker", description=description, prompt=prompt),
        read_output,
        answer_output,
    ]


def final(text: str = "finished") -> AssistantMessage:
    """The answer that ends a run."""
    return AssistantMessage(content=text)
