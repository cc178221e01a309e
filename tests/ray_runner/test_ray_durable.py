"""Durable tasks on Ray: a child that dies, and a node that is lost, resume from the journal.

The children are ``support.durable_children``'s: they log each model call and tool run, and
die (or block) where the test said, so the test checks that no done step ran again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from _ray_testing import BOUND

from support.beacons import Beacons
from support.calls import final
from support.durable_children import BEFORE_EFFECT, Log, Steps, die_at, work_tool
from support.parent import worker
from support.scripted_models import StepModel
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension, SubAgentTaskStatus
from zett_agent.runners.ray import RayRunner

pytestmark = pytest.mark.ray

REPORT = "report: 4 steps, results did 0,did 1,did 2,did 3"


async def run_task(extension: AsyncSubAgentExtension) -> Any:
    client = await create_agent(
        StepModel([final()]), config=AgentRunConfig(session_id="parent"), extensions=[extension]
    )
    await client.run("hello")
    context = client.agent._new_context(client.config, None)
    task = await extension.start(context, extension.subagents[0], description="d", prompt="go")
    return client, task


async def test_a_durable_ray_child_that_dies_resumes_without_repeating_a_done_step(
    ray_cluster: dict[str, Any], tmp_path: Path
) -> None:
    die_at(tmp_path, 2, BEFORE_EFFECT)
    steps = worker(Steps(str(tmp_path), 4), tools=[work_tool(str(tmp_path))], max_turns=50)
    extension = AsyncSubAgentExtension(
        [steps], runner=RayRunner(), store=tmp_path / "tasks.sqlite", durable=True
    )
    async with extension:
        client, task = await run_task(extension)
        await extension.wait(task, BOUND)
        assert (task.status, task.output) == (SubAgentTaskStatus.COMPLETED, REPORT)
        assert extension.task_info(task)["resumes"] == 1
        log = Log.read(tmp_path)
        assert log.model_steps() == [0, 1, 2, 3, 4]
        assert sorted(log.tool_steps()) == [0, 1, 2, 3]
        await client.close()


async def test_a_lost_ray_node_is_a_death_its_durable_task_resumes_from_elsewhere(
    ray_cluster: dict[str, Any], tmp_path: Path, beacons: Beacons
) -> None:
    host = ray_cluster["host"]
    host.call("add_node", name="doomed", num_cpus=1, resources={"durable": 1})
    (tmp_path / "block-1").touch()
    steps = worker(
        Steps(str(tmp_path), 4, beacons.path), tools=[work_tool(str(tmp_path))], max_turns=50
    )
    runner = RayRunner(placement={"worker": {"num_cpus": 1, "resources": {"durable": 1}}})
    extension = AsyncSubAgentExtension(
        [steps], runner=runner, store=tmp_path / "tasks.sqlite", durable=True
    )
    spare = False
    try:
        async with extension:
            client, task = await run_task(extension)
            await asyncio.wait_for(beacons.until("blocked"), BOUND)
            first = extension.task_info(task)["node_id"]
            host.call("add_node", name="spare", num_cpus=1, resources={"durable": 1})
            spare = True
            host.call("remove_node", name="doomed")
            await extension.wait(task, BOUND * 2)
            assert (task.status, task.output) == (SubAgentTaskStatus.COMPLETED, REPORT), task.error
            info = extension.task_info(task)
            assert info["resumes"] == 1
            assert (
                f"the Ray node {first[:12]} died or left the cluster"
                in (info["deaths"][0]["reason"])
            )
            assert info["node_id"] != first
            log = Log.read(tmp_path)
            assert log.model_steps() == [0, 1, 2, 3, 4]
            # step 1's call had started on the lost node: it ran again, under the same key
            assert sorted(log.tool_steps()) == [0, 1, 1, 2, 3]
            assert len({key for step, key, _ in log.tool if step == 1}) == 1
            await client.close()
    finally:
        if spare:
            host.call("remove_node", name="spare")
