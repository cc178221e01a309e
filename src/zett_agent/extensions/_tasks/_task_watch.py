"""Following a running background task: its child's events folded in, then its outcome.

``TaskWatch.watch`` is the task's watcher (an asyncio task per background task): it folds
each event of the child into the task (a sign of work, progress, token usage, a confirmed
message, a durable child's journal step), follows a durable task's new child when its child
died and it resumes (``_task_resume``), then settles the task from its job's outcome
(completed, failed, cancelled, or stopped by a budget), writes it to the store, files its
notice, and calls the owner's ``task_finished``. Whatever ends the watcher (even its
cancellation), the task settles. A durable task whose host closed while it ran (``suspended``)
settles here too, but its store still says it runs: the next host on that store resumes it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from zett_agent.extensions._tasks._store_rows import progress_columns
from zett_agent.extensions._tasks._task import SubAgentTaskStatus
from zett_agent.extensions._tasks._task_guard import observe
from zett_agent.process import JobCancelled, PoolClosed
from zett_agent.runners._report import failure_reason, report_content

if TYPE_CHECKING:
    from zett_agent.extensions._tasks._task import SubAgentTask
    from zett_agent.extensions._tasks._task_guard import TaskGuard
    from zett_agent.extensions._tasks._task_journal import TaskJournal
    from zett_agent.extensions._tasks._task_notices import TaskNotices
    from zett_agent.extensions._tasks._task_owner import TaskOwner
    from zett_agent.extensions._tasks._task_registry import TaskRegistry
    from zett_agent.runners._base import ChildJob
    from zett_agent.runners._span_relay import ChildTrace

__all__ = ["SUSPENDED", "TaskWatch"]

#: the error of a durable task its host closed while it ran
SUSPENDED = (
    "suspended: the extension was closed while the task ran; its store keeps it as running, "
    "and an extension opened on that store resumes it"
)


class TaskWatch:
    """Watches the owner's tasks (reads its ``notify_parent`` and ``task_finished``)."""

    def __init__(
        self,
        owner: TaskOwner,
        registry: TaskRegistry,
        guard: TaskGuard,
        notices: TaskNotices,
        journal: TaskJournal,
        resume: Callable[[SubAgentTask], Awaitable[bool]],
    ) -> None:
        self._owner = owner
        self._registry = registry
        self._guard = guard
        self._notices = notices
        self._journal = journal
        #: starts a new child for a durable task whose child died (``TaskResumer.after_death``)
        self._resume = resume

    async def watch(self, task: SubAgentTask, trace: ChildTrace | None = None) -> None:
        """Fold the child's progress into the task, then settle it from the job's outcome.

        A durable task whose child died follows its new child, as long as it resumes.
        """
        try:
            while True:
                job = task.job
                assert job is not None
                try:
                    await self._follow(task, job, trace)
                finally:
                    if trace is not None:  # ended first: who sees the task settled sees its spans
                        trace.end_job(job)
                        trace = None  # a resumed child is not traced
                if task.durable is None or not await self._resume(task):
                    break
        finally:
            # Whatever happened above (even this watcher being cancelled), the task settles.
            self.settle(task)
        await observe(self._owner.task_finished, task)

    async def _follow(self, task: SubAgentTask, job: ChildJob, trace: ChildTrace | None) -> None:
        async for event in job.events():
            if trace is not None and trace.fold(event):  # the child's spans
                continue
            if task.status is SubAgentTaskStatus.PENDING:
                task.transition(SubAgentTaskStatus.RUNNING)
                task.last_activity = time.monotonic()
                self._registry.write(task, status=task.status.value)
                self._guard.arm_stall(task)
            task.pid = job.pid
            self.fold(task, event)
        await job.wait()

    def fold(self, task: SubAgentTask, event: Any) -> None:
        """One event of the child: a sign of work, progress, usage, a message, a journal step."""
        task.last_activity = time.monotonic()
        if task.stalled:  # it works again: a later stall is a new one
            task.stalled = False
            self._guard.arm_stall(task)
        if self._journal.fold(task, event):
            return
        if task.fold_progress(event, count_tokens=not task.trusted_tokens):
            self._registry.write_progress(task)
            self._guard.tokens_counted(task)
        elif type(event) is dict and task.messages is not None:
            kind = event.get("kind")
            if kind == "message_received":
                task.messages.arrived(event.get("id"))
            elif kind == "message_delivered" and task.messages.confirm(event.get("id")):
                self._registry.write(task, messages=task.messages.stored())

    def settle(self, task: SubAgentTask) -> None:
        """Give the task its outcome from its job's (a no-op for a finished task)."""
        if task.done():
            return
        job = task.job
        error: BaseException | None
        if task.suspended:
            error = JobCancelled(SUSPENDED)
        elif job is None and task.cancelling:  # a durable task cancelled before it resumed
            error = JobCancelled()
        elif job is None or not job.done():
            error = RuntimeError("the task's supervisor stopped before the child finished")
        else:
            error = job.exception()
            self._guard.record_usage(task)
        if task.suspended:
            task.error = SUSPENDED
            task.transition(SubAgentTaskStatus.CANCELLED)
        elif task.stop_reason is not None:  # the extension stopped it: that is why it ended
            task.error = task.stop_reason
            task.transition(SubAgentTaskStatus.FAILED)
        elif error is None:
            assert job is not None
            task.output = report_content(job.result())
            task.transition(SubAgentTaskStatus.COMPLETED)
        elif isinstance(error, (JobCancelled, PoolClosed)):
            task.error = failure_reason(error)
            task.transition(SubAgentTaskStatus.CANCELLED)
        else:
            task.error = failure_reason(error)
            task.transition(SubAgentTaskStatus.FAILED)
        if task.stall_timer is not None:
            task.stall_timer.cancel()
            task.stall_timer = None
        if task.messages is not None:
            task.messages.end()
        session = self._registry.get(task.parent_session_id)
        kept = session is not None and session.tasks.get(task.task_id) is task
        notify = kept and self._owner.notify_parent and not task.suspended
        if task.suspended:  # its store still says running: the next host resumes it
            if session is not None and kept:
                session.active -= 1
                self._registry.refresh(task.parent_session_id, session)
            return
        self._registry.write(
            task,
            status=task.status.value,
            error=task.error,
            output=task.output,
            elapsed=task.elapsed,
            notice="due" if notify else "none",
            messages=task.messages.stored() if task.messages is not None else None,
            **progress_columns(task),
        )
        if session is not None and kept:
            gone = session.finish(
                task, notify=self._owner.notify_parent, render=self._notices.render_notice
            )
            if self._registry.store is not None:
                for task_id in gone:
                    self._registry.store.delete(task.parent_session_id, task_id)
            self._registry.refresh(task.parent_session_id, session)
