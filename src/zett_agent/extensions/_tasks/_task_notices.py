"""Telling the parent about its background tasks: completion and stall notices, read reports.

A finished task owes its session a notice (unless the model already read its report); a
stalled one owes it one too. ``TaskNotices.announce`` adds what is owed to the parent's
request as ``AgentMessage``s, before its next model call or when its next request starts
(with a store, it first records them as delivered). The texts are the owner's
``completion_notice`` and ``stall_notice`` (overridable), whose defaults are
``completion_text`` and ``stall_text``; a notice that raises is skipped and logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from zett_agent._messages import AgentMessage
from zett_agent._text import valid_text
from zett_agent.extensions._tasks._store import TaskStoreError
from zett_agent.extensions._tasks._task import NOTICE_REPORT_CHARS, SubAgentTaskStatus

if TYPE_CHECKING:
    from zett_agent.agent import AgentRunContext
    from zett_agent.extensions._tasks._task import SubAgentTask
    from zett_agent.extensions._tasks._task_owner import TaskOwner
    from zett_agent.extensions._tasks._task_registry import TaskRegistry

__all__ = ["TaskNotices", "completion_text", "stall_text"]

# the records keep the name they always had: the extension's module
log = logging.getLogger("zett_agent.extensions._async_subagent")


class TaskNotices:
    """What the owner's sessions are owed, and its delivery to the parent."""

    def __init__(self, owner: TaskOwner, registry: TaskRegistry) -> None:
        self._owner = owner
        self._registry = registry

    def mark_read(self, task: SubAgentTask) -> None:
        """The model read the finished task's report: no notice is owed for it."""
        registry = self._registry
        session = registry.get(task.parent_session_id)
        if session is not None:
            if task.task_id in session.due:
                registry.write(task, notice="read")
            session.mark_read(task.task_id)
            registry.refresh(task.parent_session_id, session)

    def render_notice(self, task: SubAgentTask) -> str | None:
        """``completion_notice(task)`` as valid Unicode; ``None`` (logged) if it raised."""
        return self.render(self._owner.completion_notice, task)

    def render(
        self, notice: Callable[[SubAgentTask], str | None], task: SubAgentTask
    ) -> str | None:
        """``notice(task)`` as valid Unicode; ``None`` (logged) if it raised."""
        try:
            text = notice(task)
        except Exception:
            log.exception("%s(%s) raised; notice skipped", notice.__name__, task.task_id)
            return None
        return None if text is None else valid_text(str(text))

    async def announce(self, context: AgentRunContext) -> None:
        """Add the notices the session of ``context`` is owed to its request."""
        registry, owner = self._registry, self._owner
        session = registry.get(context.session_id)
        if session is None or not (session.due or session.dropped_notices or session.attention):
            return
        due, dropped = session.take_due()
        stalled = [t for t in session.take_attention() if t.stalled and not t.done()]
        registry.refresh(context.session_id, session)
        store = registry.store
        if store is not None and due:
            # written before the parent sees them: after a restart, a notice is delivered
            # again only if this process never got as far as telling the parent
            for owed in due:
                if not isinstance(owed, str):
                    registry.write(owed, notice="delivered")
            flushed = store.flush()
            if flushed is not None:
                try:
                    await asyncio.shield(flushed)
                except TaskStoreError:
                    log.warning("the store could not record delivered notices", exc_info=True)
        if dropped:
            context.add_message(
                AgentMessage(
                    f"{dropped} earlier background tasks finished and were forgotten (only the "
                    f"last {owner.max_retained} finished tasks are kept) before they could be "
                    "announced; their reports are gone.",
                    source=owner.name,
                )
            )
        for owed in due:
            text = owed if isinstance(owed, str) else self.render_notice(owed)
            if text is not None:
                context.add_message(AgentMessage(text, source=owner.name))
        for task in stalled:
            text = self.render(owner.stall_notice, task)
            if text is not None:
                context.add_message(AgentMessage(text, source=owner.name))


def completion_text(task: SubAgentTask, max_retained: int) -> str:
    """The default ``completion_notice``: see ``AsyncSubAgentExtension.completion_notice``."""
    detail = (
        f": {task.error}" if task.error and task.status is not SubAgentTaskStatus.COMPLETED else ""
    )
    head = (
        f"Background task {task.task_id} ({task.subagent_type}: {task.description}) "
        f"{task.status.value}{detail}."
    )
    unread = task.messages.undelivered() if task.messages is not None else []
    if unread:
        head += (
            f" It ended before it read the message{'s' if len(unread) > 1 else ''} "
            f"{', '.join(unread)}: never delivered."
        )
    if not task.evicted:
        return f"{head} Read its report with task_output."
    forgotten = (
        f"it was evicted (only the last {max_retained} finished tasks are kept) and "
        "can no longer be read with task_output"
    )
    if task.status is not SubAgentTaskStatus.COMPLETED or task.output is None:
        return f"{head} Its record was evicted: {forgotten}."
    report = task.output
    if len(report) > NOTICE_REPORT_CHARS:
        cut = f", cut to {NOTICE_REPORT_CHARS} of {len(report)} characters"
        report = report[:NOTICE_REPORT_CHARS] + " [...]"
    else:
        cut = ""
    return f"{head} Its report ({forgotten}{cut}):\n{report}"


def stall_text(
    task: SubAgentTask, stall_seconds: float | None, extra_tools: tuple[str, ...]
) -> str:
    """The default ``stall_notice``: see ``AsyncSubAgentExtension.stall_notice``."""
    options = "check it with task_status"
    if "task_message" in extra_tools:
        options += ", tell it something with task_message"
    return (
        f"Background task {task.task_id} ({task.subagent_type}: {task.description}) has "
        f"shown no sign of work for {task.idle_seconds:.0f} seconds "
        f"(stall_seconds={stall_seconds:g}); it may be stuck. You can {options}, or "
        "stop it with task_cancel."
    )
