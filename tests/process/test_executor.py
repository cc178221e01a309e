"""The engine as a ``concurrent.futures.Executor``: ``pool.executor()`` and
``ProcessPoolExecutor``.

The behaviours of the standard library's own executor tests that apply (submit, keyword
arguments, ``map`` order, exceptions and timeout, shutdown with and without waiting,
``cancel_futures``, the context manager, calls from many threads, ``wait``/``as_completed``,
``run_in_executor``), and the two differences: ``cancel()`` of a running job kills its tree and
returns ``True``, and a crashed job fails only its own future.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import os
import select
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.jobs import GUARD
from support.liveness import alive
from zett_agent.process import ProcessPool, ProcessPoolExecutor, WorkerCrashed
from zett_agent.process._host._pool import engine_of

from . import _jobs


@pytest.fixture
def executor(containment: str) -> Iterator[ProcessPoolExecutor]:
    with ProcessPoolExecutor(2, containment=containment) as executor:
        yield executor


def read_pids(path: str) -> list[int]:
    with open(path) as stream:
        return [int(pid) for pid in stream.readline().split()]


def gone(pid: int) -> bool:
    """Wait (a hang guard, on a pidfd) until ``pid`` exited; True once it did."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        select.select([fd], [], [], GUARD)
    finally:
        os.close(fd)
    return not alive(pid)


# -- what the stdlib's executor tests check ---------------------------------------------------


def test_submit(executor: ProcessPoolExecutor) -> None:
    assert executor.submit(pow, 2, 8).result(GUARD) == 256


def test_submit_keyword(executor: ProcessPoolExecutor) -> None:
    assert executor.submit(_jobs.power, 3, y=3).result(GUARD) == 27
    assert executor.submit(_jobs.add, a=1, b=2).result(GUARD) == 3


def test_map_keeps_the_order_of_its_inputs(executor: ProcessPoolExecutor) -> None:
    delays = [0.05, 0.0, 0.03, 0.0, 0.01]
    results = executor.map(_jobs.sleep_then, delays, range(len(delays)), timeout=GUARD)
    assert list(results) == list(range(len(delays)))
    assert list(executor.map(pow, range(10), range(10))) == list(map(pow, range(10), range(10)))


def test_map_raises_the_first_failure_in_order(executor: ProcessPoolExecutor) -> None:
    results = executor.map(_jobs.divide, [1, 2, 3], [1, 0, 1], timeout=GUARD)
    assert next(results) == 1.0
    with pytest.raises(ZeroDivisionError):
        next(results)


def test_map_timeout_cancels_what_is_left(executor: ProcessPoolExecutor, tmp_path: Path) -> None:
    fifo = str(tmp_path / "pids")
    os.mkfifo(fifo)
    results = executor.map(_jobs.tree_then_wait, [fifo], timeout=0.5)
    started = time.monotonic()
    reader = threading.Thread(target=lambda: pids.extend(read_pids(fifo)))
    pids: list[int] = []
    reader.start()
    with pytest.raises(cf.TimeoutError):
        list(results)
    assert time.monotonic() - started < GUARD
    reader.join(GUARD)
    # map cancelled the future it timed out on: its job's tree is gone
    assert pids and all(gone(pid) for pid in pids)


def test_exceptions_arrive_on_their_future(executor: ProcessPoolExecutor) -> None:
    future = executor.submit(_jobs.raise_value_error)
    assert type(future.exception(GUARD)) is ValueError
    with pytest.raises(ValueError):
        future.result()


def test_shutdown_waits_for_running_futures(containment: str) -> None:
    executor = ProcessPoolExecutor(2, containment=containment)
    futures = [executor.submit(_jobs.sleep_then, 0.2, index) for index in range(3)]
    executor.shutdown(wait=True)
    assert [future.result(0) for future in futures] == [0, 1, 2]
    assert not executor.pool.running and not executor._thread.is_alive()
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(pow, 2, 2)


def test_shutdown_without_waiting_returns_at_once_and_the_futures_complete(
    containment: str,
) -> None:
    executor = ProcessPoolExecutor(1, containment=containment)
    futures = [executor.submit(_jobs.sleep_then, 0.3, index) for index in range(2)]
    started = time.monotonic()
    executor.shutdown(wait=False)
    assert time.monotonic() - started < 0.3
    assert [future.result(GUARD) for future in futures] == [0, 1]
    executor._thread.join(GUARD)  # the pool closes once they are done
    assert not executor._thread.is_alive()


