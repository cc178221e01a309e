"""Starting a background task: its record, its slot, its child and its watcher.

``TaskStarter.start`` is ``AsyncSubAgentExtension.start`` once the call was checked. It numbers
the task and takes its session's ``max_concurrent`` slot before anything is awaited, writes the
task to the store (a task the store cannot take never runs), starts its child on the runner,
and hands the running task to its watcher. A task whose child did not start is forgotten again;
a start that finds the extension closing, or its session released, once the runner answered
cancels the child it just started. A durable task is stored with its prompt, and its child
gets an empty journal (``_durable``); its definition must be picklable (each resume ships it
to a new child), and its runner able to send the child the journal's acknowledgements.

The starter owns none of the extension's state: the owner gives it its registry, guard and
watcher, and four calls of its own (``number``, ``launch``, ``closing``, ``durable``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zett_agent.extensions._subagent import open_child_trace
from zett_agent.extensions._tasks._durable import DurableState, check_durable
from zett_agent.extensions._tasks._task import SubAgentTask
from zett_agent.runners._base import SupportsSend, counts_tokens

if TYPE_CHECKING:
    from zett_agent.agent import AgentRunContext
    from zett_agent.extensions._definition import SubAgentDefinition
    from zett_agent.extensions._tasks._task_guard import TaskGuard
    from zett_agent.extensions._tasks._task_registry import TaskRegistry
    from zett_agent.extensions._tasks._task_watch import TaskWatch
    from zett_agent.runners._base import ChildJob
    from zett_agent.runners._span_relay import ChildTrace

__all__ = ["Launch", "TaskStarter"]

#: ``launch(parent_model, definition, session_id=..., prompt=..., trace=...)``: the child's
#: job, started on the runner (``ChildAgentExtension._launch``)
Launch = Callable[..., Awaitable["ChildJob"]]


@dataclass(frozen=True, slots=True)
class TaskStarter:
    """Starts the owner's background tasks.

    Attributes:
        registry: The sessions' task records (slots, store).
        guard: Counts a task's tokens against its budgets.
        watcher: Follows each running task to its outcome.
        number: The next task number (shared with the store's restored numbering).
        launch: Starts a child on the runner (see ``Launch``).
        closing: Whether the owner's ``close()`` has begun.
        durable: Whether the owner's tasks are durable.
    """

    registry: TaskRegistry
    guard: TaskGuard
    watcher: TaskWatch
    number: Callable[[], int]
    launch: Launch
    closing: Callable[[], bool]
    durable: Callable[[], bool]

    async def start(
        self, context: AgentRunContext, profile: SubAgentDefinition, description: str, prompt: str
    ) -> SubAgentTask:
        """Start one task of ``context``'s session; raises as the owner's ``start`` says."""
        registry = self.registry
        session = registry.admit(context.session_id, context.agent)
        number = self.number()
        task_id = f"task-{number}"
        task = SubAgentTask(
            task_id=task_id,
            parent_session_id=context.session_id,
            session_id=f"{context.session_id}/{task_id}",
            subagent_type=profile.name,
            description=description,
            prompt=prompt,
            token_budget=profile.token_budget,
        )
        durable = self.durable()
        if durable:
            task.durable = DurableState(prompt, profile, context.model)
        # the slot is taken from here on, across the awaits below
        with registry.starting(context.session_id, session):
            # tracing: the child's invoke_agent span (None when off)
            trace = open_child_trace(profile, task_id, task.session_id, description, context.model)
            started = False
            try:
                # stored before its child starts: a task the store cannot take never runs
                await registry.insert(task, number, prompt=prompt if durable else None)
                job = await self.launch(
                    context.model,
                    profile,
                    session_id=task.session_id,
                    prompt=prompt,
                    trace=trace,
                    journal={"steps": [], "next": 1, "follow_up": None} if durable else None,
                    check=check_durable if durable else None,
                )
                if durable and not job.done() and not isinstance(job, SupportsSend):
                    await job.cancel()
                    raise TypeError(
                        "durable tasks need a runner whose children take messages (the journal "
                        f"acknowledges each step): {type(job).__name__} cannot; use "
                        "ProcessRunner (the default), InProcessRunner or RayRunner"
                    )
                if self.closing() or session.released:  # closing began while it started
                    await job.cancel()
                    what = (
                        "AsyncSubAgentExtension was closed"
                        if self.closing()
                        else "this session was released (the agent that ran it was closed)"
                    )
                    raise RuntimeError(f"{what} while the task started; it did not start")
                task.job = job
                task.last_activity = time.monotonic()
                session.add(task)
                started = True
            except BaseException as exc:
                if trace is not None:
                    trace.abandon(exc)
                raise
            finally:
                if not started:
                    registry.delete(task)
        self.follow(task, trace)
        return task

    def follow(self, task: SubAgentTask, trace: ChildTrace | None = None) -> None:
        """Count the started task's tokens as its job reports them, and start its watcher."""
        job = task.job
        assert job is not None
        if counts_tokens(job) and job.tokens() is not None:
            task.trusted_tokens = True
            job.on_tokens(lambda more: self.guard.tokens_counted(task, more))
        task.watcher = asyncio.get_running_loop().create_task(
            self.watcher.watch(task, trace), name=f"zett-agent-{task.task_id}"
        )
