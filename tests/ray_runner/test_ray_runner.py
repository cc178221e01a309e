"""RayRunner on a local three-node cluster: results, events, typed failures, kill, placement."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import _ray_children as kids
import pytest
from _ray_testing import gone, wait_gone

from zett_agent.process import (
    JobCancelled,
    JobFailed,
    JobTimeout,
    LimitExceeded,
    ProcessLimits,
    WorkerCrashed,
)
from zett_agent.runners.ray import RayJob, RayRunner

pytestmark = pytest.mark.ray

#: hang guard for one child's whole life (a fresh Ray worker starts in about 1-2 s here)
BOUND = 60.0


@pytest.fixture
async def runner(ray_cluster: dict[str, Any]) -> Any:
    runner = RayRunner()
    yield runner
    await asyncio.wait_for(runner.close(), BOUND)


async def settle(job: RayJob) -> RayJob:
    await asyncio.wait_for(job.wait(), BOUND)
    return job


async def test_result_and_events_come_back_as_json(runner: RayRunner) -> None:
    job = await runner.submit_function(kids.echo, {"a": [1, 2.5, None]}, 3)
    events = [event async for event in job.events()]
    await settle(job)
    assert events == [{"i": 0}, {"i": 1}, {"i": 2}]
    result = job.result()
    assert result["value"] == {"a": [1, 2.5, None]}
    assert job.exception() is None and job.pid is None
    assert job.node_id is not None


async def test_async_function_and_usage(runner: RayRunner) -> None:
    job = await runner.submit_function(kids.echo_async, "x")
    events = [event async for event in job.events()]
    await settle(job)
    assert events == [{"async": True}] and job.result() == "x"
    usage = job.usage()
    assert usage.elapsed > 0 and usage.peak_rss_bytes > 0


async def test_a_child_that_raises_fails_with_job_failed(runner: RayRunner) -> None:
    job = await settle(await runner.submit_function(kids.raises, "bad input"))
    error = job.exception()
    assert isinstance(error, JobFailed)
    assert (error.type_name, error.message) == ("ValueError", "bad input")
    assert "raises" in error.traceback_text
    assert str(error) == "the job raised ValueError: bad input"


async def test_a_result_that_is_not_json_fails_clearly(runner: RayRunner) -> None:
    job = await settle(await runner.submit_function(kids.not_json))
    error = job.exception()
    assert isinstance(error, JobFailed) and "not JSON-compatible" in error.message


async def test_segfault_beside_a_sibling_that_completes(runner: RayRunner) -> None:
    crasher = await runner.submit_function(kids.segfault, resources={"w1": 1})
    sibling = await runner.submit_function(kids.burn, 0.5, resources={"w2": 1})
    await asyncio.gather(settle(crasher), settle(sibling))
    error = crasher.exception()
    assert isinstance(error, WorkerCrashed) and error.signal_name == "SIGSEGV"
    assert "killed by SIGSEGV" in str(error)
    assert sibling.result() >= 0.5


async def test_os_exit_is_a_crash_without_signal(runner: RayRunner) -> None:
    job = await settle(await runner.submit_function(kids.hard_exit, 7))
    error = job.exception()
    assert isinstance(error, WorkerCrashed) and error.signal_name is None


async def test_children_placed_on_different_nodes(
    runner: RayRunner, ray_cluster: dict[str, Any]
) -> None:
    nodes = ray_cluster["nodes"]
    one = await runner.submit_function(kids.echo, 1, resources={"w1": 1})
    two = await runner.submit_function(kids.echo, 2, resources={"w2": 1})
    await asyncio.gather(settle(one), settle(two))
    assert (one.node_id, two.node_id) == (nodes["w1"], nodes["w2"])
    assert one.result()["pid"] != two.result()["pid"]


async def test_cancel_kills_a_never_yielding_child_and_its_escapees(runner: RayRunner) -> None:
    job = await runner.submit_function(kids.spin_with_tree, resources={"w1": 1})
    events = job.events()
    tree = await asyncio.wait_for(anext(events), BOUND)
    assert job.pid == tree["worker"]
    started = time.monotonic()
    await asyncio.wait_for(job.cancel(), BOUND)
    took = time.monotonic() - started
    assert job.done() and isinstance(job.exception(), JobCancelled)
    pids = [tree["worker"], tree["plain"], tree["escapee"]]
    assert [pid for pid in pids if not gone(pid)] == [], f"alive after cancel ({took:.3f} s)"
    assert [event async for event in events] == []


async def test_a_child_that_returns_leaves_no_process(runner: RayRunner) -> None:
    job = await settle(await runner.submit_function(kids.tree_then_return))
    tree = job.result()
    assert [pid for pid in tree.values() if not gone(pid)] == []


async def test_timeout_is_enforced_from_the_host(runner: RayRunner) -> None:
    job = await runner.submit_function(kids.spin_with_tree, limits=ProcessLimits(timeout=3))
    tree = await asyncio.wait_for(anext(job.events()), BOUND)
    await settle(job)
    error = job.exception()
    assert isinstance(error, JobTimeout) and error.timeout == 3
    assert wait_gone(list(tree.values())) == []


async def test_cpu_limit(runner: RayRunner) -> None:
    job = await settle(
        await runner.submit_function(kids.burn, 30.0, limits=ProcessLimits(cpu_seconds=1))
    )
    error = job.exception()
    assert isinstance(error, LimitExceeded) and error.limit == "cpu_seconds"


async def test_memory_limit(runner: RayRunner) -> None:
    limits = ProcessLimits(memory_bytes=200 * 2**20)
    small = await runner.submit_function(kids.allocate, 20, limits=limits)
    big = await runner.submit_function(kids.allocate, 1024, limits=limits)
    await asyncio.gather(settle(small), settle(big))
    assert small.result() == 20 * 2**20
    error = big.exception()
    assert isinstance(error, LimitExceeded) and error.limit == "memory_bytes"


async def test_cancel_a_queued_child(runner: RayRunner) -> None:
    # w1 has one CPU: the second child waits for the first
    first = await runner.submit_function(kids.wait_forever, resources={"w1": 1})
    await asyncio.wait_for(anext(first.events()), BOUND)
    queued = await runner.submit_function(kids.echo, 1, resources={"w1": 1})
    await asyncio.wait_for(queued.cancel(), BOUND)
    assert isinstance(queued.exception(), JobCancelled) and queued.node_id is None
    await asyncio.wait_for(first.cancel(), BOUND)


async def test_cpu_bound_children_run_in_parallel(runner: RayRunner) -> None:
    """Two CPU-bound children on two nodes burn at the same time: at least half of one
    child's work overlaps the other's (the reference, the same work done one after the other,
    is measured here; the speedup itself is the benchmark's, this machine is shared)."""
    work = 1.5
    started = time.monotonic()
    kids.burn(work)
    kids.burn(work)
    sequential = time.monotonic() - started
    jobs = [
        await runner.submit_function(kids.burn_span, work, resources={n: 1}) for n in ("w1", "w2")
    ]
    await asyncio.gather(*(settle(job) for job in jobs))
    spans = [job.result() for job in jobs]
    overlap = min(end for _, end in spans) - max(start for start, _ in spans)
    assert len({job.node_id for job in jobs}) == 2
    assert overlap > 0.25 * sequential, (spans, sequential)


async def test_a_subagent_child_runs_through_submit(runner: RayRunner) -> None:
    """``submit(spec)`` runs the extension's child (``run_child``) in a Ray worker."""
    from zett_agent.extensions._child import ChildSpec
    from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
    from zett_agent.extensions.subagent import SubAgentDefinition
    from zett_agent.testing import ScriptedModel

    model = ScriptedModel(["the child's report"])
    definition = SubAgentDefinition(
        name="worker",
        description="test child",
        system_prompt="You are a test child.",
        model=model,
    )
    extension = AsyncSubAgentExtension([definition])
    spec = ChildSpec(extension, definition, model, "parent/task-1", "do it")
    job = await runner.submit(spec)
    events = [event async for event in job.events()]
    await settle(job)
    await extension.close()
    assert job.result()["content"] == "the child's report"
    assert [e["kind"] for e in events] == ["started", "turn_started", "turn_finished"]
