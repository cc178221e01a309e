"""Opening a ``TaskStore``: all or nothing, and one live host per file, whatever its name.

A store file that a hostile or buggy writer shaped (a value of the wrong type or range, a
NULL, a huge text, bad JSON, a table missing or added, a newer schema, not a file at all) is
a ``TaskStoreError`` naming the file and the first bad row and column; the directory is left
byte for byte as it was, nothing stays open (the autouse guard checks threads and fds), and
the same process opens the store once the file is fixed. The lock is the file's: a host that
holds it is named by pid to an opener through a symlink or a hard link, in another process or
this one. What a store writes, it reads back.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import select
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from zett_agent.extensions._tasks._store_schema import (
    MAX_COUNT,
    MAX_ID_BYTES,
    MAX_TEXT_BYTES,
    SCHEMA_VERSION,
)
from zett_agent.extensions.async_subagent import (
    AsyncSubAgentExtension,
    SubAgentTask,
    SubAgentTaskStatus,
    TaskStore,
    TaskStoreError,
)

HANG_GUARD = 60


def row(number: int, status: str, session: str = "parent") -> dict[str, object]:
    """A task's row as ``task_row`` makes it."""
    return {
        "parent_session_id": session,
        "task_id": f"task-{number}",
        "session_id": f"{session}/subagent-{number}",
        "subagent_type": "worker",
        "description": f"job {number}",
        "status": status,
        "created_at": 1_700_000_000.0 + number,
        "number": number,
    }


def make_store(path: Path) -> bytes:
    """A genuine store: task-1 running, task-2 completed, task-3 running; its bytes.

    Each task has progress; task-2 a report, messages and an owed notice; the session spent.
    """
    store = TaskStore(path)
    for number, status in ((1, "running"), (2, "completed"), (3, "running")):
        store.insert(row(number, status))
        store.update("parent", f"task-{number}", turns=number, progress={"done": number})
    store.update(
        "parent",
        "task-2",
        output="the report",
        elapsed=2.5,
        input_tokens=7,
        messages={"sent": 2, "delivered": 1, "pending": ["msg-2"]},
        notice="due",
    )
    store.set_spent("parent", 40)
    store.close_now()
    return path.read_bytes()


def damage(path: Path, sql: str, *, unchecked: bool = False) -> None:
    """Run ``sql`` on the store file as any sqlite writer could.

    ``unchecked``: with the tables' NOT NULL constraints lifted while it runs (a writer that
    edits the schema can store what the schema forbids), then put back.
    """
    db = sqlite3.connect(path)
    try:
        if not unchecked:
            db.executescript(sql)
            return
        db.execute("PRAGMA writable_schema = ON")
        original = db.execute("SELECT sql FROM sqlite_master WHERE name = 'tasks'").fetchone()[0]
        db.execute(
            "UPDATE sqlite_master SET sql = ? WHERE name = 'tasks'",
            (original.replace(" NOT NULL", ""),),
        )
        db.commit()
        db.close()
        db = sqlite3.connect(path)
        db.executescript(sql)
        db.close()
        db = sqlite3.connect(path)
        db.execute("PRAGMA writable_schema = ON")
        db.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'tasks'", (original,))
        db.commit()
    finally:
        db.close()


def snapshot(directory: Path) -> dict[str, str]:
    """Every entry of ``directory``: a file by the hash of its bytes, anything else by kind."""
    found = {}
    for entry in os.scandir(directory):
        if entry.is_file(follow_symlinks=False):
            found[entry.name] = hashlib.sha256(Path(entry.path).read_bytes()).hexdigest()
        else:
            found[entry.name] = "symlink" if entry.is_symlink() else "other"
    return found


def writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("zett-agent-task-store")]


def reopens(path: Path | str) -> list[tuple[str, str]]:
    """Open the store, read what it holds, close it: the ids and statuses of its tasks."""
    store = TaskStore(path)
    try:
        return [(t.task_id, t.status) for t in store.tasks]
    finally:
        store.close_now()


@dataclass
class Damage:
    sql: str
    #: what the error must say of where (after the file's name)
    where: str
    unchecked: bool = False


