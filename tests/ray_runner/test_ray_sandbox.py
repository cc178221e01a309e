"""Sandboxes and brokered model calls on Ray: the child's node enforces its sandbox as a
``ProcessPool`` does, and its model calls are made by its Ray task, with the real model."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _ray_testing import BOUND, settle

from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.process import Egress, Sandbox
from zett_agent.runners import ChildSpec
from zett_agent.runners.ray import RayJob, RayRunner
from zett_agent.testing import ScriptedModel

pytestmark = pytest.mark.ray


def spec(broker: bool = False) -> ChildSpec:
    model = ScriptedModel(["the child's report"])
    definition = SubAgentDefinition("worker", "test child", "You are a test child.", model=model)
    return ChildSpec(definition, model, "parent/task-1", "do it", broker=broker)


async def test_a_sandboxed_child_runs_confined_on_its_node(ray_cluster: dict[str, Any]) -> None:
    runner = RayRunner()
    try:
        job = await runner.submit(spec(), sandbox=Sandbox())
        assert isinstance(job, RayJob)
        await settle(job)
        assert job.result()["content"] == "the child's report"
        entry = job.info()["sandbox"]
        assert entry["landlock_abi"] > 0 and entry["seccomp"] is True, entry
        assert entry["network"] == "none" and entry["scoped"] and entry["filesystem"], entry
    finally:
        await asyncio.wait_for(runner.close(), BOUND)


async def test_a_brokered_child_gets_its_model_calls_made_on_its_node(
    ray_cluster: dict[str, Any],
) -> None:
    runner = RayRunner()
    try:
        job = await settle(await runner.submit(spec(broker=True)))
        assert job.result()["content"] == "the child's report"
    finally:
        await asyncio.wait_for(runner.close(), BOUND)


async def test_egress_is_refused_on_ray_saying_why(ray_cluster: dict[str, Any]) -> None:
    runner = RayRunner()
    try:
        with pytest.raises(ValueError, match="not supported on Ray"):
            await runner.submit(spec(), sandbox=Sandbox(network=Egress(allow=["api.test"])))
    finally:
        await asyncio.wait_for(runner.close(), BOUND)
