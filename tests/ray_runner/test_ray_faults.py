"""The whole Ray cluster going away under a running extension (this test kills the cluster,
so it runs after every other Ray test)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import ray

from support.ray_cluster import driver as ray_driver

pytestmark = pytest.mark.ray

BOUND = 90.0


@pytest.mark.ray_destroys_cluster
def test_the_cluster_going_away_fails_tasks_and_the_extension_answers_and_closes(
    ray_cluster: dict[str, Any],
) -> None:
    """The tasks fail as node lost within their bounds, the extension still answers the
    parent model (a request that lists the tasks), and ``close()`` returns.

    Ray itself ends a driver whose cluster head stayed unreachable for
    ``gcs_rpc_server_reconnect_timeout_s`` (60 s by default), so the driver under test is a
    separate process, and this process disconnects before the cluster goes.
    """
    host = ray_cluster["host"]
    ray.shutdown()
    with ray_driver("_gone_driver.py", ray_cluster["address"], stdin=True) as driver:
        try:
            assert driver.stdin is not None and driver.stdout is not None
            assert driver.stdout.readline().strip() == "ready"
            host.call("kill_cluster")
            driver.stdin.write("go\n")
            driver.stdin.flush()
            # Ray prints its own news to its driver's stdout too ("(raylet) Raylet is
            # terminated...", as it sees the cluster go): the outcome is the one JSON line
            outcome = None
            for line in driver.stdout:
                if line.startswith("{"):
                    outcome = json.loads(line)
                    break
            assert outcome is not None, "the driver printed no outcome"
            assert driver.wait(timeout=BOUND) == 0
        finally:
            driver.kill()
    assert outcome["statuses"] == ["failed", "failed"], outcome
    assert outcome["listed"] == ["failed", "failed"], outcome
    for error in outcome["errors"]:
        assert "died or left the cluster" in error and "\n" not in error, outcome
    assert outcome["settled"] < BOUND and outcome["closed"] < BOUND, outcome
