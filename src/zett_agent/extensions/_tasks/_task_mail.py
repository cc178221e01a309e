"""Messages from the parent to its running tasks: accepting one, and handing it to the child.

``TaskMail.queue`` makes the checks of ``send`` and ``task_message`` (a running task, a
runner that delivers, a non-empty text within bounds), records the message in the task's
``TaskMessages`` (and the store) and starts the task's pump, which hands its queued messages
to the child in order once it runs. The child's confirmations come back as events (see
``AsyncSubAgentExtension._fold``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from zett_agent._text import valid_text
from zett_agent.extensions._tasks._task_guard import TaskPart
from zett_agent.extensions._tasks._task_messages import MessageRecord, MessageState, TaskMessages
from zett_agent.extensions._tasks._task_tools import ended
from zett_agent.runners._base import SupportsSend

if TYPE_CHECKING:
    from zett_agent.extensions._tasks._task import SubAgentTask

__all__ = ["TaskMail"]

# the records keep the name they always had: the extension's module
log = logging.getLogger("zett_agent.extensions._async_subagent")


class TaskMail(TaskPart):
    """The owner's messages to its running tasks (the owner's runner is named in errors)."""

    def queue(self, task: SubAgentTask, text: str, interrupt: bool) -> MessageRecord:
        """Accept a message for a running task and start handing it over.

        Raises as ``AsyncSubAgentExtension.send`` says.
        """
        if not isinstance(text, str):
            raise TypeError(f"a message is a str, got {type(text).__name__}")
        if not isinstance(interrupt, bool):
            raise TypeError(f"interrupt must be True or False, got {interrupt!r:.40}")
        if task.done():
            raise ValueError(
                f"task {task.task_id} has already {ended(task)}, so it can take no message; "
                "read its report with task_output (or start a new task)"
            )
        if task.stop_reason is not None:
            raise ValueError(
                f"task {task.task_id} is being stopped ({task.stop_reason}); it can take no message"
            )
        if not text.strip():
            raise ValueError("the message is empty; say what the task should know or do")
        job = task.job
        if job is None or not isinstance(job, SupportsSend):
            runner = type(self._owner.runner).__name__
            raise NotImplementedError(
                f"this extension's runner ({runner}) cannot deliver messages to running "
                "children; use ProcessRunner (the default), InProcessRunner or RayRunner for "
                "task_message"
            )
        if task.messages is None:
            task.messages = TaskMessages()
        record = task.messages.add(valid_text(text), interrupt)
        self._registry.write(task, messages=task.messages.stored())
        if task.messages.pump is None:
            task.messages.pump = asyncio.get_running_loop().create_task(
                _pump(task, job, task.messages), name=f"zett-agent-messages-{task.task_id}"
            )
            self._chores.add(task.messages.pump)
        return record


async def _pump(task: SubAgentTask, job: SupportsSend, messages: TaskMessages) -> None:
    """Hand the task's queued messages to its child, in order, once it runs."""
    try:
        await task.running.wait()
        while messages.outbox and not task.done():
            record = messages.outbox.popleft()
            record.state = MessageState.SENT  # before: the confirmation may come at once
            try:
                await job.send(record.wire())
            except RuntimeError:  # it ended, or is being killed: nothing more gets there
                return
            except Exception:
                log.exception("sending a message to %s failed", task.task_id)
                return
    finally:
        messages.pump = None
