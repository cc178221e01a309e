"""``ProcessJob``: the caller's handle of one submitted job: its outcome, messages, events.

Its state is a ``JobCore`` (``_job_core``, with its lifecycle ``JobStatus``) that the pool
runs; ``JobStatus`` and ``JobUsage`` are what the handle reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import AsyncIterator, Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# Imported here, not on first use: a first import inside usage() stalls the host's event loop
# for tens of milliseconds (more when children keep the CPUs busy).
import psutil

from .._errors import JobCancelled
from .._wire._protocol import FLAG_MESSAGE, HEADER
from ._job_core import JobCore, JobStatus
from ._proxy import EgressLog

if TYPE_CHECKING:
    from .._limits import ProcessLimits
    from .._sandbox._options import Sandbox
    from ._channel import Channel

__all__ = [
    "SEND_BUFFER_BYTES",
    "JobStatus",
    "JobUsage",
    "ProcessJob",
    "retire_worker",
    "set_event_filter",
]

#: Bytes of messages (``ProcessJob.send``) the host holds per job that the worker's socket has
#: not taken yet; a sender waits while one more would exceed it, and no message may be larger.
SEND_BUFFER_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class JobUsage:
    """Resources used by a job's process tree.

    While the job runs the numbers are read from ``/proc`` on demand (the worker and its
    descendants); once it ended they are the worker's final ``getrusage`` numbers.
    """

    cpu_seconds: float
    rss_bytes: int
    peak_rss_bytes: int
    elapsed: float


class ProcessJob:
    """One job submitted to a ``ProcessPool``. Create it with ``ProcessPool.submit``.

    ``await job`` returns the job's result or raises its error (``JobFailed``,
    ``WorkerCrashed``, ``JobTimeout``, ``LimitExceeded``, ``ProtocolError``, ``PoolClosed``,
    ``JobCancelled``). Cancelling the task that awaits the job cancels the job too (its process
    tree is killed) like awaiting an ``asyncio.Task``; use ``wait()`` to wait without that.
    """

    # The job's state is its core's (``_job_core``), which the pool runs; this is the caller's
    # face of it. What most jobs never change is a class attribute (see ``JobCore``).

    _max_send = SEND_BUFFER_BYTES
    #: senders in ``send`` that wait for room (newcomers queue behind them)
    _senders = 0
    _send_lock: asyncio.Lock | None = None
    #: the highest RSS ``usage()`` saw while the job ran
    _peak_seen = 0

    def __init__(self, core: JobCore) -> None:
        self._core = core

    def __repr__(self) -> str:
        core = self._core
        pid = f" pid={core.pid}" if core.pid is not None else ""
        return f"<ProcessJob {core.name} {core.status.name}{pid}>"

    # -- state ------------------------------------------------------------------------------

    @property
    def status(self) -> JobStatus:
        """Where the job is in its lifecycle (``JobStatus``)."""
        return self._core.status

    @property
    def name(self) -> str:
        """``#<n> <function's qualified name>``: the job's number in its pool, and what it runs."""
        return self._core.name

    @property
    def limits(self) -> ProcessLimits:
        """The ``ProcessLimits`` the job was submitted with."""
        return self._core.limits

    @property
    def sandbox(self) -> Sandbox | None:
        """The ``Sandbox`` the job was submitted with (None: not sandboxed)."""
        return self._core.sandbox

    @property
    def sandbox_report(self) -> dict[str, Any] | None:
        """What the worker enforced, as it reported before the job's code ran.

        None until then, and for a job without a sandbox: ``landlock_abi``, ``filesystem``,
        ``tcp``, ``scoped``, ``seccomp``, ``network``, ``user``, ``gid``, ``account``,
        ``scratch``, ``missing`` (what could not be enforced, and why), ``seconds`` (what
        confining took), ``absent`` (``read``/``write`` paths that did not exist) and, when
        the job did not run, ``refused``.
        """
        return self._core.sandbox_report

    @property
    def egress(self) -> EgressLog | None:
        """What the proxy of a job with ``Sandbox(network=Egress(...))`` decided, else None.

        ``counts()`` (``{"allowed", "denied", "bytes"}``), the latest ``decisions`` (each
        ``{"host", "port", "allowed", "reason", "bytes"}``; an allowed connection once more
        when it ends, ``"reason": "closed"``, with its bytes), and ``listeners`` called with
        each one. Made by the host, which the job cannot write to: it is not among the
        job's ``events()``.
        """
        return self._core.egress

    @property
    def pid(self) -> int | None:
        """The worker's pid while the job runs, else None."""
        return self._core.pid

    @property
    def dropped_events(self) -> int:
        """Events dropped because nobody iterated ``events()`` and the buffer was full."""
        return self._core.dropped_events

    def done(self) -> bool:
        """Whether the job ended (completed, failed or cancelled)."""
        return self._core.finished

    def result(self) -> Any:
        """The job's result; raises its error if it failed or was cancelled.

        Raises ``RuntimeError`` if the job has not ended yet.
        """
        core = self._core
        if not core.finished:
            raise RuntimeError(f"{self!r} has not finished yet; await it first")
        if core.exception is not None:
            raise core.exception
        return core.result

    def exception(self) -> BaseException | None:
        """The job's error, ``None`` if it completed. ``RuntimeError`` if not finished."""
        core = self._core
        if not core.finished:
            raise RuntimeError(f"{self!r} has not finished yet; await it first")
        return core.exception

    async def wait_gone(self) -> None:
        """Wait until no process of the job's tree is left; return at once if none is.

        A job's outcome can come a moment before its tree is gone (its worker is killed once
        its answer arrived, and confirmed dead then): this waits for that confirmation. For a
        job that ran, it comes once its worker was buried (its tree confirmed dead) or was
        found clean for its next job; for a job that never ran, with its outcome. Bounded as
        the pool's kill is. A cancelled or killed job is gone by the time it settles.

        Cancellation: cancelling the waiter leaves the job as it is.
        """
        core = self._core
        if core.tree_is_gone:
            return
        if core.gone is None:
            core.gone = core.loop.create_future()
        await asyncio.shield(core.gone)

    def add_done_callback(self, callback: Callable[[ProcessJob], object]) -> None:
        """Call ``callback(job)`` soon after the job ends (at once-soon if it already did)."""
        core = self._core
        if core.finished:
            core.loop.call_soon(callback, self)
        else:
            core.callbacks.append(functools.partial(callback, self))

    # -- waiting ----------------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, Any]:
        # a generator, not a coroutine calling ``_until_done``: two coroutine objects and
        # their frames less per ``await job`` (what ``_until_done`` does, inline)
        core = self._core
        if not core.finished:
            waiter: asyncio.Future[None] = core.loop.create_future()
            core.waiters.append(waiter)
            try:
                yield from waiter
            except asyncio.CancelledError:
                if not core.finished:
                    # like awaiting a Task: the awaiter's cancellation cancels the job; wait
                    # for the tree to be gone (under a shield), then let the cancellation
                    # propagate
                    kill = asyncio.ensure_future(self.cancel())
                    with contextlib.suppress(asyncio.CancelledError):
                        yield from asyncio.shield(kill)
                raise
            finally:
                if not waiter.done() or waiter.cancelled():
                    with contextlib.suppress(ValueError):
                        core.waiters.remove(waiter)
        return self.result()

    async def _until_done(self) -> None:
        """Wait for the end of the job; cancelling the waiter does not touch the job."""
        core = self._core
        if core.finished:
            return
        waiter: asyncio.Future[None] = core.loop.create_future()
        core.waiters.append(waiter)
        try:
            await waiter
        finally:
            if not waiter.done() or waiter.cancelled():
                with contextlib.suppress(ValueError):
                    core.waiters.remove(waiter)

    async def wait(self) -> None:
        """Wait until the job ended, without raising its error.

        Cancellation: cancelling the waiter does not cancel the job.
        """
        await self._until_done()

    async def cancel(self, grace: float | None = None) -> None:
        """Cancel the job and return once every process of its tree is gone.

        A queued job is dropped. A running job's tree gets SIGTERM and up to ``grace`` seconds
        to exit (default: the pool's ``kill_grace``), then is frozen and SIGKILLed. The job ends
        as ``CANCELLED`` with ``JobCancelled`` (unless it was already being killed for another
        reason, whose outcome wins). No-op for a finished job.

        Cancellation: if the caller is cancelled while waiting, the kill still completes in the
        background.
        """
        core = self._core
        if core.finished:
            return
        if core.status is JobStatus.QUEUED:
            core.seat.drop_queued(core)
            core.finish(JobStatus.CANCELLED, exception=JobCancelled())
            return
        core.seat.kill(core, JobCancelled(), grace)
        await self._until_done()

    # -- messages to the running job --------------------------------------------------------

    async def send(self, value: Any, *, topic: str = "") -> None:
        """Send a message to the running job.

        Send ``value`` (JSON data) to the running job, which reads it with
        ``zett_agent.process._child._inbox.receive(topic)`` (or ``receive_blocking``).

        Messages arrive in the order they were sent (across topics too); each topic is a
        separate queue in the job. ``send`` returns once the message is queued for the worker's
        socket, not once the job read it: delivery is not confirmed, and a message the job
        never reads is discarded when it ends. Backpressure: while the messages queued for
        this job and not yet taken by the socket would exceed ``SEND_BUFFER_BYTES`` (4 MiB)
        with this one (the job does not read, and its socket buffer is full), ``send`` waits;
        senders that wait are served in order. The host never holds more than that per job.

        Raises:
            TypeError: ``value`` is not JSON data (an object, a set; tuples become lists,
                non-``str`` keys are converted as ``json.dumps`` does), or ``topic`` is not a
                ``str``.
            ValueError: ``value`` encodes to more than ``SEND_BUFFER_BYTES``, or holds NaN or
                an infinity, or a cycle.
            RuntimeError: the job is not running: queued, finished, or being killed (also
                when that happens while ``send`` waits).

        Cancellation: a message whose ``send`` is cancelled while waiting is not sent.
        """
        frame = self._message_frame(value, topic)
        channel = self._sendable()
        if not self._senders and channel.message_bytes + len(frame) <= self._max_send:
            channel.send_message(frame)
            return
        if self._send_lock is None:
            self._send_lock = asyncio.Lock()
        self._senders += 1
        try:
            async with self._send_lock:
                while True:
                    channel = self._sendable()
                    if channel.message_bytes + len(frame) <= self._max_send:
                        break
                    core = self._core
                    waiter = core.drain_waiter = core.loop.create_future()
                    try:
                        await waiter
                    finally:
                        core.drain_waiter = None
                channel.send_message(frame)
        finally:
            self._senders -= 1

    def _message_frame(self, value: Any, topic: str) -> bytes:
        if not isinstance(topic, str):
            raise TypeError(f"send(topic=...) must be a str, got {type(topic).__name__}")
        try:
            text = json.dumps(
                {"t": topic, "v": value}, ensure_ascii=False, separators=(",", ":"), allow_nan=False
            )
        except TypeError as exc:
            raise TypeError(
                f"send() takes JSON data (dicts, lists, str, int, float, bool, None): {exc}"
            ) from None
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"send() cannot encode the value as JSON: {exc}") from None
        body = text.encode()
        if len(body) + 1 > self._max_send:
            raise ValueError(
                f"a message of {len(body) + 1} bytes is larger than the {self._max_send} "
                "bytes a job's messages may hold at once; send it in parts"
            )
        return b"".join((HEADER.pack(len(body) + 1), bytes((FLAG_MESSAGE,)), body))

    def _sendable(self) -> Channel:
        """The running job's channel; ``RuntimeError`` when messages cannot go to the job."""
        core = self._core
        channel = core.send_channel()
        if channel is None:
            state = "being stopped" if core.kill_reason is not None else core.status.value
            raise RuntimeError(
                f"cannot send to {self!r}: it is {state}; messages go only to a running job "
                "(check job.status, or wait for job.events() to show it runs)"
            )
        return channel

    # -- events -----------------------------------------------------------------------------

    def events(self) -> AsyncIterator[Any]:
        """Iterate over what the child passed to ``emit()``, in order; ends when the job ends.

        One consumer per job (a second call raises ``RuntimeError``). While a consumer exists
        and ``max_buffered_events`` are waiting, the pool stops reading the child's socket, so
        the child's ``emit`` blocks (backpressure); likewise once the events waiting hold more
        than the pool's ``max_buffered_bytes``. Before anyone calls ``events()`` the oldest
        events are dropped beyond either bound (counted in ``dropped_events``), so ``await job``
        alone never deadlocks. The iterator does not raise the job's error; await the job.
        """
        core = self._core
        if core.consumer:
            raise RuntimeError(f"events() of {self!r} already has a consumer")
        core.consumer = True
        return _EventStream(core)

    # -- usage ------------------------------------------------------------------------------

    def usage(self) -> JobUsage:
        """Resources of the job: live from ``/proc`` while running, final after it ends.

        Live numbers are the worker process's own (plus the children it has already reaped):
        finding its live descendants would mean scanning all of ``/proc``, which costs the host's
        event loop milliseconds, tens of them on a busy machine. Final numbers are the worker's
        ``getrusage``. ``elapsed`` counts from dispatch to the end (0 while queued).
        """
        core = self._core
        started = core.started_at
        if started is None:
            return JobUsage(0.0, 0, 0, 0.0)
        if core.ended_at is not None:
            return JobUsage(core.final_cpu, 0, core.final_peak, core.ended_at - started)
        cpu, rss = 0.0, 0
        pid = core.pid
        if pid is not None:
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    times = proc.cpu_times()
                    rss = proc.memory_info().rss
                cpu = times.user + times.system + times.children_user + times.children_system
            except psutil.Error:
                pass  # it just ended; the final numbers arrive with its exit report
        self._peak_seen = max(self._peak_seen, rss)
        return JobUsage(cpu, rss, self._peak_seen, time.monotonic() - started)


class _EventStream:
    def __init__(self, core: JobCore) -> None:
        self._core = core

    def __aiter__(self) -> _EventStream:
        return self

    async def __anext__(self) -> Any:
        core = self._core
        while True:
            if core.events:
                return core.take_event()
            if core.finished:
                raise StopAsyncIteration
            core.event_waiter = core.loop.create_future()
            try:
                await core.event_waiter
            finally:
                core.event_waiter = None


def set_event_filter(job: ProcessJob, accept: Callable[[Any, int], bool] | None) -> None:
    """Let ``accept(value, cost)`` take each of ``job``'s events before it is buffered.

    For the runner layer: a broker serving the job's requests. It runs on the event loop for
    every event, must be quick and must not raise; ``True`` means it took the event, which then
    never appears in ``events()`` nor counts against the buffers. Cleared when the job ends.
    """
    job._core.set_event_filter(accept)


def retire_worker(job: ProcessJob) -> None:
    """Let ``job``'s worker run no other job after it: it is ended once the job has answered.

    For the runner layer: a job that changes its process for good (a brokered child unsets its
    key variables, which a later job in the same worker may need). Call it right after
    ``submit``; the pool decides when the answer arrives, so it holds even for a job already
    dispatched.
    """
    job._core.retires_worker = True
