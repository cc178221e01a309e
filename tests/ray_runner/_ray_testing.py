"""Helpers of the Ray tests: whether processes are dead, waiting on pidfds, settling jobs."""

from __future__ import annotations

import asyncio
import json
import os
import select
import socket
import time
from typing import Any

from _liveness import alive

#: hang guard for one child's whole life (a fresh Ray worker starts in a second or two here)
BOUND = 60.0


def gone(pid: int) -> bool:
    """Whether a process is dead (reaped, a zombie awaiting its parent, or in its last exit
    step: see ``_liveness.alive``)."""
    return not alive(pid)


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Pids still alive after waiting on their pidfds (a hang guard, not a sleep)."""
    deadline = time.monotonic() + timeout
    alive = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll(max(0, int((deadline - time.monotonic()) * 1000)))
        finally:
            os.close(fd)
        if not gone(pid):
            alive.append(pid)
    return alive


async def settle(job: Any) -> Any:
    await asyncio.wait_for(job.wait(), BOUND)
    return job


class Beacons:
    """Children report JSON datagrams here (``_ray_children.beacon``): the test waits on what
    they did instead of sleeping."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.setblocking(False)

    async def next(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(BOUND):
            data = await loop.sock_recv(self.sock, 65536)
        payload: dict[str, Any] = json.loads(data)
        return payload

    def close(self) -> None:
        self.sock.close()
