"""The Executor as the standard library's door: what a user of ``concurrent.futures`` meets first.

Results and exceptions come back as the standard library returns them (pickled), the
constructor takes its arguments with their meaning, a job may use a ``Manager`` made by the
parent, bad input fails only its own future, and ``results="json"`` keeps the strict wire.
CPython's own tests of the same run in tests/cpython_executor.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import pickle
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool, _RemoteTraceback
from multiprocessing import resource_tracker
from pathlib import Path

import pytest

from support.jobs import GUARD
from zett_agent.process import JobFailed, ProcessPool, ProcessPoolExecutor, ProtocolError

from . import _executor_jobs as jobs


@pytest.fixture
def executor(containment: str) -> Iterator[ProcessPoolExecutor]:
    with ProcessPoolExecutor(2, containment=containment) as executor:
        yield executor


# -- results and exceptions --------------------------------------------------------------------


def test_results_come_back_as_the_standard_library_returns_them(
    executor: ProcessPoolExecutor,
) -> None:
    assert executor.submit(divmod, 7, 2).result(GUARD) == (3, 1)  # a tuple, not [3, 1]
    assert executor.submit(jobs.values).result(GUARD) == jobs.values()
    assert executor.submit(bytes, 3).result(GUARD) == b"\x00\x00\x00"
    # a class of the job's own module comes back as the very class
    assert type(executor.submit(jobs.Point, 1, 2).result(GUARD)) is jobs.Point
    big = executor.submit(jobs.big, 1 << 20).result(GUARD)  # past the small path: Latin-1
    assert isinstance(big, bytes) and len(big) == 1 << 20


def test_a_class_of_main_comes_back_as_the_host_s_own(executor: ProcessPoolExecutor) -> None:
    # what the host defined at run time travels by value, and comes back as the same class
    namespace: dict[str, object] = {}
    exec("class Local:\n    def __init__(self, x):\n        self.x = x\n", namespace)
    local = namespace["Local"]
    assert isinstance(local, type)
    local.__module__ = "__main__"
    result = executor.submit(local, 5).result(GUARD)
    assert type(result) is local and result.x == 5


def test_an_exception_keeps_its_type_and_brings_the_worker_s_traceback(
    executor: ProcessPoolExecutor,
) -> None:
    future = executor.submit(jobs.divide, 1, 0)
    with pytest.raises(ZeroDivisionError) as raised:
        future.result(GUARD)
    cause = raised.value.__cause__
    assert type(cause) is _RemoteTraceback  # as the standard library's
    assert "return x / y  # the line the remote traceback shows" in cause.tb
    error = executor.submit(jobs.raise_custom, 42).exception(GUARD)
    assert type(error) is jobs.CustomError and (error.code, error.detail) == (42, "it went wrong")
    with pytest.raises(SystemExit) as exited:
        executor.submit(jobs.raise_system_exit, 4).result(GUARD)
    assert exited.value.code == 4


def test_json_mode_keeps_the_strict_wire(containment: str) -> None:
    with ProcessPoolExecutor(1, containment=containment, results="json") as executor:
        assert executor.submit(divmod, 7, 2).result(GUARD) == [3, 1]
        failed = executor.submit(jobs.divide, 1, 0).exception(GUARD)
        assert isinstance(failed, JobFailed) and failed.type_name == "ZeroDivisionError"
        refused = executor.submit(jobs.values).exception(GUARD)
        assert isinstance(refused, JobFailed) and refused.type_name == "TypeError"
        # a str that looks like a pickled outcome stays a str: nothing is unpickled
        assert executor.submit(str, "rbgAVOLg==").result(GUARD) == "rbgAVOLg=="


# -- bad input ------------------------------------------------------------------------------------


def test_what_cannot_be_pickled_fails_only_its_own_future(executor: ProcessPoolExecutor) -> None:
    lock = threading.Lock()
    refused = executor.submit(jobs.put, lock, 1)
    assert type(refused.exception(0)) is TypeError  # what pickle raises, at once
    error = executor.submit(id, jobs.ErrorAtPickle()).exception(0)
    assert type(error) is pickle.PicklingError and "refused by __reduce__" in str(error)
    assert executor.submit(pow, 2, 5).result(GUARD) == 32  # and nothing else changed


def test_an_outcome_that_cannot_be_unpickled_fails_only_its_own_future(
    executor: ProcessPoolExecutor,
) -> None:
    # SystemExit raised while the host unpickles: it must not end the pool's loop thread
    error = executor.submit(jobs.exit_at_unpickle).exception(GUARD)
    assert type(error) is pickle.UnpicklingError and isinstance(error.__cause__, SystemExit)
    assert executor.submit(pow, 3, 2).result(GUARD) == 9


def test_a_result_too_big_for_the_budget_fails_its_own_future_naming_it(containment: str) -> None:
    with ProcessPoolExecutor(
        1, containment=containment, max_buffered_bytes=1 << 16, max_frame_bytes=1 << 20
    ) as executor:
        error = executor.submit(jobs.big, 1 << 18).exception(GUARD)
        assert isinstance(error, ProtocolError) and "max_buffered_bytes=65536" in str(error)
        too_long = executor.submit(jobs.big, 1 << 21).exception(GUARD)
        assert isinstance(too_long, JobFailed) and "max_frame_bytes=1048576" in str(too_long)
        assert executor.submit(pow, 2, 3).result(GUARD) == 8


def test_map_checks_its_arguments_as_the_standard_library(executor: ProcessPoolExecutor) -> None:
    for chunksize in (0, -1):
        with pytest.raises(ValueError, match="chunksize must be >= 1"):
            executor.map(pow, [1], [2], chunksize=chunksize)
    expected = [pow(n, 2) for n in range(25)]
    for chunksize in (1, 4, 25, 100):
        assert list(executor.map(pow, range(25), [2] * 25, chunksize=chunksize)) == expected
    with pytest.raises(ZeroDivisionError):
        list(executor.map(jobs.divide, [1, 1, 1], [1, 0, 1], chunksize=2))


# -- the constructor ------------------------------------------------------------------------------


def test_the_constructor_takes_the_standard_library_s_arguments(containment: str) -> None:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        1, context, jobs.init, ("ready",), max_tasks_per_child=2, containment=containment
    ) as executor:
        assert executor._max_workers == 1
        first, second, third = (executor.submit(jobs.pid).result(GUARD) for _ in range(3))
        assert first == second != third  # two jobs per worker, then a fresh one
        assert executor.submit(jobs.state).result(GUARD) == "ready"  # initialized there too


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"max_workers": 0}, ValueError, "max_workers must be greater than 0"),
        ({"max_workers": -1}, ValueError, "max_workers must be greater than 0"),
        ({"mp_context": "spawn"}, TypeError, "multiprocessing context"),
        ({"initializer": 3}, TypeError, "initializer must be a callable"),
        ({"max_tasks_per_child": 0}, ValueError, "max_tasks_per_child must be >= 1"),
        ({"max_tasks_per_child": 1.5}, TypeError, "max_tasks_per_child must be an integer"),
        ({"max_tasks_per_child": 2, "max_jobs_per_worker": 2}, TypeError, "not both"),
        ({"results": "yaml"}, ValueError, "results=...\\) must be one of pickle, json"),
        ({"initializer": jobs.init, "initargs": (threading.Lock(),)}, TypeError, "pickle"),
    ],
)
def test_bad_arguments_are_refused_naming_them(
    arguments: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ProcessPoolExecutor(**arguments)  # type: ignore[arg-type]


def test_a_failing_initializer_breaks_the_executor(containment: str) -> None:
    with ProcessPoolExecutor(1, initializer=jobs.init_fail, containment=containment) as executor:
        future = executor.submit(pow, 2, 2)
        with pytest.raises(BrokenProcessPool) as raised:
            future.result(GUARD)
        assert isinstance(raised.value.__cause__, ValueError)
        assert "error in initializer" in str(raised.value.__cause__)
        with pytest.raises(BrokenProcessPool, match="initializer raised ValueError"):
            executor.submit(pow, 2, 2)


def test_json_mode_runs_the_initializer_and_breaks_as_pickle_mode(containment: str) -> None:
    with ProcessPoolExecutor(
        1, initializer=jobs.init, initargs=("json",), results="json", containment=containment
    ) as executor:
        assert executor.submit(jobs.state).result(GUARD) == "json"
    with ProcessPoolExecutor(
        1, initializer=jobs.init_fail, results="json", containment=containment
    ) as executor:
        with pytest.raises(BrokenProcessPool):
            executor.submit(pow, 2, 2).result(GUARD)
        with pytest.raises(BrokenProcessPool):
            executor.submit(pow, 2, 2)


# -- multiprocessing in a job ---------------------------------------------------------------------


def test_a_job_may_use_a_manager_made_by_the_parent(executor: ProcessPoolExecutor) -> None:
    assert executor.submit(jobs.authkey).result(GUARD) == bytes(
        multiprocessing.current_process().authkey
    )
    try:
        with multiprocessing.get_context("spawn").Manager() as manager:
            queue = manager.Queue()
            executor.submit(jobs.put, queue, {"from": "the job"}).result(GUARD)
            assert queue.get(timeout=GUARD) == {"from": "the job"}
    finally:
        resource_tracker._resource_tracker._stop()  # what the manager's start started


async def test_a_shared_pool_s_executor_sends_no_authkey_and_may_be_strict(
    containment: str,
) -> None:
    async with ProcessPool(1, containment=containment, max_jobs_per_worker=100) as pool:
        pickled, strict = pool.executor(), pool.executor(results="json")
        theirs = await _wrap(pickled.submit(jobs.authkey))
        assert theirs != bytes(multiprocessing.current_process().authkey)
        assert await _wrap(pickled.submit(divmod, 7, 2)) == (3, 1)
        assert await _wrap(strict.submit(divmod, 7, 2)) == [3, 1]
        assert await pool.submit(divmod, 7, 2) == [3, 1]  # ProcessPool.submit: JSON, always
        with pytest.raises(ValueError, match="results"):
            pool.executor(results="pickles")


async def _wrap(future: cf.Future[object]) -> object:
    import asyncio

    async with asyncio.timeout(GUARD):
        return await asyncio.wrap_future(future)


# -- interpreter exit -----------------------------------------------------------------------------

AFTER_EXIT = textwrap.dedent(
    """
    import atexit, sys
    from zett_agent.process import ProcessPoolExecutor

    @atexit.register
    def run_last():
        try:
            executor.submit(id, None)
        except RuntimeError as exc:
            print("refused:", exc)

    executor = ProcessPoolExecutor(1, containment=sys.argv[1])
    executor.submit(id, 42).result()
    """
)


def test_submit_after_the_interpreter_began_to_exit_is_refused(
    containment: str, tmp_path: Path
) -> None:
    script = tmp_path / "late.py"
    script.write_text(AFTER_EXIT)
    done = subprocess.run(
        [sys.executable, str(script), containment],
        capture_output=True,
        text=True,
        timeout=GUARD,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("refused: cannot schedule new futures after")