T1 = "table tasks, row seq=1 (task 'task-1' of session 'parent')"
T2 = "table tasks, row seq=2 (task 'task-2' of session 'parent')"
T3 = "table tasks, row seq=3 (task 'task-3' of session 'parent')"
DAMAGES = {
    # task-1 (running, which a restore writes back as lost) is fine; task-3 is not
    "progress of the wrong shape": Damage(
        """UPDATE tasks SET progress = '{"x": 1}' WHERE task_id = 'task-3'""",
        f'{T3}, column progress: expected {{"done": n}}',
    ),
    "negative count": Damage(
        "UPDATE tasks SET turns = -1 WHERE task_id = 'task-3'",
        f"{T3}, column turns: expected a count from 0 to {MAX_COUNT}, got -1",
    ),
    "2**70": Damage(
        f"UPDATE tasks SET input_tokens = {2**70} WHERE task_id = 'task-3'",
        f"{T3}, column input_tokens: expected integer, got a value of type real",
    ),
    "text count": Damage(
        "UPDATE tasks SET tool_calls = 'many' WHERE task_id = 'task-3'",
        f"{T3}, column tool_calls: expected integer, got a value of type text",
    ),
    "huge text": Damage(
        "UPDATE tasks SET output = hex(zeroblob(9000000)) WHERE task_id = 'task-2'",
        f"{T2}, column output: it holds 18000000 bytes, more than the {MAX_TEXT_BYTES}",
    ),
    "blob": Damage(
        "UPDATE tasks SET error = x'00ff' WHERE task_id = 'task-3'",
        f"{T3}, column error: expected text or NULL, got a value of type blob",
    ),
    "NULL where the schema says NOT NULL": Damage(
        "UPDATE tasks SET status = NULL WHERE task_id = 'task-3'",
        f"{T3}, column status: expected text, got NULL",
        unchecked=True,
    ),
    "invalid UTF-8": Damage(
        "UPDATE tasks SET description = CAST(x'4aff' AS TEXT) WHERE task_id = 'task-3'",
        f"{T3}, column description: the text is not valid UTF-8",
    ),
    "invalid JSON": Damage(
        "UPDATE tasks SET progress = 'not json' WHERE task_id = 'task-3'",
        f"{T3}, column progress: the text is not valid JSON",
    ),
    "deeply nested JSON": Damage(
        f"UPDATE tasks SET messages = '{{\"sent\": {'[' * 3000}' WHERE task_id = 'task-2'",
        f"{T2}, column messages: the JSON is nested deeper than the two levels",
    ),
    "huge JSON": Damage(
        f"""UPDATE tasks SET progress = '{{"done": 1{" " * 1000}}}' WHERE task_id = 'task-1'""",
        f"{T1}, column progress: it holds 1011 bytes, more than the 256",
    ),
    "NaN in JSON": Damage(
        """UPDATE tasks SET progress = '{"done": NaN}' WHERE task_id = 'task-3'""",
        f"{T3}, column progress: the JSON holds NaN",
    ),
    "messages beyond their bounds": Damage(
        """UPDATE tasks SET messages = '{"sent": 1, "delivered": 5, "pending": []}'
           WHERE task_id = 'task-2'""",
        f'{T2}, column messages: expected {{"sent": n',
    ),
    "unknown status": Damage(
        "UPDATE tasks SET status = 'exploded' WHERE task_id = 'task-3'",
        f"{T3}, column status: expected one of ['cancelled', 'completed', 'failed', 'pending', "
        "'running'], got 'exploded'",
    ),
    "unknown notice": Damage(
        "UPDATE tasks SET notice = 'maybe' WHERE task_id = 'task-3'",
        f"{T3}, column notice: expected one of",
    ),
    "lost = 2": Damage(
        "UPDATE tasks SET lost = 2 WHERE task_id = 'task-3'",
        f"{T3}, column lost: expected 0 or 1, got 2",
    ),
    "a time as text": Damage(
        "UPDATE tasks SET created_at = 'yesterday' WHERE task_id = 'task-3'",
        f"{T3}, column created_at: expected integer or real, got a value of type text",
    ),
    "an infinite time": Damage(
        "UPDATE tasks SET elapsed = 9e999 WHERE task_id = 'task-3'",
        f"{T3}, column elapsed: expected seconds from 0 to 1e+12, got inf",
    ),
    "a task id of another form": Damage(
        "UPDATE tasks SET task_id = 'mine' WHERE task_id = 'task-3'",
        "table tasks, row seq=3 (task 'mine' of session 'parent'), column task_id: expected a "
        "task id task-N, got 'mine'",
    ),
    "a task number above the counter": Damage(
        "UPDATE tasks SET task_id = 'task-9' WHERE task_id = 'task-3'",
        "table tasks, row seq=3 (task 'task-9' of session 'parent'), column task_id: its number "
        "9 is above the store's task counter 3 (table meta), so a new task would take its id",
    ),
    "negative spent tokens": Damage(
        "UPDATE sessions SET spent_tokens = -5",
        "table sessions, row rowid=1 (session 'parent'), column spent_tokens: expected a count",
    ),
    "a counter as text": Damage(
        "UPDATE meta SET value = 'x'",
        "table meta, row rowid=1 (key 'counter'), column value: expected integer",
    ),
    "an unknown meta key": Damage(
        "INSERT INTO meta (key, value) VALUES ('other', 1)",
        "table meta, row rowid=2 (key 'other'), column key: expected one of ['counter']",
    ),
    "a table missing": Damage(
        "DROP TABLE sessions", "is damaged: its schema: the table sessions is missing"
    ),
    "a trigger added": Damage(
        "CREATE TRIGGER wipe AFTER UPDATE ON tasks BEGIN DELETE FROM tasks; END",
        "is damaged: its schema: it holds the trigger 'wipe', which a task store has not",
    ),
    "a column added": Damage(
        "ALTER TABLE tasks ADD COLUMN extra TEXT",
        "is damaged: its schema: table tasks has other columns or indexes than a task store's",
    ),
    "a schema version from the future": Damage(
        "PRAGMA user_version = 99",
        "was written by a newer zett_agent (task store schema 99; this version reads schema "
        f"{SCHEMA_VERSION} and older)",
    ),
    "another application's database": Damage(
        "PRAGMA application_id = 1",
        "is a sqlite database but not a zett_agent task store (application_id 0x1)",
    ),
}


