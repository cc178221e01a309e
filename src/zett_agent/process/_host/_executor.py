"""The engine behind the interface ``concurrent.futures`` users know.

``pool.executor()`` and ``ProcessPoolExecutor``.

Two differences from the standard library's ``ProcessPoolExecutor``, both on purpose:

- ``future.cancel()`` also stops a job that is already running: its whole process tree is
  killed, and ``cancel()`` returns ``True`` (the stdlib returns ``False`` and lets it run);
- a job whose worker crashes fails its own future with ``WorkerCrashed``, and the executor goes
  on (the stdlib marks the whole pool broken and fails every future with ``BrokenProcessPool``).

Everything else follows ``concurrent.futures``: ``submit`` from any thread returns a
``concurrent.futures.Future``; ``map`` keeps the order of its inputs and raises
``TimeoutError`` past ``timeout``; ``shutdown(wait, cancel_futures)``; a context manager; usable
as ``loop.run_in_executor(executor, fn, *args)``.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures as cf
import concurrent.futures.thread  # noqa: F401  (its exit hook comes before ours: see the end)
import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._errors import JobCancelled
from ._job import JobStatus

if TYPE_CHECKING:
    from ._job import ProcessJob
    from ._pool import ProcessPool

__all__ = ["PoolExecutor", "ProcessPoolExecutor"]

#: longest wait of a ``cancel()`` called from another thread for the job's tree to be gone
_CANCEL_WAIT = 30.0


class _JobFuture(cf.Future[Any]):
    """A ``concurrent.futures.Future`` of one pool job; ``cancel()`` kills a running one."""

    def __init__(self, kill: Callable[[_JobFuture], None]) -> None:
        super().__init__()
        #: the executor's kill of a cancelled future's job
        self._kill = kill
        #: the job, once it was submitted on the loop's thread
        self.job: ProcessJob | None = None

    def running(self) -> bool:
        job = self.job
        return not self.done() and job is not None and job.status is JobStatus.RUNNING

    def cancel(self) -> bool:
        """Cancel the job, running or not: ``True`` unless it had already finished.

        A running job's whole process tree is killed. Called from a thread other than the
        pool's event loop thread, it returns once the tree is gone (at most 30 s, a hang
        guard); on that thread it cannot wait, and the kill completes moments later.
        """
        with self._condition:  # re-entrant: one caller is the first, whatever the threads
            first = not self.cancelled()
            if not super().cancel():
                return False  # it finished already
            if first:
                # waiters of concurrent.futures.wait() and as_completed() hear of it (the
                # stdlib's executors do so when a cancelled future's turn comes; it never does)
                self.set_running_or_notify_cancel()
        if first:
            self._kill(self)
        return True


class _Pending:
    """The futures of one executor that are not done, under the lock that guards them.

    Shared by the executor (submit, shutdown) and the exit hook, which cancels them.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.futures: set[_JobFuture] = set()

    def snapshot(self) -> list[_JobFuture]:
        """The pending futures now."""
        with self.lock:
            return list(self.futures)


