"""A second Ray driver for the cluster-gone test (a driver whose GCS is lost is ended by Ray).

Starts one waiting child on each worker node, prints ``ready``, waits for a line on stdin (the
test kills the cluster meanwhile), then prints the outcomes as JSON and exits.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import _ray_children as kids

from zett_agent.runners.ray import RayRunner


async def main(address: str) -> None:
    runner = RayRunner(address, reaper_timeout=5, end_timeout=10)
    runner.connect()
    jobs = [
        await runner.submit_function(kids.wait_forever, resources={node: 1})
        for node in ("w1", "w2")
    ]
    for job in jobs:
        await asyncio.wait_for(anext(job.events()), 60)
    print("ready", flush=True)
    sys.stdin.readline()
    started = time.monotonic()
    await asyncio.wait_for(asyncio.gather(*(job.wait() for job in jobs)), 60)
    settled = time.monotonic() - started
    await asyncio.wait_for(runner.close(), 60)
    closed = time.monotonic() - started
    errors = [job.exception() for job in jobs]
    outcome = {
        "errors": [type(e).__name__ for e in errors],
        "reasons": [str(e) for e in errors],
        "settled": settled,
        "closed": closed,
    }
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
    os._exit(0)  # Ray's driver threads still wait for the lost cluster
