"""The pool job of the node inbox tests (``test_ray_inbox``), pickled by value there."""

from __future__ import annotations

from typing import Any


async def take_messages(count: int) -> list[Any]:
    """A pool job: say it runs, then return the next ``count`` task messages it was sent."""
    from zett_agent.process import emit
    from zett_agent.process._child._inbox import receive
    from zett_agent.runners._child_inbox import MESSAGE_TOPIC

    emit("ready")
    return [await receive(MESSAGE_TOPIC) for _ in range(count)]
