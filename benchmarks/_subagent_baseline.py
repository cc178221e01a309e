"""The in-process baseline of ``bench_subagents.py``.

``InProcessSubAgentExtension`` is ``AsyncSubAgentExtension`` with one thing swapped: its child
runner starts each child agent as ``asyncio.create_task(agent.run(prompt))`` in the parent's own
event loop instead of a job of the process pool, and cancels it with ``task.cancel()``. The five
tools, the registry, the notices, ``_create_child`` and the progress folding are the extension's
own code, so both variants run the very same parent program and child agents.
"""

from __future__ import annotations

from typing import Any

from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
from zett_agent.runners import InProcessRunner


class InProcessSubAgentExtension(AsyncSubAgentExtension):
    """``AsyncSubAgentExtension`` whose children run as asyncio tasks in the parent process.

    ``InProcessRunner(copy=False)``: children share the definition's objects, the cheapest
    in-process design (no pickling), so the baseline is not slowed by what processes need.
    ``max_children`` / ``max_workers`` options are dropped: there are no processes.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        for option in ("max_children", "max_workers", "pool", "kill_grace"):
            kwargs.pop(option, None)
        super().__init__(*args, runner=InProcessRunner(copy=False), **kwargs)