class PoolExecutor(cf.Executor):
    """A ``concurrent.futures.Executor`` over a started ``ProcessPool``.

    Get one with ``pool.executor()``. Jobs run exactly as ``pool.submit`` runs them (limits and
    a sandbox are not offered here: use ``pool.submit`` for those). ``shutdown()`` stops new
    submissions and waits (``wait=True``) for the futures; it leaves the pool open (it is
    yours to close). Safe to call from any thread.
    """

    def __init__(self, pool: ProcessPool, loop: asyncio.AbstractEventLoop) -> None:
        self._pool = pool
        self._loop = loop
        self._pending = _Pending()
        self._shutdown = False

    def __repr__(self) -> str:
        state = "shut down" if self._shutdown else "open"
        pending = len(self._pending.futures)
        return f"<{type(self).__name__} {state} pending={pending} pool={self._pool!r}>"

    # -- submitting --------------------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        """Run ``fn(*args, **kwargs)`` in a worker process; return its future at once.

        Raises ``RuntimeError`` after ``shutdown()`` (or once the pool closed). Called on the
        pool's event loop thread (as ``loop.run_in_executor`` does), a function or an argument
        that cannot be pickled raises ``TypeError`` here; from another thread that error is
        set on the future.
        """
        future = _JobFuture(self._kill)
        pending = self._pending
        with pending.lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            pending.futures.add(future)
        future.add_done_callback(self._forget)
        if self._on_loop_thread():
            try:
                self._start(future, fn, args, kwargs)
            except BaseException:
                self._forget(future)
                raise
        else:
            try:
                self._loop.call_soon_threadsafe(self._start, future, fn, args, kwargs, True)
            except RuntimeError as exc:  # the loop is closed: the pool is gone
                self._forget(future)
                raise RuntimeError("cannot schedule new futures: the pool is closed") from exc
        return future

    def _start(
        self,
        future: _JobFuture,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        quiet: bool = False,
    ) -> None:
        """On the loop's thread: submit the job and tie its outcome to the future.

        An error submitting it is raised; with ``quiet`` (called from another thread's
        ``submit``, where nobody would see it) it is set on the future instead.
        """
        if future.cancelled():
            return
        try:
            job = self._pool.submit(fn, *args, **kwargs)
            future.job = job
            job.add_done_callback(lambda job: _settle(future, job))
        except BaseException as exc:
            if not quiet:
                raise
            if not future.done():
                future.set_exception(exc)

    def _forget(self, future: cf.Future[Any]) -> None:  # a _JobFuture
        pending = self._pending
        with pending.lock:
            pending.futures.discard(future)

    # -- cancelling --------------------------------------------------------------------------

    def _kill(self, future: _JobFuture) -> None:
        """Kill the job of a future just cancelled; from another thread, wait until it is."""
        if self._on_loop_thread():
            job = future.job
            if job is not None:
                self._loop.create_task(job.cancel())
            return
        try:
            done = asyncio.run_coroutine_threadsafe(_cancel(future), self._loop)
        except RuntimeError:
            return  # the loop is gone, and with it every job
        with contextlib.suppress(cf.TimeoutError, cf.CancelledError):
            done.result(_CANCEL_WAIT)

    # -- shutting down -----------------------------------------------------------------------

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Accept no new jobs.

        With ``cancel_futures``, cancel those not running yet; with ``wait``, return once every
        future is done. The pool stays open.

        Raises ``RuntimeError`` when asked to wait on the pool's own event loop thread while
        futures are pending (that thread runs the jobs: it would wait for ever); shut down
        from another thread, or with ``wait=False``.
        """
        with self._pending.lock:
            self._shutdown = True
            pending = list(self._pending.futures)
        if cancel_futures:
            for future in pending:
                if not future.running():
                    future.cancel()
        if wait:
            left = [future for future in pending if not future.done()]
            if left and self._on_loop_thread():
                raise RuntimeError(
                    "shutdown(wait=True) on the pool's event loop thread would wait for ever "
                    f"({len(left)} futures pending); call it from another thread, or use "
                    "shutdown(wait=False) and await the futures (asyncio.wrap_future)"
                )
            cf.wait(left)

    def _on_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False


async def _cancel(future: _JobFuture) -> None:
    # the job was perhaps not submitted yet (its submit is queued behind this on the loop):
    # then ``_start`` sees the future cancelled and never submits it
    job = future.job
    if job is not None:
        await job.cancel()


def _settle(future: _JobFuture, job: ProcessJob) -> None:
    """On the loop's thread, once the job ended: its outcome onto the future."""
    if future.done():
        return  # cancelled through the future (the job ended with JobCancelled)
    error = job.exception()
    try:
        if error is None:
            future.set_result(job.result())
        elif isinstance(error, JobCancelled):
            future.cancel()
        else:
            future.set_exception(error)
    except cf.InvalidStateError:
        pass  # cancelled from another thread at this very moment


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
        from ._pool import ProcessPool

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
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def pool(self) -> ProcessPool:
        """The pool the jobs run in."""
        return self._pool

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
                    _close_after(self._pool, pending, self._loop), self._loop
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
