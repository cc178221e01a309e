"""Resuming durable tasks: after their child died, after their host restarted, for a follow-up.

``TaskResumer`` starts a new child for a durable task, from the journal its store holds
(read after every step queued before: ``TaskStore.read_journal``), in three cases:

- ``after_death``: the watcher's child died (``runners._report.died``: a crash, a signal
  from outside, its memory limit, its Ray node lost), the task was not being cancelled,
  stopped or closed, and it died fewer than ``max_resumes`` times since it started: the death
  is recorded with its reason, and the watcher follows the new child;
- ``resume_waiting``: at a session's next request after a restart, each of its tasks the
  store held as running (``DurableState.waiting``) starts again, with the definition of the
  same name and the request's model, and the session is told once (``resumed_text``);
- ``follow_up``: ``task_resume`` on a finished task: the task runs again, same id, with its
  conversation and a follow-up prompt.

A new child replays nothing: its journal rebuilds its conversation, and it goes on from
there (``_child_build``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from zett_agent.extensions._tasks._task_guard import TaskPart
from zett_agent.runners._report import died, failure_reason

if TYPE_CHECKING:
    from zett_agent.agent import AgentRunContext
    from zett_agent.extensions._tasks._task import SubAgentTask
    from zett_agent.extensions._tasks._task_guard import Chores
    from zett_agent.extensions._tasks._task_owner import TaskOwner
    from zett_agent.extensions._tasks._task_registry import TaskRegistry
    from zett_agent.runners._base import ChildJob

__all__ = ["TaskResumer", "resumed_text"]

# the records keep the name they always had: the extension's module
log = logging.getLogger("zett_agent.extensions._async_subagent")

#: ``launch(parent_model, definition, session_id=..., prompt=..., trace=..., journal=...)``
Launch = Callable[..., Awaitable["ChildJob"]]


def resumed_text(task: SubAgentTask) -> str:
    """The notice of a task resumed after its host restarted."""
    return (
        f"Background task {task.task_id} ({task.subagent_type}: {task.description}) resumed "
        "after a restart: it goes on from where it stopped (task_status shows its resumes)."
    )


class TaskResumer(TaskPart):
    """Starts the new children of the owner's durable tasks.

    ``launch`` starts a child on the runner; ``follow`` hands a task that runs again to a
    watcher; ``closing`` says whether the owner's ``close()`` began.
    """

    def __init__(
        self,
        owner: TaskOwner,
        registry: TaskRegistry,
        chores: Chores,
        *,
        launch: Launch,
        follow: Callable[[SubAgentTask], None],
        settle: Callable[[SubAgentTask], None],
        closing: Callable[[], bool],
    ) -> None:
        super().__init__(owner, registry, chores)
        self._launch = launch
        self._follow = follow
        self._settle = settle
        self._closing = closing

    async def after_death(self, task: SubAgentTask) -> bool:
        """Start a new child for ``task`` if its child died and it may resume; whether it did.

        On ``True`` the task's ``job`` is the new child's; on ``False`` the task settles from
        its job's outcome (a resume that could not start leaves its reason as the failure).
        """
        durable, job = task.durable, task.job
        if durable is None or job is None or not job.done():
            return False
        error = job.exception()
        if not died(error) or task.stop_reason is not None or task.cancelling or self._closing():
            return False
        assert error is not None
        reason = failure_reason(error)
        if durable.crashes >= self._owner.max_resumes:
            if durable.crashes:
                task.stop_reason = (
                    f"{reason} (its child died {durable.crashes + 1} times: it was resumed "
                    f"max_resumes={self._owner.max_resumes} times; each try's death is in "
                    "deaths)"
                )
            durable.died(reason)
            self._write(task)
            return False
        durable.died(reason)
        durable.crashes += 1
        durable.resumes += 1
        self._write(task)
        try:
            task.job = await self._start(task)
        except Exception as exc:
            task.stop_reason = f"{reason}, and its child could not be started again: {exc}"
            return False
        if task.cancelling:  # cancelled while the new child started
            await asyncio.shield(task.job.cancel())
        return True

    async def resume_waiting(self, context: AgentRunContext) -> None:
        """Start again the session's tasks its host was running when it stopped.

        Each resumes with the definition of its ``subagent_type`` and the request's model;
        the session is owed a notice for each (``resumed_text``). One that cannot start fails
        with the reason.
        """
        session = self._registry.get(context.session_id)
        if session is None:
            return
        waiting = [t for t in session.tasks.values() if t.durable is not None and t.durable.waiting]
        for task in waiting:
            durable = task.durable
            assert durable is not None
            durable.waiting = False
            durable.model = context.model
            try:
                durable.definition = self._owner.definition(task.subagent_type)
                task.job = await self._start(task)
            except Exception as exc:
                task.stop_reason = f"it could not resume after a restart: {exc}"
                self._settle(task)
                continue
            if self._owner.notify_parent:
                session.due[f"{task.task_id} resumed"] = resumed_text(task)
            self._follow(task)
            if task.cancelling:
                await asyncio.shield(task.job.cancel())

    async def follow_up(self, context: AgentRunContext, task: SubAgentTask, prompt: str) -> None:
        """Run the finished ``task`` again, with its conversation and ``prompt`` after it.

        Raises:
            ValueError: It runs, is not durable, the prompt is empty, or its session may not
                start a task now (``max_concurrent``, its token budget).
            RuntimeError: The extension or its agent is closed, or its child could not start
                (the task is failed again, with that reason).
        """
        durable = task.durable
        if durable is None:
            raise ValueError(
                f"task {task.task_id} is not durable (it was started without durable=True): "
                "it has no journal to resume from; start a new task instead"
            )
        if not task.done():
            raise ValueError(
                f"task {task.task_id} is still {task.status.value}; task_resume continues a "
                "finished task (wait for it, or tell it something with task_message)"
            )
        if not prompt.strip():
            raise ValueError("prompt is empty; say what the task should do next")
        if self._closing():
            raise RuntimeError("AsyncSubAgentExtension is closed; no task can resume")
        session = self._registry.admit(context.session_id, context.agent)
        if session.tasks.get(task.task_id) is not task:
            raise ValueError(f"task {task.task_id} is not a task of this session")
        durable.model = context.model
        durable.definition = self._owner.definition(task.subagent_type)
        with self._registry.starting(context.session_id, session):
            task.reopen()
            durable.crashes = 0
            session.reopen(task)
            self._registry.write(task, status=task.status.value, output=None, error=None)
            self._write(task)
            try:
                task.job = await self._start(task, follow_up=prompt)
            except BaseException as exc:
                task.stop_reason = f"task_resume could not start its child: {exc}"
                self._settle(task)
                raise RuntimeError(task.stop_reason) from exc
        self._follow(task)

    async def _start(self, task: SubAgentTask, follow_up: str | None = None) -> ChildJob:
        """A new child for ``task``, from the journal its store holds."""
        durable = task.durable
        store = self._registry.store
        assert durable is not None and store is not None
        if durable.definition is None:
            durable.definition = self._owner.definition(task.subagent_type)
        steps = await store.read_journal(task.parent_session_id, task.task_id)
        journal: dict[str, Any] = {
            "steps": [[step, text] for step, text in steps],
            "next": durable.next_step,
            "follow_up": follow_up,
        }
        return await self._launch(
            durable.model,
            durable.definition,
            session_id=task.session_id,
            prompt=durable.prompt,
            trace=None,
            journal=journal,
        )

    def _write(self, task: SubAgentTask) -> None:
        store, durable = self._registry.store, task.durable
        if store is not None and durable is not None and not task.evicted:
            store.update_durable(task.parent_session_id, task.task_id, **durable.columns())
