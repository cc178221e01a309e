"""Helpers of the Ray tests: waiting on pidfds, settling jobs, child definitions placed on nodes."""

from __future__ import annotations

import asyncio
import os
import select
import time
from typing import Any

from support.liveness import gone
from support.parent import worker
from support.scripted_models import ToolsThenAnswer
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.tools import AgentTool

#: hang guard for one child's whole life (a fresh Ray worker starts in a second or two here)
BOUND = 60.0


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


def child(
    name: str, *tools: tuple[AgentTool, dict[str, Any]], answer: str = "{last}"
) -> SubAgentDefinition:
    """A definition whose child calls ``tools`` in order, then answers."""
    model = ToolsThenAnswer(answer, [(tool.name, args) for tool, args in tools])
    return worker(model, name, tools=tuple(tool for tool, _ in tools))


def on(node: str) -> dict[str, Any]:
    """Ray options that place a task on the test cluster's worker node ``node``."""
    return {"num_cpus": 1, "resources": {node: 1}}
