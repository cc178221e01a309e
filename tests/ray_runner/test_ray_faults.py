"""Ray faults: a node lost while its children run, and the whole cluster going away."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _ray_children as kids
import pytest
import ray

from zett_agent.runners.ray import NodeLost, RayRunner

pytestmark = pytest.mark.ray

BOUND = 90.0
HERE = Path(__file__).parent


async def test_a_lost_node_fails_its_children_and_spares_the_others(
    ray_cluster: dict[str, Any],
) -> None:
    host = ray_cluster["host"]
    node_id = host.call("add_node", name="doomed", num_cpus=1, resources={"doomed": 4})["id"]
    runner = RayRunner()
    try:
        doomed = await runner.submit_function(kids.wait_forever, resources={"doomed": 1})
        sibling = await runner.submit_function(kids.burn, 3.0, resources={"w1": 1})
        await asyncio.wait_for(anext(doomed.events()), BOUND)
        assert doomed.node_id == node_id
        started = time.monotonic()
        host.call("remove_node", name="doomed")
        await asyncio.wait_for(asyncio.gather(doomed.wait(), sibling.wait()), BOUND)
        took = time.monotonic() - started
        error = doomed.exception()
        assert isinstance(error, NodeLost), (error, took)
        assert error.node_id == node_id
        assert "died or left the cluster" in str(error) and "\n" not in str(error)
        assert sibling.result() >= 3.0 and sibling.node_id == ray_cluster["nodes"]["w1"]
    finally:
        await asyncio.wait_for(runner.close(), BOUND)


@pytest.mark.ray_destroys_cluster
def test_the_cluster_going_away_fails_children_and_close_returns(
    ray_cluster: dict[str, Any],
) -> None:
    """Run last: it kills the session's cluster.

    A Ray driver whose cluster is gone is ended by Ray itself once it has not reached the GCS
    for ``gcs_rpc_server_reconnect_timeout_s`` (60 s by default), so the driver under test is
    a separate process, and this process disconnects before the cluster goes.
    """
    host = ray_cluster["host"]
    ray.shutdown()
    with subprocess.Popen(
        [sys.executable, str(HERE / "_gone_driver.py"), ray_cluster["address"]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(HERE)},
    ) as driver:
        try:
            assert driver.stdin is not None and driver.stdout is not None
            assert driver.stdout.readline().strip() == "ready"
            host.call("kill_cluster")
            driver.stdin.write("go\n")
            driver.stdin.flush()
            outcome = json.loads(driver.stdout.readline())
            assert driver.wait(timeout=BOUND) == 0
        finally:
            driver.kill()
    assert outcome["errors"] == ["NodeLost", "NodeLost"], outcome
    assert all("\n" not in reason for reason in outcome["reasons"])
    assert outcome["closed"] < BOUND