def test_cancel_futures_cancels_those_not_running(containment: str, tmp_path: Path) -> None:
    fifo = str(tmp_path / "running")
    os.mkfifo(fifo)
    executor = ProcessPoolExecutor(1, containment=containment, spare_workers=0)
    first = executor.submit(_jobs.signal_then_sleep, fifo, 0.5, "first")
    with open(fifo) as stream:  # the job runs once it wrote this
        assert stream.readline() == "running\n"
    assert first.running()
    queued = [executor.submit(_jobs.sleep_then, 0.5, index) for index in range(3)]
    executor.shutdown(wait=True, cancel_futures=True)
    assert first.result(0) == "first"
    assert all(future.cancelled() for future in queued)


def test_the_context_manager_shuts_down_and_leaves_nothing(containment: str) -> None:
    with ProcessPoolExecutor(2, containment=containment) as executor:
        assert executor.submit(_jobs.add, 2, 3).result(GUARD) == 5
        pool = executor.pool
    assert not executor._thread.is_alive()
    assert engine_of(pool).closed
    with pytest.raises(RuntimeError):
        executor.submit(pow, 2, 2)


def test_submit_from_many_threads(executor: ProcessPoolExecutor) -> None:
    results: dict[int, int] = {}
    lock = threading.Lock()

    def worker(start: int) -> None:
        for value in range(start, start + 10):
            result = executor.submit(_jobs.add, value, value).result(GUARD)
            with lock:
                results[value] = result

    threads = [threading.Thread(target=worker, args=(i * 10,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(GUARD * 6)
    assert results == {value: 2 * value for value in range(60)}


def test_wait_and_as_completed_see_every_future(
    executor: ProcessPoolExecutor, tmp_path: Path
) -> None:
    fifo = str(tmp_path / "pids")
    os.mkfifo(fifo)
    quick = executor.submit(_jobs.add, 1, 1)
    stuck = executor.submit(_jobs.tree_then_wait, fifo)
    read_pids(fifo)
    assert stuck.cancel()  # running: killed
    done, not_done = cf.wait([quick, stuck], timeout=GUARD)
    assert done == {quick, stuck} and not not_done
    assert set(cf.as_completed([quick, stuck], timeout=GUARD)) == {quick, stuck}
    assert quick.result() == 2 and stuck.cancelled()


# -- where the engine differs from the stdlib ---------------------------------------------------


def test_cancel_of_a_running_job_kills_its_tree_and_returns_true(
    executor: ProcessPoolExecutor, tmp_path: Path
) -> None:
    fifo = str(tmp_path / "pids")
    os.mkfifo(fifo)
    future = executor.submit(_jobs.tree_then_wait, fifo)
    worker, grandchild = read_pids(fifo)
    assert future.running()
    assert future.cancel() is True  # the stdlib says False and lets it run
    # cancel() from a thread returns once the tree is gone
    assert not alive(worker) and not alive(grandchild)
    assert future.cancelled()
    with pytest.raises(cf.CancelledError):
        future.result(0)
    assert future.cancel() is True  # cancelled already
    done = executor.submit(_jobs.add, 1, 2)
    assert done.result(GUARD) == 3 and done.cancel() is False  # finished: nothing to cancel


@pytest.mark.parametrize("crash", ["segfault", "exit3"])
def test_a_crash_fails_only_its_own_future(executor: ProcessPoolExecutor, crash: str) -> None:
    sibling = executor.submit(_jobs.sleep_then, 0.3, "sibling")
    crashed = executor.submit(getattr(_jobs, crash))
    assert isinstance(crashed.exception(GUARD), WorkerCrashed)
    assert sibling.result(GUARD) == "sibling"  # the stdlib: BrokenProcessPool for both
    assert executor.submit(_jobs.add, 2, 2).result(GUARD) == 4


# -- a program that exits without waiting -----------------------------------------------------

EXIT_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from zett_agent.process import ProcessPoolExecutor

    def held(ready, go, out):
        with open(ready, "w") as stream:
            stream.write(f"{os.getpid()}\\n")
        with open(go) as stream:
            line = stream.readline()
        with open(out, "w") as stream:
            stream.write(line)

    def queued(out):
        with open(out, "w") as stream:
            stream.write("queued ran\\n")

    containment, how, ready, go, first, second = sys.argv[1:]
    executor = ProcessPoolExecutor(1, containment=containment)
    executor.submit(held, ready, go, first)
    executor.submit(queued, second)  # waits behind the first: one worker
    if how == "shutdown(wait=False)":
        executor.shutdown(wait=False)
    print("leaving", flush=True)
    """
)


@pytest.mark.parametrize("how", ["no shutdown", "shutdown(wait=False)"])
def test_a_program_that_exits_without_waiting_finishes_its_jobs_quietly(
    containment: str, tmp_path: Path, how: str
) -> None:
    # as the stdlib's pool: interpreter exit waits for the running and the queued job, then
    # closes the pool; nothing on stderr, nothing left running
    script = tmp_path / "leave.py"
    script.write_text(EXIT_SCRIPT)
    ready, go = str(tmp_path / "ready"), str(tmp_path / "go")
    os.mkfifo(ready)
    os.mkfifo(go)
    # held open here: the job's open() of either never blocks, and neither does the test's
    keep, hear = os.open(go, os.O_RDWR), os.open(ready, os.O_RDWR)
    first, second = tmp_path / "first", tmp_path / "second"
    args = [containment, how, ready, go, str(first), str(second)]
    try:
        with subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as program:
            assert program.stdout is not None and program.stderr is not None
            assert select.select([hear], [], [], GUARD)[0], "the first job never ran"
            worker = int(os.read(hear, 100))  # the first job runs, held on go
            assert program.stdout.readline() == "leaving\n"  # the program's code is done
            assert program.poll() is None and not first.exists() and not second.exists()
            os.write(keep, b"go on\n")
            stdout, stderr = program.communicate(timeout=GUARD)
    finally:
        os.close(keep)
        os.close(hear)
    assert (program.returncode, stdout, stderr) == (0, "", "")
    assert first.read_text() == "go on\n"
    assert second.read_text() == "queued ran\n"
    assert gone(worker)


# -- over a pool of one's own, on its event loop ------------------------------------------------


async def test_run_in_executor_over_a_started_pool(containment: str) -> None:
    async with ProcessPool(2, containment=containment) as pool:
        executor = pool.executor()
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(GUARD):
            assert await loop.run_in_executor(executor, _jobs.add, 20, 22) == 42
            assert await asyncio.gather(
                *(loop.run_in_executor(executor, _jobs.power, n) for n in range(5))
            ) == [0, 1, 4, 9, 16]
        # on the loop's thread, an unpicklable argument fails its future with pickle's error;
        # in json mode (ProcessPool.submit's rules) it is refused at the call
        lock = threading.Lock()
        assert type(executor.submit(_jobs.echo_value, lock).exception(0)) is TypeError
        with pytest.raises(TypeError, match="could not pickle argument 0"):
            pool.executor(results="json").submit(_jobs.echo_value, lock)
        # shutdown(wait=True) here would wait for ever with futures pending: refused
        pending = executor.submit(_jobs.sleep_then, 0.2, "late")
        with pytest.raises(RuntimeError, match="would wait for ever"):
            executor.shutdown(wait=True)
        async with asyncio.timeout(GUARD):
            assert await asyncio.wrap_future(pending) == "late"
        executor.shutdown(wait=True)  # nothing pending: fine, and the pool stays open
        assert await pool.submit(_jobs.add, 1, 1) == 2


async def test_a_cancelled_run_in_executor_future_kills_the_job(
    containment: str, tmp_path: Path
) -> None:
    fifo = str(tmp_path / "pids")
    os.mkfifo(fifo)
    async with ProcessPool(2, containment=containment) as pool:
        executor = pool.executor()
        future = executor.submit(_jobs.tree_then_wait, fifo)
        worker, grandchild = await asyncio.to_thread(read_pids, fifo)
        assert future.cancel() is True  # on the loop's thread: the kill follows at once
        assert await asyncio.to_thread(gone, worker)
        assert await asyncio.to_thread(gone, grandchild)


def test_executor_needs_a_started_pool() -> None:
    with pytest.raises(RuntimeError, match="before start"):
        ProcessPool(1).executor()
