"""Messages from the host to a running job: ``ProcessJob.send`` and the child's ``_inbox``."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import cloudpickle
import pytest

from support.jobs import GUARD, first_event, outcome
from zett_agent.process import JobStatus, ProcessJob, ProcessPool
from zett_agent.process._child._inbox import receive, receive_blocking
from zett_agent.process._host import _job as job_module

from . import _jobs, _message_jobs

cloudpickle.register_pickle_by_value(_message_jobs)


async def _running(job: ProcessJob) -> None:
    """Wait for the job's "ready" event: from then on it runs and may be sent to."""
    assert await first_event(job) == "ready"
    assert job.status is JobStatus.RUNNING


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_messages_arrive_in_the_order_sent(containment: str, kind: str) -> None:
    fn = _message_jobs.echo_async if kind == "async" else _message_jobs.echo_sync
    sent: list[Any] = [
        {"n": i, "text": "é" * (i % 7), "nested": [i, None, True]} for i in range(200)
    ]
    async with ProcessPool(1, containment=containment) as pool:
        job = pool.submit(fn, len(sent))
        await _running(job)
        for value in sent:
            await job.send(value)
        async with asyncio.timeout(GUARD):
            assert await job == sent


#: what each child shows, by the test's name for it: the child, what the test sends it
#: (``(message, topic)`` pairs, in order) and what the child must answer
RECEIVING: dict[str, tuple[Any, list[tuple[Any, str]], Any]] = {
    "each-topic-is-its-own-queue": (
        _message_jobs.topics_in_their_order,
        [(f"{t}{i}", t) for i in range(3) for t in "ab"],
        {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"]},
    ),
    "receivers-wait-at-once-on-two-topics": (
        _message_jobs.concurrent_receivers,
        [("for x", "x"), ("for y", "y")],
        ["for y", "for x"],
    ),
    "a-cancelled-receive-takes-no-message": (
        _message_jobs.cancelled_receive_loses_nothing,
        [("kept", "")],
        ["kept"],
    ),
    "a-thread-and-the-loop-receive-side-by-side": (
        _message_jobs.receive_in_a_thread_and_the_loop,
        [("to the thread", "thread"), ("to the loop", "loop")],
        ["to the loop", "to the thread"],
    ),
    "a-job-on-its-own-uvloop-receives": (
        _message_jobs.receive_under_uvloop,
        [(42, "")],
        [42, "uvloop"],
    ),
}


@pytest.mark.parametrize(("fn", "sends", "expected"), RECEIVING.values(), ids=RECEIVING)
async def test_a_running_job_receives_what_is_sent(
    fn: Any, sends: list[tuple[Any, str]], expected: Any
) -> None:
    async with ProcessPool(1) as pool:
        job = pool.submit(fn)
        await _running(job)
        for message, topic in sends:
            await job.send(message, topic=topic)
        async with asyncio.timeout(GUARD):
            assert await job == expected


async def test_a_blocking_receive_times_out() -> None:
    async with ProcessPool(1) as pool:
        job = pool.submit(_message_jobs.sync_timeout)
        async with asyncio.timeout(GUARD):
            result = await job
    assert result.startswith("timeout: no message on topic 'never'")


async def test_a_job_that_does_not_read_makes_send_wait_with_a_bounded_queue(
    containment: str, fifo: tuple[str, int]
) -> None:
    path, go = fifo
    chunk = "x" * 65536
    async with ProcessPool(1, containment=containment) as pool:
        job = pool.submit(_message_jobs.blocked_until_go, path)
        await _running(job)
        frame = len(job._message_frame(chunk, ""))
        sent = 0
        # every send completes at once while the socket and the host's queue have room
        while job._core.channel is None or job._core.channel.message_bytes + frame <= job._max_send:
            await job.send(chunk)
            sent += 1
            assert job._core.channel is not None
            assert job._core.channel.message_bytes <= job_module.SEND_BUFFER_BYTES
        assert job._core.channel.message_bytes > 0  # the socket is full: the rest is held here
        blocked = asyncio.ensure_future(job.send(chunk))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not blocked.done(), "send must wait while the job does not read"
        later = asyncio.ensure_future(job.send("stop"))  # queues behind the blocked sender
        await asyncio.sleep(0)
        assert not later.done()
        assert job._core.channel.message_bytes <= job_module.SEND_BUFFER_BYTES
        os.write(go, b"go\n")
        async with asyncio.timeout(GUARD):
            await blocked
            await later
            count = await job
    assert count == sent + 1  # everything arrived, the waiting message included, in order


async def test_cancelling_a_waiting_send_sends_nothing(fifo: tuple[str, int]) -> None:
    path, go = fifo
    chunk = "y" * 65536
    async with ProcessPool(1) as pool:
        job = pool.submit(_message_jobs.blocked_until_go, path)
        await _running(job)
        sent = 0
        while True:
            waiting = asyncio.ensure_future(job.send(chunk))
            await asyncio.sleep(0)
            if not waiting.done():
                break
            await waiting
            sent += 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await job.send("stop")  # room once the job reads; the cancelled message is not sent
        os.write(go, b"go\n")
        async with asyncio.timeout(GUARD):
            assert await job == sent


async def test_killing_the_job_wakes_a_waiting_sender(fifo: tuple[str, int]) -> None:
    path, _go = fifo
    async with ProcessPool(1) as pool:
        job = pool.submit(_message_jobs.blocked_until_go, path)
        await _running(job)
        while True:
            waiting = asyncio.ensure_future(job.send("z" * 65536))
            await asyncio.sleep(0)
            if not waiting.done():
                break
            await waiting
        await job.cancel()
        with pytest.raises(RuntimeError, match=r"being stopped|cancelled"):
            async with asyncio.timeout(GUARD):
                await waiting
        assert job._core.channel is None  # the job let go of the worker's channel


@pytest.mark.parametrize("first_reads", [True, False], ids=["first-read-one", "first-read-none"])
async def test_a_message_for_an_ended_job_is_never_read_by_the_next(
    containment: str, first_reads: bool, fifo: tuple[str, int]
) -> None:
    path, go = fifo
    async with ProcessPool(
        1, spare_workers=1, max_jobs_per_worker=2, containment=containment
    ) as pool:
        if first_reads:  # its inbox reads what came behind the one it takes
            first = pool.submit(_message_jobs.read_one_then_end)
        else:  # the messages wait in the socket for the worker's job loop
            first = pool.submit(_message_jobs.wait_then_end, path)
        await _running(first)
        pid = first.pid
        await first.send("one")
        for i in range(20):
            await first.send(f"late {i}")
        if not first_reads:
            os.write(go, b"done\n")
        async with asyncio.timeout(GUARD):
            assert await first == ("one" if first_reads else "done")
        second = pool.submit(_message_jobs.first_message_or_none)
        await _running(second)
        assert second.pid == pid  # the same worker
        await second.send("for the second")
        async with asyncio.timeout(GUARD):
            assert await second == "for the second"


async def test_sending_to_a_job_that_is_not_running_is_refused() -> None:
    async with ProcessPool(1, spare_workers=0) as pool:
        job = pool.submit(_jobs.add, 1, 2)
        queued = pool.submit(_jobs.add, 3, 4)
        assert queued.status is JobStatus.QUEUED
        with pytest.raises(RuntimeError, match="queued; messages go only to a running job"):
            await queued.send("early")
        assert await job == 3
        with pytest.raises(RuntimeError, match="completed; messages go only to a running job"):
            await job.send("late")
        assert await queued == 7


async def test_bad_values_are_refused_with_the_reason() -> None:
    async with ProcessPool(1) as pool:
        job = pool.submit(_message_jobs.echo_async, 1)
        await _running(job)
        with pytest.raises(TypeError, match="JSON data"):
            await job.send({1, 2})
        with pytest.raises(ValueError, match=r"NaN|not JSON compliant"):
            await job.send(float("nan"))
        with pytest.raises(ValueError, match="larger than"):
            await job.send("x" * job_module.SEND_BUFFER_BYTES)
        with pytest.raises(TypeError, match="topic"):
            await job.send(1, topic=3)  # type: ignore[arg-type]
        await job.send("fine")
        assert await job == ["fine"]


async def test_receive_outside_a_worker_says_where_it_works() -> None:
    with pytest.raises(RuntimeError, match="inside a job"):
        await receive()
    with pytest.raises(RuntimeError, match="inside a job"):
        receive_blocking(timeout=0)


async def test_a_job_killed_while_it_waits_ends_on_time(containment: str) -> None:
    async with ProcessPool(1, containment=containment) as pool:
        job = pool.submit(_message_jobs.echo_async, 1)
        await _running(job)
        await job.cancel()
        assert isinstance(await outcome(job), Exception)
