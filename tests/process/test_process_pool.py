"""The pool's ordinary life: results, sync and async functions, events, queueing, reuse,
limits that change the environment, closing."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

import zett_agent.process as process
from support.jobs import GUARD, first_event, outcome, until
from support.liveness import alive
from zett_agent.process import (
    JobFailed,
    JobStatus,
    PoolClosed,
    ProcessError,
    ProcessLimits,
    ProcessPool,
    _linux,
)
from zett_agent.process._host._pool import engine_of

from . import _jobs


def test_exports_match_all() -> None:
    assert sorted(process.__all__) == sorted(
        name
        for name in dir(process)
        if not name.startswith("_") and name not in ("annotations", "TYPE_CHECKING")
    )
    for name in process.__all__:
        assert getattr(process, name) is not None


def test_emit_outside_a_worker_raises() -> None:
    with pytest.raises(RuntimeError, match="inside a job"):
        process.emit({"x": 1})


def test_limits_validate() -> None:
    with pytest.raises(ValueError, match="timeout"):
        ProcessLimits(timeout=0)
    assert not ProcessLimits(timeout=1).applies_in_child
    assert ProcessLimits(cwd="/").applies_in_child


async def test_submit_before_start_and_after_close() -> None:
    pool = ProcessPool(1)
    with pytest.raises(RuntimeError, match="before start"):
        pool.submit(_jobs.add, 1, 2)
    async with pool:
        assert await pool.submit(_jobs.add, 1, 2) == 3
    with pytest.raises(PoolClosed):
        pool.submit(_jobs.add, 1, 2)
    await pool.close()  # idempotent
    with pytest.raises(PoolClosed):
        await pool.start()


async def test_results_of_plain_async_lambda_and_closure() -> None:
    offset = 40

    def closure(x: int) -> int:
        return x + offset

    async with ProcessPool(2) as pool:
        jobs = [
            pool.submit(_jobs.add, 1, b=2),
            pool.submit(_jobs.async_add, 2, 3),
            pool.submit(lambda: "lambda"),
            pool.submit(closure, 2),
            pool.submit(_jobs.print_and_return),
        ]
        async with asyncio.timeout(GUARD):
            results = [await job for job in jobs]
    assert results == [3, 5, "lambda", 42, "ok"]
    assert all(job.status is JobStatus.COMPLETED for job in jobs)
    assert "COMPLETED" in repr(jobs[0])
    usage = jobs[0].usage()
    assert usage.elapsed > 0 and usage.peak_rss_bytes > 0


async def test_each_job_gets_a_fresh_process_by_default() -> None:
    async with ProcessPool(2) as pool:
        pids = [await pool.submit(_jobs.getpid) for _ in range(3)]
    assert len(set(pids)) == 3
    assert os.getpid() not in pids


async def test_max_jobs_per_worker_reuses_the_process() -> None:
    async with ProcessPool(1, spare_workers=1, max_jobs_per_worker=3) as pool:
        pids = [await pool.submit(_jobs.getpid) for _ in range(4)]
    assert pids[0] == pids[1] == pids[2] != pids[3]


async def test_a_reused_worker_kills_what_the_previous_job_left_running() -> None:
    async with ProcessPool(1, spare_workers=1, max_jobs_per_worker=2) as pool:
        leftover = await pool.submit(_jobs.leave_background_child)
        assert await pool.submit(_jobs.add, 1, 1) == 2
        assert not alive(leftover)


async def test_jobs_beyond_max_workers_queue_in_order(tmp_path: Path) -> None:
    fifo = str(tmp_path / "go")
    os.mkfifo(fifo)
    keep = os.open(fifo, os.O_RDWR)  # the job's open() never blocks; the line waits here
    try:
        async with ProcessPool(1, spare_workers=1) as pool:
            first = pool.submit(_jobs.wait_for_go, fifo)
            rest = [pool.submit(_jobs.add, i, 0) for i in range(3)]
            assert await first_event(first) == "ready"
            assert first.status is JobStatus.RUNNING and first.pid is not None
            assert [job.status for job in rest] == [JobStatus.QUEUED] * 3
            finished: list[int] = []
            for i, job in enumerate(rest):
                job.add_done_callback(lambda _job, i=i: finished.append(i))
            os.write(keep, b"go\n")
            async with asyncio.timeout(GUARD):
                assert await first == "go"
                assert [await job for job in rest] == [0, 1, 2]
                await asyncio.sleep(0)  # callbacks run soon after the end
            assert finished == [0, 1, 2]
    finally:
        os.close(keep)


async def test_cancel_a_queued_job_drops_it() -> None:
    async with ProcessPool(1, spare_workers=0) as pool:
        running = pool.submit(_jobs.ready_then_sleep)
        queued = pool.submit(_jobs.add, 1, 2)
        await queued.cancel()
        assert queued.status is JobStatus.CANCELLED
        with pytest.raises(process.JobCancelled):
            await queued
        await running.cancel()


async def test_events_stream_in_order_with_backpressure() -> None:
    n, bound = 3000, 8
    async with ProcessPool(1, max_buffered_events=bound) as pool:
        job = pool.submit(_jobs.flood, n)
        seen = []
        async with asyncio.timeout(GUARD):
            async for event in job.events():
                assert len(job._core.events) <= bound
                seen.append(event)
            assert await job == n
    assert seen == list(range(n))
    assert job.dropped_events == 0


async def test_events_nobody_reads_are_bounded_and_never_block_the_result() -> None:
    n, bound = 5000, 16
    async with ProcessPool(1, max_buffered_events=bound) as pool:
        job = pool.submit(_jobs.flood, n)
        async with asyncio.timeout(GUARD):
            assert await job == n
        assert job.dropped_events == n - bound
        assert [event async for event in job.events()] == list(range(n - bound, n))
        with pytest.raises(RuntimeError, match="consumer"):
            job.events()


async def test_env_cwd_and_open_files_limits_apply(tmp_path: Path) -> None:
    async with ProcessPool(2) as pool:
        env = pool.submit(_jobs.environ, limits=ProcessLimits(env={"ONLY": "this"}))
        cwd = pool.submit(_jobs.cwd, limits=ProcessLimits(cwd=str(tmp_path)))
        nofile = pool.submit(_jobs.nofile, limits=ProcessLimits(max_open_files=64))
        async with asyncio.timeout(GUARD):
            assert await env == {"ONLY": "this"}
            assert await cwd == str(tmp_path)
            assert await nofile == [64, 64]
        # limits never leak into the next job: those workers were retired
        assert "ONLY" not in await pool.submit(_jobs.environ)


async def test_unpicklable_job_raises_at_submit_and_pool_keeps_working() -> None:
    async with ProcessPool(1) as pool:
        with pytest.raises(TypeError, match=r"argument 1 \(<unlocked _thread.lock"):
            pool.submit(_jobs.add, 1, threading.Lock())
        assert await pool.submit(_jobs.add, 1, 2) == 3


async def test_close_kills_running_and_drops_queued_jobs() -> None:
    pool = ProcessPool(1, spare_workers=1)
    await pool.start()
    running = pool.submit(_jobs.ready_then_spin)
    queued = pool.submit(_jobs.add, 1, 2)
    pid = await first_event(running)
    async with asyncio.timeout(GUARD):
        await asyncio.gather(pool.close(), pool.close())
    assert not alive(pid)
    for job in (running, queued):
        assert job.status is JobStatus.CANCELLED
        assert isinstance(await outcome(job), PoolClosed)
        assert isinstance(job.exception(), ProcessError)


async def test_bad_preload_fails_start_with_a_clear_error() -> None:
    pool = ProcessPool(1, preload=["no_such_module_for_zett"])
    with pytest.raises(ProcessError, match="no_such_module_for_zett"):
        await pool.start()
    await pool.close()


async def test_large_text_and_json_results_round_trip() -> None:
    async with ProcessPool(2) as pool:
        text = pool.submit(_jobs.text, 3_000_000)
        nested = pool.submit(lambda: {"items": list(range(100_000)), "t": "x" * 100_000})
        async with asyncio.timeout(GUARD):
            assert await text == _jobs.text(3_000_000)
            assert await nested == {"items": list(range(100_000)), "t": "x" * 100_000}


async def test_large_ascii_results_of_every_slice_boundary_round_trip() -> None:
    # ASCII text goes in 1 MiB slices, each copied into its place in the final string: sizes
    # around the slice boundary, in a row, must each arrive exactly
    sizes = [3_000_001, 1_500_007, (1 << 20) + 1, 1 << 20, (1 << 20) - 1, 2_000_000]
    async with ProcessPool(1) as pool:
        async with asyncio.timeout(GUARD):
            for i, n in enumerate(sizes):
                fill = "abcdef"[i]
                assert await pool.submit(_jobs.ascii_text, n, fill) == _jobs.ascii_text(n, fill)


async def test_a_text_with_a_lone_surrogate_is_refused_in_the_worker() -> None:
    # not valid Unicode: the parent could never encode it again, so the worker does not send
    # it (in one frame or as raw text) and says where it is
    async with ProcessPool(1) as pool:
        async with asyncio.timeout(GUARD):
            for n in (10, 100_000):
                with pytest.raises(JobFailed) as failed:
                    await pool.submit(_jobs.surrogate_text, n)
                assert failed.value.type_name == "TypeError"
                assert (
                    f"at the value itself: a str holding a lone surrogate ('\\ud800' at index {n})"
                    in failed.value.message
                )
            assert await pool.submit(len, "next") == 4


async def test_a_spare_that_took_a_job_is_replaced() -> None:
    # while another spare is ready, the replacement fork waits (it would compete with the job
    # for the CPU), but only briefly
    async with ProcessPool(4, spare_workers=2) as pool:
        async with asyncio.timeout(GUARD):
            assert await pool.submit(_jobs.add, 1, 2) == 3
            while engine_of(pool).spawning:  # the replacement of the first job's worker
                await first_worker_message(pool)
            assert len(engine_of(pool).idle) == 2
            job = pool.submit(_jobs.ready_then_spin)
            assert (len(engine_of(pool).idle), engine_of(pool).spawning) == (1, 0)
            assert engine_of(pool).replace_timer is not None
            await first_worker_message(pool)
            assert len(engine_of(pool).idle) == 2
            await job.cancel()


async def first_worker_message(pool: ProcessPool) -> None:
    """Return once the launcher handed the pool a new worker."""
    arrived = asyncio.get_running_loop().create_future()
    engine = engine_of(pool)
    handle = engine.on_worker

    def spy(launcher: Any, message: dict[str, Any], fds: list[int]) -> None:
        handle(launcher, message, fds)
        if not arrived.done():
            arrived.set_result(None)

    engine.on_worker = spy  # type: ignore[method-assign]
    try:
        await arrived
    finally:
        del engine.on_worker


async def test_a_forked_copy_of_the_job_never_answers() -> None:
    async with ProcessPool(1) as pool:
        async with asyncio.timeout(GUARD):
            assert await pool.submit(_jobs.fork_and_return) == 1
            assert await pool.submit(_jobs.add, 1, 1) == 2


async def test_large_arguments_are_written_without_blocking() -> None:
    data = "y" * (8 << 20)  # far more than a socket buffer holds
    async with ProcessPool(2) as pool:
        async with asyncio.timeout(GUARD):
            assert (
                await asyncio.gather(
                    pool.submit(_jobs.echo_size, data), pool.submit(_jobs.echo_size, data)
                )
                == [len(data)] * 2
            )


def _module_level(x: int) -> int:
    return x


def test_plain_pickle_only_where_cloudpickle_would_pickle_by_reference() -> None:
    import sys

    import cloudpickle

    from zett_agent.process._host._pickling import _by_reference as _pickle_by_reference

    fast = _pickle_by_reference((os.getpid, (_module_level, [1]), {}, None))
    assert fast is not None
    assert cloudpickle.loads(fast)[1][0] is _module_level
    # by value: a lambda, a closure, a module registered by value, anything from __main__
    assert _pickle_by_reference((lambda: 1, (), {}, None)) is None
    value = 2
    assert _pickle_by_reference((lambda: value, (), {}, None)) is None
    assert _pickle_by_reference((_jobs.add, (), {}, None)) is None
    assert _pickle_by_reference((os.getpid, (_jobs.add,), {}, None)) is None

    def from_main() -> None:
        return None

    from_main.__module__ = "__main__"
    from_main.__qualname__ = "_zett_from_main"
    main = sys.modules["__main__"]
    main._zett_from_main = from_main  # type: ignore[attr-defined]
    try:
        assert _pickle_by_reference((os.getpid, ({"f": from_main},), {}, None)) is None
    finally:
        del main._zett_from_main  # type: ignore[attr-defined]


async def test_workers_start_at_the_pools_niceness() -> None:
    async with ProcessPool(1, nice=7) as pool:
        assert await pool.submit(_jobs.niceness) == os.nice(0) + 7


_AUTOGROUPS = os.path.exists("/proc/self/autogroup")
#: Linux 6.12's scheduler takes a slice a task asks for (``sched_attr.sched_runtime``)
_CUSTOM_SLICES = tuple(int(part) for part in os.uname().release.split(".")[:2]) >= (6, 12)


@pytest.mark.skipif(not _CUSTOM_SLICES, reason="a kernel older than 6.12 ignores custom slices")
async def test_workers_ask_for_the_shortest_slice_at_the_pools_niceness() -> None:
    """A host that wakes preempts a running worker only once that one has run its slice: a
    worker asks for the kernel's shortest, 0.1 ms, at its first job, keeping its niceness. Not
    before: a task that wakes with a shorter slice than the running one preempts it, so an idle
    spare that had it would take the host's CPU the moment the host hands it a job. The host
    keeps its slice, and so does the launcher (woken by the host's every request)."""
    host_slice = _linux.requested_slice()
    assert host_slice is not None and host_slice != _linux.SHORT_SLICE_NS
    async with ProcessPool(1, spare_workers=1, nice=7) as pool:
        async with asyncio.timeout(GUARD):
            while not engine_of(pool).idle:
                await first_worker_message(pool)
        spare = engine_of(pool).idle[0].pid
        assert _linux.requested_slice(spare) == host_slice
        worker = await pool.submit(_jobs.slice_and_niceness)
        launcher = await pool.submit(_jobs.launcher_slice)
    assert list(worker) == [_linux.SHORT_SLICE_NS, os.nice(0) + 7]
    assert launcher == host_slice
    assert _linux.requested_slice() == host_slice


async def test_a_pools_workers_share_its_session_each_in_a_process_group_of_its_own() -> None:
    """The launcher leads the pool's session; each worker leads a process group in it, so no
    terminal's signal reaches a job, and a group's kill is one worker's."""
    async with ProcessPool(2) as pool:
        seen = await asyncio.gather(*(pool.submit(_jobs.session_and_group) for _ in range(2)))
    launcher = {worker["ppid"] for worker in seen}
    assert len(launcher) == 1 and [w["sid"] for w in seen] == [*launcher] * 2
    assert os.getsid(0) not in launcher
    assert all(worker["pgid"] == worker["pid"] for worker in seen)


@pytest.mark.skipif(not _AUTOGROUPS, reason="a kernel without scheduler autogroups")
async def test_a_pools_session_carries_its_niceness() -> None:
    """With autogroups the scheduler weighs sessions first: the pool's session must be as
    nice as its workers, or a niced pool takes the host's CPU as a session at niceness 0. One
    session for the pool, not one per worker: 1,000 workers weigh as one program, as a
    ``make -j`` does, not as 1,000 sessions the host's event loop waits behind."""
    host_group = _jobs.session_niceness()[0]
    async with ProcessPool(2, nice=7) as pool:
        groups = await asyncio.gather(*(pool.submit(_jobs.session_niceness) for _ in range(2)))
    [(name, nice)] = {tuple(group) for group in groups}
    assert nice == 7 and name != host_group


@pytest.mark.skipif(not _AUTOGROUPS, reason="a kernel without scheduler autogroups")
async def test_a_sandboxed_job_cannot_put_its_session_back_to_niceness_0() -> None:
    """The kernel lets a process raise its own autogroup's weight back to 0 (not below); a
    sandboxed job sees ``/proc`` read-only, so a niced pool stays niced for it."""
    from zett_agent.process import Sandbox
    from zett_agent.process._sandbox._options import sandbox_support

    if not sandbox_support()["required_ok"]:
        pytest.skip("no sandbox on this machine")
    async with ProcessPool(1, nice=7) as pool:
        answer = await pool.submit(_jobs.lower_session_niceness, sandbox=Sandbox())
    assert answer in {"EROFS", "EACCES", "EPERM"}


@pytest.mark.skipif(not _AUTOGROUPS, reason="a kernel without scheduler autogroups")
async def test_a_pool_at_niceness_0_leaves_its_session_at_0() -> None:
    async with ProcessPool(1) as pool:
        assert (await pool.submit(_jobs.session_niceness))[1] == 0


async def test_spares_run_an_event_loop_ahead_only_once_the_pool_ran_a_coroutine_job() -> None:
    """A spare's event-loop warm-up costs it memory of its own: pools whose jobs are plain
    functions never ask for it; once a coroutine function was submitted, every spare started
    from then on does (``_worker.warm_up``)."""
    async with ProcessPool(1, spare_workers=1) as pool:
        engine = engine_of(pool)
        assert engine.supervisor is not None
        supervisor = engine.supervisor
        asked: list[dict[str, Any]] = []
        request = supervisor.request

        def spy(message: dict[str, Any]) -> bool:
            if message.get("op") == "spawn":
                asked.append(message)
            return request(message)

        supervisor.request = spy  # type: ignore[method-assign]
        try:
            async with asyncio.timeout(GUARD):
                for n in range(3):
                    assert await pool.submit(_jobs.add, n, 1) == n + 1
                plain = list(asked)
                for n in range(3):  # each worker runs one job: spares replace them
                    assert await pool.submit(_jobs.async_add, n, 2) == n + 2
        finally:
            del supervisor.request
    assert plain and not any(message["loop"] for message in plain), plain
    assert asked[len(plain) :] and all(message["loop"] for message in asked[len(plain) :]), asked


async def test_a_worker_seen_dead_before_its_answer_was_read_is_buried_once_it_is(
    containment: str,
) -> None:
    """The worker's exit and the launcher's report of it can come before its last frames are
    read (here: reading waits for a consumer of unread events). Once its answer is read, the
    worker is buried: the job's tree reads gone, and nothing waits for the pool's close."""
    async with ProcessPool(1, containment=containment, max_buffered_events=2) as pool:
        job = pool.submit(_jobs.flood, 6)
        events = job.events()  # a consumer that does not read yet: reading pauses at two
        await until(lambda: job.pid is not None, what="the job to run")
        pid = job.pid
        assert pid is not None
        worker = engine_of(pool).workers[pid]
        await until(
            lambda: worker.exited_at is not None and worker.report is not None,
            what="the worker's exit and the launcher's report of it, its answer unread",
        )
        assert not job.done()
        assert [event async for event in events] == list(range(6))
        assert await job == 6
        async with asyncio.timeout(GUARD):
            await job.wait_gone()
        assert pid not in engine_of(pool).workers
