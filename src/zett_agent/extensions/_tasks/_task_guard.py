"""Budgets and stalls of background tasks: who stops a task, and who notices one stuck.

``TaskGuard`` adds each task's token usage to its session's, stops (kills) a task that went
past its own ``token_budget`` or its session's ``session_token_budget``, reads what a child
used (CPU, memory), and arms a timer per running task that marks it stalled once it showed no
sign of work for ``stall_seconds``. Everything it starts in the background (a stop, a hook)
is a chore of the extension's ``Chores``, which ``close()`` waits for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from zett_agent.extensions._tasks._task import SubAgentTaskStatus
from zett_agent.runners._base import counts_tokens

if TYPE_CHECKING:
    from zett_agent.extensions._tasks._task import SubAgentTask
    from zett_agent.extensions._tasks._task_owner import TaskOwner
    from zett_agent.extensions._tasks._task_registry import TaskRegistry

__all__ = ["Chores", "TaskGuard", "TaskPart", "observe"]

# the records keep the name they always had: the extension's module
log = logging.getLogger("zett_agent.extensions._async_subagent")


async def observe(hook: Callable[[SubAgentTask], Awaitable[None]], task: SubAgentTask) -> None:
    """Run an observer hook (``task_started``...); its errors are logged, never raised."""
    try:
        await hook(task)
    except Exception:
        log.exception("%s(%s) raised; ignored", getattr(hook, "__name__", hook), task.task_id)


class Chores:
    """The extension's background tasks (stops, hooks, message pumps), kept until they end."""

    def __init__(self) -> None:
        self.running: set[asyncio.Task[None]] = set()

    def add(self, chore: asyncio.Task[None]) -> None:
        """Keep ``chore`` until it ends (``close()`` waits); its error is logged."""
        self.running.add(chore)
        chore.add_done_callback(self._done)

    def _done(self, chore: asyncio.Task[None]) -> None:
        self.running.discard(chore)
        if not chore.cancelled() and chore.exception() is not None:
            log.error("%s failed", chore.get_name(), exc_info=chore.exception())

    async def settle(self) -> None:
        """Wait until every chore ended (those a chore starts meanwhile too)."""
        while self.running:
            await asyncio.gather(*list(self.running), return_exceptions=True)


class TaskPart:
    """A part of the extension that works on its tasks: the owner, its registry and chores."""

    def __init__(self, owner: TaskOwner, registry: TaskRegistry, chores: Chores) -> None:
        self._owner = owner
        self._registry = registry
        self._chores = chores


