"""The parent's messages to a running child, as the runners carry them: topic and receiving loop.

The parent sends a running child messages (``ChildJob.send``) shaped ``{"id": str, "text":
str, "interrupt": bool}``; a process runner sends them on ``MESSAGE_TOPIC``. In the child,
``run_child`` hands each one its ``receive`` returns to the child's ``ChildRun.take`` with
``receive_forever``; what a message does to the child's agent is the build's business
(``zett_agent.extensions._child_inbox``).

Imported by every child (through ``_child``): light.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["MESSAGE_TOPIC", "receive_forever"]

#: the engine topic the parent's messages to a process child travel on
MESSAGE_TOPIC = "zett.task_message"


async def receive_forever(
    receive: Callable[[], Awaitable[Any]], take: Callable[[Any], None]
) -> None:
    """Hand every message ``receive()`` returns to ``take`` until the channel ends.

    Ends quietly when there is no channel (``RuntimeError``: not in a pool job) or it closed
    (``EOFError``: the parent is killing the job).
    """
    while True:
        try:
            message = await receive()
        except (EOFError, RuntimeError):
            return
        take(message)
