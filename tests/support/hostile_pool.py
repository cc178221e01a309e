"""What the tests that attack a ``ProcessPool`` directly share: the bounds a hostile job's
outcome must meet, waiting on a job, and a sibling job that must come through unharmed.

A ``Sibling`` runs ``support.children.wait_on_fifo`` next to the hostile job in the same pool:
``started()`` once it runs, ``completes()`` once the test released it (it answers what the test
wrote to its FIFO), so an attack that broke the pool, the channel or a neighbour shows.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from support import jobs
from support.children import wait_on_fifo
from zett_agent.process import JobStatus, ProcessJob, ProcessPool

#: hang guard for anything a test awaits
GUARD = 20.0
#: every hostile outcome must be reached within this many seconds
BOUND = 5.0


async def first_event(job: ProcessJob) -> Any:
    """The first event ``job`` emits (``support.jobs.first_event`` with this module's guard)."""
    return await jobs.first_event(job, GUARD)


async def outcome(job: ProcessJob) -> BaseException | None:
    """The error ``job`` ended with (``None`` if it completed), reached within ``BOUND``."""
    started = time.monotonic()
    error = await jobs.outcome(job, GUARD)
    assert time.monotonic() - started < BOUND, f"{job!r} took {time.monotonic() - started:.1f}s"
    return error


class Sibling:
    """A job that runs next to the hostile one and must complete once released."""

    def __init__(self, pool: ProcessPool, fifo: str, keep: int) -> None:
        self.keep = keep
        self.job = pool.submit(wait_on_fifo, fifo)

    async def started(self) -> None:
        async with asyncio.timeout(GUARD):
            async for event in self.job.events():
                assert event == "ready"
                return

    async def completes(self) -> None:
        assert self.job.status is JobStatus.RUNNING, self.job
        os.write(self.keep, b"unharmed\n")
        async with asyncio.timeout(GUARD):
            assert await self.job == "unharmed"
