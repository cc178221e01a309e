"""A task store's file: its schema, and opening, checking and loading it.

``TaskStore`` (``_store``) calls these once, when it opens, with the file locked
(``_store_lock``); nothing here runs after that. Opening checks the file before anything is
written to it: a file that is not a sqlite database, not a zett_agent task store, damaged, or
written by a newer schema raises ``TaskStoreError`` naming it, and nothing in it is changed.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zett_agent.extensions._store_lock import StoreLock

__all__ = [
    "APPLICATION_ID",
    "SCHEMA_VERSION",
    "StoredTask",
    "TaskStoreError",
    "load",
    "open_db",
]

#: the schema this version writes and reads (``PRAGMA user_version``)
SCHEMA_VERSION = 1
#: ``PRAGMA application_id`` of a task store: "zett" in ASCII
APPLICATION_ID = 0x7A657474
_SCHEMA = """
CREATE TABLE tasks (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    parent_session_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    subagent_type TEXT NOT NULL,
    description TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    elapsed REAL,
    output TEXT,
    error TEXT,
    turns INTEGER NOT NULL DEFAULT 0,
    tool_calls INTEGER NOT NULL DEFAULT 0,
    last_tool TEXT,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    progress TEXT,
    messages TEXT,
    lost INTEGER NOT NULL DEFAULT 0,
    notice TEXT NOT NULL DEFAULT 'none',
    UNIQUE (parent_session_id, task_id)
);
CREATE TABLE sessions (
    parent_session_id TEXT PRIMARY KEY,
    spent_tokens INTEGER NOT NULL
);
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""


class TaskStoreError(Exception):
    """A task store cannot be used.

    It is held by another live host, damaged, not a task store, or written by a newer
    version. The message names the file; nothing in it was changed.
    """


@dataclass
class StoredTask:
    """One task as the store keeps it (what ``AsyncSubAgentExtension`` restores)."""

    parent_session_id: str
    task_id: str
    session_id: str
    subagent_type: str
    description: str
    status: str
    created_at: float
    updated_at: float
    elapsed: float | None
    output: str | None
    error: str | None
    turns: int
    tool_calls: int
    last_tool: str | None
    input_tokens: int
    output_tokens: int
    progress: dict[str, int] | None
    messages: dict[str, Any] | None
    lost: bool
    notice: str


#: the columns of a ``StoredTask``, in its order
_ROW_FIELDS = tuple(StoredTask.__dataclass_fields__)


def open_db(lock: StoreLock) -> sqlite3.Connection:
    """The store's connection, to the file ``lock`` holds (by its resolved path)."""
    path = lock.shown
    try:
        fresh = os.fstat(lock.fd).st_size == 0
        # autocommit: transactions are explicit; the writer thread is the only user later
        db = sqlite3.connect(lock.real, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise TaskStoreError(f"cannot open task store {path}: {exc}") from exc
    try:
        _check(db, path, fresh)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        db.close()
        raise
    return db


def _check(db: sqlite3.Connection, path: str, fresh: bool) -> None:
    """Refuse a file that is not ours, damaged or newer, before anything is written to it."""
    try:
        application_id = db.execute("PRAGMA application_id").fetchone()[0]
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        raise TaskStoreError(
            f"{path} is not a readable task store ({exc}); it was left as it is. Move it "
            "away, or choose another store path"
        ) from exc
    if fresh or (application_id == 0 and version == 0 and tables == 0):
        try:
            db.executescript(
                f"BEGIN; {_SCHEMA} PRAGMA application_id = {APPLICATION_ID}; "
                f"PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            )
        except sqlite3.Error as exc:
            raise TaskStoreError(f"cannot create task store {path}: {exc}") from exc
        return
    if application_id != APPLICATION_ID:
        raise TaskStoreError(
            f"{path} is a sqlite database but not a zett_agent task store (application_id "
            f"{application_id:#x}); it was left as it is. Choose another store path"
        )
    if version > SCHEMA_VERSION:
        raise TaskStoreError(
            f"{path} was written by a newer zett_agent (task store schema {version}; this "
            f"version reads schema {SCHEMA_VERSION} and older); it was left as it is. Upgrade "
            "zett_agent, or choose another store path"
        )
    if version < 1:
        raise TaskStoreError(
            f"{path} is damaged (a task store without a schema version); it was left as it "
            "is. Move it away, or choose another store path"
        )


def load(db: sqlite3.Connection, path: str) -> tuple[list[StoredTask], dict[str, int], int]:
    """Every stored task (oldest first), what each session spent, the last task number."""
    try:
        rows = db.execute(f"SELECT {', '.join(_ROW_FIELDS)} FROM tasks ORDER BY seq").fetchall()
        spent = dict(db.execute("SELECT parent_session_id, spent_tokens FROM sessions"))
        found = db.execute("SELECT value FROM meta WHERE key = 'counter'").fetchone()
    except sqlite3.DatabaseError as exc:
        raise TaskStoreError(
            f"{path} is damaged ({exc}); it was left as it is. Move it away, or choose "
            "another store path"
        ) from exc
    tasks = []
    try:
        for row in rows:
            fields = dict(zip(_ROW_FIELDS, row, strict=True))
            fields["progress"] = _json(fields["progress"])
            fields["messages"] = _json(fields["messages"])
            fields["lost"] = bool(fields["lost"])
            tasks.append(StoredTask(**fields))
    except (TypeError, ValueError) as exc:
        raise TaskStoreError(
            f"{path} is damaged (a task row cannot be read: {exc}); it was left as it is"
        ) from exc
    return tasks, {str(k): int(v) for k, v in spent.items()}, int(found[0]) if found else 0


def _json(text: str | None) -> Any:
    if text is None:
        return None
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value
