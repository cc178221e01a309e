"""Opening a task store's file: read whole and checked, then connected for writing.

``TaskStore`` (``_store``) opens its file once, in three steps, and nothing here runs after:

1. ``take_lock`` (``_store_lock``): the file, resolved and locked on its identity.
2. ``read``: a read-only sqlite connection reads the whole file in one transaction and checks
   it: its header (application id, schema version), its schema (exactly the tables, columns
   and indexes this version makes: no table missing, no trigger added), sqlite's own
   ``quick_check``, then every row and every column against its rule (``_store_schema``),
   the JSON ones decoded and shape-checked, and every task's number against the store's
   counter. The first bad value is a ``TaskStoreError`` naming the file, the table, the row
   (and its task) and the column. A value beyond its column's bound never reaches Python.
   The journals of durable tasks are the exception (``_store_journal``): a bad step fails
   only its task, which the store reports as damaged. A file of an older schema is checked
   against that schema.
   A read-only connection writes nothing, not even the checkpoint of a WAL a dead host left;
   the sqlite side files it had to make are removed again when the store is refused.
3. ``connect``: only then the connection that writes, for the writer thread: a new file gets
   the schema, in WAL mode with ``synchronous=NORMAL``; a file of an older schema is
   upgraded in place, in one transaction (``TaskStoreError`` naming both versions if that
   fails, the file unchanged).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from zett_agent.extensions._tasks._store_journal import JournalInfo, read_journals
from zett_agent.extensions._tasks._store_lock import SIDE_FILES, StoreLock
from zett_agent.extensions._tasks._store_schema import (
    APPLICATION_ID,
    DURABLE,
    META,
    SCHEMA,
    SCHEMA_VERSION,
    SESSIONS,
    TASKS,
    UPGRADES,
    BadValue,
    Column,
    StoredDurable,
    StoredTask,
    TaskStoreError,
    task_number,
)

__all__ = ["Contents", "connect", "read"]

#: rows fetched from sqlite at a time
_FETCH = 512


@dataclass
class Contents:
    """What a store file holds, every value checked.

    Its tasks (oldest first), what each session spent, the last task number, whether the file
    is new (empty: it gets the schema), the durable tasks' rows and journals (by
    ``(parent_session_id, task_id)``), the journal rows of no task, and the schema it was
    written with when older than this version's (it is upgraded).
    """

    tasks: list[StoredTask] = field(default_factory=list)
    spent: dict[str, int] = field(default_factory=dict)
    counter: int = 0
    fresh: bool = False
    durable: dict[tuple[str, str], StoredDurable] = field(default_factory=dict)
    journals: dict[tuple[str, str], JournalInfo] = field(default_factory=dict)
    orphans: int = 0
    upgrade: int | None = None


class _Damaged(Exception):
    """Where the file breaks its rules (its schema; a table, row and column), and how."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.row = where.startswith("table ")


def read(lock: StoreLock) -> Contents:
    """Read and check the whole store file ``lock`` holds, writing nothing.

    Raises:
        TaskStoreError: The file is not a sqlite database, not a task store, written by a
            newer schema, or damaged (the message names the first bad row and column).
    """
    shown = lock.shown
    had = {side for side in SIDE_FILES if os.path.lexists(lock.real + side)}
    try:
        try:
            db = sqlite3.connect(f"file:{quote(lock.real)}?mode=ro", uri=True, isolation_level=None)
        except sqlite3.Error as exc:
            raise TaskStoreError(f"cannot open task store {shown}: {exc}") from exc
        with contextlib.closing(db):
            try:
                db.execute("BEGIN")  # one snapshot of the whole file
                contents = _read(db, shown)
            except sqlite3.Error as exc:
                raise TaskStoreError(
                    f"{shown} is not a readable task store ({exc}); it was left as it is. Move "
                    "it away, or choose another store path"
                ) from exc
            except _Damaged as exc:
                fix = "fix or delete that row, move the file away" if exc.row else "move it away"
                raise TaskStoreError(
                    f"{shown} is damaged: {exc}. It was left as it is: {fix}, or choose another "
                    "store path"
                ) from None
            if not lock.same_file():
                raise TaskStoreError(
                    f"task store {shown} was replaced while it was being opened; open it again"
                )
            return contents
    except BaseException:
        for side in SIDE_FILES:
            if side not in had:
                with contextlib.suppress(OSError):
                    os.unlink(lock.real + side)
        raise