@pytest.mark.parametrize("case", DAMAGES.values(), ids=DAMAGES.keys())
def test_a_damaged_store_is_refused_naming_its_first_bad_row_and_is_left_as_it_is(
    tmp_path: Path, case: Damage
) -> None:
    path = tmp_path / "tasks.sqlite"
    healthy = make_store(path)
    damage(path, case.sql, unchecked=case.unchecked)
    before = snapshot(tmp_path)
    with pytest.raises(TaskStoreError) as refused:
        AsyncSubAgentExtension(store=path)
    message = str(refused.value)
    assert message.startswith(f"{path} "), message
    assert case.where in message, message
    assert "it was left as it is" in message.lower(), message
    # nothing written (not even task-1 as lost), nothing added, nothing left running
    assert snapshot(tmp_path) == before
    assert writer_threads() == []
    path.write_bytes(healthy)  # fixed: this process opens it (no lock or thread was left)
    assert reopens(path) == [("task-1", "running"), ("task-2", "completed"), ("task-3", "running")]


async def test_a_damaged_store_is_not_written_back_and_opens_once_fixed(tmp_path: Path) -> None:
    """The report's case: the running task-1 is not written back as lost before task-3 fails."""
    path = tmp_path / "tasks.sqlite"
    healthy = make_store(path)
    damage(path, """UPDATE tasks SET progress = '{"x": 1}' WHERE task_id = 'task-3'""")
    before = snapshot(tmp_path)
    with pytest.raises(TaskStoreError, match=re.escape(f"{T3}, column progress")):
        AsyncSubAgentExtension(store=path)
    assert snapshot(tmp_path) == before
    path.write_bytes(healthy)
    async with AsyncSubAgentExtension(store=path) as extension:
        first, second, third = extension.tasks("parent")
        assert (first.status, first.lost) == (SubAgentTaskStatus.FAILED, True)
        assert (second.status, second.output) == (SubAgentTaskStatus.COMPLETED, "the report")
        assert third.lost and (third.error or "").startswith("lost: ")


