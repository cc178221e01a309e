"""``TaskStore``: the background-task registry in a sqlite3 file, so it survives a restart.

One store belongs to one live host at a time: opening it takes an exclusive ``flock`` on the
store file itself (``_store_lock``), keyed on the file's identity (any symlink or hard link
to it meets the same lock), held until ``close()`` or the process's death (the kernel drops
it, even on SIGKILL). A second opener, in another process or this one, gets
``TaskStoreError`` naming the holder's pid: a lock, never a silent share.

Opening is all or nothing (``_store_file``): the whole file is read and checked (every row,
every column's type and range, the JSON ones decoded) on a read-only connection before
anything is written to it; any failure closes what was opened, releases the lock and
changes nothing. A new (or empty) file gets the schema, in WAL mode with
``synchronous=NORMAL``: a committed write survives the host's death (it is in the WAL file),
and commits need no ``fsync`` (a power cut may lose the last ones).

Reads happen once, when the store opens (the whole registry is in memory from then on), but
for the journal of a durable task, read again when the task resumes (``read_journal``).
Writes happen in one background thread, never on the event loop: the loop only appends an
operation to a queue (``insert``, ``update``, ``delete``, ``journal``...), and updates of one
row that wait are merged into one. Every value is written within its column's rule
(``_store_schema``), so what a store writes it reads back. ``insert``, ``journal`` and
``flush`` return a future the loop may await for the commit. A write that fails is logged
(once per kind of error) and the registry goes on in memory (a durable task whose step could
not be written is stopped by its owner: its journal would not hold what it did).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from zett_agent.extensions._tasks._store_file import connect, read
from zett_agent.extensions._tasks._store_lock import take_lock
from zett_agent.extensions._tasks._store_schema import (
    SCHEMA_VERSION,
    StoredDurable,
    StoredTask,
    TaskStoreError,
    stored,
    stored_row,
)

__all__ = [
    "SCHEMA_VERSION",
    "StoredDurable",
    "StoredTask",
    "TaskStore",
    "TaskStoreError",
]

log = logging.getLogger(__name__)

#: operations written in one transaction at most
_BATCH = 256

#: the columns ``update`` may set
_COLUMNS = frozenset(
    {
        "status", "elapsed", "output", "error", "turns", "tool_calls", "last_tool",
        "input_tokens", "output_tokens", "progress", "messages", "lost", "notice",
    }
)  # fmt: skip


class TaskStore:
    """The task registry of one ``AsyncSubAgentExtension`` in a sqlite3 file.

    ``AsyncSubAgentExtension(store=PATH)`` opens one; pass a ``TaskStore`` object instead to
    open it (and see its errors) at a moment of your choosing. Opening reads the whole file
    and takes the store's lock: it does file I/O in the calling thread, once.

    A store serves one extension at a time; the extension flushes it in its ``close()`` and
    closes it when it opened it from a path (a ``TaskStore`` you passed is yours to close).

    Args:
        path: The sqlite3 file (created if missing; a symlink is followed). Its directory must
            exist, on a local file system. sqlite's ``-wal`` and ``-shm`` files live next to
            the file the path resolves to.

    Raises:
        TaskStoreError: another live host (or another ``TaskStore`` of this process) holds
            the file, by whatever path (the message names its pid); the file is not a task
            store, is damaged (the message names the first bad row and column), has a newer
            schema, has more than one name (hard links), or is not a regular file; it cannot
            be opened (a missing directory, no permission). Nothing in it is changed then,
            and nothing stays open.

    Attributes:
        tasks: The tasks the file held when it was opened, oldest first (each checked).
        spent: What each session's tasks had spent, in tokens.
        counter: The last task number the file held.
        durable: What each durable task needs to resume, by ``(parent_session_id, task_id)``.
        journals: Each durable task's journal as it opened (its steps, or why it is damaged).
        upgraded_from: The schema the file had when it was older and upgraded, else ``None``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        with contextlib.ExitStack() as undo:  # on any failure: all that was opened, closed
            self._lock = take_lock(self.path)
            undo.callback(self._lock.abandon)
            contents = read(self._lock)  # every row checked, nothing written
            self.tasks, self.spent, self.counter = contents.tasks, contents.spent, contents.counter
            self.durable, self.journals = contents.durable, contents.journals
            self.upgraded_from = contents.upgrade
            self._db = connect(self._lock, fresh=contents.fresh, upgrade=contents.upgrade)
            undo.callback(self._db.close)
            #: the extension using this store (one at a time)
            self.owner: object | None = None
            self.closed = False
            self._cond = threading.Condition()
            self._ops: deque[tuple[Any, ...]] = deque()
            #: merged column values of rows whose update op waits in ``_ops``
            self._updates: dict[tuple[str, str], dict[str, Any]] = {}
            self._spent_waiting: dict[str, int] = {}
            self._closing = False
            self._errors: set[str] = set()
            self._thread = threading.Thread(
                target=self._write_forever, name=f"zett-agent-task-store {self.path}", daemon=True
            )
            self._thread.start()
            undo.pop_all()
        if contents.orphans:  # journal rows of no task the file holds
            self._put(("orphans",))

    def __repr__(self) -> str:
        return f"<TaskStore {self.path!r}{' closed' if self.closed else ''}>"

    # -- operations (from the event loop; each only appends to the queue) ---------------------

    def insert(
        self, row: Mapping[str, Any], *, prompt: str | None = None
    ) -> asyncio.Future[None] | None:
        """Store a new task (its row as ``task_row`` gives it, its number in ``counter``).

        ``prompt``: the task is durable; its row in ``durable`` is written in the same
        transaction. Returns a future of the commit when called in a running loop (it raises
        what the write raised).

        Raises:
            TaskStoreError: An id of the row is longer than a store keeps (nothing queued).
        """
        try:
            values = stored_row(row)
        except ValueError as exc:
            raise TaskStoreError(f"task store {self.path}: {exc}") from None
        future = _future()
        durable = None if prompt is None else stored("prompt", prompt)
        self._put(("insert", values, future, durable))
        return future

    def update_durable(
        self, parent_session_id: str, task_id: str, *, resumes: int, crashes: int, deaths: Any
    ) -> None:
        """Set what a durable task counts of its tries (``deaths``: see ``StoredDurable``)."""
        columns = {
            "resumes": stored("resumes", resumes),
            "crashes": stored("crashes", crashes),
            "deaths": stored("deaths", deaths),
        }
        self._put(("durable", parent_session_id, task_id, columns))

    def journal(
        self,
        parent_session_id: str,
        task_id: str,
        step: int,
        text: str,
        *,
        snapshot: bool,
        failed: Callable[[BaseException], object] | None = None,
        committed: Callable[[], object] | None = None,
    ) -> asyncio.Future[None] | None:
        """Add step ``step`` (its entry's JSON ``text``) to a durable task's journal.

        ``snapshot``: the step replaces every earlier one. Returns a future of the commit (in
        a running loop); it raises ``TaskStoreError`` if the write failed. With ``failed``
        instead, no future is made: ``failed(error)`` is called on the loop if the write
        failed, else ``committed()`` if given (a commit nobody waits for wakes no one).
        """
        if failed is not None:
            listener = (asyncio.get_running_loop(), failed, committed)
            self._put(("journal", parent_session_id, task_id, step, text, snapshot, listener))
            return None
        future = _future()
        self._put(("journal", parent_session_id, task_id, step, text, snapshot, future))
        return future

    def read_journal(
        self, parent_session_id: str, task_id: str
    ) -> asyncio.Future[list[tuple[int, str]]]:
        """A future of a durable task's journal: ``(step, text)`` oldest first.

        Read after everything queued before it was written. Call it in a running loop; the
        future raises ``TaskStoreError`` if the read failed.
        """
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._put(("read", parent_session_id, task_id, future))
        return future

    def update(self, parent_session_id: str, task_id: str, **columns: Any) -> None:
        """Set columns of a stored task (merged with updates of it still waiting).

        Raises:
            ValueError: A column that is none of a task's, or a status or notice state that
                is none of its column's (nothing queued).
        """
        unknown = columns.keys() - _COLUMNS
        if unknown:
            raise ValueError(f"unknown task store columns: {sorted(unknown)}")
        for name in ("status", "notice"):  # a state the store could not read back: a bug
            if name in columns:
                stored(name, columns[name])
        key = (parent_session_id, task_id)
        with self._cond:
            waiting = self._updates.get(key)
            if waiting is not None:
                waiting.update(columns)
                return
            self._updates[key] = dict(columns)
            self._ops.append(("update", key))
            self._cond.notify()

    def delete(self, parent_session_id: str, task_id: str) -> None:
        self._put(("delete", parent_session_id, task_id))

    def delete_session(self, parent_session_id: str) -> None:
        """Forget every task of a session, and what it spent."""
        self._put(("delete_session", parent_session_id))

    def set_spent(self, parent_session_id: str, tokens: int) -> None:
        """The tokens a session's tasks used so far (its ``session_token_budget``)."""
        with self._cond:
            waiting = parent_session_id in self._spent_waiting
            self._spent_waiting[parent_session_id] = tokens
            if not waiting:
                self._ops.append(("spent", parent_session_id))
                self._cond.notify()

    def flush(self) -> asyncio.Future[None] | None:
        """A future done once everything queued before it is written."""
        future = _future()
        self._put(("flush", future))
        return future

    def _put(self, op: tuple[Any, ...]) -> None:
        with self._cond:
            self._ops.append(op)
            self._cond.notify()

    async def close(self) -> None:
        """Write what is queued, stop the writer thread, close the file, release the lock.

        Idempotent. If the caller is cancelled, closing completes in the background: the
        writer thread closes the file and releases the lock once the queue is written.
        """
        if self.closed:
            return
        self.closed = True
        future = _future()
        with self._cond:
            self._closing = True
            self._ops.append(("flush", future))
            self._cond.notify()
        if future is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(future)
        self._thread.join()  # it returns right after the flush above

    def close_now(self) -> None:
        """Close at once, from any thread: write what is queued, then as ``close()``.

        Blocks until the queued writes are done: for a store nothing was queued to yet (an
        extension whose construction failed closes the store it opened with it).
        """
        if self.closed:
            return
        self.closed = True
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()

    # -- the writer thread --------------------------------------------------------------------

    def _write_forever(self) -> None:
        """Write the queue until the store closes; then close the file, release the lock."""
        try:
            while True:
                with self._cond:
                    while not self._ops and not self._closing:
                        self._cond.wait()
                    if not self._ops:
                        return
                    batch: list[tuple[Any, ...]] = []
                    while self._ops and len(batch) < _BATCH:
                        op = self._ops.popleft()
                        if op[0] == "update":
                            op = ("update", op[1], self._updates.pop(op[1]))
                        elif op[0] == "spent":
                            op = ("spent", op[1], self._spent_waiting.pop(op[1]))
                        batch.append(op)
                self._write(batch)
        finally:
            self._db.close()
            self._lock.release()

    def _write(self, batch: list[tuple[Any, ...]]) -> None:
        futures = [op[-1] for op in batch if op[0] in ("journal", "flush")]
        futures += [op[2] for op in batch if op[0] == "insert"]
        reads: list[tuple[asyncio.Future[Any], Any]] = []
        error: BaseException | None = None
        try:
            now = time.time()
            db = self._db
            db.execute("BEGIN")
            try:
                for op in batch:
                    if op[0] == "read":
                        rows = db.execute(
                            "SELECT step, entry FROM journal WHERE parent_session_id = ? AND "
                            "task_id = ? ORDER BY step",
                            (op[1], op[2]),
                        ).fetchall()
                        reads.append((op[3], rows))
                    else:
                        self._apply(db, op, now)
                db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                raise
        except Exception as exc:
            error = TaskStoreError(f"task store {self.path}: a write failed: {exc}")
            kind = type(exc).__name__ + str(exc)
            if kind not in self._errors:
                self._errors.add(kind)
                log.error(
                    "task store %s: a write failed; the registry goes on in memory: %s",
                    self.path,
                    exc,
                )
        settled: list[tuple[asyncio.Future[Any], Any]] = [
            (future, None) for future in futures if isinstance(future, asyncio.Future)
        ]
        calls: list[tuple[asyncio.AbstractEventLoop, Callable[[], object]]] = []
        for future in futures:  # the writes whose caller gave callbacks instead
            if isinstance(future, tuple):
                loop, failed, committed = future
                if error is not None:
                    calls.append((loop, functools.partial(failed, error)))
                elif committed is not None:
                    calls.append((loop, committed))
        _resolve_all([*settled, *reads], error, calls)

    @staticmethod
    def _apply(db: sqlite3.Connection, op: tuple[Any, ...], now: float) -> None:
        kind = op[0]
        if kind == "journal":
            _, parent, task_id, step, text, snapshot, _ = op
            if snapshot:
                db.execute(
                    "DELETE FROM journal WHERE parent_session_id = ? AND task_id = ?",
                    (parent, task_id),
                )
            db.execute(
                "INSERT OR REPLACE INTO journal (parent_session_id, task_id, step, entry) "
                "VALUES (?, ?, ?, ?)",
                (parent, task_id, step, text),
            )
        elif kind == "insert":
            row = dict(op[1], updated_at=stored("updated_at", now))
            number = row.pop("number")
            names = ", ".join(row)
            marks = ", ".join("?" for _ in row)
            db.execute(
                f"INSERT OR REPLACE INTO tasks ({names}) VALUES ({marks})", list(row.values())
            )
            key = (row["parent_session_id"], row["task_id"])
            db.execute("DELETE FROM journal WHERE parent_session_id = ? AND task_id = ?", key)
            db.execute("DELETE FROM durable WHERE parent_session_id = ? AND task_id = ?", key)
            if op[3] is not None:
                db.execute(
                    "INSERT INTO durable (parent_session_id, task_id, prompt) VALUES (?, ?, ?)",
                    (*key, op[3]),
                )
            db.execute(
                "INSERT INTO meta (key, value) VALUES ('counter', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)",
                (number,),
            )
        elif kind == "update":
            (parent, task_id), columns = op[1], op[2]
            columns = {k: stored(k, v) for k, v in columns.items()}
            sets = ", ".join(f"{name} = ?" for name in columns)
            db.execute(
                f"UPDATE tasks SET {sets}, updated_at = ? "
                "WHERE parent_session_id = ? AND task_id = ?",
                [*columns.values(), stored("updated_at", now), parent, task_id],
            )
        elif kind == "delete":
            for table in ("tasks", "durable", "journal"):
                db.execute(
                    f"DELETE FROM {table} WHERE parent_session_id = ? AND task_id = ?",
                    (op[1], op[2]),
                )
        elif kind == "delete_session":
            for table in ("tasks", "sessions", "durable", "journal"):
                db.execute(f"DELETE FROM {table} WHERE parent_session_id = ?", (op[1],))
        elif kind == "durable":
            columns = op[3]
            sets = ", ".join(f"{name} = ?" for name in columns)
            db.execute(
                f"UPDATE durable SET {sets} WHERE parent_session_id = ? AND task_id = ?",
                [*columns.values(), op[1], op[2]],
            )
        elif kind == "orphans":
            db.execute(
                "DELETE FROM journal WHERE NOT EXISTS (SELECT 1 FROM durable WHERE "
                "durable.parent_session_id = journal.parent_session_id AND "
                "durable.task_id = journal.task_id)"
            )
        elif kind == "spent":
            db.execute(
                "INSERT INTO sessions (parent_session_id, spent_tokens) VALUES (?, ?) "
                "ON CONFLICT (parent_session_id) "
                "DO UPDATE SET spent_tokens = excluded.spent_tokens",
                (op[1], stored("spent_tokens", op[2])),
            )