class TaskGuard(TaskPart):
    """Token budgets, usage and stalls of the owner's tasks.

    Reads the owner's ``session_token_budget``, ``stall_seconds``, ``notify_parent`` and its
    ``task_stalled`` hook as they are now.
    """

    def tokens_counted(self, task: SubAgentTask, more: int = 0) -> bool:
        """The task's usage changed: add it to its session's, then stop what went past a budget.

        Runs on the loop for every usage report (and, for a brokered child, as the parent's
        count of its calls changes), so it only compares numbers; a stop kills in the
        background. ``more`` is the estimated input of the model call a brokered child is about
        to make: a call that would take the task past its budget, or its session to its
        budget, stops the task before it is made.

        Returns whether the task may go on (``False`` once it is stopped or ended: the parent
        then makes no more model calls for it).
        """
        job = task.job
        if task.trusted_tokens and job is not None and counts_tokens(job):
            counted = job.tokens()
            if counted is not None:
                # the parent's count of the calls it made is a floor the child cannot lower;
                # the child's own reports count when higher (its calls the parent did not make)
                before = task.total_tokens
                reported_in, reported_out = task.reported_tokens
                task.input_tokens = max(counted[0], reported_in)
                task.output_tokens = max(counted[1], reported_out)
                if task.total_tokens != before:
                    self._registry.write_progress(task)
        used = task.total_tokens
        delta = used - task.counted_tokens
        session = self._registry.sessions.get(task.parent_session_id)  # per usage report
        budget = task.token_budget
        limit = self._owner.session_token_budget
        if delta:  # down too: a brokered call's estimate settled at the usage reported
            task.counted_tokens = used
            if session is not None and session.tasks.get(task.task_id) is task:
                session.spent_tokens += delta
                store = self._registry.store
                if store is not None:
                    store.set_spent(task.parent_session_id, session.spent_tokens)
        if delta > 0:
            if budget is not None and used > budget:
                self.stop(task, f"token budget exceeded (used {used} of {budget} tokens)")
            if session is not None and limit is not None and session.spent_tokens >= limit:
                spent = session.spent_tokens
                for other in session.running():
                    self.stop(
                        other, f"session token budget exceeded (used {spent} of {limit} tokens)"
                    )
        if more > 0:
            needs = f"and its next model call needs about {more} more"
            if budget is not None and used + more > budget:
                self.stop(task, f"token budget exceeded (used {used} of {budget} tokens, {needs})")
            spent = session.spent_tokens if session is not None else 0
            if session is not None and limit is not None and spent + more >= limit:
                self.stop(
                    task, f"session token budget exceeded (used {spent} of {limit} tokens, {needs})"
                )
        return task.stop_reason is None and not task.done()

    def stop(self, task: SubAgentTask, reason: str) -> None:
        """Kill the task's child (its whole tree) because of ``reason``.

        The failed task then says ``reason``. The first reason wins; a finished task is left
        alone.
        """
        if task.done() or task.stop_reason is not None:
            return
        task.stop_reason = reason
        job = task.job
        if job is None:
            return
        stop = asyncio.get_running_loop().create_task(
            job.cancel(), name=f"zett-agent-stop-{task.task_id}"
        )
        self._chores.add(stop)

    def record_usage(self, task: SubAgentTask) -> None:
        """Read what the task's child used (CPU seconds, peak memory) into the task."""
        if task.job is None:
            return
        try:
            usage = task.job.usage()
        except Exception:  # usage is a nicety; never let it break settling
            log.debug("could not read usage of %s", task.task_id, exc_info=True)
            return
        task.cpu_seconds = usage.cpu_seconds
        task.peak_memory_bytes = max(task.peak_memory_bytes, usage.peak_rss_bytes)

    def arm_stall(self, task: SubAgentTask) -> None:
        """Check for a stall ``stall_seconds`` after the child's last sign of work."""
        stall_seconds = self._owner.stall_seconds
        if stall_seconds is None or task.done() or task.stall_timer is not None:
            return
        delay = task.last_activity + stall_seconds - time.monotonic()
        task.stall_timer = asyncio.get_running_loop().call_later(
            max(0.0, delay), self._check_stall, task
        )

    def _check_stall(self, task: SubAgentTask) -> None:
        task.stall_timer = None
        owner = self._owner
        if task.done() or task.stalled or owner.stall_seconds is None:
            return
        if task.idle_seconds < owner.stall_seconds:  # it worked meanwhile: look again later
            self.arm_stall(task)
            return
        task.stalled = True  # re-armed by the child's next sign of work
        session = self._registry.get(task.parent_session_id)
        if owner.notify_parent and session is not None and session.tasks.get(task.task_id) is task:
            session.attention[task.task_id] = task
        self._chores.add(
            asyncio.get_running_loop().create_task(
                observe(owner.task_stalled, task), name=f"zett-agent-stalled-{task.task_id}"
            )
        )

    def needs_attention(self, task: SubAgentTask) -> bool:
        """Whether a running task has been idle beyond ``stall_seconds``."""
        stall_seconds = self._owner.stall_seconds
        return (
            stall_seconds is not None
            and task.status is SubAgentTaskStatus.RUNNING
            and task.idle_seconds >= stall_seconds
        )