@pytest.mark.parametrize(
    "what", ["garbage", "FIFO", "directory", "symlink loop", "missing directory"]
)
def test_a_path_that_is_no_store_file_is_refused_and_left_as_it_is(
    tmp_path: Path, what: str
) -> None:
    path = tmp_path / ("gone/tasks.sqlite" if what == "missing directory" else "tasks.sqlite")
    expected = {
        "garbage": f"{path} is not a readable task store (file is not a database)",
        "FIFO": f"task store {path} is not a regular file (it is a FIFO)",
        "directory": f"task store {path} is not a regular file (it is a directory)",
        "symlink loop": f"cannot resolve task store {path}: Too many levels of symbolic links",
        "missing directory": f"cannot create task store {path}: No such file or directory; "
        "check that its directory exists",
    }[what]
    if what == "garbage":
        path.write_bytes(b"not a database at all" * 100)
    elif what == "FIFO":
        os.mkfifo(path)
    elif what == "directory":
        path.mkdir()
    elif what == "symlink loop":
        os.symlink(tmp_path / "loop.sqlite", path)
        os.symlink(path, tmp_path / "loop.sqlite")
    before = snapshot(tmp_path)
    with pytest.raises(TaskStoreError, match=re.escape(expected)):
        TaskStore(path)
    assert snapshot(tmp_path) == before
    assert writer_threads() == []


def test_a_store_whose_host_died_is_read_without_writing(tmp_path: Path) -> None:
    """A WAL a killed host left is read, not checkpointed, by an open that is refused."""
    path = tmp_path / "tasks.sqlite"
    make_store(path)
    killed = textwrap.dedent(
        f"""
        import os, sqlite3
        db = sqlite3.connect({str(path)!r})
        db.execute("UPDATE tasks SET turns = -1 WHERE task_id = 'task-3'")
        db.commit()
        os.kill(os.getpid(), 9)
        """
    )
    subprocess.run([sys.executable, "-c", killed], check=False, timeout=HANG_GUARD)
    assert (tmp_path / "tasks.sqlite-wal").stat().st_size > 0  # the update is only there
    before = snapshot(tmp_path)
    with pytest.raises(TaskStoreError, match=re.escape(f"{T3}, column turns")):
        TaskStore(path)
    # the store and its WAL as they were; sqlite's index of the WAL (-shm) is not data: any
    # reader rebuilds it
    after = snapshot(tmp_path)
    assert after.keys() == before.keys()
    assert {k: v for k, v in after.items() if k != "tasks.sqlite-shm"} == {
        k: v for k, v in before.items() if k != "tasks.sqlite-shm"
    }


# -- the lock ---------------------------------------------------------------------------------

HOLDER = textwrap.dedent(
    """
    import sys
    from zett_agent.extensions.async_subagent import TaskStore
    store = TaskStore(sys.argv[1])
    print("held", flush=True)
    sys.stdin.read()
    """
)


