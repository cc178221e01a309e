"""A hostile child builds cgroup structure for its supervisor to walk, or hides in it.

A job running as root (or as a user the cgroup subtree was delegated to) may create cgroups
below its own. Under cgroup containment that is its worker's cgroup, which the host kills,
checks and removes: what the job may build there is bounded (``cgroup.max.depth`` and
``cgroup.max.descendants``), a worker is reused only if nothing was built below it, and what was
built is removed off the event loop once the tree is dead, so neither a cancel nor a close waits
on it or fails because of it. Under scan containment the job's cgroup is the host's own, which
the engine never walks: the same jobs must not disturb it either (the test removes what they
built there).
"""

from __future__ import annotations

import asyncio
import os
import select
import uuid
from collections.abc import Iterator

import _reliability_children as hostile
import pytest

from support.liveness import alive
from zett_agent.process import JobCancelled, JobStatus, ProcessPool
from zett_agent.process._containment._cgroup import JOB_MAX_DEPTH, JOB_MAX_DESCENDANTS, remove_tree
from zett_agent.process._host._pool import engine_of

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root may create cgroups here")

GUARD = 30.0


@pytest.fixture
def top() -> Iterator[str]:
    """A unique name for the structure a job builds; what it built outside the engine's own
    cgroups (under scan containment: in the host's cgroup) is removed afterwards."""
    name = f"zett-test-{uuid.uuid4().hex[:8]}"
    yield name
    base = os.path.join(hostile.own_cgroup_dir(), name)
    if os.path.isdir(base):
        assert remove_tree(base)


async def first_event(job: object) -> dict[str, object]:
    async with asyncio.timeout(GUARD):
        async for event in job.events():  # type: ignore[attr-defined]
            return event  # type: ignore[no-any-return]
    raise AssertionError(f"{job!r} ended without an event")


@pytest.mark.parametrize(
    ("shape", "count", "bound"),
    [("deep", 1100, JOB_MAX_DEPTH), ("wide", 4000, JOB_MAX_DESCENDANTS)],
)
async def test_structure_a_job_builds_is_bounded_and_removed_off_the_loop(
    containment: str, top: str, shape: str, count: int, bound: int
) -> None:
    """A job that builds 1,100 nested or 4,000 sibling cgroups: under cgroup containment it
    gets no further than the bound; cancel returns, close returns without an error, and the
    pool's cgroups are gone afterwards."""
    async with ProcessPool(1, containment=containment) as pool:
        pool_cgroup = getattr(engine_of(pool).containment, "path", None)
        job = pool.submit(hostile.build_cgroups, shape, count, top)
        built = await first_event(job)
        if containment == "cgroup":
            assert built["made"] == bound, built
            assert built["errno"] is not None  # the kernel refused the next one
        else:
            assert built["made"] == count, built  # the host's cgroup: not the engine's
        async with asyncio.timeout(GUARD):
            await job.cancel()
        assert job.status is JobStatus.CANCELLED and isinstance(job.exception(), JobCancelled)
        # the pool goes on
        async with asyncio.timeout(GUARD):
            assert await pool.submit(hostile.huge_result, 2) == "RR"
    if pool_cgroup is not None:
        assert not os.access(pool_cgroup, os.F_OK), "the pool's cgroups were left behind"


async def test_a_hidden_orphan_retires_its_worker(containment: str) -> None:
    """A job that switched off its worker's subreaper flag leaves a double-forked orphan, which
    moves itself into a cgroup of its own below the worker's: the worker must not be reused,
    and the orphan must not outlive the job's result."""
    async with ProcessPool(1, max_jobs_per_worker=2, containment=containment) as pool:
        job = pool.submit(hostile.hide_orphan, containment == "cgroup")
        async with asyncio.timeout(GUARD):
            answer = await job
        pid_text, where = answer.split(" ", 1)
        orphan = int(pid_text)
        if containment == "cgroup":
            assert where == "hidden", answer
        # gone soon after the answer: killed with its worker's tree (cgroup) or swept by the
        # launcher it was reparented to (scan)
        try:
            pidfd = os.pidfd_open(orphan)
        except ProcessLookupError:
            pass  # already gone and reaped
        else:
            try:
                ready, _, _ = await asyncio.to_thread(select.select, [pidfd], [], [], GUARD)
            finally:
                os.close(pidfd)
            assert ready and not alive(orphan), f"the orphan {orphan} outlived the job's result"
        # the next job runs in a fresh worker, beside no orphan
        async with asyncio.timeout(GUARD):
            second = await pool.submit(os.getpid)
        if containment == "cgroup":
            assert second != job.pid
