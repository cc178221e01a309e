"""Cleaning up after jobs off the event loop: one thread that runs removals in order.

What a job leaves for the host to remove once its tree is dead (the cgroups it created below its
worker's cgroup, a sandbox's scratch directory with whatever the job wrote into it) has a size the
job chose. Removing it inline would stall the event loop for as long as the job made it take
(4,000 sibling cgroups cost 190 to 380 ms), so the pool hands such work to its ``Janitor``: a
single thread, started on first use, that runs each removal in turn (or, at interpreter exit,
when no thread may start any more, the caller's). Nothing waits on it but
``close()``, and that only for a bounded time: what is left then is stopped (every removal checks
``stopping`` between steps) and stays for the next pool to sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["Janitor"]

#: how long a stopped removal may take to reach its next step
_STOP_WAIT = 1.0


class Janitor:
    """Runs cleanup calls in one background thread, in the order they were deferred."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._last: Future[Any] | None = None
        #: set by ``close`` when its time is up: long removals stop at their next step
        self.stopping = threading.Event()

    def defer(self, fn: Callable[..., Any], /, *args: Any) -> None:
        """Run ``fn(*args)`` in the janitor's thread.

        Exceptions are swallowed (a removal that fails leaves its leftovers for the next sweep, it
        never fails a job).
        """
        if self.stopping.is_set():
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="zett-agent-janitor")
        try:
            self._last = self._executor.submit(_quietly, fn, *args)
        except RuntimeError:
            # the interpreter is exiting (a pool closed by an exit hook): no new thread may
            # start (Python 3.12) nor work be scheduled; what is left to do is done here
            _quietly(fn, *args)

    @property
    def busy(self) -> bool:
        """Whether a deferred call has not finished yet."""
        return self._last is not None and not self._last.done()

    async def close(self, within: float) -> bool:
        """Wait up to ``within`` seconds for what was deferred, then stop the thread.

        True if everything ran to its end. Idempotent.

        Cancellation: the thread is told to stop before the cancellation propagates (the
        removal under way stops at its next step; the thread then exits on its own).
        """
        executor, last = self._executor, self._last
        finished = True
        try:
            if last is not None and not last.done():
                try:
                    await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(last)), within)
                except TimeoutError:
                    finished = False
                    self.stopping.set()
                    # the removal under way sees ``stopping`` at its next step
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            asyncio.shield(asyncio.wrap_future(last)), _STOP_WAIT
                        )
        finally:
            self.stopping.set()
            if executor is not None:
                self._executor = None
                # joins at once when the last call is done (else: one stuck in the kernel
                # ends on its own, later)
                executor.shutdown(wait=last is None or last.done(), cancel_futures=True)
        return finished

    def close_now(self) -> None:
        """Stop without waiting for the deferred work (the event loop is gone)."""
        self.stopping.set()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    # a leftover stays for the next sweep; nobody waits on the outcome
    with contextlib.suppress(Exception):
        fn(*args)
