"""MCP tasks (protocol 2025-11-25) of one client: their ids, lifetimes, statuses and bounds.

A task-augmented call of a child's tool starts the child as a background task of the
extension, in the client's own session, and registers it here under an MCP task id: 256
random bits (``secrets.token_urlsafe``), so an id can be neither guessed nor confused with the
extension's ``task-N``. Each client has its own ``McpTasks``: an id of another client is
unknown here, exactly as an id never issued is.

What the spec asks, and how it is kept:

- **Status**: ``working`` while the child is pending or running, then ``completed``,
  ``failed`` or ``cancelled`` as the child ends; ``cancelled`` for good once ``tasks/cancel``
  was accepted, even if the child finished in the same instant. ``input_required`` never
  applies: a child never asks its requestor anything.
- **Lifetime**: the requested ``ttl`` (milliseconds from creation), clamped to
  ``[MIN_TTL_MS, max_ttl_ms]``; ``DEFAULT_TTL_MS`` (within the maximum) when none is asked. When
  it has elapsed the task is deleted, its child killed first if it still runs; its id then
  reads "Task has expired" (the last ``MAX_EXPIRED_REMEMBERED`` such ids). Beyond
  ``max_retained`` finished tasks, the oldest finished are deleted the same way before their
  time. So a client holds at most its running tasks (``max_concurrent``) plus ``max_retained``.
- **Notifications**: ``notifications/tasks/status`` on every change of status; with a progress
  token on the call, ``notifications/progress`` with that token while the task runs.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from zett_agent._mcp._progress import forward_progress, progress_line
from zett_agent.extensions._tasks._task import SubAgentTaskStatus

if TYPE_CHECKING:
    from zett_agent._mcp._watch import Bells
    from zett_agent.extensions._async_subagent import AsyncSubAgentExtension
    from zett_agent.extensions._tasks._task import SubAgentTask

__all__ = [
    "DEFAULT_TTL_MS",
    "MIN_TTL_MS",
    "POLL_INTERVAL_MS",
    "McpTask",
    "McpTasks",
    "TaskError",
]

log = logging.getLogger(__name__)

#: the shortest lifetime granted: a smaller ``ttl`` would delete a task before it is polled
MIN_TTL_MS = 1_000
#: the lifetime of a task whose call asked for none (one hour, or the maximum if smaller)
DEFAULT_TTL_MS = 3_600_000
#: how often a client is asked to poll ``tasks/get``
POLL_INTERVAL_MS = 1_000
#: tasks per ``tasks/list`` page
PAGE_SIZE = 20
#: expired ids remembered per client, so that ``tasks/get`` can say "expired"
MAX_EXPIRED_REMEMBERED = 1_000

#: sends one notification (method, params) on the client's connection, best effort
Notify = Callable[[str, dict[str, Any]], Awaitable[None]]

_STATUS = {
    SubAgentTaskStatus.PENDING: "working",
    SubAgentTaskStatus.RUNNING: "working",
    SubAgentTaskStatus.COMPLETED: "completed",
    SubAgentTaskStatus.FAILED: "failed",
    SubAgentTaskStatus.CANCELLED: "cancelled",
}


class TaskError(Exception):
    """A ``tasks/*`` request names a task it cannot act on: JSON-RPC's invalid params.

    Its message is the one the client reads (the spec's wording where it gives one).
    """


def iso(timestamp: float) -> str:
    """A wall-clock time as ISO 8601 in UTC, to the millisecond (``2025-11-25T10:30:00.000Z``)."""
    moment = datetime.fromtimestamp(timestamp, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(eq=False)
class McpTask:
    """One MCP task: the child it runs, its lifetime and what the client was told."""

    task_id: str
    child: SubAgentTask
    #: the child's tool the call named
    tool: str
    ttl_ms: int
    #: its place in the client's ``tasks/list`` order
    seq: int
    progress_token: str | int | None = None
    created_at: float = field(default_factory=time.time)
    #: when its status last changed (wall clock)
    updated_at: float = field(default_factory=time.time)
    #: ``tasks/cancel`` was accepted and its child is dead: cancelled for good
    cancelled: bool = False
    #: the kill of a ``tasks/cancel`` (which announces the child's end itself)
    kill: asyncio.Task[None] | None = field(default=None, repr=False)
    expiry: asyncio.TimerHandle | None = field(default=None, repr=False)

    @property
    def status(self) -> str:
        """The MCP status: ``working``, ``completed``, ``failed`` or ``cancelled``."""
        return "cancelled" if self.cancelled else _STATUS[self.child.status]

    @property
    def terminal(self) -> bool:
        return self.status != "working"

    def status_message(self) -> str:
        """What the child did so far, or why it ended."""
        status = self.status
        if status == "working":
            return progress_line(self.child)
        if status == "completed":
            return progress_line(self.child)
        if self.cancelled and self.child.status is not SubAgentTaskStatus.CANCELLED:
            return "cancelled by tasks/cancel"
        return f"{status}: {self.child.error or 'no reason given'}"

    def wire(self) -> dict[str, Any]:
        """The task as the spec's ``Task`` object (camelCase keys)."""
        return {
            "taskId": self.task_id,
            "status": self.status,
            "statusMessage": self.status_message(),
            "createdAt": iso(self.created_at),
            "lastUpdatedAt": iso(self.updated_at),
            "ttl": self.ttl_ms,
            "pollInterval": POLL_INTERVAL_MS,
        }


class McpTasks:
    """One client's MCP tasks.

    Args:
        extension: The extension the children run in (its ``cancel`` kills a child's tree).
        bells: Rung as the children report (progress notifications follow them).
        notify: Sends a notification on the client's connection (never raises).
        max_ttl_ms: The longest lifetime granted.
        max_retained: Finished tasks kept; the oldest finished are deleted first.
    """

    def __init__(
        self,
        extension: AsyncSubAgentExtension,
        bells: Bells,
        notify: Notify,
        *,
        max_ttl_ms: int,
        max_retained: int,
    ) -> None:
        self._extension = extension
        self._bells = bells
        self._notify = notify
        self.max_ttl_ms = max_ttl_ms
        self._max_retained = max_retained
        self._tasks: OrderedDict[str, McpTask] = OrderedDict()
        #: ids of the finished tasks, oldest finished first
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._expired: OrderedDict[str, None] = OrderedDict()
        self._seq = 0
        #: notifications, progress forwarders and kills in flight (awaited by ``close``)
        self._chores: set[asyncio.Task[Any]] = set()
        self._closed = False
        #: the client left: nobody can read a finished task any more, so none is kept
        self._orphaned = False
        #: set whenever the table becomes empty (a client that left waits for it)
        self.empty = asyncio.Event()
        self.empty.set()

    def __len__(self) -> int:
        return len(self._tasks)

    def tasks(self) -> list[McpTask]:
        """Every task of the client, oldest first."""
        return list(self._tasks.values())

    def granted_ttl(self, requested: int | None) -> int:
        """The lifetime a call asking for ``requested`` milliseconds (or none) gets."""
        if requested is None:
            return min(DEFAULT_TTL_MS, self.max_ttl_ms)
        return max(MIN_TTL_MS, min(requested, self.max_ttl_ms))

    def create(
        self,
        child: SubAgentTask,
        tool: str,
        *,
        ttl: int | None,
        progress_token: str | int | None,
    ) -> McpTask:
        """Register a child that just started as a new ``working`` task and return it."""
        self._seq += 1
        task = McpTask(
            task_id=secrets.token_urlsafe(32),
            child=child,
            tool=tool,
            ttl_ms=self.granted_ttl(ttl),
            seq=self._seq,
            progress_token=progress_token,
        )
        self._tasks[task.task_id] = task
        self.empty.clear()
        loop = asyncio.get_running_loop()
        task.expiry = loop.call_later(task.ttl_ms / 1000, self._expire, task)
        if progress_token is not None:
            self._spawn(forward_progress(child, self._bells, self._progress_sender(task)))
        if child.done():
            self._settled(task)
        else:
            child.settle_callbacks.append(lambda _child: self._settled(task))
        return task

    def get(self, task_id: str) -> McpTask:
        """The task ``task_id`` of this client.

        Raises:
            TaskError: no such task here (never issued, another client's), or it expired.
        """
        task = self._tasks.get(task_id) if isinstance(task_id, str) else None
        if task is not None:
            return task
        if task_id in self._expired:
            raise TaskError("Failed to retrieve task: Task has expired")
        raise TaskError("Failed to retrieve task: Task not found")

    def page(self, cursor: str | None) -> tuple[list[McpTask], str | None]:
        """One ``tasks/list`` page from ``cursor`` (oldest first) and the next page's cursor.

        Raises:
            TaskError: the cursor is not one this server gave.
        """
        after = 0 if cursor is None else _read_cursor(cursor)
        tasks = [t for t in self._tasks.values() if t.seq > after]
        page = tasks[:PAGE_SIZE]
        more = len(tasks) > PAGE_SIZE
        return page, (_cursor(page[-1].seq) if more else None)

    async def cancel(self, task_id: str) -> McpTask:
        """Kill the task's child and answer once its whole process tree is gone.

        Raises:
            TaskError: no such task, or it is already finished (the spec's -32602).

        Cancellation: the kill completes in the background; the task still reads cancelled.
        """
        task = self.get(task_id)
        if task.terminal:
            raise TaskError(f"Cannot cancel task: already in terminal status '{task.status}'")
        if task.kill is None:
            task.kill = self._spawn(self._kill(task))
        await asyncio.shield(task.kill)
        return task

    async def result(self, task_id: str) -> McpTask:
        """The task once it is finished: ``tasks/result`` blocks until then.

        Raises:
            TaskError: no such task, or it expired (before or while waiting).

        Cancellation: stops the wait, never the task.
        """
        task = self.get(task_id)
        await task.child.settled.wait()
        if task.kill is not None:  # a tasks/cancel is killing it: it ends cancelled
            await asyncio.shield(task.kill)
        return self.get(task_id)  # it may have expired meanwhile

    def orphan(self) -> None:
        """The client left: delete its finished tasks now, and each running one as it ends.

        A running task's child still runs until its lifetime ends (then it is killed).
        """
        self._orphaned = True
        for task_id in list(self._finished):
            self._delete(self._tasks[task_id])

    async def close(self) -> None:
        """Stop the timers and the notifications; the children are the extension's to stop."""
        self._closed = True
        for task in self._tasks.values():
            if task.expiry is not None:
                task.expiry.cancel()
        for chore in list(self._chores):
            chore.cancel()
        for chore in list(self._chores):
            with contextlib.suppress(asyncio.CancelledError):
                await chore

    # -- the life of a task -----------------------------------------------------------------

    def _settled(self, task: McpTask) -> None:
        """The child ended: announce it (unless a ``tasks/cancel`` does), bound the finished."""
        if self._tasks.get(task.task_id) is not task:
            return  # deleted (expired) before its child ended
        if task.kill is None:
            task.updated_at = time.time()
            self._announce(task)
        self._finished[task.task_id] = None
        if self._orphaned:
            self._delete(task)
            return
        while len(self._finished) > self._max_retained:
            oldest, _ = self._finished.popitem(last=False)
            self._delete(self._tasks[oldest])

    async def _kill(self, task: McpTask) -> None:
        await self._extension.cancel(task.child)  # returns once the tree is gone
        task.cancelled = True
        task.updated_at = time.time()
        if self._tasks.get(task.task_id) is task:
            self._announce(task)

    def _expire(self, task: McpTask) -> None:
        """Its lifetime elapsed: delete it, killing its child if it still runs."""
        task.expiry = None
        if self._tasks.get(task.task_id) is not task:
            return
        self._delete(task)
        if not task.child.done():
            self._spawn(self._extension.cancel(task.child))

    def _delete(self, task: McpTask) -> None:
        del self._tasks[task.task_id]
        self._finished.pop(task.task_id, None)
        if task.expiry is not None:
            task.expiry.cancel()
            task.expiry = None
        self._expired[task.task_id] = None
        while len(self._expired) > MAX_EXPIRED_REMEMBERED:
            self._expired.popitem(last=False)
        if not self._tasks:
            self.empty.set()

    def _announce(self, task: McpTask) -> None:
        self._spawn(self._notify("notifications/tasks/status", task.wire()))

    def _progress_sender(self, task: McpTask) -> Callable[[int, str], Awaitable[None]]:
        token = task.progress_token

        async def send(progress: int, line: str) -> None:
            await self._notify(
                "notifications/progress",
                {"progressToken": token, "progress": progress, "message": line},
            )

        return send

    def _spawn(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        chore = asyncio.ensure_future(work)
        if self._closed:
            chore.cancel()
        self._chores.add(chore)
        chore.add_done_callback(self._chores.discard)
        return chore


def _cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"after:{seq}".encode()).decode().rstrip("=")


def _read_cursor(cursor: str) -> int:
    """The position a cursor of ``_cursor`` names; ``TaskError`` for anything else."""
    try:
        if not isinstance(cursor, str) or len(cursor) > 64:
            raise ValueError(cursor)
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        prefix, _, number = text.partition(":")
        if prefix != "after" or not number.isdigit() or len(number) > 18:
            raise ValueError(cursor)
        return int(number)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise TaskError(
            "Invalid cursor: pass the nextCursor of an earlier tasks/list answer, or none"
        ) from None
