"""What a task store holds: its tables, the type and range of every value, its error.

One table of rules (``TASKS``, ``SESSIONS``, ``META``, ``DURABLE``, ``JOURNAL``) serves both
directions: the writer (``_store``) passes each value through ``stored`` (counts clamped to
their range, long text cut with a note), and opening a store (``_store_file``) refuses any
value the writer could not have written. What a store writes, it reads back.

Schema 2 added the tables of durable tasks (``durable``: what a durable task needs to resume;
``journal``: its steps, see ``_journal_entries``); a schema-1 file is upgraded in place when it
opens (``UPGRADES``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from zett_agent.extensions._journal_entries import MAX_ENTRY_BYTES
from zett_agent.extensions._tasks._task import SubAgentTaskStatus
from zett_agent.extensions._tasks._task_messages import MAX_MESSAGES

__all__ = [
    "APPLICATION_ID",
    "DURABLE",
    "JOURNAL",
    "MAX_COUNT",
    "MAX_DEATHS",
    "MAX_ID_BYTES",
    "MAX_TEXT_BYTES",
    "META",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SESSIONS",
    "TASKS",
    "UPGRADES",
    "BadValue",
    "Column",
    "StoredDurable",
    "StoredTask",
    "TaskStoreError",
    "stored",
    "stored_row",
    "task_number",
]

#: the schema this version writes and reads (``PRAGMA user_version``)
SCHEMA_VERSION = 2
#: ``PRAGMA application_id`` of a task store: "zett" in ASCII
APPLICATION_ID = 0x7A657474
_SCHEMA_1 = """
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
_DURABLE_TABLES = """
CREATE TABLE durable (
    parent_session_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    prompt TEXT NOT NULL,
    resumes INTEGER NOT NULL DEFAULT 0,
    crashes INTEGER NOT NULL DEFAULT 0,
    deaths TEXT,
    PRIMARY KEY (parent_session_id, task_id)
);
CREATE TABLE journal (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    parent_session_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    entry TEXT NOT NULL,
    UNIQUE (parent_session_id, task_id, step)
);
"""
#: the schema a new store gets
SCHEMA = _SCHEMA_1 + _DURABLE_TABLES
#: each older schema this version reads: what it holds, and the script that upgrades it to
#: this version's in place (in one transaction, with ``PRAGMA user_version``)
UPGRADES = {1: (_SCHEMA_1, _DURABLE_TABLES)}

#: longest id, name or key (a session id, a task id, a definition's name, a tool's name), in
#: UTF-8 bytes: far beyond any real one; a longer id is refused when its task is stored
MAX_ID_BYTES = 1 << 16
#: longest text (a description, a report, an error), in UTF-8 bytes: a longer one is stored
#: cut, with a note saying how much was left out
MAX_TEXT_BYTES = 1 << 24
#: longest stored progress and messages (JSON text), in bytes: several times what is written
_MAX_PROGRESS_BYTES = 256
_MAX_MESSAGES_BYTES = 4096
#: largest count (tokens, turns, tool calls, a task number): a sqlite INTEGER
MAX_COUNT = 2**63 - 1
#: largest time (seconds: a duration, or since the epoch): beyond any real one
MAX_SECONDS = 1e12
#: most a progress report may count (as ``SubAgentTask.fold_progress`` takes it)
_MAX_PROGRESS = 10**12
#: most deaths of a durable task kept (the latest; each names its try)
MAX_DEATHS = 100
#: longest reason of one death, in characters
_MAX_REASON = 500
#: what a task's ``notice`` column may say
NOTICES = frozenset({"none", "due", "read", "delivered"})
STATUSES = frozenset(s.value for s in SubAgentTaskStatus)
_TASK_ID = re.compile(r"task-([1-9][0-9]{0,18})")


class TaskStoreError(Exception):
    """A task store cannot be used.

    It is held by another live host, damaged, not a task store, or written by a newer
    version. The message names the file (and, for a damaged one, the first bad row); nothing
    in it was changed.
    """


@dataclass
class StoredTask:
    """One task as the store keeps it (what ``AsyncSubAgentExtension`` restores).

    Every field was checked against its column's rule when the store opened.
    """

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


