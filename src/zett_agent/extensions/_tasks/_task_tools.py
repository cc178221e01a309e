"""The model's task tools: the five of every request, the opt-in three, and waiting on tasks.

``task_tools`` builds what ``AsyncSubAgentExtension.build_tools`` returns: ``task_start``,
``task_list``, ``task_status``, ``task_output``, ``task_cancel``, then the ``extra_tools``
(``task_wait``, ``task_message``, ``task_resume``). The handlers use the extension's public
methods, and for the rest only the ``TaskAccess`` the extension grants them (reading a
session's task ids, marking a report read, queueing a message).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zett_agent._checks import repeated_names
from zett_agent._text import valid_text
from zett_agent.extensions._subagent import short_repr, start_schema
from zett_agent.extensions._tasks._task import SubAgentTask, SubAgentTaskStatus
from zett_agent.extensions._tasks._task_messages import MAX_MESSAGE_CHARS
from zett_agent.tools import AgentTool

if TYPE_CHECKING:
    from zett_agent.agent import AgentRunContext
    from zett_agent.extensions._definition import SubAgentDefinition
    from zett_agent.extensions._tasks._task_messages import MessageRecord
    from zett_agent.extensions._tasks._task_owner import TaskOwner

__all__ = [
    "DEFAULT_WAIT_SECONDS",
    "EXTRA_TOOLS",
    "MAX_WAIT_IDS",
    "MAX_WAIT_SECONDS",
    "TaskAccess",
    "distinct",
    "ended",
    "extra_tools",
    "extra_tools_option",
    "task_id_property",
    "task_tools",
    "wait_for",
]

#: Longest ``wait_seconds`` a model may ask ``task_output`` and ``task_wait`` for.
MAX_WAIT_SECONDS = 600.0
#: the tools ``extra_tools=`` may name
EXTRA_TOOLS = ("task_wait", "task_message", "task_resume")
#: most ids one ``task_wait`` takes
MAX_WAIT_IDS = 50
#: ``task_wait``'s default ``wait_seconds``
DEFAULT_WAIT_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class TaskAccess:
    """What the task tools may do that the extension's public methods do not offer.

    Granted by the extension (its own bound methods), per request: the tools never touch its
    state themselves.

    Attributes:
        known_ids: The task ids a session has, oldest first.
        mark_read: Record that the model read a finished task's report (no notice owed).
        queue_message: Accept a message for a running task (``task_message``); raises as
            ``AsyncSubAgentExtension.send`` does for a bad one.
    """

    known_ids: Callable[[str], list[str]]
    mark_read: Callable[[SubAgentTask], None]
    queue_message: Callable[[SubAgentTask, str, bool], MessageRecord]


async def wait_for(tasks: Sequence[SubAgentTask], *, every: bool, seconds: float | None) -> None:
    """Return once one of ``tasks`` (``every``: all of them) ended, or ``seconds`` passed.

    ``seconds=None``: no bound. Cancelling the caller cancels no task.
    """
    pending = [t for t in tasks if not t.done()]
    if not pending or (not every and len(pending) < len(tasks)):
        return
    woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    left = len(pending)

    def settled(_: SubAgentTask) -> None:
        nonlocal left
        left -= 1
        if (not every or left == 0) and not woken.done():
            woken.set_result(None)

    for task in pending:
        task.settle_callbacks.append(settled)
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await woken
    finally:
        for task in pending:
            with contextlib.suppress(ValueError):
                task.settle_callbacks.remove(settled)


def task_tools(
    extension: TaskOwner,
    access: TaskAccess,
    context: AgentRunContext,
    subagents: Sequence[SubAgentDefinition],
) -> tuple[AgentTool, ...]:
    """The tools of one request: the five, then the ``extra_tools`` in the order given.

    What ``AsyncSubAgentExtension.build_tools`` returns; each handler works through the
    extension's public methods and the ``access`` it granted.
    """
    session_id = context.session_id
    profiles = "; ".join(f"{d.name}: {d.description}" for d in subagents)
    by_name = {d.name: d for d in subagents}

    async def task_start(subagent_type: str, description: str, prompt: str) -> str:
        definition = by_name.get(subagent_type)
        if definition is None:
            known = ", ".join(repr(n) for n in by_name)
            raise ValueError(
                f"unknown subagent_type {short_repr(subagent_type)}; choose one of: {known}"
            )
        task = await extension.start(context, definition, description=description, prompt=prompt)
        info = extension.task_info(task)
        info.setdefault(
            "hint",
            "running in the background; keep working, then read it with task_output",
        )
        return _json(info)

    async def task_list() -> str:
        tasks = extension.tasks(session_id)
        return _json({"tasks": [extension.task_info(t) for t in tasks]})

    async def task_status(task_id: str) -> str:
        return _json(extension.task_info(extension.get_task(session_id, task_id)))

    async def task_output(task_id: str, wait_seconds: float = 0) -> str:
        if not 0 <= wait_seconds <= MAX_WAIT_SECONDS:
            raise ValueError(
                f"wait_seconds must be between 0 and {MAX_WAIT_SECONDS:g}, got {wait_seconds}"
            )
        task = await extension.wait(extension.get_task(session_id, task_id), wait_seconds)
        info = extension.task_info(task, include_output=True)
        if task.done():
            access.mark_read(task)
        else:
            info.setdefault(
                "hint",
                "still running; do other work, or call task_output again with wait_seconds",
            )
        return _json(info)

    async def task_cancel(task_id: str) -> str:
        task = extension.get_task(session_id, task_id)
        ended_before = task.done()
        await extension.cancel(task)
        access.mark_read(task)
        info = extension.task_info(task)
        if ended_before or task.status is not SubAgentTaskStatus.CANCELLED:
            info.setdefault(
                "hint",
                f"it had already {ended(task)} before task_cancel; nothing was stopped. "
                "Read its report with task_output",
            )
        return _json(info)

    output_schema = _task_id_schema()
    output_schema["properties"]["wait_seconds"] = {
        "type": "number",
        "minimum": 0,
        "maximum": MAX_WAIT_SECONDS,
        "description": "seconds to wait for the report if the task still runs (default 0)",
    }
    return (
        AgentTool(
            "task_start",
            "Start a background task from a subagent profile; returns its task_id at once. "
            f"Profiles: {profiles}",
            start_schema(),
            task_start,
            guidelines=(
                "Use `task_start` for independent work that can run while you continue; the "
                "child does not see this conversation, so give it a complete prompt. You "
                "will be told when it finishes."
            ),
        ),
        AgentTool(
            "task_list",
            "Show every task of this session with its status and progress.",
            {"type": "object", "properties": {}, "additionalProperties": False},
            task_list,
        ),
        AgentTool(
            "task_status",
            "Show one task's status and progress without its report; never waits.",
            _task_id_schema(),
            task_status,
        ),
        AgentTool(
            "task_output",
            "Return a task's report (or its error), waiting up to wait_seconds for it.",
            output_schema,
            task_output,
            guidelines=(
                "Use `task_output` with wait_seconds only when you have nothing else to do; "
                "a task that is still running comes back with status 'running'."
            ),
        ),
        AgentTool(
            "task_cancel",
            "Stop a running task; its process is killed. Returns the task once stopped.",
            _task_id_schema(),
            task_cancel,
        ),
        *extra_tools(extension, access, context, extension.extra_tools),
    )


def extra_tools(
    extension: TaskOwner, access: TaskAccess, context: AgentRunContext, names: Iterable[str]
) -> tuple[AgentTool, ...]:
    """The tools ``names`` (from ``EXTRA_TOOLS``) for one request (``context``)."""
    build = {"task_wait": _task_wait, "task_message": _task_message, "task_resume": _task_resume}
    return tuple(build[name](extension, access, context) for name in names)


def _task_id_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"task_id": task_id_property("the task_id task_start returned")},
        "required": ["task_id"],
        "additionalProperties": False,
    }


def ended(task: SubAgentTask) -> str:
    """``"completed"``, ``"failed"`` or ``"been cancelled"``, as in "it has already ..."."""
    return "been cancelled" if task.status is SubAgentTaskStatus.CANCELLED else task.status.value


def _json(value: Any) -> str:
    return valid_text(json.dumps(value, ensure_ascii=False))


def _tasks(extension: TaskOwner, access: TaskAccess, session_id: str, ids: list[str]) -> list[Any]:
    """The tasks of ``ids`` (repeats once); one ``ValueError`` naming every unknown id."""
    tasks, unknown, errors = [], [], []
    for task_id in dict.fromkeys(ids):
        try:
            tasks.append(extension.get_task(session_id, task_id))
        except ValueError as exc:
            unknown.append(task_id)
            errors.append(str(exc))
    if len(unknown) == 1:
        raise ValueError(errors[0])
    if unknown:
        known = ", ".join(access.known_ids(session_id)) or "none"
        shown = ", ".join(repr(i[:100]) for i in unknown[:10])
        raise ValueError(
            f"{len(unknown)} task_ids are not tasks of this session ({shown}); this session's "
            f"tasks are: {known}"
        )
    return tasks


def _task_wait(extension: TaskOwner, access: TaskAccess, context: AgentRunContext) -> AgentTool:
    session_id = context.session_id

    async def task_wait(
        task_ids: list[str], mode: str = "any", wait_seconds: float = DEFAULT_WAIT_SECONDS
    ) -> str:
        if not 1 <= len(task_ids) <= MAX_WAIT_IDS:
            raise ValueError(
                f"task_ids must list 1 to {MAX_WAIT_IDS} task ids, got {len(task_ids)}"
            )
        if not 0 <= wait_seconds <= MAX_WAIT_SECONDS:
            raise ValueError(
                f"wait_seconds must be between 0 and {MAX_WAIT_SECONDS:g}, got {wait_seconds}"
            )
        tasks = _tasks(extension, access, session_id, task_ids)
        every = mode == "all"
        await wait_for(tasks, every=every, seconds=wait_seconds)
        finished, running = [], []
        for task in tasks:
            if task.done():
                finished.append(extension.task_info(task, include_output=True))
                access.mark_read(task)
            else:
                running.append(extension.task_info(task))
        timed_out = bool(running) if every else not finished
        return _json({"finished": finished, "running": running, "timed_out": timed_out})

    schema = {
        "type": "object",
        "properties": {
            "task_ids": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": 100},
                "minItems": 1,
                "maxItems": MAX_WAIT_IDS,
                "description": "the task_ids to wait for (task_start returned them)",
            },
            "mode": {
                "type": "string",
                "enum": ["any", "all"],
                "description": "'any' (default): return when one of them finished; 'all': "
                "when every one did",
            },
            "wait_seconds": {
                "type": "number",
                "minimum": 0,
                "maximum": MAX_WAIT_SECONDS,
                "description": f"longest wait in seconds (default {DEFAULT_WAIT_SECONDS:g})",
            },
        },
        "required": ["task_ids"],
        "additionalProperties": False,
    }
    return AgentTool(
        "task_wait",
        "Wait until any (or all) of several tasks finished, up to wait_seconds; returns the "
        "finished ones with their reports and the others' status.",
        schema,
        task_wait,
        guidelines=(
            "Use `task_wait` with several task_ids when you have nothing else to do until one "
            "(mode 'any') or all (mode 'all') of them report; reports it returns are read."
        ),
    )


def task_id_property(description: str) -> dict[str, Any]:
    """The JSON schema of a ``task_id`` argument (every task tool takes one the same way)."""
    return {"type": "string", "minLength": 1, "maxLength": 100, "description": description}


def _task_message(extension: TaskOwner, access: TaskAccess, context: AgentRunContext) -> AgentTool:
    session_id = context.session_id

    async def task_message(task_id: str, message: str, interrupt: bool = False) -> str:
        task = extension.get_task(session_id, task_id)
        record = access.queue_message(task, message, interrupt)
        return _json({"task_id": task.task_id, "message_id": record.message_id, "status": "queued"})

    schema = {
        "type": "object",
        "properties": {
            "task_id": task_id_property("the task_id of a running task"),
            "message": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_MESSAGE_CHARS,
                "description": "what to tell the task; it reads it before its next model call",
            },
            "interrupt": {
                "type": "boolean",
                "description": "true: interrupt what the task is doing now (its running tool "
                "calls stop, the ones not started are skipped) so it reads this at once",
            },
        },
        "required": ["task_id", "message"],
        "additionalProperties": False,
    }
    return AgentTool(
        "task_message",
        "Send a running task a message it reads before its next model call (interrupt: at "
        "once); returns a message_id. task_status shows what it received.",
        schema,
        task_message,
        guidelines=(
            "Use `task_message` to correct or extend a running task's instructions instead of "
            "cancelling and restarting it; `task_status` shows `messages.delivered` once the "
            "task read it."
        ),
    )


def _task_resume(extension: TaskOwner, access: TaskAccess, context: AgentRunContext) -> AgentTool:
    async def task_resume(task_id: str, prompt: str) -> str:
        task = extension.get_task(context.session_id, task_id)
        await extension.resume(context, task, prompt)
        info = extension.task_info(task)
        info.setdefault(
            "hint",
            "running again in the background with its conversation; read it with task_output",
        )
        return _json(info)

    schema = {
        "type": "object",
        "properties": {
            "task_id": task_id_property("the task_id of a finished task"),
            "prompt": {
                "type": "string",
                "minLength": 1,
                "maxLength": 100_000,
                "description": "the follow-up: what the task should do next; it sees its own "
                "earlier conversation, not this one",
            },
        },
        "required": ["task_id", "prompt"],
        "additionalProperties": False,
    }
    return AgentTool(
        "task_resume",
        "Continue a finished (completed, failed, cancelled or lost) task with a follow-up "
        "prompt: it runs again, same task_id, with its own conversation.",
        schema,
        task_resume,
        guidelines=(
            "Use `task_resume` to ask a finished task for more (a correction, the next step) "
            "instead of starting a new one: it keeps what it already did and learned."
        ),
    )


def extra_tools_option(value: Iterable[str]) -> tuple[str, ...]:
    """The ``extra_tools=`` option, checked: a tuple of distinct names from ``EXTRA_TOOLS``."""
    if isinstance(value, str):
        raise TypeError(f"extra_tools takes a list of tool names, not a str; write ({value!r},)")
    try:
        names = tuple(value)
    except TypeError:
        raise TypeError(
            f"extra_tools takes a list of tool names, got {type(value).__name__}"
        ) from None
    known = ", ".join(repr(n) for n in EXTRA_TOOLS)
    for name in names:
        if name not in EXTRA_TOOLS:
            raise ValueError(f"unknown extra tool {short_repr(name)}; the extra tools are: {known}")
    repeated = repeated_names(names)
    if repeated:
        raise ValueError(f"extra_tools names a tool twice: {', '.join(repeated)}")
    return names


def distinct(tasks: Iterable[SubAgentTask]) -> list[SubAgentTask]:
    """``tasks`` once each, in order; ``TypeError`` for anything but a ``SubAgentTask``."""
    chosen = list(dict.fromkeys(tasks))
    for task in chosen:
        if not isinstance(task, SubAgentTask):
            raise TypeError(f"expected SubAgentTask objects, got {type(task).__name__}")
    return chosen
