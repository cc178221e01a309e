"""The engine behind the interface ``concurrent.futures`` users know.

``pool.executor()`` and ``ProcessPoolExecutor``.

In its default mode (``results="pickle"``) the executor is the standard library's: a call is
pickled in ``submit`` (an error pickling it fails its future with that very error), and its
result, or its exception with the worker's traceback as ``__cause__``, comes back pickled
(``_pickled_call``): the executor trusts its jobs as the standard library's does. With
``results="json"`` it is as strict as ``ProcessPool.submit``: results are JSON data, a job's
exception is ``JobFailed``, and the host never unpickles what a worker wrote.

Two differences from the standard library's ``ProcessPoolExecutor``, both on purpose:

- ``future.cancel()`` also stops a job that is already running: its whole process tree is
  killed, and ``cancel()`` returns ``True`` (the stdlib returns ``False`` and lets it run);
- a job whose worker crashes fails its own future with ``WorkerCrashed``, and the executor goes
  on (the stdlib marks the whole pool broken and fails every future with ``BrokenProcessPool``).

Everything else follows ``concurrent.futures``: ``submit`` from any thread returns a
``concurrent.futures.Future``; ``map`` keeps the order of its inputs, runs ``chunksize`` calls
per job and raises ``TimeoutError`` past ``timeout``; ``shutdown(wait, cancel_futures)``; a
context manager; usable as ``loop.run_in_executor(executor, fn, *args)``; an initializer that
raises breaks the executor (``BrokenProcessPool``), as the stdlib's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import concurrent.futures.thread  # noqa: F401  (its exit hook comes before ours: see the end)
import contextlib
import functools
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .._errors import JobCancelled, JobFailed
from .._pickled_call import InitializerFailed, call_with_init, outcome, process_chunk, run
from ._job_core import JobStatus
from ._pickling import pickle_call

if TYPE_CHECKING:
    from ._job import ProcessJob

__all__ = ["RESULTS", "PoolExecutor", "Submits"]

#: the executor's modes: the standard library's (pickled outcomes), or the engine's strict one
RESULTS = ("pickle", "json")

#: the type name a worker reports for ``InitializerFailed`` (json mode)
_INIT_FAILED = f"{InitializerFailed.__module__}.{InitializerFailed.__qualname__}"
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
        #: in the order they were submitted (a dict: ordered, and removed from in O(1))
        self.futures: dict[_JobFuture, None] = {}

    def snapshot(self) -> list[_JobFuture]:
        """The pending futures now."""
        with self.lock:
            return list(self.futures)


class Submits(Protocol):
    """What an executor needs of its pool (``ProcessPool`` is one)."""

    #: jobs running at once, at most
    max_workers: int

    @property
    def running(self) -> int:
        """Jobs running now."""
        ...

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> ProcessJob:
        """Start ``fn(*args, **kwargs)`` as a job."""
        ...


class PoolExecutor(cf.Executor):
    """A ``concurrent.futures.Executor`` over a started ``ProcessPool``.

    Get one with ``pool.executor()``. Jobs run exactly as ``pool.submit`` runs them (limits and
    a sandbox are not offered here: use ``pool.submit`` for those). ``shutdown()`` stops new
    submissions and waits (``wait=True``) for the futures; it leaves the pool open (it is
    yours to close). Safe to call from any thread.

    ``results="pickle"`` (the default): results and exceptions come back as the standard
    library's executor returns them (pickled: the executor trusts its jobs; see
    docs/threat-model.md); ``results="json"``: as ``ProcessPool.submit`` returns them (JSON
    data, ``JobFailed``), for jobs the host does not trust.
    """

    def __init__(
        self,
        pool: Submits,
        loop: asyncio.AbstractEventLoop,
        *,
        results: Literal["pickle", "json"] = "pickle",
        init: tuple[int, bytes] | None = None,
        authkey: bool = False,
    ) -> None:
        self._pool = pool
        self._loop = loop
        self._pending = _Pending()
        self._shutdown = False
        #: why no job runs any more (an initializer raised), else False (the stdlib's name)
        self._broken: str | Literal[False] = False
        self._pickled = results == "pickle"
        #: the initializer's token and pickled ``(initializer, initargs)``, sent with each job
        self._init = init
        #: whether each job carries this process's multiprocessing authkey (pickle mode only)
        self._authkey = authkey and self._pickled

    def __repr__(self) -> str:
        state = "shut down" if self._shutdown else "broken" if self._broken else "open"
        pending = len(self._pending.futures)
        mode = "pickle" if self._pickled else "json"
        return (
            f"<{type(self).__name__} {state} results={mode} pending={pending} pool={self._pool!r}>"
        )

    # -- submitting --------------------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        """Run ``fn(*args, **kwargs)`` in a worker process; return its future at once.

        Raises ``RuntimeError`` after ``shutdown()`` (or once the pool closed), and
        ``concurrent.futures.process.BrokenProcessPool`` once the executor is broken (its
        initializer raised). A function or an argument that cannot be pickled fails the
        returned future with the pickler's error (pickle mode, as the standard library), or
        raises ``TypeError`` here (json mode, on the pool's event loop thread; from another
        thread that error is set on the future).
        """
        future = _JobFuture(self._kill)
        pending = self._pending
        with pending.lock:
            if self._broken:
                raise _broken_pool(self._broken)
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            pending.futures[future] = None
        future.add_done_callback(self._forget)
        job = self._job(future, fn, args, kwargs)
        if job is None:
            return future  # its pickling failed: the future holds the error
        if self._on_loop_thread():
            try:
                self._start(future, job)
            except BaseException:
                self._forget(future)
                raise
        else:
            try:
                self._loop.call_soon_threadsafe(self._start, future, job, True)
            except RuntimeError as exc:  # the loop is closed: the pool is gone
                self._forget(future)
                raise RuntimeError("cannot schedule new futures: the pool is closed") from exc
        return future

    def _job(
        self,
        future: _JobFuture,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None:
        """What the pool runs for ``fn(*args, **kwargs)``: a function, its arguments.

        In pickle mode the call is pickled here, in the caller's thread; an error doing so
        fails ``future`` with it (``None`` is returned).
        """
        if not self._pickled:
            if self._init is None:
                return fn, args, kwargs
            return call_with_init, (self._init, fn, *args), kwargs
        try:
            call = pickle_call(fn, args, kwargs)
        except Exception as exc:
            future.set_exception(exc)
            return None
        authkey = None
        if self._authkey:
            from multiprocessing import process

            authkey = bytes(process.current_process().authkey)
        return run, (call, self._init, authkey), {}

    def _start(
        self,
        future: _JobFuture,
        job: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]],
        quiet: bool = False,
    ) -> None:
        """On the loop's thread: submit the job and tie its outcome to the future.

        An error submitting it is raised; with ``quiet`` (called from another thread's
        ``submit``, where nobody would see it) it is set on the future instead.
        """
        if future.done():
            return  # cancelled, or failed by a broken executor, before it was submitted
        fn, args, kwargs = job
        try:
            submitted = self._pool.submit(fn, *args, **kwargs)
            future.job = submitted
            submitted.add_done_callback(lambda done: self._settle(future, done))
        except BaseException as exc:
            if not quiet:
                raise
            if not future.done():
                future.set_exception(exc)

    def _forget(self, future: cf.Future[Any]) -> None:  # a _JobFuture
        pending = self._pending
        with pending.lock:
            pending.futures.pop(future, None)  # type: ignore[call-overload]

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[Any]:
        """``map(fn, *iterables)``, each job running ``chunksize`` calls, results in order.

        As the standard library's: raises ``ValueError`` for a ``chunksize`` below 1, and
        ``TimeoutError`` from the iterator once ``timeout`` seconds passed since the call
        (the futures not done are cancelled: running jobs are killed).
        """
        if not isinstance(chunksize, int) or isinstance(chunksize, bool):
            raise TypeError(f"chunksize must be an int, not {type(chunksize).__name__}")
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        if chunksize == 1:
            return super().map(fn, *iterables, timeout=timeout)
        chunks = _chunks(zip(*iterables, strict=False), chunksize)
        results = super().map(functools.partial(process_chunk, fn), chunks, timeout=timeout)
        return itertools.chain.from_iterable(results)

    # -- outcomes ----------------------------------------------------------------------------

    def _settle(self, future: _JobFuture, job: ProcessJob) -> None:
        """On the loop's thread, once the job ended: its outcome onto the future."""
        if future.done():
            return  # cancelled through the future (the job ended with JobCancelled)
        error = job.exception()
        try:
            if error is None:
                if self._pickled:
                    self._unpickle(future, job.result())
                else:
                    future.set_result(job.result())
            elif isinstance(error, JobCancelled):
                future.cancel()
            elif isinstance(error, JobFailed) and error.type_name == _INIT_FAILED:
                self._break(error)  # json mode's initializer raised: as in pickle mode
            else:
                future.set_exception(error)
        except cf.InvalidStateError:
            pass  # cancelled from another thread at this very moment

    def _unpickle(self, future: _JobFuture, payload: object) -> None:
        """The outcome onto the future; nothing unpickling raises leaves this future."""
        try:
            kind, value = outcome(payload)
        except Exception as exc:  # what unpickling raised: this future's, and nothing else's
            future.set_exception(exc)
            return
        except BaseException as exc:  # SystemExit and the like must not end the loop's thread
            import pickle

            error = pickle.UnpicklingError(
                f"unpickling the job's outcome raised {type(exc).__name__}: {exc}"
            )
            error.__cause__ = exc
            future.set_exception(error)
            return
        if kind == "result":
            future.set_result(value)
        elif kind == "error":
            future.set_exception(value)
        else:
            self._break(value)

    def _break(self, cause: BaseException) -> None:
        """The initializer raised: fail every pending future, refuse new ones (the stdlib's way)."""
        reason = (
            f"the executor's initializer raised {type(cause).__name__}: {cause}; no job runs on "
            "this executor any more (as the standard library's BrokenProcessPool): fix the "
            "initializer and make a new executor"
        )
        with self._pending.lock:
            if not self._broken:
                self._broken = reason
            pending = list(self._pending.futures)
        for future in pending:
            error = _broken_pool(reason)
            error.__cause__ = cause
            with contextlib.suppress(cf.InvalidStateError):
                future.set_exception(error)
            job = future.job
            if job is not None and not job.done():
                self._loop.create_task(job.cancel())

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

        With ``cancel_futures``, cancel those not running yet (but for the first ones in line
        for a worker free now, as the standard library runs those of its call queue); with
        ``wait``, return once every future is done. The pool stays open.

        Raises ``RuntimeError`` when asked to wait on the pool's own event loop thread while
        futures are pending (that thread runs the jobs: it would wait for ever); shut down
        from another thread, or with ``wait=False``.
        """
        with self._pending.lock:
            self._shutdown = True
            pending = list(self._pending.futures)
        if cancel_futures:
            if self._on_loop_thread():
                self._cancel_waiting(pending)
            else:
                try:
                    # after the submissions queued on the loop: they reach the pool first
                    done = asyncio.run_coroutine_threadsafe(self._cancel_later(pending), self._loop)
                except RuntimeError:  # the loop is closed: the pool is gone, and every job
                    pass
                else:
                    with contextlib.suppress(cf.CancelledError):
                        done.result()
        if wait:
            left = [future for future in pending if not future.done()]
            if left and self._on_loop_thread():
                raise RuntimeError(
                    "shutdown(wait=True) on the pool's event loop thread would wait for ever "
                    f"({len(left)} futures pending); call it from another thread, or use "
                    "shutdown(wait=False) and await the futures (asyncio.wrap_future)"
                )
            cf.wait(left)

    async def _cancel_later(self, pending: list[_JobFuture]) -> None:
        self._cancel_waiting(pending)

    def _cancel_waiting(self, pending: list[_JobFuture]) -> None:
        """On the loop's thread: ``cancel_futures``, as the standard library means it.

        The futures that have not started are cancelled, but for the first ones in line for
        a worker free now (the standard library's call queue holds as many, and runs them).
        """
        free = max(0, self._pool.max_workers - self._pool.running)
        for future in pending:
            if future.done() or future.running():
                continue
            if free > 0:
                free -= 1
                continue
            future.cancel()

    def _on_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False


def _chunks(items: Iterator[tuple[Any, ...]], size: int) -> Iterator[tuple[tuple[Any, ...], ...]]:
    """The argument tuples of ``map`` in chunks of ``size`` (the last one may be shorter)."""
    while chunk := tuple(itertools.islice(items, size)):
        yield chunk


def _broken_pool(reason: str) -> BaseException:
    from concurrent.futures.process import BrokenProcessPool

    return BrokenProcessPool(reason)


async def _cancel(future: _JobFuture) -> None:
    # the job was perhaps not submitted yet (its submit is queued behind this on the loop):
    # then ``_start`` sees the future cancelled and never submits it
    job = future.job
    if job is not None:
        await job.cancel()
