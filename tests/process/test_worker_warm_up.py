"""A spare worker warms up (runs an empty job and an empty event loop) while it waits, and a
pool's launcher runs its ``warm_up`` once before it forks: the job a worker then gets must find
the process as a fresh one would be, asyncio included."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from zett_agent.process import ProcessError, ProcessPool
from zett_agent.runners._process import warming

HANG_GUARD = 60

#: what a job can observe of asyncio before it ran a loop, printed as JSON
PROBE = """
import asyncio, json, warnings
seen = {"policy_class": type(asyncio.get_event_loop_policy()).__name__}
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        loop = asyncio.get_event_loop()  # creates one in a process that never ran a loop
        seen["get_event_loop"] = "closed" if loop.is_closed() else "open"
        loop.close()
    except RuntimeError as exc:
        seen["get_event_loop"] = f"RuntimeError: {exc}"
async def answer():
    return 42
seen["run"] = asyncio.run(answer())
print(json.dumps(seen))
"""


def observe(warm: bool) -> dict[str, object]:
    warm_up = "from zett_agent.process._child import _worker; _worker.warm_up(False, True)\n"
    warm_up = warm_up if warm else ""
    done = subprocess.run(
        [sys.executable, "-c", "import zett_agent.process._child._worker\n" + warm_up + PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


@pytest.mark.parametrize("warm", [False, True], ids=["fresh", "warmed"])
def test_a_job_after_the_warm_up_finds_asyncio_as_a_fresh_process_has_it(warm: bool) -> None:
    assert observe(warm) == {
        "policy_class": "_UnixDefaultEventLoopPolicy",
        "get_event_loop": "open",
        "run": 42,
    }


def test_a_job_after_a_rehearsal_finds_asyncio_as_a_fresh_process_has_it() -> None:
    """The runner's rehearsal runs a whole child (its event loop included) in the launcher,
    whose state every worker inherits."""
    rehearsal = (
        "import zett_agent.extensions._child_build\n"
        "from zett_agent.runners._child import rehearse\n"
        "from zett_agent.process._child import _launcher\n"
        "_launcher._rehearse(rehearse)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", rehearsal + PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "policy_class": "_UnixDefaultEventLoopPolicy",
        "get_event_loop": "open",
        "run": 42,
    }


def test_the_rehearsal_runs_a_child_from_start_to_report() -> None:
    """It must really run (a failing rehearsal is ignored in the spare, so it is checked
    here): the default build, a model turn, a tool call, the report."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import zett_agent.extensions._child_build\n"
            "from zett_agent.runners._child import rehearse\n"
            "import threading\n"
            "print(rehearse(), threading.active_count())\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["rehearsed", "1"]  # and it left no thread


# -- ProcessPool(warm_up=...) ---------------------------------------------------------------


async def _next_pid(reader: int) -> int:
    """The next pid a warm-up announced on the FIFO whose reading end is ``reader``."""
    loop = asyncio.get_running_loop()
    arrived = loop.create_future()
    loop.add_reader(reader, lambda: arrived.done() or arrived.set_result(None))
    try:
        async with asyncio.timeout(HANG_GUARD):
            await arrived
    finally:
        loop.remove_reader(reader)
    return int(os.read(reader, 64).split()[0])


@pytest.fixture
def announcements(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    fifo = tmp_path / "warm-ups"
    os.mkfifo(fifo)
    monkeypatch.setenv("ZETT_TEST_WARM_UP_FIFO", str(fifo))
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        yield reader
    finally:
        os.close(reader)


@pytest.mark.parametrize("name", ["announce", "announce_then_raise"])
async def test_the_launcher_runs_the_pools_warm_up_once_before_it_forks(
    announcements: int, name: str
) -> None:
    from support import warm_ups

    async with ProcessPool(2, spare_workers=2, warm_up=f"support.warm_ups:{name}") as pool:
        ran_in = await _next_pid(announcements)
        # every worker is a fork of the process that warmed up (the launcher), inherits what
        # its warm-up did (even one that raised), and finds asyncio as a fresh process has it
        jobs = [pool.submit(warm_ups.warmed_here) for _ in range(2)]
        answers = await asyncio.gather(*jobs)
        assert [answer[1:] for answer in answers] == [[ran_in, ran_in, 42]] * 2
        assert len({answer[0] for answer in answers} - {ran_in}) == 2  # two workers, not it
        # once: nothing else was announced (a warm-up run again would have written a pid)
        assert os.read(announcements, 64) == b""


async def test_a_warm_up_that_leaves_a_thread_fails_the_start_naming_it(
    announcements: int,
) -> None:
    """A fork copies no thread but every lock one held: the launcher stays single-threaded."""
    pool = ProcessPool(warm_up="support.warm_ups:leave_a_thread")
    with pytest.raises(ProcessError, match=r"warm_up left 1 thread\(s\) running \(lingering\)"):
        await pool.start()
    await pool.close()


async def test_a_thread_a_preloaded_module_started_is_not_the_warm_ups(
    announcements: int,
) -> None:
    """Only what the warm-up left counts: a pool whose preload starts a thread still starts."""
    async with ProcessPool(
        1, preload=["support.thread_at_import"], warm_up="support.warm_ups:announce"
    ) as pool:
        ran_in = await _next_pid(announcements)
        assert (await pool.submit(os.getppid)) == ran_in


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (42, TypeError),
        ("support.warm_ups", ValueError),
        ("support.warm_ups:", ValueError),
        ("support..warm_ups:announce", ValueError),
        ("support.warm_ups:an-nounce", ValueError),
    ],
)
def test_a_bad_warm_up_is_refused_naming_the_form(value: object, error: type) -> None:
    with pytest.raises(error, match="warm_up"):
        ProcessPool(warm_up=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("support.no_such_module:announce", "No module named 'support.no_such_module'"),
        ("support.warm_ups:missing", "has no attribute 'missing'"),
        ("support.warm_ups:NOT_A_FUNCTION", "is not a function"),
    ],
)
async def test_a_warm_up_the_launcher_cannot_find_fails_the_start(value: str, said: str) -> None:
    pool = ProcessPool(warm_up=value)
    with pytest.raises(ProcessError, match=re.escape(said)):
        await pool.start()
    await pool.close()


async def test_the_process_runner_pool_rehearses_a_child() -> None:
    from zett_agent.runners import ProcessRunner

    async with ProcessRunner() as runner:
        runner.warm_up()
        booting = warming(runner)
        assert booting is not None
        await booting
        assert runner.pool is not None
        assert runner.pool.warm_up == "zett_agent.runners._child:rehearse"
        # the launcher ran it: every child is a fork of a process that rehearsed
        assert await runner.pool.submit(_rehearsed) is True


def _rehearsed() -> bool:
    from zett_agent.process._child import _worker

    return _worker.rehearsed
