"""Killing a Ray child's whole tree: both containments, both kill paths, a hostile child, a crash
and the parent's death. Every pid below is checked right when the call returned (no waiting):
a job settles, and ``cancel()`` returns, only once the tree is gone."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import _ray_children as kids
import pytest
from _ray_testing import BOUND, gone, settle, wait_gone

from zett_agent.process import JobCancelled, WorkerCrashed
from zett_agent.runners.ray import RayRunner

pytestmark = pytest.mark.ray

HERE = Path(__file__).parent


async def _runner(containment: str, from_host: bool) -> Any:
    runner = RayRunner(containment=containment, kill_from_host=from_host)
    yield runner
    await asyncio.wait_for(runner.close(), BOUND)


@pytest.fixture(
    params=[("cgroup", True), ("cgroup", False), ("scan", True), ("scan", False)],
    ids=["cgroup-host", "cgroup-reaper", "scan-host", "scan-reaper"],
)
async def runner(request: pytest.FixtureRequest, ray_cluster: dict[str, Any]) -> Any:
    """A runner per containment, killing from this process or through the node's reaper."""
    async for runner in _runner(*request.param):
        yield runner


@pytest.fixture(params=["cgroup", "scan"])
async def contained(request: pytest.FixtureRequest, ray_cluster: dict[str, Any]) -> Any:
    """A runner per containment (for what the task does itself: no kill path involved)."""
    async for runner in _runner(request.param, True):
        yield runner


@pytest.fixture(params=[("cgroup", True), ("scan", False)], ids=["cgroup-host", "scan-reaper"])
async def crashing(request: pytest.FixtureRequest, ray_cluster: dict[str, Any]) -> Any:
    """Both containments, each confirmed dead by one of the kill paths."""
    async for runner in _runner(*request.param):
        yield runner


async def test_cancel_kills_a_never_yielding_child_and_its_escapees(
    runner: RayRunner, ray_cluster: dict[str, Any]
) -> None:
    job = await runner.submit_function(kids.spin_with_tree, resources={"w1": 1})
    events = job.events()
    tree = await asyncio.wait_for(anext(events), BOUND)
    assert job.pid == tree["worker"]
    assert job.info() == {"node_id": ray_cluster["nodes"]["w1"]}
    await asyncio.wait_for(job.cancel(), BOUND)
    assert job.done() and isinstance(job.exception(), JobCancelled) and job.tree_gone
    assert [pid for pid in tree.values() if not gone(pid)] == []
    assert [event async for event in events] == []


async def test_a_child_that_returns_leaves_no_process(contained: RayRunner) -> None:
    job = await settle(await contained.submit_function(kids.tree_then_return))
    tree = job.result()
    # the worker itself lives on for the next child (reused); what the child started does not
    assert [pid for pid in (tree["plain"], tree["escapee"]) if not gone(pid)] == []


async def test_a_crashed_worker_leaves_no_process(crashing: RayRunner, tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as beacons:
        beacons.bind(str(tmp_path / "beacons"))
        job = await crashing.submit_function(kids.tree_then_segfault, str(tmp_path / "beacons"))
        beacons.settimeout(BOUND)
        tree = json.loads(await asyncio.to_thread(beacons.recv, 4096))
        await settle(job)
    error = job.exception()
    assert isinstance(error, WorkerCrashed) and error.signal_name == "SIGSEGV"
    assert [pid for pid in tree.values() if not gone(pid)] == [] and job.tree_gone


async def test_a_hostile_child_in_a_cgroup_is_killed_whole(ray_cluster: dict[str, Any]) -> None:
    """It kills the node's reaper and its own sentinel, clears its subreaper flag and starts a
    grandchild that clears its environment, double-forks and calls setsid: the reaper is
    replaced, and the cgroup holds everything."""
    runner = RayRunner(containment="cgroup", kill_from_host=False)
    try:
        job = await runner.submit_function(kids.hostile, resources={"w2": 1})
        tree = await asyncio.wait_for(anext(job.events()), BOUND)
        assert len(tree["killed"]) >= 2, tree  # a reaper and the sentinel
        await asyncio.wait_for(job.cancel(), BOUND)
        assert isinstance(job.exception(), JobCancelled) and job.tree_gone
        assert [pid for pid in (tree["worker"], tree["escapee"]) if not gone(pid)] == []
    finally:
        await asyncio.wait_for(runner.close(), BOUND)


async def test_scan_containment_loses_a_child_that_clears_its_flag_and_environment(
    ray_cluster: dict[str, Any],
) -> None:
    """What the README says does not hold without cgroups: a grandchild started after the
    child cleared its worker's subreaper flag, with an empty environment, escapes the kill."""
    runner = RayRunner(containment="scan")
    try:
        job = await runner.submit_function(kids.hostile, False)
        tree = await asyncio.wait_for(anext(job.events()), BOUND)
        await asyncio.wait_for(job.cancel(), BOUND)
        assert gone(tree["worker"])
        escaped = not gone(tree["escapee"])
    finally:
        await asyncio.wait_for(runner.close(), BOUND)
        os.kill(tree["escapee"], signal.SIGKILL)  # the cluster host reaps it
    assert escaped


@pytest.mark.parametrize("containment", ["cgroup", "scan"])
def test_the_parent_dying_leaves_no_process(ray_cluster: dict[str, Any], containment: str) -> None:
    """A Ray driver SIGKILLed while its child runs a tree: Ray kills the worker (its owner
    died) and the task's sentinel kills the rest."""
    with subprocess.Popen(
        [sys.executable, str(HERE / "_dying_driver.py"), ray_cluster["address"], containment],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])},
    ) as driver:
        try:
            assert driver.stdout is not None
            tree = json.loads(driver.stdout.readline())
        finally:
            driver.kill()
    assert wait_gone(list(tree.values()), timeout=BOUND) == []
    # no host waits for the sentinel here: let it finish removing the cgroup, then exit
    left = ray_cluster["host"].call("wait_clean", within=BOUND)
    assert not (left["leftovers"] or left["cgroups"]), left
