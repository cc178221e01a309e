"""A Ray driver the test SIGKILLs: starts one child that runs a process tree, prints the tree's
pids as one JSON line, then waits to be killed."""

from __future__ import annotations

import asyncio
import json
import sys

import _ray_children as kids

from zett_agent.runners.ray import RayRunner


async def main(address: str, containment: str) -> None:
    runner = RayRunner(address, containment=containment)
    runner.connect()
    job = await runner.submit_function(kids.spin_with_tree, resources={"w1": 1})
    tree = await asyncio.wait_for(anext(job.events()), 60)
    print(json.dumps(tree), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
