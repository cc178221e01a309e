"""``ProcessPool``: runs jobs in worker processes, supervised from the asyncio event loop.

Structure: one launcher process per pool (``_launcher``) forks workers ahead of demand and
reports their deaths; the pool talks to it over one control socket, and to each worker over
that worker's own socket. Everything is driven by ``loop.add_reader`` callbacks (no threads,
no polling): the control socket, the launcher's pidfd, and each worker socket.

A job is finished by whichever comes first of: a ``result``/``error`` frame from its worker, or
the launcher's report that the worker died (then, a crash, unless the pool itself was killing
the job, in which case the reason it was killed). The launcher reports a death only after the
worker *and every process of its tree that had to be killed* are reaped, which is what makes
``cancel()`` return only once the tree is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import pickle
import signal
import socket
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle

from ._control import LauncherHandle
from ._errors import (
    JobCancelled,
    JobFailed,
    JobTimeout,
    LimitExceeded,
    PoolClosed,
    ProcessError,
    ProtocolError,
    WorkerCrashed,
)
from ._job import JobStatus, ProcessJob
from ._limits import ProcessLimits
from ._protocol import (
    FLAG_LAST,
    HEADER,
    MAX_FRAME_LIMIT,
    BufferCache,
    FrameDecoder,
    FrameError,
    decode_message,
)

__all__ = ["ProcessPool"]

_NO_LIMITS = ProcessLimits()
#: frames handled per reader callback before yielding to the loop (keeps stalls short)
_FRAMES_PER_CALLBACK = 64
_RECV_SIZE = 1 << 18
#: how long close() waits for the launcher to report every tree dead before SIGKILLing it
_CLOSE_TIMEOUT = 5.0
_START_TIMEOUT = 60.0
#: how long a worker that closed its socket mid-job may take to be reported dead before it is
#: killed as a protocol breaker (a dying worker closes its socket just before the report)
_EOF_GRACE = 1.0
#: longest delay of the fork that replaces a spare which just took a job, while another spare
#: is still ready (see ``_top_up``)
_REPLACE_DELAY = 0.005
#: how long the receive buffer of a large frame is kept for the next one
_BUFFER_KEEP = 2.0


class _WorkerState(enum.Enum):
    IDLE = "idle"  # ready for a job
    BUSY = "busy"  # running a job
    RETIRING = "retiring"  # will run no more jobs; waiting for its death report
    DEAD = "dead"


class _Worker:
    """The host's view of one worker process."""

    def __init__(
        self, pid: int, sock: socket.socket, max_frame_bytes: int, buffers: BufferCache
    ) -> None:
        self.pid = pid
        self.sock = sock
        self.fd = sock.fileno()
        self.decoder = FrameDecoder(max_frame_bytes, buffers)
        self.state = _WorkerState.IDLE
        self.job: ProcessJob | None = None
        self.jobs_done = 0
        self.last_sent = False
        self.reading = False
        self.paused = False
        self.eof = False
        self.pump_scheduled = False
        self.outbox: memoryview | None = None
        self.term_sent = False
        self.kill_sent = False
        self.term_timer: asyncio.TimerHandle | None = None
        self.timeout_timer: asyncio.TimerHandle | None = None
        self.eof_timer: asyncio.TimerHandle | None = None
        #: the launcher's death report; frames still buffered are delivered before burial
        self.exit_report: dict[str, Any] | None = None
        #: (bytes, cpu, peak rss) of an announced raw text result still to come
        self.text_result: tuple[int, float, int] | None = None
        self.sock_closed = False

    def __repr__(self) -> str:
        return f"<worker {self.pid} {self.state.name}>"


