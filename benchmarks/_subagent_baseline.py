"""The in-process baseline of ``bench_subagents.py``.

``InProcessSubAgentExtension`` is ``AsyncSubAgentExtension`` with one thing swapped: its child
runner starts each child agent as ``asyncio.create_task(agent.run(prompt))`` in the parent's own
event loop instead of a job of the process pool, and cancels it with ``task.cancel()``. The five
tools, the registry, the notices, ``_create_child`` and the progress folding are the extension's
own code, so both variants run the very same parent program and child agents.
"""

from __future__ import annotations

from typing import Any

from zett_agent.extensions._inprocess import InProcessRunner
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension


class InProcessSubAgentExtension(AsyncSubAgentExtension):
    """``AsyncSubAgentExtension`` whose children run as asyncio tasks in the parent process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._runner = InProcessRunner()  # type: ignore[assignment]
