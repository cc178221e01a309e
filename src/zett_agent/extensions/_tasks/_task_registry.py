"""The background-task registry of an ``AsyncSubAgentExtension``: its sessions, bounded.

``TaskRegistry`` keeps each session's records (``SessionTasks``), files the idle ones (nothing
running or starting, no notice owed) least recently used first, forgets those beyond
``max_sessions`` (remembering why, and what they had spent, for a while), and keeps the
``TaskStore`` in step when there is one: a task's row written as it changes, a forgotten
session deleted. It admits a new task into a session (``admit``: not released, budget not
spent, below ``max_concurrent``), holds the session's slot while the task starts
(``starting``) and writes its row before its child starts (``insert``); closing an agent
releases the sessions only it ran (``release``). The extension owns one; what it does with a
task (start, settle, cancel) stays the extension's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from zett_agent.extensions._tasks._store import TaskStore, TaskStoreError
from zett_agent.extensions._tasks._store_rows import progress_columns, restore_tasks, task_row
from zett_agent.extensions._tasks._task import SessionTasks

if TYPE_CHECKING:
    from zett_agent._runtime._agent import Agent
    from zett_agent.extensions._tasks._task import SubAgentTask
    from zett_agent.extensions._tasks._task_owner import TaskOwner

__all__ = ["EVICTED", "RELEASED", "TaskRegistry"]

#: why a session's records are gone, as ``get_task`` says it
EVICTED = (
    "it was idle, nothing running or unread, while more than max_sessions={} idle sessions "
    "were kept"
)
RELEASED = "the agent that ran it was closed"


class TaskRegistry:
    """Every session's task records, the idle ones bounded by the owner's ``max_sessions``.

    Attributes:
        sessions: The sessions with records, by session id.
        idle: The idle sessions (forgettable), least recently used first.
        forgotten: Sessions whose records were forgotten, with why (the most recent ones).
        forgotten_spent: What the forgotten sessions had spent (their token budget goes on).
        store: The registry's file, if any (a copy of the extension in a child has none).
    """

    def __init__(self, owner: TaskOwner) -> None:
        #: read for its ``max_sessions`` and ``max_retained``, as they are now
        self._owner = owner
        self.sessions: dict[str, SessionTasks] = {}
        self.idle: OrderedDict[str, None] = OrderedDict()
        self.forgotten: OrderedDict[str, str] = OrderedDict()
        self.forgotten_spent: OrderedDict[str, int] = OrderedDict()
        self.store: TaskStore | None = None
        #: whether the registry opened its store from a path (and closes it at the end)
        self._own_store = False

    def get(self, session_id: str) -> SessionTasks | None:
        """The session's records, or ``None``; creates nothing, marks nothing used."""
        return self.sessions.get(session_id)

    def holding(self, task: SubAgentTask) -> SessionTasks | None:
        """The session whose records hold ``task`` itself (not a forgotten one), or ``None``."""
        session = self.sessions.get(task.parent_session_id)
        if session is not None and session.tasks.get(task.task_id) is task:
            return session
        return None

    def known_ids(self, session_id: str) -> list[str]:
        """The task ids a session has, oldest first."""
        session = self.sessions.get(session_id)
        return list(session.tasks) if session else []

    def session(self, session_id: str) -> SessionTasks:
        """The session's records, created (with what a forgotten one left) if it has none."""
        session = self.sessions.get(session_id)
        if session is None:
            session = self.sessions[session_id] = SessionTasks(self._owner.max_retained)
            session.forgotten_before = self.forgotten.pop(session_id, None)
            session.spent_tokens = self.forgotten_spent.pop(session_id, 0)
        return session

    def use(self, session_id: str, agent: Agent | None = None) -> SessionTasks | None:
        """The session's records, marked as just used (and used by ``agent``).

        ``None`` if it has none. Creates nothing.
        """
        session = self.sessions.get(session_id)
        if session is not None:
            if agent is not None:
                session.users.add(agent)
            if session_id in self.idle:
                self.idle.move_to_end(session_id)
        return session

    def admit(self, session_id: str, agent: Agent) -> SessionTasks:
        """The records of a session that may start a task now, used by ``agent``.

        Raises:
            RuntimeError: The session is being released (its agent was closed).
            ValueError: Its ``session_token_budget`` is spent, or it already runs
                ``max_concurrent`` tasks (the message lists them).
        """
        session = self.session(session_id)
        if session.released:
            raise RuntimeError(
                "this session is being released (the agent that ran it was closed); no new "
                "task can start in it until that is done"
            )
        session.users.add(agent)
        budget = self._owner.session_token_budget
        if budget is not None and session.spent_tokens >= budget:
            raise ValueError(
                f"this session's token budget is spent: its tasks used {session.spent_tokens} "
                f"of {budget} tokens (session_token_budget={budget}), so no new task can start "
                "in it. Finish with what the tasks reported (task_output)."
            )
        limit = self._owner.max_concurrent
        # ``active`` counts every task not finished yet (never fewer than are running): the
        # walk of the session's tasks is only for a start at the limit, not for every start
        running = session.running() if session.active + session.starting >= limit else ()
        if len(running) + session.starting >= limit:
            listing = ", ".join(
                f"{t.task_id} ({t.subagent_type}, {t.status.value})" for t in running
            )
            if session.starting:
                listing += f"{', ' if listing else ''}{session.starting} starting"
            raise ValueError(
                f"this session already runs {len(running) + session.starting} tasks "
                f"(max_concurrent={self._owner.max_concurrent}): {listing}. Wait for one with "
                "task_output or stop one with task_cancel, then start again."
            )
        return session

    def find(self, session_id: str, task_id: str) -> SubAgentTask:
        """One task of a session; ``ValueError`` as ``AsyncSubAgentExtension.get_task`` says."""
        session = self.use(session_id)
        if session is not None:
            task = session.tasks.get(task_id)
            if task is not None:
                return task
            if task_id in session.evicted:
                raise ValueError(
                    f"task {task_id!r} finished and was evicted (only the last "
                    f"{self._owner.max_retained} finished tasks are kept); start it again if "
                    "needed"
                )
        why = self.forgotten.get(session_id) if session is None else session.forgotten_before
        if why is not None:
            earlier = "this session's" if session is None else "this session's earlier"
            raise ValueError(
                f"task {task_id!r} is not known any more: {earlier} task records were "
                f"forgotten ({why}); start it again if needed"
            )
        known = ", ".join(self.known_ids(session_id)) or "none"
        raise ValueError(f"unknown task_id {task_id!r}; this session's tasks are: {known}")

    def refresh(self, session_id: str, session: SessionTasks) -> None:
        """After a change of what the session runs or owes.

        File it as idle (most recently used) or not, then forget the least recently used idle
        sessions beyond ``max_sessions``.
        """
        if self.sessions.get(session_id) is not session:
            return  # forgotten meanwhile
        if session.idle and not session.released:
            self.idle[session_id] = None
            self.idle.move_to_end(session_id)
        else:
            self.idle.pop(session_id, None)
        max_sessions = self._owner.max_sessions
        while len(self.idle) > max_sessions:
            oldest, _ = self.idle.popitem(last=False)
            self.forget(oldest, EVICTED.format(max_sessions))

    def forget(self, session_id: str, why: str) -> None:
        """Drop a session's records, remembering ``why`` (``get_task`` says it)."""
        session = self.sessions.pop(session_id, None)
        self.idle.pop(session_id, None)
        if session is None:
            return
        for task in session.tasks.values():
            task.evicted = True
        bound = max(self._owner.max_sessions, 1000)
        self.forgotten[session_id] = why
        self.forgotten.move_to_end(session_id)
        while len(self.forgotten) > bound:
            self.forgotten.popitem(last=False)
        if session.spent_tokens:
            self.forgotten_spent[session_id] = session.spent_tokens
            while len(self.forgotten_spent) > bound:
                self.forgotten_spent.popitem(last=False)
        # a session released by its agent's close stays in the store (that is what survives
        # a restart); one forgotten for being idle beyond max_sessions is gone from both
        if self.store is not None and why != RELEASED:
            self.store.delete_session(session_id)

    # -- closing an agent --------------------------------------------------------------------

    async def release(
        self,
        agent: Agent,
        session_ids: frozenset[str],
        cancel: Callable[[SubAgentTask], Awaitable[object]],
    ) -> None:
        """Release the sessions ``agent`` ran that no other open agent uses.

        Cancel their running tasks with ``cancel`` (killing each child's tree), wait for them
        to settle, forget them.
        """
        released = []
        for session_id in session_ids:
            session = self.sessions.get(session_id)
            if session is None:
                continue
            session.users.discard(agent)
            if not session.users:
                released.append(session_id)
        if released:
            await asyncio.gather(*(self._release(s, cancel) for s in released))

    async def stop_all(self, cancel: Callable[[SubAgentTask], Awaitable[object]]) -> None:
        """Cancel every session's running tasks with ``cancel`` and wait until each settled.

        For the owner's ``close()``: the sessions stay (their records are what a store keeps).
        """
        await asyncio.gather(*(_stop(s, cancel) for s in list(self.sessions.values())))

    async def _release(
        self, session_id: str, cancel: Callable[[SubAgentTask], Awaitable[object]]
    ) -> None:
        session = self.sessions.get(session_id)
        if session is None or session.released:
            return
        session.released = True  # from here on no task starts in it
        self.idle.pop(session_id, None)
        try:
            await _stop(session, cancel)
        finally:
            if self.sessions.get(session_id) is session:
                self.forget(session_id, RELEASED)

    @contextlib.contextmanager
    def starting(self, session_id: str, session: SessionTasks) -> Iterator[None]:
        """Hold one of ``session``'s ``max_concurrent`` slots while a task of it starts.

        ``admit`` counts the slot from the entry on, across the start's awaits; at the exit,
        however the start ended, the slot is free again and the session is filed anew.
        """
        session.starting += 1
        session.no_starts.clear()
        self.refresh(session_id, session)
        try:
            yield
        finally:
            session.starting -= 1
            if not session.starting:
                session.no_starts.set()
            self.refresh(session_id, session)

    # -- the store ---------------------------------------------------------------------------

    async def insert(self, task: SubAgentTask, number: int, *, prompt: str | None = None) -> None:
        """Write a new task's row, before its child starts (a no-op without a store).

        ``number`` is the task's place in the extension's count; ``prompt``: the task is
        durable (its prompt is stored with it). The commit (a thread's) overlaps nothing a
        start needs; cancelling the caller leaves it running.

        Raises:
            RuntimeError: The store could not write the row, or refused it (an id longer than
                a store keeps): the task must not start then.
        """
        if self.store is None:
            return
        try:
            committed = self.store.insert(task_row(task, number), prompt=prompt)
            if committed is not None:
                await asyncio.shield(committed)
        except TaskStoreError as exc:
            raise RuntimeError(f"the task could not be stored, so it did not start: {exc}") from exc

    def delete(self, task: SubAgentTask) -> None:
        """Delete the row of a task whose child did not start (a no-op without a store)."""
        if self.store is not None:
            self.store.delete(task.parent_session_id, task.task_id)

    def open_store(
        self,
        store: str | os.PathLike[str] | TaskStore,
        *,
        notify: bool,
        render: Callable[[SubAgentTask], str | None],
    ) -> int:
        """Take ``store`` (a path opens one) and restore its tasks; return its task counter.

        All or nothing: if restoring fails, the registry is as it was, nothing was written to
        the store, and a store opened here is closed again.

        Raises:
            ValueError: If the ``TaskStore`` is closed or serves another extension.
            TaskStoreError: If the file cannot be opened as a store (see ``TaskStore``).
        """
        if isinstance(store, TaskStore):
            if store.closed:
                raise ValueError(f"{store!r} is closed; open a new TaskStore")
            if store.owner is not None:
                raise ValueError(
                    f"{store!r} already serves another AsyncSubAgentExtension; one store "
                    "serves one extension (give each its own file)"
                )
            own = False
        else:
            store = TaskStore(store)
            own = True
        try:
            self._restore(store, notify=notify, render=render)
        except BaseException:
            if own:
                store.close_now()  # nothing was queued to it
            raise
        store.owner = self._owner
        self.store = store
        self._own_store = own
        return store.counter

    async def close_store(self) -> None:
        """Write what is queued; close the store if the registry opened it from a path."""
        store = self.store
        if store is None:
            return
        if self._own_store:
            await store.close()
        else:
            flushed = store.flush()
            if flushed is not None:
                with contextlib.suppress(TaskStoreError):
                    await flushed
            store.owner = None

    def _restore(
        self, store: TaskStore, *, notify: bool, render: Callable[[SubAgentTask], str | None]
    ) -> None:
        """Take in the tasks ``store`` holds (it was just opened), then write back the lost.

        Finished ones come back as they were, running ones as lost (failed) unless they are
        durable (then they wait for their session's next request to resume, see
        ``_task_resume``), notices owed as owed (``render`` writes a notice of a task
        forgotten meanwhile). For a new registry: its records are built aside and taken in
        whole, and the store is written to only then.
        """
        restored, lost, resumed = restore_tasks(store, notify=notify)
        aside = TaskRegistry(self._owner)
        gone: list[tuple[str, str]] = []
        for session_id, tasks, spent in restored:
            session = aside.session(session_id)
            session.spent_tokens = max(session.spent_tokens, spent)
            for task, due in tasks:
                session.add(task)
                if due is not None:  # ended (else: it resumes)
                    gone += (
                        (session_id, g) for g in session.finish(task, notify=due, render=render)
                    )
            aside.refresh(session_id, session)
        self.sessions, self.idle = aside.sessions, aside.idle
        self.forgotten, self.forgotten_spent = aside.forgotten, aside.forgotten_spent
        for task, columns in lost:
            store.update(task.parent_session_id, task.task_id, **columns)
        for task in resumed:
            assert task.durable is not None
            store.update(task.parent_session_id, task.task_id, status=task.status.value)
            store.update_durable(task.parent_session_id, task.task_id, **task.durable.columns())
        for session_id, task_id in gone:
            store.delete(session_id, task_id)
        for session_id in aside.forgotten:  # beyond max_sessions: gone from the store too
            store.delete_session(session_id)

    # -- writing ---------------------------------------------------------------------------

    def write(self, task: SubAgentTask, **columns: Any) -> None:
        """Queue a write of the task's row (a no-op without a store)."""
        if self.store is not None and not task.evicted:
            self.store.update(task.parent_session_id, task.task_id, **columns)

    def write_progress(self, task: SubAgentTask) -> None:
        """Queue a write of the task's progress columns (a no-op without a store)."""
        if self.store is not None:
            self.write(task, **progress_columns(task))


async def _stop(session: SessionTasks, cancel: Callable[[SubAgentTask], Awaitable[object]]) -> None:
    """Cancel a session's running tasks with ``cancel`` and wait for all its watchers.

    Its starts in flight end first: each cancels its own child once its runner answered (the
    owner is closing, or the session was released).
    """
    await session.no_starts.wait()
    running = session.running()
    if running:
        await asyncio.gather(*(cancel(t) for t in running))
    watchers = [t.watcher for t in session.tasks.values() if t.watcher is not None]
    await asyncio.gather(*watchers, return_exceptions=True)
