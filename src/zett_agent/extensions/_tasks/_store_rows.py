"""What a background task is in a ``TaskStore``: the row it is written as, and how it returns.

``task_row`` and ``progress_columns`` are what the registry writes of a task; ``restore_tasks``
turns the rows a store loaded (each checked when it opened) back into ``SubAgentTask``
objects: ended ones as they were, a task that was running when its host stopped as lost
(``lost_reason`` says what it had done), unless it is durable: then it runs again, waiting
for its session's next request to resume (one whose journal is damaged is lost, saying so).
It writes nothing: what a lost or resumed task becomes is returned, for the registry to write
once the whole restore succeeded.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from zett_agent.extensions._tasks._durable import HOST_STOPPED, DurableState
from zett_agent.extensions._tasks._store_journal import JournalInfo
from zett_agent.extensions._tasks._task import SubAgentTask, SubAgentTaskStatus
from zett_agent.extensions._tasks._task_messages import TaskMessages

if TYPE_CHECKING:
    from zett_agent.extensions._tasks._store import TaskStore

__all__ = ["lost_reason", "progress_columns", "restore_tasks", "task_row"]


def task_row(task: SubAgentTask, number: int) -> dict[str, Any]:
    """The row a new task is inserted as (``number``: its place in the extension's count)."""
    return {
        "parent_session_id": task.parent_session_id,
        "task_id": task.task_id,
        "session_id": task.session_id,
        "subagent_type": task.subagent_type,
        "description": task.description,
        "status": task.status.value,
        "created_at": task.created_at,
        "number": number,
    }


def progress_columns(task: SubAgentTask) -> dict[str, Any]:
    """What ``update`` writes when the child's progress changed."""
    return {
        "turns": task.turns,
        "tool_calls": task.tool_calls,
        "last_tool": task.last_tool,
        "input_tokens": task.input_tokens,
        "output_tokens": task.output_tokens,
        "progress": task.progress,
    }


#: a restored session: its id, its tasks (each with whether its notice is owed, ``None`` for a
#: task that resumes), what it spent
RestoredSession = tuple[str, list[tuple[SubAgentTask, bool | None]], int]
#: a lost task to write back: the task, and its columns as ``TaskStore.update`` takes them
LostTask = tuple[SubAgentTask, dict[str, Any]]


def restore_tasks(
    store: TaskStore, *, notify: bool
) -> tuple[list[RestoredSession], list[LostTask], list[SubAgentTask]]:
    """The stored tasks as ``SubAgentTask`` objects, by session (oldest first).

    Each comes with whether its completion notice is still owed, each session with what it
    spent.

    A task stored as pending or running was lost with its host: it becomes ``failed`` with
    ``lost`` set and an error that starts with ``lost:`` and says what it had done, and its
    notice is owed (with ``notify``). Those are returned too, with the columns to write back:
    nothing is written here. A durable one is ``running`` instead, waiting to resume
    (``DurableState.waiting``, its host's stop recorded as a death), and returned as resumed;
    unless its journal is damaged: then it is lost, its error saying where.
    """
    now = time.monotonic()
    lost: list[LostTask] = []
    resumed: list[SubAgentTask] = []
    sessions: dict[str, list[tuple[SubAgentTask, bool | None]]] = {}
    spent: dict[str, int] = dict(store.spent)
    used: dict[str, int] = {}
    for stored in store.tasks:
        status = SubAgentTaskStatus(stored.status)  # one of them: checked when it opened
        elapsed = stored.elapsed
        if elapsed is None:
            elapsed = max(0.0, stored.updated_at - stored.created_at)
        task = SubAgentTask(
            task_id=stored.task_id,
            parent_session_id=stored.parent_session_id,
            session_id=stored.session_id,
            subagent_type=stored.subagent_type,
            description=stored.description,
            prompt="",
            status=status if status.terminal else SubAgentTaskStatus.FAILED,
            created_at=stored.created_at,
            started_monotonic=now - elapsed,
            finished_monotonic=now,
            output=stored.output,
            error=stored.error,
            turns=stored.turns,
            tool_calls=stored.tool_calls,
            last_tool=stored.last_tool,
            input_tokens=stored.input_tokens,
            output_tokens=stored.output_tokens,
            progress=stored.progress,
            lost=stored.lost,
        )
        task.last_activity = now - elapsed
        task.counted_tokens = task.total_tokens
        if stored.messages is not None:
            task.messages = TaskMessages.restored(stored.messages)
        key = (stored.parent_session_id, stored.task_id)
        durable = store.durable.get(key)
        journal = store.journals.get(key, JournalInfo())
        if durable is not None:
            task.durable = DurableState(
                durable.prompt,
                resumes=durable.resumes,
                crashes=durable.crashes,
                deaths=list(durable.deaths or ()),
                steps=journal.steps,
                bytes=journal.bytes,
                next_step=journal.last + 1,
            )
            if not status.terminal and journal.damaged is None:
                task.status = SubAgentTaskStatus.RUNNING
                task.finished_monotonic = None
                task.durable.died(HOST_STOPPED)
                task.durable.resumes += 1
                task.durable.waiting = True
                task.durable.model = None
                sessions.setdefault(task.parent_session_id, []).append((task, None))
                resumed.append(task)
                used[task.parent_session_id] = used.get(task.parent_session_id, 0) + (
                    task.total_tokens
                )
                continue
        task.settled.set()
        task.running.set()
        due: bool | None = stored.notice == "due"
        if not status.terminal:
            task.lost = True
            task.error = lost_reason(task, status)
            if durable is not None:
                task.error = (
                    f"lost: its journal is damaged, so it could not resume after its host "
                    f"stopped ({journal.damaged}). Start it again if needed"
                )
            due = notify
            columns = {
                "status": task.status.value,
                "lost": True,
                "error": task.error,
                "elapsed": elapsed,
                "notice": "due" if due else "none",
            }
            lost.append((task, columns))
        sessions.setdefault(task.parent_session_id, []).append((task, due))
        used[task.parent_session_id] = used.get(task.parent_session_id, 0) + task.total_tokens
    restored = [
        (session_id, tasks, max(spent.get(session_id, 0), used.get(session_id, 0)))
        for session_id, tasks in sessions.items()
    ]
    return restored, lost, resumed


def lost_reason(task: SubAgentTask, status: SubAgentTaskStatus) -> str:
    """``lost: ...``: that the host stopped while the task ran, and what it had done."""
    done = [f"{task.turns} model turn{'s' if task.turns != 1 else ''}"]
    done.append(f"{task.tool_calls} tool call{'s' if task.tool_calls != 1 else ''}")
    if task.last_tool:
        done[-1] += f" (the last: {task.last_tool})"
    done.append(f"{task.total_tokens} tokens")
    if task.progress is not None:
        total = task.progress.get("total")
        done.append(
            f"progress {task.progress['done']}" + (f" of {total}" if total is not None else "")
        )
    if status is SubAgentTaskStatus.PENDING:
        return "lost: the host stopped before the task's child started; start it again if needed"
    return (
        f"lost: the host stopped while the task was running; by then it had done "
        f"{', '.join(done)}. Its work is gone: start it again if needed"
    )
