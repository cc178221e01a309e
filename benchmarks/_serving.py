"""What the benchmarks' endpoint processes share: the port they print, the stdin that ends them.

Imports nothing but the standard library (the endpoints start at once, light).
"""

from __future__ import annotations

import asyncio
import sys


def announce(server: asyncio.base_events.Server) -> None:
    """Print the port ``server`` listens on, alone on a line (the benchmark reads it)."""
    print(server.sockets[0].getsockname()[1], flush=True)


async def until_stdin_closes() -> None:
    """Return once this process's stdin is closed (the benchmark's way to end it)."""
    loop = asyncio.get_running_loop()
    closed = loop.create_future()
    loop.add_reader(sys.stdin.fileno(), lambda: closed.done() or closed.set_result(None))
    try:
        await closed
    finally:
        loop.remove_reader(sys.stdin.fileno())