def _future() -> asyncio.Future[None] | None:
    try:
        return asyncio.get_running_loop().create_future()
    except RuntimeError:
        return None


def _resolve_all(
    futures: list[tuple[asyncio.Future[Any], Any]],
    error: BaseException | None,
    calls: list[tuple[asyncio.AbstractEventLoop, Callable[[], object]]],
) -> None:
    """Settle ``futures`` (each with its value) and make ``calls``, one wake-up per loop.

    Each call runs on its own loop, after the futures of that loop were settled.
    """
    by_loop: dict[asyncio.AbstractEventLoop, tuple[list[Any], list[Callable[[], object]]]] = {}
    for future, value in futures:
        by_loop.setdefault(future.get_loop(), ([], []))[0].append((future, value))
    for loop, call in calls:
        by_loop.setdefault(loop, ([], []))[1].append(call)

    def settle(
        group: list[tuple[asyncio.Future[Any], Any]], then: list[Callable[[], object]]
    ) -> None:
        for future, value in group:
            if future.done():
                continue
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)
        for call in then:  # each on its own: one that raises does not keep the others
            try:
                call()
            except Exception:
                log.exception("a callback of a task store's commit raised")

    for loop, (group, then) in by_loop.items():
        with contextlib.suppress(RuntimeError):  # its loop was closed meanwhile
            loop.call_soon_threadsafe(settle, group, then)