def connect(lock: StoreLock, *, fresh: bool, upgrade: int | None = None) -> sqlite3.Connection:
    """The connection the writer thread writes with.

    A ``fresh`` file gets the schema first; one of an older schema (``upgrade``: its version)
    is upgraded to this version's, in one transaction.

    Raises:
        TaskStoreError: The file cannot be opened for writing, or not upgraded (nothing was
            written then).
    """
    shown = lock.shown
    try:
        # autocommit: transactions are explicit; the writer thread is the only user later
        db = sqlite3.connect(lock.real, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise TaskStoreError(f"cannot open task store {shown}: {exc}") from exc
    try:
        db.execute("PRAGMA application_id").fetchone()  # sqlite opens the file here
        if not lock.same_file():
            raise TaskStoreError(
                f"task store {shown} was replaced while it was being opened; open it again"
            )
        db.execute("PRAGMA journal_mode = WAL")
        if fresh:
            db.executescript(
                f"BEGIN; {SCHEMA} PRAGMA application_id = {APPLICATION_ID}; "
                f"PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            )
        elif upgrade is not None:
            _upgrade(db, shown, upgrade)
        db.execute("PRAGMA synchronous = NORMAL")
    except sqlite3.Error as exc:
        db.close()
        raise TaskStoreError(f"cannot open task store {shown} for writing: {exc}") from exc
    except BaseException:
        db.close()
        raise
    return db


def _upgrade(db: sqlite3.Connection, shown: str, version: int) -> None:
    """Upgrade the file from schema ``version`` to this version's, all or nothing."""
    try:
        db.executescript(
            f"BEGIN IMMEDIATE; {UPGRADES[version][1]} PRAGMA user_version = {SCHEMA_VERSION}; "
            "COMMIT;"
        )
    except sqlite3.Error as exc:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise TaskStoreError(
            f"task store {shown} was written by an older zett_agent (task store schema "
            f"{version}) and could not be upgraded to schema {SCHEMA_VERSION} ({exc}); it was "
            "left as it is. Check that its directory is writable, or choose another store path"
        ) from exc


def _read(db: sqlite3.Connection, shown: str) -> Contents:
    application_id = db.execute("PRAGMA application_id").fetchone()[0]
    version = db.execute("PRAGMA user_version").fetchone()[0]
    objects = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if application_id == 0 and version == 0 and objects == 0:
        return Contents(fresh=True)  # an empty file (or database): it gets the schema
    if application_id != APPLICATION_ID:
        raise TaskStoreError(
            f"{shown} is a sqlite database but not a zett_agent task store (application_id "
            f"{application_id:#x}); it was left as it is. Choose another store path"
        )
    if version > SCHEMA_VERSION:
        raise TaskStoreError(
            f"{shown} was written by a newer zett_agent (task store schema {version}; this "
            f"version reads schema {SCHEMA_VERSION} and older); it was left as it is. Upgrade "
            "zett_agent, or choose another store path"
        )
    if version < 1 or (version < SCHEMA_VERSION and version not in UPGRADES):
        raise TaskStoreError(
            f"{shown} is damaged (a task store without a schema version this version knows: "
            f"{version}; this version reads schema {SCHEMA_VERSION} and upgrades "
            f"{', '.join(map(str, sorted(UPGRADES))) or 'none'}); it was left as it is. Move it "
            "away, or choose another store path"
        )
    upgrade = version if version < SCHEMA_VERSION else None
    _check_schema(db, UPGRADES[version][0] if upgrade is not None else SCHEMA)
    counter = 0
    for _, (_, value) in _rows(db, "meta", "rowid", META):
        counter = value  # the one key there is: "counter"
    spent = {session: tokens for _, (session, tokens) in _rows(db, "sessions", "rowid", SESSIONS)}
    tasks = _tasks(db, counter)
    durable: dict[tuple[str, str], StoredDurable] = {}
    journals: dict[tuple[str, str], JournalInfo] = {}
    orphans = 0
    if upgrade is None:  # a schema-1 file has no durable task
        durable = _durable(db, {(t.parent_session_id, t.task_id) for t in tasks})
        journals, orphans = read_journals(db, durable.keys())
    # after the rows (a bad value is named by its row), what they do not show: the indexes
    verdict = db.execute("PRAGMA quick_check(1)").fetchone()[0]
    if verdict != "ok":
        raise _Damaged("sqlite's quick_check", str(verdict)[:500])
    return Contents(tasks, spent, counter, False, durable, journals, orphans, upgrade)


def _durable(
    db: sqlite3.Connection, tasks: set[tuple[str, str]]
) -> dict[tuple[str, str], StoredDurable]:
    durable: dict[tuple[str, str], StoredDurable] = {}
    for rowid, values in _rows(db, "durable", "rowid", DURABLE):
        row = StoredDurable(*values)
        key = (row.parent_session_id, row.task_id)
        if key not in tasks:
            raise _Damaged(
                f"{_row(db, 'durable', 'rowid', rowid)}, column task_id",
                "the store holds no such task",
            )
        durable[key] = row
    return durable


def _tasks(db: sqlite3.Connection, counter: int) -> list[StoredTask]:
    tasks: list[StoredTask] = []
    seen: set[tuple[str, str]] = set()
    for seq, values in _rows(db, "tasks", "seq", TASKS):
        task = StoredTask(*values)
        number = task_number(task.task_id)
        if number is None:
            why = f"expected a task id task-N, got {task.task_id[:60]!r}"
        elif number > counter:
            why = (
                f"its number {number} is above the store's task counter {counter} (table "
                "meta), so a new task would take its id"
            )
        elif (task.parent_session_id, task.task_id) in seen:
            why = "a second row of the same task in the same session"
        else:
            seen.add((task.parent_session_id, task.task_id))
            tasks.append(task)
            continue
        raise _Damaged(f"{_row(db, 'tasks', 'seq', seq)}, column task_id", why)
    return tasks


#: the columns that name a row of each table in an error, and how
_LABELS = {
    "tasks": (("task_id", "task"), ("parent_session_id", "of session")),
    "sessions": (("parent_session_id", "session"),),
    "meta": (("key", "key"),),
    "durable": (("task_id", "task"), ("parent_session_id", "of session")),
}


def _row(db: sqlite3.Connection, table: str, key: str, value: int) -> str:
    """``table tasks, row seq=3 (task 'task-3' of session 'parent')``: a row, for an error.

    Each naming column is shown if it is short text (decoded as far as it goes).
    """
    labels = []
    for column, label in _LABELS[table]:
        text = db.execute(
            f"SELECT CASE WHEN typeof({column}) = 'text' AND length(CAST({column} AS BLOB)) "
            f"<= 100 THEN CAST({column} AS BLOB) END FROM {table} WHERE {key} = ?",
            (value,),
        ).fetchone()[0]
        if text is None:
            break
        labels.append(f"{label} {bytes(text).decode('utf-8', 'replace')!r}")
    named = f" ({' '.join(labels)})" if labels else ""
    return f"table {table}, row {key}={value}{named}"


def _rows(
    db: sqlite3.Connection, table: str, key: str, columns: Sequence[Column]
) -> Iterator[tuple[int, list[Any]]]:
    """Each row of ``table`` as (its ``key``, its values checked), in ``key`` order.

    sqlite checks what it can of every column's rule (``Column.condition``: type, size,
    range, choice) and hands a value over only when it passed: a huge text or blob stays in
    the file. A row where one failed names the first such column; Python then reads the rest
    (``Column.read``: UTF-8, JSON). The first bad value is ``_Damaged`` naming its row and
    column, and how it breaks the rule (``Column.check``).
    """
    fault = " ".join(
        f"WHEN NOT coalesce({column.condition}, 0) THEN {index}"
        for index, column in enumerate(columns)
    )
    values = ", ".join(
        f"CASE WHEN coalesce({column.condition}, 0) THEN {column.name} END" for column in columns
    )
    db.text_factory = bytes  # text is decoded by each column's rule: bad UTF-8 names its row
    try:
        cursor = db.execute(f"SELECT {key}, CASE {fault} END, {values} FROM {table} ORDER BY {key}")
        while batch := cursor.fetchmany(_FETCH):
            for row in batch:
                column = columns[row[1] or 0]  # the column an error names
                try:
                    if row[1] is not None:
                        _explain(db, table, key, row[0], column)
                    checked = []
                    for column, value in zip(columns, row[2:], strict=True):
                        checked.append(column.read(value))
                except BadValue as exc:
                    where = _row(db, table, key, row[0])
                    raise _Damaged(f"{where}, column {column.name}", str(exc)) from None
                yield row[0], checked
    finally:
        db.text_factory = str


def _explain(db: sqlite3.Connection, table: str, key: str, value: int, column: Column) -> None:
    """Raise ``BadValue`` saying how the ``column`` of a row breaks its rule."""
    name = column.name
    size = f"length(CAST({name} AS BLOB))"
    kind, length, held = db.execute(
        f"SELECT typeof({name}), {size}, CASE WHEN {size} <= {column.bound} THEN {name} END "
        f"FROM {table} WHERE {key} = ?",
        (value,),
    ).fetchone()
    column.check(kind.decode("ascii"), length, held)
    raise BadValue("it breaks the rule of its column")  # sqlite said so; Python found nothing


def _check_schema(db: sqlite3.Connection, schema: str) -> None:
    """Refuse a file whose schema is not exactly ``schema`` (the one it says it has).

    Its objects are compared first, by name: only a table known to be ours is then described
    (its name goes into a ``PRAGMA``).
    """
    expected = _reference_schema(schema)
    objects = {
        (str(kind), str(name)) for kind, name in db.execute("SELECT type, name FROM sqlite_master")
    }
    wanted = set(expected)
    for kind, name in sorted(wanted - objects, key=lambda o: (o[0] != "table", o)):
        raise _Damaged("its schema", f"the {kind} {name} is missing")
    for kind, name in sorted(objects - wanted):
        raise _Damaged(
            "its schema", f"it holds the {kind} {name[:80]!r}, which a task store has not"
        )
    for (kind, name), described in sorted(expected.items()):
        if kind == "table" and _table(db, name) != described:
            raise _Damaged(
                "its schema", f"table {name} has other columns or indexes than a task store's"
            )


def _table(db: sqlite3.Connection, name: str) -> Any:
    """A table's columns and indexes, as sqlite describes them."""
    columns = db.execute(f"PRAGMA table_xinfo({name})").fetchall()
    indexes = [
        (unique, origin, partial, db.execute(f'PRAGMA index_info("{index}")').fetchall())
        for _, index, unique, origin, partial in db.execute(f"PRAGMA index_list({name})")
    ]
    return columns, sorted(indexes)


@functools.cache
def _reference_schema(schema: str) -> dict[tuple[str, str], Any]:
    """A store's schema objects, each table with its description (made once, in memory)."""
    with contextlib.closing(sqlite3.connect(":memory:")) as db:
        db.executescript(schema)
        objects = db.execute("SELECT type, name FROM sqlite_master").fetchall()
        return {
            (kind, name): _table(db, name) if kind == "table" else None for kind, name in objects
        }