@dataclass
class StoredDurable:
    """What a durable task needs to resume, as the store keeps it (checked when it opened).

    ``deaths`` lists each try that died: ``{"try": n, "reason": "..."}``, oldest first.
    """

    parent_session_id: str
    task_id: str
    prompt: str
    resumes: int
    crashes: int
    deaths: list[dict[str, Any]] | None


class BadValue(ValueError):
    """A stored value that breaks its column's rule (the message says how)."""


@dataclass(frozen=True)
class Column:
    """The rule of one column: its kind, whether it may be NULL, and its bound.

    ``kind`` is ``"id"`` (text, refused beyond ``bound`` bytes), ``"text"`` (text, cut beyond
    ``bound`` bytes when written), ``"count"`` (an integer from 0 to ``MAX_COUNT``),
    ``"seconds"`` (a finite real from 0 to ``MAX_SECONDS``), ``"flag"`` (0 or 1), ``"choice"``
    (one of ``choices``) or ``"json"`` (JSON text of at most ``bound`` bytes whose value
    ``shape`` checks).

    A rule is checked in two parts: ``condition`` is what sqlite can check (the type, the
    size, the range, the choice), for every row at once; ``read`` does the rest (UTF-8, JSON)
    as it converts a value that passed. ``check`` is the whole rule in Python, which says how
    a value sqlite found bad breaks it.
    """

    name: str
    kind: str
    nullable: bool = False
    bound: int = MAX_ID_BYTES
    choices: frozenset[str] = frozenset()
    shape: Callable[[Any], None] | None = None

    @property
    def sqlite_types(self) -> frozenset[str]:
        """The ``typeof()`` a valid value of this column has."""
        types = {
            "count": {"integer"},
            "flag": {"integer"},
            "seconds": {"real", "integer"},
        }.get(self.kind, {"text"})
        return frozenset(types | ({"null"} if self.nullable else set()))

    @property
    def condition(self) -> str:
        """SQL true for a value sqlite sees within the rule (``read`` checks the rest)."""
        name, kind = self.name, self.kind
        if kind == "count":
            test = f"typeof({name}) = 'integer' AND {name} BETWEEN 0 AND {MAX_COUNT}"
        elif kind == "flag":
            test = f"typeof({name}) = 'integer' AND {name} IN (0, 1)"
        elif kind == "seconds":
            test = f"typeof({name}) IN ('integer', 'real') AND {name} BETWEEN 0 AND {MAX_SECONDS}"
        elif kind == "choice":
            choices = ", ".join(f"'{c}'" for c in sorted(self.choices))
            test = f"typeof({name}) = 'text' AND {name} IN ({choices})"
        else:
            test = f"typeof({name}) = 'text' AND length(CAST({name} AS BLOB)) <= {self.bound}"
        return f"({name} IS NULL OR {test})" if self.nullable else f"({test})"

    def read(self, value: Any) -> Any:
        """A value sqlite found within ``condition``, as Python reads it (text as bytes).

        Raises ``BadValue`` for what sqlite could not check: UTF-8, and the JSON and its shape.
        """
        return None if value is None else _READERS[self.kind](value, self)

    def check(self, kind: str, size: int | None, value: Any) -> None:
        """Raise ``BadValue`` saying how a stored value breaks the rule.

        ``kind`` is its ``typeof()``, ``size`` its length in bytes, and ``value`` the value
        itself (text as bytes) unless it is larger than the rule's bound.
        """
        if kind not in self.sqlite_types:
            expected = " or ".join(sorted(self.sqlite_types - {"null"}))
            got = "NULL" if kind == "null" else f"a value of type {kind}"
            raise BadValue(f"expected {expected}{' or NULL' if self.nullable else ''}, got {got}")
        if size is not None and size > self.bound:
            raise BadValue(
                f"it holds {size} bytes, more than the {self.bound} a store writes there"
            )
        if value is None:
            return
        if self.kind == "count" and not 0 <= value <= MAX_COUNT:
            raise BadValue(f"expected a count from 0 to {MAX_COUNT}, got {value}")
        if self.kind == "flag" and value not in (0, 1):
            raise BadValue(f"expected 0 or 1, got {value}")
        if self.kind == "seconds" and not (math.isfinite(value) and 0.0 <= value <= MAX_SECONDS):
            raise BadValue(f"expected seconds from 0 to {MAX_SECONDS:g}, got {float(value)!r}")
        text = self.read(value)
        if self.kind == "choice" and text not in self.choices:
            raise BadValue(f"expected one of {sorted(self.choices)}, got {text[:60]!r}")


