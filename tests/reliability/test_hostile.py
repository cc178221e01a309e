"""A hostile child: it attacks the parent through the result channel, floods it, hides from the
kill, or multiplies. Each test ends with the child's whole tree dead (checked pid by pid) and
the parent unharmed: a sibling job that ran all along completes normally."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import _reliability_children as hostile
import psutil
import pytest

from support.calls import tool_call
from support.children import escape_then_wait
from support.hostile_pool import BOUND, GUARD, Sibling, first_event, outcome
from support.liveness import alive
from support.scripted_models import StepModel, ToolsThenAnswer, tool_results
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension, SubAgentTaskStatus
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AssistantMessage
from zett_agent.process import (
    JobCancelled,
    JobFailed,
    JobStatus,
    JobTimeout,
    ProcessJob,
    ProcessLimits,
    ProcessPool,
    ProtocolError,
    WorkerCrashed,
)
from zett_agent.process._wire._protocol import HEADER, TEXT_SLICE

MB = 1 << 20


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


def gone(pids: list[int]) -> list[int]:
    """The pids of ``pids`` still alive. A zombie is dead: its parent (the worker, or the
    launcher, a subreaper) reaps it moments later; a cancel does not wait for that, since it
    must not depend on the launcher answering."""
    return [pid for pid in pids if alive(pid)]


@contextlib.asynccontextmanager
async def pool_with_sibling(
    fifo: tuple[str, int], containment: str, **options: Any
) -> AsyncIterator[tuple[ProcessPool, Sibling]]:
    async with ProcessPool(2, containment=containment, **options) as pool:
        sibling = Sibling(pool, *fifo)
        await sibling.started()
        yield pool, sibling
        await sibling.completes()
        # and the pool takes new work
        async with asyncio.timeout(GUARD):
            assert await pool.submit(hostile.huge_result, 3) == "RRR"


async def cancel_within_bound(job: ProcessJob, grace: float | None = None) -> float:
    started = time.monotonic()
    async with asyncio.timeout(GUARD):
        await job.cancel(grace=grace)
    elapsed = time.monotonic() - started
    assert elapsed < BOUND, f"cancel took {elapsed:.1f}s"
    assert job.status is JobStatus.CANCELLED and isinstance(job.exception(), JobCancelled)
    return elapsed


# ------------------------------------------------------------------------ code through results


async def test_pickle_payloads_are_never_loaded(
    tmp_path: Path, fifo: tuple[str, int], containment: str
) -> None:
    # the payload is live: loading it here (once, on purpose) runs its code
    control = tmp_path / "control"
    pickle.loads(hostile.malicious_pickle(str(control)))
    assert control.is_dir()

    marker = tmp_path / "pwned"
    async with pool_with_sibling(fifo, containment) as (pool, _):
        # 1. a binary pickle written as the result frame
        job = pool.submit(hostile.write_pickle_frame, str(marker))
        pid = await first_event(job)
        error = await outcome(job)
        assert isinstance(error, ProtocolError), error
        assert gone([pid]) == []

        # 2. a binary pickle as the raw text frame of an announced text result
        payload = hostile.malicious_pickle(str(marker))
        job = pool.submit(hostile.announce_text_then, len(payload), payload)
        error = await outcome(job)
        assert isinstance(error, ProtocolError) and "UTF-8" in str(error), error

        # 3. an ASCII (protocol 0) pickle as a result string, short (JSON) and long (raw text),
        #    and as an event: it arrives as the plain string it is
        for pad in (0, 100_000):
            job = pool.submit(hostile.return_protocol0_pickle, str(marker), pad)
            async with asyncio.timeout(GUARD):
                text = await job
            assert isinstance(text, str) and text.startswith("c") and "mkdir" in text
            assert len(text) >= pad
        job = pool.submit(hostile.emit_pickle_then_return, str(marker))
        event = await first_event(job)
        assert isinstance(event, str) and "mkdir" in event
        async with asyncio.timeout(GUARD):
            assert await job == "done"
    assert not marker.exists(), "a child's bytes ran code in the parent"


async def test_a_child_agent_writing_a_pickle_fails_its_task_only(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    definitions = [
        SubAgentDefinition(
            "evil",
            "writes a pickle into its result channel",
            "p",
            model=ToolsThenAnswer(tools=[("pickle_bomb", {"marker": str(marker)})]),
            tools=(hostile.PICKLE_TOOL,),
        ),
        SubAgentDefinition("good", "a normal child", "p", model=ToolsThenAnswer("fine")),
    ]
    starts = AssistantMessage(
        tool_calls=(
            tool_call("task_start", subagent_type="evil", description="evil", prompt="p"),
            tool_call("task_start", subagent_type="good", description="good", prompt="p"),
        )
    )
    reads = AssistantMessage(
        tool_calls=(
            tool_call("task_output", task_id="task-1", wait_seconds=GUARD),
            tool_call("task_output", task_id="task-2", wait_seconds=GUARD),
        )
    )
    model = StepModel([starts, reads, AssistantMessage("went on")])
    async with AsyncSubAgentExtension(definitions) as extension:
        client = await create_agent(
            model, config=AgentRunConfig(session_id="s"), extensions=[extension]
        )
        async with client, asyncio.timeout(GUARD):
            answer = await client.run("go")
            evil, good = extension.tasks("s")  # closing the client releases them
    assert answer.content == "went on"
    assert evil.status is SubAgentTaskStatus.FAILED
    assert "invalid data" in (evil.error or ""), evil.error
    assert good.status is SubAgentTaskStatus.COMPLETED and good.output == "fine"
    infos = [json.loads(m.text) for m in tool_results(model.requests[-1])[-2:]]
    assert [i["status"] for i in infos] == ["failed", "completed"]
    assert not marker.exists()


# ------------------------------------------------------------------------ lying frames


LYING = {
    # a header that claims fewer bytes than the message: the cut JSON is rejected
    "short": (5, b'{"k":"result","v":1,"u":{"cpu":0,"maxrss":0}}', "sleep", ProtocolError),
    "zero": (0, b"", "sleep", ProtocolError),
    # a header that claims more than ever comes, then the child exits: a crash, not a hang
    "long then exit": (1000, b'{"k":"res', "exit", WorkerCrashed),
}


@pytest.mark.parametrize("case", list(LYING))
async def test_lying_length_header(case: str, fifo: tuple[str, int], containment: str) -> None:
    claimed, payload, then, expected = LYING[case]
    async with pool_with_sibling(fifo, containment) as (pool, _):
        job = pool.submit(hostile.lying_length, claimed, payload, then)
        pid = await first_event(job)
        error = await outcome(job)
        assert isinstance(error, expected), error
        assert gone([pid]) == []


async def test_lying_length_then_silence_is_cancellable_and_times_out(
    fifo: tuple[str, int],
    containment: str,
) -> None:
    async with pool_with_sibling(fifo, containment, max_frame_bytes=64 * MB) as (pool, _):
        before = rss()
        # claims the largest frame the protocol has and never sends it
        job = pool.submit(hostile.lying_length, TEXT_SLICE, b'{"k"', "sleep")
        pid = await first_event(job)
        await cancel_within_bound(job)
        assert not gone([pid])
        # no frame is larger than TEXT_SLICE: the announcement could not make the parent hold
        # more than that
        assert rss() - before < 16 * MB

        job = pool.submit(
            hostile.lying_length, 1000, b"{", "sleep", limits=ProcessLimits(timeout=0.5)
        )
        error = await outcome(job)
        assert isinstance(error, JobTimeout), error


async def test_text_result_of_another_size_than_announced(
    fifo: tuple[str, int], containment: str
) -> None:
    async with pool_with_sibling(fifo, containment) as (pool, _):
        job = pool.submit(hostile.announce_text_then, 10, b"x" * 11)
        error = await outcome(job)
        assert isinstance(error, ProtocolError) and "announced" in str(error), error


# ------------------------------------------------------------------------ floods


async def test_endless_events_keep_parent_memory_bounded_and_cancel_works(
    tmp_path: Path, fifo: tuple[str, int], containment: str
) -> None:
    buffered, size = 16, 64 * 1024
    counter = tmp_path / "sent"
    async with pool_with_sibling(fifo, containment, max_buffered_events=buffered) as (pool, _):
        job = pool.submit(hostile.endless_events, size, str(counter))
        stream = aiter(job.events())
        async with asyncio.timeout(GUARD):
            await anext(stream)
        before = rss()
        # the consumer stalls; the child floods. Waiting longer only makes the check stricter.
        await asyncio.sleep(0.5)
        sent = int(counter.read_bytes())
        # what the parent buffers, plus what the socket and one read can hold
        assert sent <= buffered + 32, f"the child got {sent} events out while nobody read"
        assert rss() - before < 16 * MB
        # the stream still works, and a huge volume through it keeps memory flat
        async with asyncio.timeout(GUARD):
            for _ in range(2000):
                event = await anext(stream)
        assert event["n"] >= 2000 and len(event["blob"]) == size
        assert rss() - before < 32 * MB, f"{(rss() - before) / MB:.0f} MB after 128 MB of events"
        pid = job.pid
        assert pid is not None
        await cancel_within_bound(job)
        assert not gone([pid])


async def test_huge_report_over_the_cap_is_a_protocol_error(
    fifo: tuple[str, int], containment: str
) -> None:
    async with pool_with_sibling(fifo, containment, max_frame_bytes=MB) as (pool, _):
        before = rss()
        # a raw frame announced over the cap, written forever
        job = pool.submit(hostile.huge_raw_report, 2 * MB, 64 * 1024)
        error = await outcome(job)
        assert isinstance(error, ProtocolError) and "larger than any frame" in str(error), error
        assert rss() - before < 16 * MB
        # an announced text result whose frame is over the cap
        job = pool.submit(hostile.announce_text_then, 2 * MB, b"x" * (2 * MB))
        error = await outcome(job)
        assert isinstance(error, ProtocolError) and "max_frame_bytes" in str(error), error
        # an honest child returning too much is told so by its own side
        job = pool.submit(hostile.huge_result, 2 * MB)
        error = await outcome(job)
        assert isinstance(error, JobFailed) and "max_frame_bytes" in str(error), error


async def test_a_child_agent_with_a_huge_report_fails_with_a_reason(containment: str) -> None:
    definition = SubAgentDefinition(
        "big", "answers too much", "p", model=ToolsThenAnswer("x" * (2 * MB))
    )
    async with (
        ProcessPool(2, max_frame_bytes=MB, containment=containment) as pool,
        AsyncSubAgentExtension([definition], pool=pool) as extension,
    ):
        model = StepModel(
            [
                AssistantMessage(
                    tool_calls=(
                        tool_call("task_start", subagent_type="big", description="b", prompt="p"),
                    )
                ),
                AssistantMessage(
                    tool_calls=(tool_call("task_output", task_id="task-1", wait_seconds=GUARD),)
                ),
                AssistantMessage("went on"),
            ]
        )
        client = await create_agent(
            model, config=AgentRunConfig(session_id="s"), extensions=[extension]
        )
        async with client, asyncio.timeout(GUARD):
            assert (await client.run("go")).content == "went on"
            [task] = extension.tasks("s")  # closing the client releases it
    assert task.status is SubAgentTaskStatus.FAILED
    assert "max_frame_bytes" in (task.error or ""), task.error


# ------------------------------------------------------------------------ escaping the kill


async def test_closing_the_channel_and_running_on_ends_the_job(
    fifo: tuple[str, int], containment: str
) -> None:
    async with pool_with_sibling(fifo, containment) as (pool, _):
        job = pool.submit(hostile.close_channel_and_keep_running)
        pid = await first_event(job)
        error = await outcome(job)
        assert isinstance(error, ProtocolError), error
        assert not gone([pid])


async def test_fork_bomb_is_killed_whole(fifo: tuple[str, int], containment: str) -> None:
    async with pool_with_sibling(fifo, containment) as (pool, _):
        job = pool.submit(hostile.fork_bomb, 50)
        pids = await first_event(job)
        worker = job.pid
        assert worker is not None and len(set(pids)) == 50 and worker not in pids
        assert not set(gone(pids)) ^ set(pids), "the tree was not complete before the kill"
        await cancel_within_bound(job)
        assert gone([*pids, worker]) == []


async def test_ignoring_sigterm_does_not_survive_cancel_with_grace(
    fifo: tuple[str, int], containment: str
) -> None:
    grace = 0.3
    async with pool_with_sibling(fifo, containment) as (pool, _):
        job = pool.submit(hostile.ignore_sigterm)
        pids = await first_event(job)
        elapsed = await cancel_within_bound(job, grace=grace)
        assert elapsed >= grace, "SIGKILL came before the grace period"
        assert gone(pids) == []


@pytest.mark.parametrize("how", ["cancel", "timeout"])
async def test_setsid_double_fork_escapee_is_killed(
    how: str, fifo: tuple[str, int], containment: str
) -> None:
    async with pool_with_sibling(fifo, containment) as (pool, _):
        limits = ProcessLimits(timeout=1.0) if how == "timeout" else None
        job = pool.submit(escape_then_wait, limits=limits)
        pids = await first_event(job)
        # its own session and process group: a kill by session or group would miss it
        assert os.getsid(pids[1]) != os.getsid(pids[0])
        assert os.getpgid(pids[1]) != os.getpgid(pids[0])
        if how == "cancel":
            await cancel_within_bound(job)
        else:
            assert isinstance(await outcome(job), JobTimeout)
        assert gone(pids) == []


# keep HEADER imported for readers cross-checking the frame layout used by the children
assert HEADER.size == 4