def _pickle_by_reference(job: object) -> bytes | None:
    """``job`` pickled by the plain ``pickle`` module, when that is provably what cloudpickle
    would produce; else ``None`` (the caller uses cloudpickle).

    Plain pickle is about 5 times faster than cloudpickle, and for importable module-level
    functions and classes both write the same by-reference pickle. It differs where cloudpickle
    pickles by value: plain pickle refuses lambdas, closures and local classes (the lookup of
    their qualified name fails), and the other cases name their module in the pickle: objects
    of the host's ``__main__`` (a child never imports it) and of modules registered with
    ``cloudpickle.register_pickle_by_value``. A pickle that contains one of those module names
    anywhere (even in a string argument: a false alarm only costs the slow path) is dropped.
    """
    try:
        data = pickle.dumps(job, protocol=cloudpickle.DEFAULT_PROTOCOL)
    except Exception:
        return None
    if b"__main__" in data:
        return None
    for module in cloudpickle.list_registry_pickle_by_value():
        if module.encode() in data:
            return None
    return data


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _describe(obj: object) -> str:
    text = repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."


class ProcessPool:
    """An asyncio-native pool of worker processes with hard kill, limits and streaming.

    ::

        async with ProcessPool(max_workers=4) as pool:
            job = pool.submit(fn, *args, limits=ProcessLimits(timeout=30))
            async for event in job.events():   # what fn passed to emit()
                ...
            result = await job

    - ``max_workers``: jobs running at once (default ``os.cpu_count()``); more queue FIFO.
    - ``spare_workers``: ready workers kept forked ahead of demand (default
      ``min(2, max_workers)``), so dispatching a job is one socket write.
    - ``max_jobs_per_worker``: jobs a worker runs before it is replaced (default 1: a fresh
      process per job). A job with child-side limits always retires its worker.
    - ``max_frame_bytes``: size cap of one event or result from a child; a bigger frame fails
      the job with ``ProtocolError`` and kills its tree.
    - ``max_buffered_events``: per-job event buffer (see ``ProcessJob.events``).
    - ``kill_grace``: default seconds between SIGTERM and SIGKILL when a job is killed.
    - ``preload``: modules imported once in the launcher, so forked workers start warm.

    Processes: one launcher process (a child subreaper) forks the workers and reaps every
    descendant. If this process dies, even by SIGKILL, the launcher kills every worker tree and
    exits. Start the pool from the thread that will keep running for its whole life (the
    launcher's parent-death signal fires when that thread ends).
    """

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        spare_workers: int | None = None,
        max_jobs_per_worker: int = 1,
        max_frame_bytes: int = 64 * 1024 * 1024,
        max_buffered_events: int = 1024,
        kill_grace: float = 0.0,
        preload: Sequence[str] = (),
    ) -> None:
        if max_workers is None:
            max_workers = os.cpu_count() or 1
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        if spare_workers is None:
            spare_workers = min(2, max_workers)
        if spare_workers < 0:
            raise ValueError(f"spare_workers must be >= 0, got {spare_workers}")
        if max_jobs_per_worker < 1:
            raise ValueError(f"max_jobs_per_worker must be >= 1, got {max_jobs_per_worker}")
        if not 16 <= max_frame_bytes <= MAX_FRAME_LIMIT:
            raise ValueError(f"max_frame_bytes must be in [16, {MAX_FRAME_LIMIT}]")
        if max_buffered_events < 1:
            raise ValueError("max_buffered_events must be at least 1")
        if kill_grace < 0:
            raise ValueError("kill_grace must be >= 0")
        self.max_workers = max_workers
        self.spare_workers = spare_workers
        self.max_jobs_per_worker = max_jobs_per_worker
        self.max_frame_bytes = max_frame_bytes
        self.max_buffered_events = max_buffered_events
        self.kill_grace = kill_grace
        self.preload = tuple(preload)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._launcher: LauncherHandle | None = None
        self._started = False
        self._closed = False
        self._broken: str | None = None
        self._hello: asyncio.Future[None] | None = None
        self._launcher_gone: asyncio.Future[None] | None = None
        self._close_task: asyncio.Task[None] | None = None
        self._queue: deque[ProcessJob] = deque()
        self._workers: dict[int, _Worker] = {}
        self._idle: deque[_Worker] = deque()
        self._busy: dict[ProcessJob, _Worker] = {}
        self._spawning = 0
        self._replace_timer: asyncio.TimerHandle | None = None
        #: one reusable receive buffer for large frames, freed after _BUFFER_KEEP idle seconds
        self._buffers = BufferCache()
        self._buffers_timer: asyncio.TimerHandle | None = None
        self._job_counter = 0

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        launcher = self._launcher
        if launcher is None or self._close_task is not None:
            return
        if self._launcher_gone is not None and self._launcher_gone.done():
            return
        _warn(
            f"unclosed {self!r}; use 'async with ProcessPool()' or 'await pool.close()'",
            ResourceWarning,
            source=self,
        )
        # only reachable once the event loop is gone; EOF makes the launcher kill every tree
        with contextlib.suppress(OSError):
            launcher.close()
        for worker in self._workers.values():
            worker.sock.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._started else "new"
        return (
            f"<ProcessPool {state} max_workers={self.max_workers} busy={len(self._busy)} "
            f"queued={len(self._queue)} idle={len(self._idle)}>"
        )

    @property
    def running(self) -> int:
        """Jobs running now (each in its own worker process); at most ``max_workers``."""
        return len(self._busy)

    @property
    def queued(self) -> int:
        """Jobs submitted and waiting for a worker because ``max_workers`` are running."""
        return len(self._queue)

    # -- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> ProcessPool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the launcher process and the spare workers; no-op if already started.

        Raises ``PoolClosed`` after ``close()``, and ``ProcessError`` if the launcher cannot
        start (for example a ``preload`` module fails to import; the message says which).

        Cancellation: the launcher is killed and reaped before the cancellation propagates.

        Blocks the event loop once, for the ``posix_spawn`` of the launcher: about 0.3 ms,
        several ms when the CPUs are busy (the call returns only once the new process has
        exec'd). It cannot move to a helper thread: the launcher's parent-death signal fires
        when the thread that spawned it ends.
        """
        if self._closed:
            raise PoolClosed("start() after close(); create a new ProcessPool")
        if self._started:
            return
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._hello = loop.create_future()
        self._launcher_gone = loop.create_future()
        launcher = LauncherHandle(preload=self.preload, max_frame_bytes=self.max_frame_bytes)
        self._launcher = launcher
        self._started = True
        loop.add_reader(launcher.sock.fileno(), self._on_control)
        loop.add_reader(launcher.pidfd, self._on_launcher_exit)
        try:
            async with asyncio.timeout(_START_TIMEOUT):
                await self._hello
        except BaseException as exc:
            await self.close()
            if isinstance(exc, TimeoutError):
                raise ProcessError(
                    f"the pool's launcher did not start within {_START_TIMEOUT:g} s"
                ) from exc
            raise
        self._top_up()

    async def close(self) -> None:
        """Cancel every job, kill every process tree, reap everything, close every fd.

        Queued jobs end ``CANCELLED`` with ``PoolClosed``; running jobs are killed and end the
        same way once their trees are gone. Idempotent: later calls wait for the first one.
        Bounded: if the launcher does not report within a few seconds it is SIGKILLed.

        Cancellation: the shutdown continues in the background; a later ``close()`` waits
        for it.
        """
        if self._close_task is None:
            if not self._started:
                self._closed = True
                return
            assert self._loop is not None
            self._close_task = self._loop.create_task(self._close())
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        self._closed = True
        for timer in (self._replace_timer, self._buffers_timer):
            if timer is not None:
                timer.cancel()
        self._replace_timer = self._buffers_timer = None
        self._buffers.clear()
        launcher, gone = self._launcher, self._launcher_gone
        assert launcher is not None and gone is not None
        while self._queue:
            job = self._queue.popleft()
            job._finish(
                JobStatus.CANCELLED,
                exception=PoolClosed("the pool was closed before the job started"),
            )
        for job in list(self._busy):
            self._kill_job(job, PoolClosed("the pool was closed while the job ran"), 0.0)
        if not gone.done():
            self._send({"op": "shutdown"})
            try:
                async with asyncio.timeout(_CLOSE_TIMEOUT):
                    await asyncio.shield(gone)
            except TimeoutError:
                launcher.kill()
        await asyncio.shield(gone)

    # -- submitting -------------------------------------------------------------------------

    def submit(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        limits: ProcessLimits | None = None,
        **kwargs: Any,
    ) -> ProcessJob:
        """Queue ``fn(*args, **kwargs)`` to run in a worker process; return its job at once.

        ``fn`` may be sync or async (an async result is run with ``asyncio.run`` in the child),
        and may be a lambda, a closure or come from ``__main__``: it is sent with cloudpickle.
        Its result must be JSON-compatible (a large ``str`` travels as raw UTF-8). Never waits
        for a worker: the job queues if all ``max_workers`` are busy. The job is pickled here,
        synchronously, so huge arguments cost loop time in this call.

        Raises ``TypeError`` naming the value that cannot be pickled (the pool is unaffected),
        ``PoolClosed`` after ``close()`` or once the launcher died, and ``RuntimeError`` before
        ``start()``. Must be called from the event loop thread that started the pool.

        On crash: a job whose worker dies ends with ``WorkerCrashed`` (or ``LimitExceeded`` when
        a limit explains the death); other jobs are not affected.
        """
        if self._closed or self._broken is not None:
            raise PoolClosed(
                self._broken or "submit() after close(); create a new ProcessPool for new jobs"
            )
        if not self._started or self._loop is None:
            raise RuntimeError(
                "ProcessPool.submit() before start(); use 'async with ProcessPool() as pool:' "
                "or 'await pool.start()' first"
            )
        limits = limits or _NO_LIMITS
        payload = self._pickle(fn, args, kwargs, limits)
        self._job_counter += 1
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        job = ProcessJob(
            self,
            self._loop,
            payload,
            limits,
            f"#{self._job_counter} {name}",
            self.max_buffered_events,
        )
        self._queue.append(job)
        self._dispatch(replace_now=False)
        return job

    @staticmethod
    def _pickle(
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        limits: ProcessLimits,
    ) -> bytes:
        spec = limits.child_spec() if limits.applies_in_child else None
        job = (fn, args, kwargs, spec)
        fast = _pickle_by_reference(job)
        if fast is not None:
            return fast
        try:
            return bytes(cloudpickle.dumps(job))
        except Exception as exc:
            culprit = "the job"
            candidates: list[tuple[str, object]] = [("the function", fn)]
            candidates += [(f"argument {i}", arg) for i, arg in enumerate(args)]
            candidates += [(f"keyword argument {key!r}", value) for key, value in kwargs.items()]
            for label, value in candidates:
                try:
                    cloudpickle.dumps(value)
                except Exception:
                    culprit = f"{label} ({_describe(value)})"
                    break
            raise TypeError(
                f"could not pickle {culprit} for the worker process: {exc}. Jobs are sent with "
                "cloudpickle; pass picklable values, or create resources (locks, sockets, "
                "clients) inside the job"
            ) from exc

    def _drop_queued(self, job: ProcessJob) -> None:
        with contextlib.suppress(ValueError):
            self._queue.remove(job)

    # -- scheduling -------------------------------------------------------------------------

    def _dispatch(self, *, replace_now: bool = True) -> None:
        while self._queue and self._idle and len(self._busy) < self.max_workers:
            self._run(self._queue.popleft(), self._idle.popleft())
        self._top_up(replace_now=replace_now)

    def _top_up(self, *, replace_now: bool = True) -> None:
        """Ask the launcher for the workers that are missing: one per queued job that could
        start, plus enough to keep ``spare_workers`` ready.

        With ``replace_now=False`` (a job was just dispatched) and another worker still ready,
        the fork that replaces the spare waits until a job ends or ``_REPLACE_DELAY`` passed:
        on a small machine, a fork and the new worker's start compete for the CPU with the job
        that just started, which more than doubled the latency of short jobs. A job that
        arrives meanwhile still finds a ready worker, and once none is left the fork is
        immediate.
        """
        if self._closed or self._broken is not None or not self._started:
            return
        demand = min(len(self._queue), self.max_workers - len(self._busy))
        missing = self.spare_workers + demand - len(self._idle) - self._spawning
        if missing <= 0:
            return
        if not replace_now and demand == 0 and self._idle:
            if self._replace_timer is None:
                assert self._loop is not None
                self._replace_timer = self._loop.call_later(_REPLACE_DELAY, self._replace_due)
            return
        if self._replace_timer is not None:
            self._replace_timer.cancel()
            self._replace_timer = None
        self._spawning += missing
        self._send({"op": "spawn", "n": missing})

    def _replace_due(self) -> None:
        self._replace_timer = None
        self._top_up()

    def _run(self, job: ProcessJob, worker: _Worker) -> None:
        assert self._loop is not None
        payload = job._begin(worker.pid)
        worker.state = _WorkerState.BUSY
        worker.job = job
        self._busy[job] = worker
        last = job.limits.applies_in_child or worker.jobs_done + 1 >= self.max_jobs_per_worker
        worker.last_sent = last
        data = b"".join(
            (HEADER.pack(len(payload) + 1), bytes((FLAG_LAST if last else 0,)), payload)
        )
        try:
            sent = worker.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            sent = len(data)  # the worker died; its death report will settle the job
        if sent < len(data):
            worker.outbox = memoryview(data)[sent:]
            self._loop.add_writer(worker.fd, self._on_writable, worker)
        if job.limits.timeout is not None:
            worker.timeout_timer = self._loop.call_later(job.limits.timeout, self._on_timeout, job)

    def _on_writable(self, worker: _Worker) -> None:
        assert self._loop is not None
        outbox = worker.outbox
        if outbox is not None:
            try:
                sent = worker.sock.send(outbox)
            except BlockingIOError:
                return
            except OSError:
                sent = len(outbox)
            outbox = outbox[sent:] if sent < len(outbox) else None
            worker.outbox = outbox
        if worker.outbox is None:
            self._loop.remove_writer(worker.fd)

    def _on_timeout(self, job: ProcessJob) -> None:
        timeout = job.limits.timeout
        assert timeout is not None
        self._kill_job(job, JobTimeout(timeout), None)

    # -- killing ----------------------------------------------------------------------------

    def _kill_job(self, job: ProcessJob, reason: BaseException, grace: float | None) -> None:
        if job.done():
            return
        if job.status is JobStatus.QUEUED:
            self._drop_queued(job)
            job._finish(JobStatus.CANCELLED, exception=reason)
            return
        if job._kill_reason is None:
            job._kill_reason = reason
        worker = self._busy.get(job)
        if worker is not None:
            self._kill_worker(worker, self.kill_grace if grace is None else grace)

    def _kill_worker(self, worker: _Worker, grace: float) -> None:
        if worker.state is _WorkerState.DEAD:
            return
        if worker.exit_report is not None:
            self._bury(worker)  # already dead; only its buffered frames were pending
            return
        if worker.kill_sent:
            return
        if grace > 0 and not worker.term_sent:
            assert self._loop is not None
            worker.term_sent = True
            self._send({"op": "term", "pid": worker.pid})
            worker.term_timer = self._loop.call_later(grace, self._kill_worker, worker, 0.0)
            return
        if grace > 0:
            return  # SIGTERM already sent; the pending timer sends the SIGKILL
        worker.kill_sent = True
        if worker.term_timer is not None:
            worker.term_timer.cancel()
        self._send({"op": "kill", "pid": worker.pid})

    # -- control channel --------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        launcher = self._launcher
        if launcher is None or (self._launcher_gone is not None and self._launcher_gone.done()):
            return
        if launcher.send(message):
            assert self._loop is not None
            self._loop.add_writer(launcher.sock.fileno(), self._flush_control)

    def _flush_control(self) -> None:
        launcher = self._launcher
        assert launcher is not None and self._loop is not None
        if not launcher.flush():
            self._loop.remove_writer(launcher.sock.fileno())

    def _on_control(self) -> None:
        launcher = self._launcher
        assert launcher is not None and self._loop is not None
        for _ in range(64):
            try:
                received = launcher.receive()
            except EOFError:
                self._loop.remove_reader(launcher.sock.fileno())
                return
            if received is None:
                return
            self._handle_control(*received)

    def _handle_control(self, message: dict[str, Any], fds: list[int]) -> None:
        op = message.get("op")
        if op == "worker":
            self._spawning = max(0, self._spawning - 1)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=fds[0])
            for fd in fds[1:]:
                os.close(fd)
            worker = _Worker(int(message["pid"]), sock, self.max_frame_bytes, self._buffers)
            sock.setblocking(False)
            self._workers[worker.pid] = worker
            if self._closed or self._broken is not None:
                worker.state = _WorkerState.RETIRING
                return
            self._idle.append(worker)
            self._start_reading(worker)
            self._dispatch()
            return
        for fd in fds:
            os.close(fd)
        if op == "exit":
            self._on_worker_exit(message)
        elif op == "hello":
            hello = self._hello
            if hello is not None and not hello.done():
                if "error" in message:
                    hello.set_exception(
                        ProcessError(
                            f"the pool's launcher failed to start: {message['error']}; check "
                            "the ProcessPool(preload=...) module names"
                        )
                    )
                else:
                    hello.set_result(None)
        elif op == "spawn_failed":
            self._spawning = max(0, self._spawning - 1)
            if self._queue and not self._workers:
                job = self._queue.popleft()
                job._finish(
                    JobStatus.FAILED,
                    exception=ProcessError(
                        f"could not start a worker process ({message.get('error')}); the "
                        "machine is out of processes or memory"
                    ),
                )

    def _on_launcher_exit(self) -> None:
        launcher, loop, gone = self._launcher, self._loop, self._launcher_gone
        assert launcher is not None and loop is not None and gone is not None
        if not launcher.try_reap():
            return
        loop.remove_reader(launcher.pidfd)
        # the launcher may have written its last death reports just before exiting
        while True:
            try:
                received = launcher.receive()
            except EOFError:
                break
            if received is None:
                break
            self._handle_control(*received)
        hello = self._hello
        if hello is not None and not hello.done():
            hello.set_exception(
                ProcessError(
                    f"the pool's launcher process exited during startup (exit status "
                    f"{launcher.returncode}); see its output on stderr"
                )
            )
        if not self._closed:
            self._broken = (
                f"the pool's launcher process died unexpectedly (exit status "
                f"{launcher.returncode}); create a new ProcessPool"
            )
        for worker in list(self._workers.values()):
            self._on_worker_exit(
                {"pid": worker.pid, "code": None, "signal": None, "cpu": 0.0, "maxrss": 0}
            )
        while self._queue:
            self._queue.popleft()._finish(
                JobStatus.CANCELLED, exception=PoolClosed(self._broken or "the pool was closed")
            )
        try:
            loop.remove_reader(launcher.sock.fileno())
            loop.remove_writer(launcher.sock.fileno())
        finally:
            launcher.close()
        if not gone.done():
            gone.set_result(None)

    # -- worker sockets ---------------------------------------------------------------------

    def _start_reading(self, worker: _Worker) -> None:
        if not worker.reading and not worker.sock_closed:
            assert self._loop is not None
            self._loop.add_reader(worker.fd, self._on_readable, worker)
            worker.reading = True

    def _stop_reading(self, worker: _Worker) -> None:
        if worker.reading:
            assert self._loop is not None
            self._loop.remove_reader(worker.fd)
            worker.reading = False

    def _on_readable(self, worker: _Worker) -> None:
        try:
            received = worker.decoder.recv_from(worker.sock, _RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            received = 0
        if not received:
            worker.eof = True
            self._stop_reading(worker)
            if worker.job is not None and not worker.job.done() and worker.exit_report is None:
                # no result can come any more: unless the worker's death is reported
                # meanwhile, it closed its socket and lives on, and the job must not hang
                assert self._loop is not None
                worker.eof_timer = self._loop.call_later(_EOF_GRACE, self._on_eof_grace, worker)
            return
        self._pump(worker)

    def _on_eof_grace(self, worker: _Worker) -> None:
        worker.eof_timer = None
        job = worker.job
        if job is not None and not job.done() and worker.exit_report is None:
            reason = "the child closed its result channel while its job still ran"
            self._kill_job(job, ProtocolError(reason), 0.0)

    def _pump(self, worker: _Worker) -> None:
        worker.pump_scheduled = False
        for _ in range(_FRAMES_PER_CALLBACK):
            if worker.paused or worker.state is _WorkerState.DEAD or worker.kill_sent:
                self._stop_reading(worker)
                return
            try:
                frame = worker.decoder.next_frame()
                if frame is None:
                    if worker.exit_report is not None:
                        self._bury(worker)
                    elif not worker.eof and not worker.reading:
                        self._start_reading(worker)
                    return
                try:
                    self._handle_frame(worker, frame)
                finally:
                    if isinstance(frame, memoryview):
                        self._recycle(worker)
            except FrameError as exc:
                self._protocol_error(worker, str(exc))
                return
        # more frames are buffered: stop reading and continue on the next loop iteration
        self._stop_reading(worker)
        if not worker.pump_scheduled:
            assert self._loop is not None
            worker.pump_scheduled = True
            self._loop.call_soon(self._pump, worker)

    def _recycle(self, worker: _Worker) -> None:
        """Keep the buffer of the large frame just handled for the next one, for a while."""
        worker.decoder.close()
        if self._buffers.kept and self._loop is not None and not self._closed:
            if self._buffers_timer is not None:
                self._buffers_timer.cancel()
            self._buffers_timer = self._loop.call_later(_BUFFER_KEEP, self._release_buffers)

    def _release_buffers(self) -> None:
        self._buffers_timer = None
        self._buffers.clear()

    def _events_consumed(self, job: ProcessJob) -> None:
        worker = self._busy.get(job)
        if worker is None or not worker.paused:
            return
        if len(job._events) <= self.max_buffered_events // 2:
            worker.paused = False
            self._pump(worker)

    def _handle_frame(self, worker: _Worker, frame: bytes | bytearray | memoryview) -> None:
        pending = worker.text_result
        if pending is not None:
            # the raw UTF-8 frame that a {"k": "result", "text": N} frame announced
            worker.text_result = None
            if len(frame) != pending[0]:
                raise FrameError(f"a text result of {len(frame)} bytes, {pending[0]} announced")
            try:
                text = str(frame, "utf-8")
            except UnicodeDecodeError as exc:
                raise FrameError(f"a text result is not valid UTF-8 ({exc})") from None
            self._job_ended(worker, JobStatus.COMPLETED, text, None, pending[1], pending[2])
            return
        message = decode_message(frame)
        job = worker.job
        if job is None:
            raise FrameError(f"a {message['k']!r} frame arrived while the worker had no job")
        kind = message["k"]
        if kind == "event":
            if "v" not in message:
                raise FrameError("an event frame without a value")
            if job._push_event(message["v"]):
                worker.paused = True
            return
        usage = message.get("u")
        if not isinstance(usage, dict):
            raise FrameError(f"a {kind} frame without usage numbers")
        cpu, peak = usage.get("cpu"), usage.get("maxrss")
        if not isinstance(cpu, int | float) or not isinstance(peak, int):
            raise FrameError(f"a {kind} frame with malformed usage numbers")
        if kind == "result":
            size = message.get("text")
            if size is not None:
                if not isinstance(size, int) or size < 0:
                    raise FrameError("a text result frame with a malformed size")
                worker.text_result = (size, float(cpu), peak)
                return
            if "v" not in message:
                raise FrameError("a result frame without a value")
            self._job_ended(worker, JobStatus.COMPLETED, message["v"], None, float(cpu), peak)
            return
        fields = (message.get("type"), message.get("message"), message.get("traceback"))
        if not all(isinstance(field, str) for field in fields):
            raise FrameError("an error frame with malformed fields")
        type_name, text, traceback_text = (str(field) for field in fields)
        error: ProcessError = JobFailed(type_name, text, traceback_text)
        memory = job.limits.memory_bytes
        if type_name == "MemoryError" and memory is not None:
            failed = error
            error = LimitExceeded("memory_bytes", memory, peak)
            error.__cause__ = failed
        self._job_ended(worker, JobStatus.FAILED, None, error, float(cpu), peak)

    def _job_ended(
        self,
        worker: _Worker,
        status: JobStatus,
        result: Any,
        error: BaseException | None,
        cpu: float,
        peak: int,
    ) -> None:
        job = worker.job
        assert job is not None
        if job._kill_reason is not None:
            return  # being killed: it ends with the kill's reason once the tree is gone
        worker.job = None
        self._busy.pop(job, None)
        if worker.timeout_timer or worker.term_timer or worker.eof_timer:
            self._clear_timers(worker)
        job._finish(status, result=result, exception=error, cpu=cpu, peak_rss=peak)
        worker.jobs_done += 1
        if worker.last_sent or self._closed or worker.exit_report is not None:
            worker.state = _WorkerState.RETIRING
        else:
            worker.state = _WorkerState.IDLE
            # a used worker goes first: its jobs left it warm, and spares stay untouched
            self._idle.appendleft(worker)
        self._dispatch()

    def _protocol_error(self, worker: _Worker, reason: str) -> None:
        self._stop_reading(worker)
        job = worker.job
        if job is not None and not job.done():
            self._kill_job(job, ProtocolError(reason), 0.0)
        else:
            if worker in self._idle:
                self._idle.remove(worker)
            worker.state = _WorkerState.RETIRING
            self._kill_worker(worker, 0.0)
            self._top_up()

    @staticmethod
    def _clear_timers(worker: _Worker) -> None:
        for timer in (worker.timeout_timer, worker.term_timer, worker.eof_timer):
            if timer is not None:
                timer.cancel()
        worker.timeout_timer = worker.term_timer = worker.eof_timer = None

    def _on_worker_exit(self, message: dict[str, Any]) -> None:
        """The launcher reports a worker (and every process it had to kill) dead and reaped."""
        worker = self._workers.pop(int(message["pid"]), None)
        if worker is None:
            return
        assert self._loop is not None
        worker.exit_report = message
        # take what is still in the kernel's buffer (bounded by it), then let go of the socket
        while not worker.eof:
            try:
                received = worker.decoder.recv_from(worker.sock, _RECV_SIZE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                received = 0
            if not received:
                break
        worker.eof = True
        self._stop_reading(worker)
        if worker.outbox is not None:
            self._loop.remove_writer(worker.fd)
            worker.outbox = None
        worker.sock.close()
        worker.sock_closed = True
        if worker in self._idle:
            self._idle.remove(worker)
        job = worker.job
        if job is None or job.done() or job._kill_reason is not None:
            self._bury(worker)
        else:
            # a result or events may still be buffered: deliver them at the consumer's pace
            # (backpressure still holds), then bury
            self._pump(worker)

    def _bury(self, worker: _Worker) -> None:
        if worker.state is _WorkerState.DEAD:
            return
        worker.state = _WorkerState.DEAD
        self._clear_timers(worker)
        job = worker.job
        worker.job = None
        if job is not None:
            self._busy.pop(job, None)
            if not job.done():
                assert worker.exit_report is not None
                self._settle_dead(job, worker.exit_report)
        self._dispatch()

    def _settle_dead(self, job: ProcessJob, message: dict[str, Any]) -> None:
        cpu, peak = float(message.get("cpu") or 0.0), int(message.get("maxrss") or 0)
        reason = job._kill_reason
        if reason is not None:
            status = (
                JobStatus.CANCELLED
                if isinstance(reason, JobCancelled | PoolClosed)
                else JobStatus.FAILED
            )
            job._finish(status, exception=reason, cpu=cpu, peak_rss=peak)
            return
        signum = message.get("signal")
        crashed = WorkerCrashed(
            message.get("code"), None if signum is None else _signal_name(int(signum))
        )
        if self._broken is not None:
            crashed.__cause__ = ProcessError(self._broken)
        error: ProcessError = crashed
        limits = job.limits
        if limits.cpu_seconds is not None and (
            signum == signal.SIGXCPU or (signum == signal.SIGKILL and cpu >= limits.cpu_seconds)
        ):
            error = LimitExceeded("cpu_seconds", limits.cpu_seconds, round(cpu, 3))
            error.__cause__ = crashed
        elif limits.memory_bytes is not None and signum in (
            signal.SIGSEGV,
            signal.SIGABRT,
            signal.SIGBUS,
            signal.SIGKILL,
        ):
            error = LimitExceeded("memory_bytes", limits.memory_bytes, peak)
            error.__cause__ = crashed
        job._finish(JobStatus.FAILED, exception=error, cpu=cpu, peak_rss=peak)
