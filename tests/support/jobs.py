"""Waiting on a ``ProcessJob`` in the process engine tests: its first event, its outcome, or a
condition outside this process, each within a hang guard."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from zett_agent.process import ProcessJob

#: hang guard for anything a test awaits; outcomes arrive in milliseconds
GUARD = 10.0


async def first_event(job: ProcessJob, within: float = GUARD) -> Any:
    """The first event a job emits (the job's "I am running" signal in these tests);
    ``AssertionError`` (with the job's error) if it ends without one, ``TimeoutError`` after
    ``within`` seconds (a hang guard)."""
    async with asyncio.timeout(within):
        async for event in job.events():
            return event
    raise AssertionError(f"{job!r} ended without an event: {job.exception()!r}")


async def outcome(job: ProcessJob, within: float = GUARD) -> BaseException | None:
    """Wait for a job's end and return its error (None if it completed); ``within`` is a hang
    guard, longer for a job that must use CPU time (slow in wall time on a loaded machine)."""
    async with asyncio.timeout(within):
        await job.wait()
    return job.exception()


async def until(condition: Callable[[], bool], within: float = GUARD, what: str = "") -> None:
    """Return as soon as ``condition()`` holds; fail after ``within`` seconds (a hang guard).

    For state outside this process that has no event to wait on (a file a job writes, a pid
    in /proc, a cgroup directory): it is looked at every few milliseconds.
    """
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not true within {within} s: {what or condition}")
        await asyncio.sleep(0.005)