@contextlib.contextmanager
def held(path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Another host holding the store at ``path`` while the block runs; killed at its end.

    A plain ``Popen``: the lock has nothing to do with an event loop (and asyncio's child
    watcher would leave a thread finishing after the wait).
    """
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as host:
        try:
            assert host.stdout is not None
            ready, _, _ = select.select([host.stdout], [], [], HANG_GUARD)
            line = host.stdout.readline() if ready else b""
            assert line == b"held\n", f"the holder did not take the store: {line!r}"
            yield host
        finally:
            host.kill()
            host.wait()


def test_a_store_held_by_a_live_host_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "tasks.sqlite"
    with (
        held(store) as host,
        pytest.raises(
            TaskStoreError,
            match=re.escape(f"task store {store} is held by another live host (pid {host.pid})"),
        ),
    ):
        AsyncSubAgentExtension(store=store)
    mine = TaskStore(store)  # the lock went with its holder; a second opener here is refused
    with pytest.raises(
        TaskStoreError, match=re.escape(f"another TaskStore of this process (pid {os.getpid()}")
    ):
        TaskStore(store)
    mine.close_now()


def test_a_held_store_is_refused_through_a_symlink_or_a_hard_link_naming_the_holder(
    tmp_path: Path,
) -> None:
    real = tmp_path / "tasks.sqlite"
    (tmp_path / "elsewhere").mkdir()
    aliases = {
        "symlink": tmp_path / "link.sqlite",
        "symlinked directory": tmp_path / "dirlink" / "tasks.sqlite",
        "hard link": tmp_path / "elsewhere" / "hard.sqlite",
    }
    with held(real) as host:
        os.symlink(real, aliases["symlink"])
        os.symlink(tmp_path, tmp_path / "dirlink")
        os.link(real, aliases["hard link"])
        for alias in aliases.values():
            named = str(alias) if alias.parent.name == "elsewhere" else f"{alias} (the file {real})"
            with pytest.raises(
                TaskStoreError,
                match=re.escape(
                    f"task store {named} is held by another live host (pid {host.pid})"
                ),
            ):
                AsyncSubAgentExtension(store=alias)
    # free, the file still has two names: a store by either would split sqlite's journal
    with pytest.raises(TaskStoreError, match="has 2 names \\(hard links\\)"):
        TaskStore(aliases["hard link"])
    os.unlink(aliases["hard link"])
    mine = TaskStore(aliases["symlink"])
    try:
        # sqlite's side files are beside the real file, never beside the alias it was opened by
        assert {"tasks.sqlite-wal", "tasks.sqlite-shm"} <= set(os.listdir(tmp_path))
        assert not [name for name in os.listdir(tmp_path) if name.startswith("link.sqlite-")]
        for alias in (real, aliases["symlinked directory"]):
            with pytest.raises(
                TaskStoreError,
                match=re.escape(f"another TaskStore of this process (pid {os.getpid()}, opened as ")
                + re.escape(f"{aliases['symlink']}; close it first)"),
            ):
                TaskStore(alias)
        os.link(real, aliases["hard link"])  # a name made while it is held: refused as held
        with pytest.raises(TaskStoreError, match="another TaskStore of this process"):
            TaskStore(aliases["hard link"])
    finally:
        mine.close_now()


def test_two_hosts_never_both_write_a_store_opened_by_two_names(tmp_path: Path) -> None:
    """The report's case: through a symlink, a second host wrote the first one's task-2."""
    real = tmp_path / "tasks.sqlite"
    link = tmp_path / "link.sqlite"
    os.symlink(real, link)
    with held(link) as host, pytest.raises(TaskStoreError, match=re.escape(f"(pid {host.pid})")):
        TaskStore(real)


# -- writing ----------------------------------------------------------------------------------


async def test_what_a_store_writes_it_reads_back(tmp_path: Path) -> None:
    """Values beyond their column's rule are written within it, so the store opens again."""
    path = tmp_path / "tasks.sqlite"
    store = TaskStore(path)
    long = "é" * (MAX_TEXT_BYTES // 2 + 10)  # two bytes each: beyond the bound
    await store.insert({**row(1, "running"), "description": long})
    store.update(
        "parent",
        "task-1",
        turns=2**80,
        tool_calls=-3,
        input_tokens=True,
        output=long,
        error="x" * (MAX_TEXT_BYTES + 1),
        elapsed=float("nan"),
        last_tool="t" * 100,
        progress={"done": 10**12, "total": 10**12},
        messages={"sent": 100, "delivered": 0, "pending": [f"msg-{n}" for n in range(1, 101)]},
        status="failed",
        lost=True,
        notice="delivered",
    )
    store.set_spent("parent", 2**70)
    with pytest.raises(ValueError, match=r"notice must be one of \['delivered', 'due', 'none', "):
        store.update("parent", "task-1", notice="maybe")  # nothing queued: it would not read back
    with pytest.raises(TaskStoreError, match=f"more than the {MAX_ID_BYTES} a task store keeps"):
        store.insert({**row(2, "running"), "parent_session_id": "p" * (MAX_ID_BYTES + 1)})
    await store.close()

    again = TaskStore(path)
    [task] = again.tasks
    await again.close()
    assert (task.turns, task.tool_calls, task.input_tokens) == (MAX_COUNT, 0, 1)
    assert (task.elapsed, task.lost, task.notice) == (0.0, True, "delivered")
    for text in (task.description, task.output, task.error):
        assert text is not None and len(text.encode()) <= MAX_TEXT_BYTES
        assert text.endswith("bytes in all; the task store keeps the first ones]")
    assert task.output is not None and task.output.startswith("é" * 1000)
    assert again.spent == {"parent": MAX_COUNT}
    assert again.counter == 1


class Boom(BaseException):
    pass


class RendersBoom(AsyncSubAgentExtension):
    def completion_notice(self, task: SubAgentTask) -> str | None:
        raise Boom(task.task_id)


async def test_an_extension_whose_restore_fails_closes_its_store_and_writes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tasks.sqlite"
    store = TaskStore(path)
    for number in (1, 2):
        store.insert(row(number, "running"))
    store.close_now()
    before = snapshot(tmp_path)
    # both restored as lost with their notice owed; max_retained=1 forgets task-1 and renders it
    with pytest.raises(Boom, match="task-1"):
        RendersBoom(store=path, max_retained=1)
    assert snapshot(tmp_path) == before
    assert writer_threads() == []
    assert reopens(path) == [("task-1", "running"), ("task-2", "running")]


async def test_progress_and_messages_come_back_as_they_were_stored(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite"
    make_store(path)
    async with AsyncSubAgentExtension(store=path) as extension:
        second = extension.get_task("parent", "task-2")
        assert second.messages is not None and second.messages.summary() == {
            "sent": 2, "delivered": 1, "undelivered": ["msg-2"]
        }  # fmt: skip
        assert (second.progress, second.input_tokens, second.turns) == ({"done": 2}, 7, 2)
        assert extension.get_task("parent", "task-3").progress == {"done": 3}


# -- schema 2: the durable tasks' tables ------------------------------------------------------


def downgrade(path: Path) -> None:
    """Make the store at ``path`` what a schema-1 version wrote: no durable tables."""
    damage(path, "DROP TABLE journal; DROP TABLE durable; PRAGMA user_version = 1;")


def test_a_store_of_schema_1_is_upgraded_in_place_and_keeps_its_tasks(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite"
    make_store(path)
    downgrade(path)
    store = TaskStore(path)
    assert store.upgraded_from == 1
    assert [(t.task_id, t.status) for t in store.tasks] == [
        ("task-1", "running"), ("task-2", "completed"), ("task-3", "running")
    ]  # fmt: skip
    store.close_now()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        names = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    assert {"durable", "journal"} <= names
    again = TaskStore(path)  # exactly a new store's schema: it opens as one
    assert again.upgraded_from is None
    again.close_now()


def test_a_store_that_cannot_be_upgraded_is_refused_naming_both_versions_and_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zett_agent.extensions._tasks import _store_schema

    path = tmp_path / "tasks.sqlite"
    make_store(path)
    downgrade(path)
    schema_1 = _store_schema.UPGRADES[1][0]
    # the first table is made, the second fails: the transaction leaves nothing
    monkeypatch.setitem(
        _store_schema.UPGRADES, 1, (schema_1, "CREATE TABLE durable (x); CREATE TABLE tasks (y);")
    )
    before = snapshot(tmp_path)
    with pytest.raises(
        TaskStoreError,
        match=re.escape(
            f"task store {path} was written by an older zett_agent (task store schema 1) and "
            f"could not be upgraded to schema {SCHEMA_VERSION} (table tasks already exists); "
            "it was left as it is"
        ),
    ):
        TaskStore(path)
    after = snapshot(tmp_path)
    assert after.get("tasks.sqlite") == before["tasks.sqlite"]
    assert writer_threads() == []
    monkeypatch.undo()
    upgraded = TaskStore(path)  # fixed: it upgrades
    assert upgraded.upgraded_from == 1
    upgraded.close_now()


ENTRY = '{"m":{"role":"user","content":"go"},"input":true}'


def durable_store(path: Path) -> None:
    """Durable task-1 and task-2, both running, each with a journal of three steps."""
    store = TaskStore(path)
    for number in (1, 2):
        store.insert(row(number, "running"), prompt="go")
        for step in (1, 2, 3):
            entry = ENTRY if step == 1 else f'{{"m":{{"role":"user","content":"{step}"}}}}'
            store.journal("parent", f"task-{number}", step, entry, snapshot=False)
    store.update_durable(
        "parent", "task-2", resumes=1, crashes=1, deaths=[{"try": 1, "reason": "x"}]
    )
    store.close_now()


J2 = "table journal, row seq=5 (task 'task-2' of session 'parent')"
JOURNAL_DAMAGES = {
    "not JSON": (
        "UPDATE journal SET entry = 'nope' WHERE seq = 5",
        f"{J2}, column entry: the text is not valid JSON",
    ),
    "not an entry": (
        """UPDATE journal SET entry = '{"m":{"role":"wizard"}}' WHERE seq = 5""",
        f"{J2}, column entry: m.role must be one of user, assistant, tool, agent",
    ),
    "a step missing": (
        "UPDATE journal SET step = 7 WHERE seq = 5",
        f"{J2}, column step: step 7 follows step 1: the steps between are missing",
    ),
    "a step as text": (
        "UPDATE journal SET step = 'two' WHERE seq = 5",
        f"{J2}, column step: expected integer, got a value of type text",
    ),
    "a late snapshot": (
        """UPDATE journal SET entry = '{"snapshot":[]}' WHERE seq = 5""",
        f"{J2}, column entry: a snapshot may only be a journal's first step",
    ),
    "deeply nested": (
        f"""UPDATE journal SET entry = '{{"m":{"[" * 100}' WHERE seq = 5""",
        f"{J2}, column entry: the JSON is nested deeper than the 64 levels",
    ),
    "a blob": (
        "UPDATE journal SET entry = x'00' WHERE seq = 5",
        f"{J2}, column entry: expected text, got a value of type blob",
    ),
}


@pytest.mark.parametrize("case", JOURNAL_DAMAGES.values(), ids=JOURNAL_DAMAGES.keys())
async def test_a_damaged_journal_fails_only_its_task_and_the_others_resume(
    tmp_path: Path, case: tuple[str, str]
) -> None:
    path = tmp_path / "tasks.sqlite"
    durable_store(path)
    damage(path, case[0] + "; INSERT INTO journal (parent_session_id, task_id, step, entry) "
           f"VALUES ('nobody', 'task-9', 1, '{ENTRY}')")  # fmt: skip
    store = TaskStore(path)
    try:
        assert store.journals[("parent", "task-1")].damaged is None
        assert case[1] in (store.journals[("parent", "task-2")].damaged or "")
        async with AsyncSubAgentExtension(store=store, durable=True) as extension:
            first, second = extension.tasks("parent")
            assert first.status is SubAgentTaskStatus.RUNNING  # it resumes at the next request
            assert second.status is SubAgentTaskStatus.FAILED and second.lost
            assert (second.error or "").startswith(
                "lost: its journal is damaged, so it could not resume after its host stopped "
                "(table journal, row seq="
            )
            assert case[1] in (second.error or "")
            assert extension.task_info(second)["deaths"] == [{"try": 1, "reason": "x"}]
            await extension.cancel(first)
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(path)) as db:  # the orphan row was deleted
        assert db.execute("SELECT count(*) FROM journal WHERE task_id = 'task-9'").fetchone() == (
            0,
        )


DURABLE_DAMAGES = {
    "deaths of another shape": (
        """UPDATE durable SET deaths = '[{"try": "one"}]' WHERE task_id = 'task-2'""",
        "table durable, row rowid=2 (task 'task-2' of session 'parent'), column deaths: expected "
        '[{"try": n, "reason": "..."}, ...]',
    ),
    "a prompt as a blob": (
        "UPDATE durable SET prompt = x'00' WHERE task_id = 'task-1'",
        "table durable, row rowid=1 (task 'task-1' of session 'parent'), column prompt: "
        "expected text, got a value of type blob",
    ),
    "a durable row of no task": (
        "INSERT INTO durable (parent_session_id, task_id, prompt) VALUES ('p', 'task-7', 'x')",
        "table durable, row rowid=3 (task 'task-7' of session 'p'), column task_id: the store "
        "holds no such task",
    ),
}


@pytest.mark.parametrize("case", DURABLE_DAMAGES.values(), ids=DURABLE_DAMAGES.keys())
def test_a_damaged_durable_row_refuses_the_store_and_leaves_it_as_it_is(
    tmp_path: Path, case: tuple[str, str]
) -> None:
    path = tmp_path / "tasks.sqlite"
    durable_store(path)
    damage(path, case[0])
    before = snapshot(tmp_path)
    with pytest.raises(TaskStoreError, match=re.escape(case[1])):
        TaskStore(path)
    assert snapshot(tmp_path) == before
    assert writer_threads() == []