def _text(value: bytes, column: Column) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadValue(f"the text is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def _json(value: bytes, column: Column) -> Any:
    assert column.shape is not None
    decoded = _decode_json(_text(value, column))
    column.shape(decoded)
    return decoded


#: how each kind of column reads a value sqlite passed (never ``None``)
_READERS: dict[str, Callable[[Any, Column], Any]] = {
    "count": lambda value, column: value,
    "flag": lambda value, column: bool(value),
    "seconds": lambda value, column: float(value),
    "id": _text,
    "text": _text,
    "choice": _text,
    "json": _json,
}


def _refuse(constant: str) -> Any:
    raise BadValue(f"the JSON holds {constant}, which a store never writes")


_DECODER = json.JSONDecoder(parse_constant=_refuse)


def _decode_json(text: str) -> Any:
    """The value of a flat JSON text (nesting of at most two levels), or ``BadValue``.

    The nesting is counted before decoding, so no text makes the decoder recurse deeply.
    """
    if text.count("[") + text.count("{") > 2:  # else it cannot nest deeper: no need to count
        _check_nesting(text)

    try:
        return _DECODER.decode(text)
    except BadValue:
        raise
    except ValueError as exc:  # JSONDecodeError, or an integer of too many digits
        raise BadValue(f"the text is not valid JSON ({exc})") from None


def _check_nesting(text: str) -> None:
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > 2:
                raise BadValue("the JSON is nested deeper than the two levels a store writes")
        elif char in "]}":
            depth -= 1


def _count(value: Any, top: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top


def _progress_shape(value: Any) -> None:
    """``{"done": n}`` or ``{"done": n, "total": m}``, as ``SubAgentTask.progress`` is."""
    if (
        not isinstance(value, dict)
        or not {"done"} <= value.keys() <= {"done", "total"}
        or not all(_count(v, _MAX_PROGRESS) for v in value.values())
    ):
        raise BadValue(
            f'expected {{"done": n}} or {{"done": n, "total": m}} with counts from 0 to '
            f"{_MAX_PROGRESS}, got {json.dumps(value)[:80]}"
        )


def _messages_shape(value: Any) -> None:
    """``{"sent": n, "delivered": d, "pending": [ids]}``, as ``TaskMessages.stored`` writes."""
    ok = isinstance(value, dict) and value.keys() == {"sent", "delivered", "pending"}
    if ok:
        sent, delivered, pending = value["sent"], value["delivered"], value["pending"]
        ok = (
            _count(sent, MAX_MESSAGES)
            and _count(delivered, sent)
            and isinstance(pending, list)
            and len(pending) <= sent
            and all(isinstance(p, str) and re.fullmatch(r"msg-[1-9][0-9]{0,2}", p) for p in pending)
        )
    if not ok:
        raise BadValue(
            f'expected {{"sent": n, "delivered": d, "pending": ["msg-1", ...]}} with at most '
            f"{MAX_MESSAGES} messages, got {json.dumps(value)[:80]}"
        )


def _deaths_shape(value: Any) -> None:
    """``[{"try": n, "reason": "..."}, ...]``, as ``DurableState.stored_deaths`` writes."""
    ok = isinstance(value, list) and len(value) <= MAX_DEATHS
    if ok:
        for item in value:
            if not (
                isinstance(item, dict)
                and item.keys() == {"try", "reason"}
                and _count(item["try"], MAX_COUNT)
                and isinstance(item["reason"], str)
                and len(item["reason"]) <= _MAX_REASON
            ):
                ok = False
                break
    if not ok:
        raise BadValue(
            f'expected [{{"try": n, "reason": "..."}}, ...] with at most {MAX_DEATHS} deaths '
            f"and reasons of at most {_MAX_REASON} characters, got {json.dumps(value)[:80]}"
        )


#: the columns of ``tasks`` but ``seq``, in the order of ``StoredTask``
TASKS = (
    Column("parent_session_id", "id"),
    Column("task_id", "id"),
    Column("session_id", "id"),
    Column("subagent_type", "id"),
    Column("description", "text", bound=MAX_TEXT_BYTES),
    Column("status", "choice", choices=STATUSES),
    Column("created_at", "seconds"),
    Column("updated_at", "seconds"),
    Column("elapsed", "seconds", nullable=True),
    Column("output", "text", nullable=True, bound=MAX_TEXT_BYTES),
    Column("error", "text", nullable=True, bound=MAX_TEXT_BYTES),
    Column("turns", "count"),
    Column("tool_calls", "count"),
    Column("last_tool", "text", nullable=True),
    Column("input_tokens", "count"),
    Column("output_tokens", "count"),
    Column("progress", "json", nullable=True, bound=_MAX_PROGRESS_BYTES, shape=_progress_shape),
    Column("messages", "json", nullable=True, bound=_MAX_MESSAGES_BYTES, shape=_messages_shape),
    Column("lost", "flag"),
    Column("notice", "choice", choices=NOTICES),
)
SESSIONS = (Column("parent_session_id", "id"), Column("spent_tokens", "count"))
META = (Column("key", "choice", choices=frozenset({"counter"})), Column("value", "count"))
#: the columns of ``durable``, in the order of ``StoredDurable``
DURABLE = (
    Column("parent_session_id", "id"),
    Column("task_id", "id"),
    Column("prompt", "text", bound=MAX_TEXT_BYTES),
    Column("resumes", "count"),
    Column("crashes", "count"),
    # a death is about 600 bytes as JSON at most
    Column("deaths", "json", nullable=True, bound=MAX_DEATHS * 700, shape=_deaths_shape),
)
#: the columns of ``journal`` but ``seq`` (an entry's JSON is checked by ``read_entry``)
JOURNAL = (
    Column("parent_session_id", "id"),
    Column("task_id", "id"),
    Column("step", "count"),
    Column("entry", "text", bound=MAX_ENTRY_BYTES),
)
assert tuple(StoredTask.__dataclass_fields__) == tuple(c.name for c in TASKS)
assert tuple(StoredDurable.__dataclass_fields__) == tuple(c.name for c in DURABLE)
_RULES = (
    {column.name: column for column in (*TASKS, *SESSIONS)}
    | {"number": META[1]}
    | {column.name: column for column in DURABLE[2:]}
)


def task_number(task_id: str) -> int | None:
    """The number of a task id ``task-N``, or ``None`` if it has not that form."""
    found = _TASK_ID.fullmatch(task_id)
    return int(found.group(1)) if found else None


def stored(name: str, value: Any) -> Any:
    """``value`` as column ``name`` is written: within its rule.

    Counts are clamped to their range (a child shaped them: they must not fail the write),
    times too, long text is cut with a note, dicts are written as JSON. Raises ``ValueError``
    for an id beyond its bound (the caller's to refuse), and for a status or notice state
    that is none of its column's (a bug: a store must never hold what it cannot read).
    """
    rule = _RULES[name]
    if value is None:
        return None
    kind = rule.kind
    if kind == "flag":
        return int(bool(value))
    if kind == "count":
        return max(0, min(int(value), MAX_COUNT))
    if kind == "choice":
        if value not in rule.choices:
            raise ValueError(f"{name} must be one of {sorted(rule.choices)}, got {value!r}")
        return value
    if kind == "seconds":
        seconds = float(value)
        return min(max(seconds, 0.0), MAX_SECONDS) if math.isfinite(seconds) else 0.0
    if kind == "json":
        return json.dumps(value, ensure_ascii=False)
    if not isinstance(value, str) or len(value) * 4 <= rule.bound:
        return value
    encoded = value.encode("utf-8", "surrogatepass")
    if len(encoded) <= rule.bound:
        return value
    if kind == "id":
        raise ValueError(
            f"{name} has {len(encoded)} bytes, more than the {rule.bound} a task store keeps; "
            "use a shorter one"
        )
    note = f"\n[... {len(encoded)} bytes in all; the task store keeps the first ones]"
    kept = encoded[: rule.bound - len(note.encode())].decode("utf-8", "ignore")
    return kept + note


def stored_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A new task's row (``task_row``) as it is written; ``ValueError`` for a too long id."""
    return {name: stored(name, value) for name, value in row.items()}
