"""A running child's progress as an MCP client sees it: one short line, sent as it changes.

Both ways of waiting for a child send it: a plain call of a child's tool (or ``task_output``)
on its own request, a task-augmented call on the connection with the request's progress token,
for as long as the task runs (the spec keeps that token valid for the task's whole life).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zett_agent._mcp._watch import Bells
    from zett_agent.extensions._tasks._task import SubAgentTask

__all__ = ["PROGRESS_INTERVAL", "forward_progress", "progress_line"]

log = logging.getLogger(__name__)

#: least seconds between two progress notifications of one wait: a child that reports a
#: thousand times a second costs the client ten notifications a second
PROGRESS_INTERVAL = 0.1

#: sends one notification: (progress, the line); the spec asks ``progress`` to grow each time
Send = Callable[[int, str], Awaitable[None]]


def _count(value: object) -> str:
    # a child shapes these numbers: never format an unbounded int
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**18:
        return str(value)
    return "?"


def progress_line(task: SubAgentTask) -> str:
    """One short line: what the child did so far, as the task shows it.

    For example ``running, turn 1, 1 tool calls (last: count_lines), 3 of 7 done``.
    """
    parts = [task.status.value, f"turn {_count(task.turns)}"]
    if task.tool_calls:
        last = f" (last: {task.last_tool})" if task.last_tool else ""
        parts.append(f"{_count(task.tool_calls)} tool calls{last}")
    if task.progress is not None:
        done, total = task.progress.get("done"), task.progress.get("total")
        parts.append(
            f"{_count(done)} of {_count(total)} done"
            if total is not None
            else f"{_count(done)} done"
        )
    return ", ".join(parts)


async def forward_progress(task: SubAgentTask, bells: Bells, send: Send) -> None:
    """Send the task's progress line now, then each time it changes, until the task ends.

    At most one notification every ``PROGRESS_INTERVAL`` seconds; a line equal to the last one
    sent is not sent again. A send that fails (the client went away) ends it quietly: progress
    is a courtesy, never a reason for an error.

    Cancellation: ends it, and nothing else (the task runs on).
    """
    sent = 0
    last = None
    with bells.watch(task.session_id) as bell:
        while not task.done():
            line = progress_line(task)
            if line != last:
                last = line
                sent += 1
                try:
                    await send(sent, line)
                except Exception:
                    log.debug("progress of %s not sent; stopped", task.task_id, exc_info=True)
                    return
                await asyncio.sleep(PROGRESS_INTERVAL)
            await bell.wait()
            bell.clear()
