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
import concurrent.futures as cf
import concurrent.futures.thread  # noqa: F401  (its exit hook comes before ours: see the end)
import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import JobCancelled
from ._job_core import JobStatus

if TYPE_CHECKING:
    from ._job import ProcessJob

__all__ = ["PoolExecutor", "Submits"]

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


class Submits(Protocol):
    """What an executor needs of its pool: ``submit`` (``ProcessPool`` is one)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> ProcessJob:
        """Start ``fn(*args, **kwargs)`` as a job."""
        ...


class PoolExecutor(cf.Executor):
    """A ``concurrent.futures.Executor`` over a started ``ProcessPool``.

    Get one with ``pool.executor()``. Jobs run exactly as ``pool.submit`` runs them (limits and
    a sandbox are not offered here: use ``pool.submit`` for those). ``shutdown()`` stops new
    submissions and waits (``wait=True``) for the futures; it leaves the pool open (it is
    yours to close). Safe to call from any thread.
    """

    def __init__(self, pool: Submits, loop: asyncio.AbstractEventLoop) -> None:
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
