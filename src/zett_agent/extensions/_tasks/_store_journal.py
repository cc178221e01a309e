"""The journals a task store holds as it opens: each task's steps checked, a damaged one named.

Unlike the other tables, where one bad value refuses the whole store (``_store_file``), a bad
journal row fails only its task: ``read_journals`` reads every row of ``journal`` once, checks
each value against its column's rule and each entry's JSON as a child's step is checked
(``_journal_entries.read_entry``), and the order of each task's steps (as written: one after
the other, a snapshot only first), and returns per task how many steps and bytes its journal
holds, or why it is damaged (naming the row and the column). Nothing is kept of the entries
themselves: a resume reads them again. Rows of no task the store holds (or whose task cannot be
told) are counted as orphans, which the store deletes once it opened.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection
from dataclasses import dataclass

from zett_agent.extensions._journal_entries import BadEntry, read_entry
from zett_agent.extensions._tasks._store_schema import JOURNAL, BadValue

__all__ = ["JournalInfo", "read_journals"]

#: rows fetched from sqlite at a time
_FETCH = 64


@dataclass
class JournalInfo:
    """One task's journal as the store opened it.

    Attributes:
        steps: Its steps (rows).
        bytes: The bytes of their entries' text.
        last: The number of its last step (0: none).
        damaged: Why it cannot be read (a row and column named), or ``None``.
    """

    steps: int = 0
    bytes: int = 0
    last: int = 0
    damaged: str | None = None


def read_journals(
    db: sqlite3.Connection, tasks: Collection[tuple[str, str]]
) -> tuple[dict[tuple[str, str], JournalInfo], int]:
    """Each task's journal (by ``(parent_session_id, task_id)``), and the count of orphan rows.

    ``tasks`` are the tasks the store holds. Reads in the open's transaction; writes nothing.
    """
    session, task, step, entry = JOURNAL
    ident = f"{session.condition} AND {task.condition}"
    cursor = db.execute(
        f"SELECT seq, CASE WHEN {ident} THEN parent_session_id END, "
        f"CASE WHEN {ident} THEN task_id END, typeof(step), "
        "CASE WHEN typeof(step) = 'integer' THEN step END, "
        f"CASE WHEN {step.condition} THEN step END, typeof(entry), "
        f"length(CAST(entry AS BLOB)), CASE WHEN {entry.condition} THEN entry END "
        "FROM journal ORDER BY parent_session_id, task_id, seq"
    )
    journals: dict[tuple[str, str], JournalInfo] = {}
    orphans = 0
    db.text_factory = bytes
    try:
        while batch := cursor.fetchmany(_FETCH):
            for seq, sid, tid, step_type, raw, number, kind, size, text in batch:
                key = _key(sid, tid)
                if key is None or key not in tasks:
                    orphans += 1
                    continue
                info = journals.setdefault(key, JournalInfo())
                if info.damaged is not None:
                    continue
                where = f"table journal, row seq={seq} (task {key[1]!r} of session {key[0]!r})"
                try:
                    if number is None:
                        step.check(step_type.decode("ascii"), None, raw)
                        raise BadValue("it breaks the rule of its column")
                    column = "entry"
                    if text is None:
                        entry.check(kind.decode("ascii"), size, None)
                        raise BadValue("it breaks the rule of its column")
                    read = read_entry(entry.read(text))
                    column = "step"
                    if info.steps and number != info.last + 1:
                        raise BadValue(
                            f"step {number} follows step {info.last}: the steps between are missing"
                        )
                    column = "entry"
                    if read.snapshot and info.steps:
                        raise BadValue("a snapshot may only be a journal's first step")
                except (BadValue, BadEntry) as exc:
                    name = "step" if number is None else column
                    info.damaged = f"{where}, column {name}: {exc}"
                    continue
                info.steps += 1
                info.bytes += size
                info.last = number
    finally:
        db.text_factory = str
    return journals, orphans


def _key(sid: bytes | None, tid: bytes | None) -> tuple[str, str] | None:
    if sid is None or tid is None:
        return None
    try:
        return sid.decode("utf-8"), tid.decode("utf-8")
    except UnicodeDecodeError:
        return None
