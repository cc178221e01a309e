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
import itertools
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

import cloudpickle

from ..._checks import check_choice
from .._pickled_call import CALL_PROTOCOL
from ._executor import RESULTS, PoolExecutor
from ._pool import ProcessPool

__all__ = ["ProcessPoolExecutor", "close_all"]

#: the default of ``max_frame_bytes`` and ``max_buffered_bytes`` in pickle mode
_PICKLED_BUDGET = 1 << 30
#: one token per executor with an initializer: a worker runs the initializer of its token once
_TOKENS = itertools.count(1)
#: set once the interpreter began to exit (the standard library's ``_global_shutdown``)
_EXITING = threading.Event()


def _pickle_init(initializer: Callable[..., object], initargs: tuple[Any, ...]) -> bytes:
    """``(initializer, initargs)`` pickled once, sent with each job (a worker runs it once)."""
    return bytes(cloudpickle.dumps((initializer, tuple(initargs)), protocol=CALL_PROTOCOL))


class ProcessPoolExecutor(PoolExecutor):
    """A drop-in for the standard library's ``ProcessPoolExecutor``.

    A ``concurrent.futures.Executor`` with a ``ProcessPool`` of its own, for programs
    without an event loop. Its arguments mean what the standard library's mean:

    - ``max_workers``: processes running jobs at once (default ``os.cpu_count()``);
    - ``mp_context``: a ``multiprocessing`` context, accepted whatever its start method: the
      engine starts its workers its own way, forked from a small launcher process that never
      imported the host's ``__main__`` (so, as under ``spawn`` and ``forkserver``, a worker
      inherits nothing the host built at run time); ``TypeError`` for anything but a context;
    - ``initializer(*initargs)``: runs in each worker before its first job; one that raises
      breaks the executor (every pending future fails with ``BrokenProcessPool``, and so does
      ``submit``), as the standard library's;
    - ``max_tasks_per_child``: jobs a worker runs before a fresh one replaces it (default
      ``None``: no limit, workers are reused; a job that leaves a thread or a process behind
      retires its worker all the same).

    Its own keywords: ``results`` (``"pickle"``, the default: results and exceptions as the
    standard library returns them; ``"json"``: as ``ProcessPool.submit``, for jobs the host
    does not trust, see docs/executor.md) and ``ProcessPool``'s options (``containment``,
    ``preload``, ``max_jobs_per_worker`` instead of ``max_tasks_per_child``, ...). In pickle
    mode ``max_frame_bytes`` and ``max_buffered_bytes``, the largest result a job may return,
    default to 1 GiB (``ProcessPool``'s defaults are for untrusted children); a bigger one
    fails its own future with ``ProtocolError`` or ``JobFailed``, naming the budget.

    The pool runs on a private event loop thread, started here; ``shutdown()`` closes it
    (after the futures are done, with ``wait=True``; in the background otherwise, once they
    are). A program that exits without ``shutdown()`` finishes what it submitted first, as with
    the standard library: at interpreter exit (before the thread pools stop) the executor waits
    for its running and queued jobs, then closes its pool, quietly; a ``submit`` from then on
    raises ``RuntimeError``.

    Raises ``ValueError`` for ``max_workers`` below 1 and ``max_tasks_per_child`` below 1,
    ``TypeError`` and ``ValueError`` for other bad options (as ``ProcessPool``), what pickling
    raises for an ``initializer`` or ``initargs`` that cannot be pickled, and
    ``zett_agent.process.ProcessError`` when the pool cannot start here.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        mp_context: Any = None,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
        *,
        max_tasks_per_child: int | None = None,
        results: Literal["pickle", "json"] = "pickle",
        **pool_options: Any,
    ) -> None:
        results = check_choice("ProcessPoolExecutor(results=...)", results, RESULTS)  # type: ignore[assignment]
        if type(max_workers) is int and max_workers <= 0:  # the standard library's words
            raise ValueError("max_workers must be greater than 0")
        if mp_context is None:
            import multiprocessing

            mp_context = multiprocessing.get_context()
        else:
            from multiprocessing.context import BaseContext

            if not isinstance(mp_context, BaseContext):
                raise TypeError(
                    "ProcessPoolExecutor(mp_context=...) takes a multiprocessing context "
                    f"(multiprocessing.get_context(...)), got {type(mp_context).__name__}"
                )
        #: the context given (its start method is not the engine's: see the class docstring)
        self._mp_context = mp_context
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if max_tasks_per_child is not None:
            if not isinstance(max_tasks_per_child, int) or isinstance(max_tasks_per_child, bool):
                raise TypeError("max_tasks_per_child must be an integer")
            if max_tasks_per_child <= 0:
                raise ValueError("max_tasks_per_child must be >= 1")
            if "max_jobs_per_worker" in pool_options:
                raise TypeError(
                    "ProcessPoolExecutor() takes max_tasks_per_child or max_jobs_per_worker "
                    "(the same limit), not both"
                )
            pool_options["max_jobs_per_worker"] = max_tasks_per_child
        pool_options.setdefault("max_jobs_per_worker", sys.maxsize)
        if results == "pickle":
            pool_options.setdefault("max_frame_bytes", _PICKLED_BUDGET)
            pool_options.setdefault("max_buffered_bytes", _PICKLED_BUDGET)
        init = None
        if initializer is not None:
            init = (next(_TOKENS), _pickle_init(initializer, initargs))
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
        # the host's multiprocessing authkey goes with each job: the pool is this executor's
        # alone, so no other job's worker ever holds it
        super().__init__(pool, loop, results=results, init=init, authkey=True)
        self._own_pool = pool
        #: the standard library's name for it (read by programs written for it)
        self._max_workers = pool.max_workers
        with _LIVE_LOCK:
            _LIVE.add(self)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        """As ``PoolExecutor.submit``; also ``RuntimeError`` once the interpreter is exiting."""
        if _EXITING.is_set():
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        return super().submit(fn, *args, **kwargs)

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


def close_all() -> None:
    """Shut down every executor left open, as ``wait=True`` (the exit hook; tests call it too)."""
    while True:
        with _LIVE_LOCK:
            if not _LIVE:
                return
            executor = _LIVE.pop()
        executor.shutdown(wait=True)


def _at_exit() -> None:
    """At interpreter exit: shut down every executor the program left open, as ``wait=True``.

    What the standard library's ``ProcessPoolExecutor`` does: the jobs submitted (running or
    queued) finish, then the pool closes. It runs among ``threading``'s exit hooks, before the
    non-daemon threads are joined and before the ``atexit`` callbacks; the hooks run last
    registered first, and ``concurrent.futures.thread``'s (which stops every thread pool, the
    event loops' default executors and the engine's cleanup threads among them) was registered
    when this module imported it, before ours: the thread pools still work while ours runs.
    """
    _EXITING.set()
    close_all()


# ``threading._register_atexit`` is CPython's (the stdlib's executors use it); elsewhere, atexit
getattr(threading, "_register_atexit", atexit.register)(_at_exit)
