"""RayRunner on a local three-node cluster: results, events, typed failures, limits, placement."""

from __future__ import annotations

import asyncio
from typing import Any

import _ray_children as kids
import pytest
from _ray_testing import BOUND, settle, wait_gone

from zett_agent.process import (
    JobCancelled,
    JobFailed,
    JobTimeout,
    LimitExceeded,
    ProcessLimits,
    WorkerCrashed,
)
from zett_agent.runners.ray import RayRunner

pytestmark = pytest.mark.ray


@pytest.fixture
async def runner(ray_cluster: dict[str, Any]) -> Any:
    runner = RayRunner()
    yield runner
    await asyncio.wait_for(runner.close(), BOUND)


async def test_result_and_events_come_back_as_json(runner: RayRunner) -> None:
    job = await runner.submit_function(kids.echo, {"a": [1, 2.5, None]}, 3)
    events = [event async for event in job.events()]
    await settle(job)
    assert events == [{"i": 0}, {"i": 1}, {"i": 2}]
    result = job.result()
    assert result["value"] == {"a": [1, 2.5, None]}
    assert job.exception() is None and job.pid is None
    assert job.node_id is not None and job.tree_gone


async def test_a_function_childs_node_pool_preloads_only_what_it_runs(runner: RayRunner) -> None:
    """Each new Ray worker starts a pool whose launcher preloads what its children run. A
    function's pool: the engine's child side, not the pool's own host side (``_ray_node``: the
    pool, its inboxes, asyncio) nor the agent runtime, which only a child agent's pool
    preloads; they were most of the CPU each such launcher took to start."""
    watched = ("zett_agent.runners._ray._ray_node", "zett_agent.process._host._pool")
    watched += ("zett_agent.agent", "zett_agent.runners._child", "asyncio")
    seen = f"sorted(set({watched!r}) & set(__import__('sys').modules))"
    job = await settle(await runner.submit_function(eval, seen))
    assert job.result() == []


async def test_the_pools_of_a_node_get_their_launchers_from_its_zygote(
    ray_cluster: dict[str, Any],
) -> None:
    """A new Ray worker's pool gets its launcher forked by the node's zygote, which imported
    the pool's modules once (issue 34: each such launcher imported them itself, most of a
    second of CPU): two children in fresh Ray workers on one node, two launchers, one zygote,
    neither launcher a child of its Ray worker."""
    runner = RayRunner(fresh_workers=True)
    try:
        seen = []
        for _ in range(2):
            job = await settle(await runner.submit_function(kids.lineage, resources={"w1": 1}))
            assert job._tree is not None
            seen.append((job.result(), job._tree["worker"][0]))
    finally:
        await asyncio.wait_for(runner.close(), BOUND)
    (first, first_worker), (second, second_worker) = seen
    assert first_worker != second_worker and first["launcher"] != second["launcher"]
    assert first["zygote"] and first["above"] == second["above"]
    assert first["above"] not in (first_worker, second_worker)


async def test_async_function_and_usage(runner: RayRunner) -> None:
    job = await runner.submit_function(kids.echo_async, "x")
    events = [event async for event in job.events()]
    await settle(job)
    assert events == [{"async": True}] and job.result() == "x"
    usage = job.usage()
    # final numbers, as a ProcessJob's: no live resident memory once the child ended
    assert usage.elapsed > 0 and usage.peak_rss_bytes > 0 and usage.rss_bytes == 0


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
    assert isinstance(error, JobFailed) and "results must be JSON data" in error.message


async def test_a_segfault_is_a_crash_named_by_its_signal(runner: RayRunner) -> None:
    job = await settle(await runner.submit_function(kids.segfault))
    error = job.exception()
    assert isinstance(error, WorkerCrashed) and error.signal_name == "SIGSEGV"
    assert "killed by SIGSEGV" in str(error)


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


async def test_timeout_is_enforced_from_the_host(runner: RayRunner) -> None:
    job = await runner.submit_function(kids.spin_with_tree, limits=ProcessLimits(timeout=2))
    tree = await asyncio.wait_for(anext(job.events()), BOUND)
    await settle(job)
    error = job.exception()
    assert isinstance(error, JobTimeout) and error.timeout == 2
    # the job settled only once the tree was gone: no waiting needed here
    assert wait_gone(list(tree.values()), timeout=0) == [] and job.tree_gone


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
    assert isinstance(queued.exception(), JobCancelled)
    # Ray may have started it just as the cancel came: then what it started is gone too
    assert queued.node_id is None or queued.tree_gone, (queued.node_id, queued.tree_gone)
    await asyncio.wait_for(first.cancel(), BOUND)
    assert isinstance(first.exception(), JobCancelled) and first.tree_gone


async def test_a_subagent_child_runs_through_submit(runner: RayRunner) -> None:
    """``submit(spec)`` runs the extension's child (``run_child``) in a Ray worker."""
    from zett_agent.extensions.subagent import SubAgentDefinition
    from zett_agent.runners import ChildSpec
    from zett_agent.testing import ScriptedModel

    model = ScriptedModel(["the child's report"])
    definition = SubAgentDefinition("worker", "test child", "You are a test child.", model=model)
    job = await runner.submit(ChildSpec(definition, model, "parent/task-1", "do it"))
    events = [event async for event in job.events()]
    await settle(job)
    assert job.result()["content"] == "the child's report"
    assert [e["kind"] for e in events] == ["started", "turn_started", "turn_finished"]
