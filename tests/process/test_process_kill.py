"""Hard kill: cancel, timeouts and resource limits kill the whole process tree, and the call
returns only once every process of it is gone."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from support.jobs import GUARD, first_event, outcome
from support.liveness import alive
from zett_agent.process import (
    JobCancelled,
    JobStatus,
    JobTimeout,
    LimitExceeded,
    ProcessLimits,
    ProcessPool,
    WorkerCrashed,
)
from zett_agent.process._host._pool import engine_of

from . import _jobs


async def test_cancel_a_pure_cpu_loop(containment: str) -> None:
    async with ProcessPool(1, containment=containment) as pool:
        job = pool.submit(_jobs.ready_then_spin)
        pid = await first_event(job)
        assert alive(pid)
        async with asyncio.timeout(GUARD):
            await job.cancel()
        assert not alive(pid)
        assert job.status is JobStatus.CANCELLED and job.pid is None
        with pytest.raises(JobCancelled):
            await job
        await job.cancel()  # no-op once finished
        assert await pool.submit(_jobs.add, 1, 1) == 2


async def test_cancel_kills_grandchildren_and_setsid_escapees(containment: str) -> None:
    async with ProcessPool(2, containment=containment) as pool:
        jobs = [pool.submit(_jobs.spawn_tree) for _ in range(2)]
        trees = [await first_event(job) for job in jobs]
        for pid in trees[0] + trees[1]:
            assert alive(pid)
        async with asyncio.timeout(GUARD):
            await jobs[0].cancel()
        assert not any(alive(pid) for pid in trees[0])
        # the sibling's tree is untouched
        assert all(alive(pid) for pid in trees[1])
        assert jobs[1].status is JobStatus.RUNNING


async def test_cancelling_the_awaiter_cancels_the_job(containment: str) -> None:
    async with ProcessPool(1, containment=containment) as pool:
        job = pool.submit(_jobs.ready_then_spin)
        pid = await first_event(job)
        waiter = asyncio.ensure_future(job)
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(GUARD):
                await waiter
        assert job.status is JobStatus.CANCELLED
        assert not alive(pid)


async def test_cancelling_wait_does_not_cancel_the_job(containment: str) -> None:
    async with ProcessPool(1, containment=containment) as pool:
        job = pool.submit(_jobs.ready_then_spin)
        await first_event(job)
        waiter = asyncio.ensure_future(job.wait())
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert job.status is JobStatus.RUNNING
        await job.cancel()


async def test_grace_lets_the_job_exit_on_sigterm(tmp_path: Path, containment: str) -> None:
    mark = tmp_path / "mark"
    async with ProcessPool(1, containment=containment) as pool:
        job = pool.submit(_jobs.term_handler, str(mark))
        await first_event(job)
        async with asyncio.timeout(GUARD):
            await job.cancel(grace=30)  # returns as soon as the tree is gone, not after 30 s
        assert mark.read_text() == "terminated"
        assert job.status is JobStatus.CANCELLED


async def test_grace_ends_with_sigkill_when_sigterm_is_ignored(containment: str) -> None:
    async with ProcessPool(1, kill_grace=0.2, containment=containment) as pool:
        job = pool.submit(_jobs.ignore_term)
        pid = await first_event(job)
        started = time.monotonic()
        async with asyncio.timeout(GUARD):
            await job.cancel()
        assert time.monotonic() - started >= 0.2
        assert not alive(pid)


async def test_timeout_kills_the_tree(containment: str) -> None:
    async with ProcessPool(1, containment=containment) as pool:
        job = pool.submit(_jobs.spawn_tree, limits=ProcessLimits(timeout=0.5))
        tree = await first_event(job)
        error = await outcome(job)
        assert isinstance(error, JobTimeout) and error.timeout == 0.5
        assert "timeout" in str(error)
        assert job.status is JobStatus.FAILED
        assert not any(alive(pid) for pid in tree)


async def test_memory_limit(containment: str) -> None:
    limit = 768 * 1024 * 1024
    async with ProcessPool(1, containment=containment) as pool:
        job = pool.submit(_jobs.allocate, 2 * limit, limits=ProcessLimits(memory_bytes=limit))
        error = await outcome(job)
        assert isinstance(error, LimitExceeded), error
        assert error.limit == "memory_bytes" and error.value == limit
        assert "memory_bytes" in str(error)
        # a small allocation under the same limit is fine
        small = pool.submit(_jobs.allocate, 1 << 20, limits=ProcessLimits(memory_bytes=limit))
        assert await small == 1 << 20


async def test_cpu_limit(containment: str) -> None:
    async with ProcessPool(1, containment=containment) as pool:
        job = pool.submit(_jobs.spin, limits=ProcessLimits(cpu_seconds=1))
        error = await outcome(job, within=6 * GUARD)
        assert isinstance(error, LimitExceeded), error
        assert error.limit == "cpu_seconds" and error.value == 1
        # the kernel enforces RLIMIT_CPU on tick-sampled CPU time, and reports the precise
        # runtime: on a busy VM the two differ by 10-20 %
        assert error.reached is not None and error.reached >= 0.5
        assert isinstance(error.__cause__, WorkerCrashed)
        assert error.__cause__.signal_name == "SIGXCPU"


async def test_a_job_never_leaves_processes_behind(containment: str) -> None:
    async with ProcessPool(1, containment=containment) as pool:
        crashed = pool.submit(_jobs.exit0_leaving_child)
        child = await first_event(crashed)
        error = await outcome(crashed)
        assert isinstance(error, WorkerCrashed) and error.exitcode == 0
        assert not alive(child)  # the crash is reported only once the tree is gone
        leftover = await pool.submit(_jobs.leave_background_child)
    assert not alive(leftover)


async def test_wait_gone_returns_once_what_a_job_left_is_dead(containment: str) -> None:
    """A result can arrive a moment before the job's tree is gone; ``wait_gone`` waits for the
    pool's confirmation (its worker buried), and returns at once for a job that never ran."""
    async with ProcessPool(1, containment=containment) as pool:
        info = pool.containment_info
        assert info["launcher_pid"] == engine_of(pool).launcher.pid  # type: ignore[union-attr]
        assert ("cgroup" in info) is (containment == "cgroup"), info
        job = pool.submit(_jobs.leave_background_child)
        queued = pool.submit(_jobs.add, 1, 2)
        await queued.cancel()  # dropped before it ran
        async with asyncio.timeout(GUARD):
            await queued.wait_gone()
            leftover = await job
            await job.wait_gone()
        assert not alive(leftover)
        await job.wait_gone()  # at once, again
        reused = ProcessPool(1, containment=containment, max_jobs_per_worker=2)
    async with reused:
        async with asyncio.timeout(GUARD):
            first = reused.submit(_jobs.getpid)
            pid = await first
            await first.wait_gone()  # found clean: its tree is the worker, which lives on
            assert await reused.submit(_jobs.getpid) == pid
