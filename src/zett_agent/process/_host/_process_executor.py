"""``ProcessPoolExecutor``: a ``concurrent.futures`` executor with a ``ProcessPool`` of its own.

For programs without an event loop: the pool runs on a private event loop thread. The
executor's behaviour is ``PoolExecutor``'s (``_executor``); here are its own pool and thread,
and what the interpreter's exit does with an executor left open.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures as cf
import concurrent.futures.thread  # noqa: F401  (its exit hook comes before ours: see the end)
import threading
from collections.abc import Sequence
from typing import Any

from ._executor import PoolExecutor
from ._pool import ProcessPool

__all__ = ["ProcessPoolExecutor"]


class ProcessPoolExecutor(PoolExecutor):
    """A drop-in for the standard library's ``ProcessPoolExecutor``.

    A ``concurrent.futures.Executor`` with a ``ProcessPool`` of its own, for programs
    without an event loop (a drop-in for the standard library's ``ProcessPoolExecutor``).

    The pool runs on a private event loop thread, started here; ``shutdown()`` closes it
    (after the futures are done, with ``wait=True``; in the background otherwise, once they
    are). ``pool_options`` are ``ProcessPool``'s keyword options (``max_jobs_per_worker``,
    ``containment``, ``preload``, ...). A program that exits without ``shutdown()`` finishes
    what it submitted first, as with the standard library: at interpreter exit (before the
    thread pools stop) the executor waits for its running and queued jobs, then closes its
    pool, quietly.

    Raises ``TypeError`` and ``ValueError`` for bad options (as ``ProcessPool``), and
    ``zett_agent.process.ProcessError`` when the pool cannot start here.
    """

    def __init__(self, max_workers: int | None = None, **pool_options: Any) -> None:
        pool = ProcessPool(max_workers, **pool_options)  # options checked here, in the caller
        loop = asyncio.new_event_loop()
        started: cf.Future[None] = cf.Future()
        self._thread = threading.Thread(
            target=_serve, args=(loop, pool, started), name="zett-agent-executor", daemon=True
        )
        self._closed: cf.Future[None] | None = None
        self._thread.start()
        try:
            started.result()
        except BaseException:
            self._thread.join()
            raise
        super().__init__(pool, loop)
        self._own_pool = pool
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def pool(self) -> ProcessPool:
        """The pool the jobs run in."""
        return self._own_pool

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """As ``PoolExecutor.shutdown``, then close the pool.

        At once with ``wait=True`` (every process gone when this returns), else in the background
        once the futures are done (and the interpreter's exit waits for that).
        """
        super().shutdown(wait, cancel_futures=cancel_futures)
        with self._pending.lock:
            pending = list(self._pending.futures)
            if self._closed is None:
                self._closed = asyncio.run_coroutine_threadsafe(
                    _close_after(self._own_pool, pending, self._loop), self._loop
                )
                # until then the exit hook waits for it (after shutdown(wait=False) too)
                self._closed.add_done_callback(self._gone)
            closed = self._closed
        if wait:
            closed.result()
            self._thread.join()

    def _gone(self, _closed: object) -> None:
        with _LIVE_LOCK:
            _LIVE.discard(self)


def _serve(loop: asyncio.AbstractEventLoop, pool: ProcessPool, started: cf.Future[None]) -> None:
    """The private loop thread.

    Start the pool (from this thread, which lives as long as the pool: its launcher's parent-death
    signal is tied to it), then run until it is closed.
    """
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(pool.start())
    except BaseException as exc:
        started.set_exception(exc)
        loop.close()
        return
    started.set_result(None)
    try:
        loop.run_forever()
    finally:
        loop.close()


async def _close_after(
    pool: ProcessPool, pending: Sequence[cf.Future[Any]], loop: asyncio.AbstractEventLoop
) -> None:
    try:
        waiting = [asyncio.wrap_future(future) for future in pending]
        await asyncio.gather(*waiting, return_exceptions=True)
        await pool.close()
    finally:
        loop.call_soon(loop.stop)


#: executors not shut down yet (held: their pool and loop thread live on without them anyway)
_LIVE: set[ProcessPoolExecutor] = set()
_LIVE_LOCK = threading.Lock()


def _at_exit() -> None:
    """At interpreter exit: shut down every executor the program left open, as ``wait=True``.

    What the standard library's ``ProcessPoolExecutor`` does: the jobs submitted (running or
    queued) finish, then the pool closes. It runs among ``threading``'s exit hooks, before the
    non-daemon threads are joined and before the ``atexit`` callbacks; the hooks run last
    registered first, and ``concurrent.futures.thread``'s (which stops every thread pool, the
    event loops' default executors and the engine's cleanup threads among them) was registered
    when this module imported it, before ours: the thread pools still work while ours runs.
    """
    while True:
        with _LIVE_LOCK:
            if not _LIVE:
                return
            executor = _LIVE.pop()
        executor.shutdown(wait=True)


# ``threading._register_atexit`` is CPython's (the stdlib's executors use it); elsewhere, atexit
getattr(threading, "_register_atexit", atexit.register)(_at_exit)
