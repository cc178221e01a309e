"""A second Ray driver for the cluster-gone test (Ray ends a driver whose head stays lost).

Runs an ``AsyncSubAgentExtension`` on ``RayRunner``: a scripted parent starts one waiting child
on each worker node, prints ``ready`` once both run, and waits for a line on stdin (the test
kills the whole cluster meanwhile). Then it waits for the tasks, asks the parent model again
(a request whose model lists the tasks), closes the extension, and prints the outcome as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time

import _ray_children as kids
from _ray_testing import child, on

from support.beacons import Beacons
from support.calls import call, final, start
from support.scripted_models import StepModel, tool_results
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
from zett_agent.runners.ray import RayRunner


async def main(address: str) -> None:
    folder = tempfile.mkdtemp()
    beacons = Beacons(os.path.join(folder, "beacons"))
    definitions = [
        child(name, (kids.ANNOUNCE, {"beacon_path": beacons.path, "label": name}))
        for name in ("a", "b")
    ]
    runner = RayRunner(
        address, placement={"a": on("w1"), "b": on("w2")}, kill_timeout=5, end_timeout=10
    )
    runner.connect()
    extension = AsyncSubAgentExtension(definitions, runner=runner)
    model = StepModel(
        [
            start("a", "b"),
            final("started"),
            call("task_list"),
            lambda r: final(tool_results(r)[-1].text),
        ]
    )
    client = await create_agent(
        model, config=AgentRunConfig(session_id="parent"), extensions=[extension]
    )
    await client.run("start two tasks")
    for _ in range(2):
        await beacons.next()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    began = time.monotonic()
    tasks = extension.tasks("parent")
    await asyncio.wait_for(asyncio.gather(*(extension.wait(t) for t in tasks)), 60)
    settled = time.monotonic() - began
    answer = await asyncio.wait_for(client.run("how are the tasks?"), 60)
    began = time.monotonic()
    await asyncio.wait_for(extension.close(), 60)
    closed = time.monotonic() - began
    outcome = {
        "statuses": [t.status.value for t in tasks],
        "errors": [t.error for t in tasks],
        "listed": [t["status"] for t in json.loads(answer.content)["tasks"]],
        "settled": settled,
        "closed": closed,
    }
    print(json.dumps(outcome), flush=True)
    beacons.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
    os._exit(0)  # Ray's driver threads still wait for the lost cluster
