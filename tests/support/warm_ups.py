"""Warm-ups for ``ProcessPool(warm_up=...)`` tests, named ``support.warm_ups:NAME``.

Each announces the pid of the process it ran in (the pool's launcher) on the FIFO named by
``$ZETT_TEST_WARM_UP_FIFO`` (opened without blocking: the test holds the reading end open) and
marks the process as warmed.
"""

from __future__ import annotations

import asyncio
import os

#: the pid of the process whose warm-up ran (None: it did not run here)
WARMED_IN: int | None = None


def _announce() -> None:
    global WARMED_IN
    WARMED_IN = os.getpid()
    fd = os.open(os.environ["ZETT_TEST_WARM_UP_FIFO"], os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)


def announce() -> None:
    """Mark, announce, and run an event loop (as a child's rehearsal does)."""
    _announce()

    async def nothing() -> None:
        return None

    asyncio.run(nothing())


def announce_then_raise() -> None:
    _announce()
    raise RuntimeError("a warm-up that fails")


NOT_A_FUNCTION = 42


def leave_a_thread() -> None:
    """A warm-up that starts a thread and returns while it runs."""
    import threading

    threading.Thread(target=threading.Event().wait, name="lingering", daemon=True).start()


def warmed_here() -> list[object]:
    """The job: its pid, its parent's, the pid the warm-up it inherits ran in, and whether
    asyncio works as in a fresh process."""

    async def answer() -> int:
        return 42

    return [os.getpid(), os.getppid(), WARMED_IN, asyncio.run(answer())]
