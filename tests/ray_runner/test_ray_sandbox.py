"""Sandboxes on Ray: not enforced on Ray nodes yet, so a required one fails its task before
anything reaches the cluster, and an optional one runs unconfined and says so."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _ray_testing import BOUND, settle

from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.process import Sandbox, SandboxUnavailable
from zett_agent.runners import ChildSpec
from zett_agent.runners.ray import RayJob, RayRunner
from zett_agent.testing import ScriptedModel

pytestmark = pytest.mark.ray


def spec() -> ChildSpec:
    model = ScriptedModel(["the child's report"])
    definition = SubAgentDefinition("worker", "test child", "You are a test child.", model=model)
    return ChildSpec(definition, model, "parent/task-1", "do it")


def test_a_required_sandbox_fails_before_anything_reaches_ray() -> None:
    runner = RayRunner()
    job = asyncio.run(runner.submit(spec(), sandbox=Sandbox()))
    error = job.exception()
    assert isinstance(error, SandboxUnavailable), error
    assert "the Ray runner does not enforce sandboxes yet" in str(error)
    assert job.info()["sandbox"]["refused"]
    assert runner._remote is None  # refused before connecting to anything


async def test_an_optional_sandbox_runs_unconfined_and_says_so(
    ray_cluster: dict[str, Any],
) -> None:
    runner = RayRunner()
    try:
        job = await runner.submit(spec(), sandbox=Sandbox(required=False))
        assert isinstance(job, RayJob)
        await settle(job)
        assert job.result()["content"] == "the child's report"
        assert job.info()["sandbox"]["enforced"] is False
        assert "refused" not in job.info()["sandbox"]
    finally:
        await asyncio.wait_for(runner.close(), BOUND)
