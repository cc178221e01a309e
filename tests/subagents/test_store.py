"""Opening a ``TaskStore``: one live host per file, whatever its name.

The lock is the file's: a host that holds it is named by pid to an opener through a symlink or
a hard link, in another process or this one, and sqlite's side files stay beside the real file.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zett_agent.extensions.async_subagent import (
    AsyncSubAgentExtension,
    TaskStore,
    TaskStoreError,
)

HANG_GUARD = 60


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


async def hold(path: Path) -> asyncio.subprocess.Process:
    """Another host holding the store at ``path``, until its stdin closes."""
    host = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, str(path), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert host.stdout is not None
    async with asyncio.timeout(HANG_GUARD):
        line = await host.stdout.readline()
    if line != b"held\n":
        host.kill()
        await host.wait()
        pytest.fail(f"the holder did not take the store: {line!r}")
    return host


async def test_a_store_held_by_a_live_host_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "tasks.sqlite"
    host = await hold(store)
    try:
        with pytest.raises(
            TaskStoreError,
            match=re.escape(f"task store {store} is held by another live host (pid {host.pid})"),
        ):
            AsyncSubAgentExtension(store=store)
    finally:
        host.kill()
        await host.wait()
    mine = TaskStore(store)  # the lock went with its holder; a second opener here is refused
    with pytest.raises(
        TaskStoreError, match=re.escape(f"another TaskStore of this process (pid {os.getpid()}")
    ):
        TaskStore(store)
    await mine.close()


async def test_a_held_store_is_refused_through_a_symlink_or_a_hard_link_naming_the_holder(
    tmp_path: Path,
) -> None:
    real = tmp_path / "tasks.sqlite"
    (tmp_path / "elsewhere").mkdir()
    host = await hold(real)
    try:
        aliases = {
            "symlink": tmp_path / "link.sqlite",
            "symlinked directory": tmp_path / "dirlink" / "tasks.sqlite",
            "hard link": tmp_path / "elsewhere" / "hard.sqlite",
        }
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
    finally:
        host.kill()
        await host.wait()
    # free, the file still has two names: a store by either would split sqlite's journal
    with pytest.raises(TaskStoreError, match="has 2 names \\(hard links\\)"):
        TaskStore(aliases["hard link"])
    os.unlink(aliases["hard link"])
    mine = TaskStore(aliases["symlink"])
    try:
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
        await mine.close()
    # sqlite's side files are beside the real file, never beside an alias
    assert sorted(os.listdir(tmp_path)) == [
        "dirlink", "elsewhere", "link.sqlite", "tasks.sqlite"
    ]  # fmt: skip


async def test_two_hosts_never_both_write_a_store_opened_by_two_names(tmp_path: Path) -> None:
    """The report's case: through a symlink, a second host wrote the first one's task-2."""
    real = tmp_path / "tasks.sqlite"
    link = tmp_path / "link.sqlite"
    os.symlink(real, link)
    host = await hold(link)
    try:
        with pytest.raises(TaskStoreError, match=re.escape(f"(pid {host.pid})")):
            TaskStore(real)
    finally:
        host.kill()
        await host.wait()
