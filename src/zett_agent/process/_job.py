"""``ProcessJob``: the handle of one submitted job, its lifecycle and its event stream."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# Imported here, not on first use: a first import inside usage() stalls the host's event loop
# for tens of milliseconds (more when children keep the CPUs busy).
import psutil

from ._errors import JobCancelled
from ._limits import ProcessLimits
from ._protocol import FLAG_MESSAGE, HEADER

if TYPE_CHECKING:
    from ._channel import Channel
    from ._pool import ProcessPool
    from ._sandbox import Sandbox

__all__ = ["SEND_BUFFER_BYTES", "JobStatus", "JobUsage", "ProcessJob"]

#: Bytes of messages (``ProcessJob.send``) the host holds per job that the worker's socket has
#: not taken yet; a sender waits while one more would exceed it, and no message may be larger.
SEND_BUFFER_BYTES = 4 * 1024 * 1024


class JobStatus(enum.Enum):
    """Lifecycle of a job. ``QUEUED -> RUNNING -> COMPLETED | FAILED | CANCELLED``; a queued
    job can also end directly (``CANCELLED``, or ``FAILED`` when no worker could be started).
    Any other transition is a bug and raises ``RuntimeError``."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    # a queued job fails without running only when no worker process can be started
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.RUNNING: frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.COMPLETED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}


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

    def __init__(
        self,
        pool: ProcessPool,
        loop: asyncio.AbstractEventLoop,
        payload: bytes,
        limits: ProcessLimits,
        name: str,
        max_buffered_events: int,
        sandbox: Sandbox | None = None,
    ) -> None:
        self._pool = pool
        self._loop = loop
        self._payload: bytes | None = payload
        self.limits = limits
        #: the ``Sandbox`` the job was submitted with (None: not sandboxed)
        self.sandbox = sandbox
        #: what the worker enforced, as it reported before the job's code ran (None until
        #: then, and for a job without a sandbox): ``landlock_abi``, ``filesystem``, ``tcp``,
        #: ``scoped``, ``seccomp``, ``network``, ``user``, ``gid``, ``account``, ``scratch``,
        #: ``missing`` (what could not be enforced, and why), ``seconds`` (what confining took),
        #: ``absent`` (``read``/``write`` paths that did not exist) and, when the job did not
        #: run, ``refused``
        self.sandbox_report: dict[str, Any] | None = None
        self._scratch: str | None = None
        self.name = name
        self.status = JobStatus.QUEUED
        #: the worker's pid while the job runs, else None
        self.pid: int | None = None
        #: events dropped because nobody iterated ``events()`` and the buffer was full
        self.dropped_events = 0
        self._done: asyncio.Future[None] = loop.create_future()
        #: one future per ``await job``/``wait()`` in progress, resolved by ``_finish``: awaiting
        #: it directly costs one event-loop iteration less per job than ``shield(self._done)``
        self._waiters: list[asyncio.Future[None]] = []
        self._result: Any = None
        self._exception: BaseException | None = None
        #: events not yet taken by ``events()``, with the memory each is counted for
        self._events: deque[tuple[Any, int]] = deque()
        #: memory counted for the buffered events (an upper bound, see ``_decode``)
        self._held = 0
        self._max_events = max_buffered_events
        self._event_waiter: asyncio.Future[None] | None = None
        self._consumer = False
        self._started_at: float | None = None
        self._ended_at: float | None = None
        self._final_cpu = 0.0
        self._final_peak = 0
        self._peak_seen = 0
        self._callbacks: list[Callable[[ProcessJob], object]] = []
        #: set when the pool starts killing the job: the outcome it will end with
        self._kill_reason: BaseException | None = None
        #: the worker's channel, once something was sent to the running job
        self._channel: Channel | None = None
        self._max_send = SEND_BUFFER_BYTES
        #: senders in ``send`` that wait for room (newcomers queue behind them)
        self._senders = 0
        self._send_lock: asyncio.Lock | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        #: takes each event before it is buffered; returns True when it consumed it
        self._event_filter: Callable[[Any, int], bool] | None = None

    def __repr__(self) -> str:
        pid = f" pid={self.pid}" if self.pid is not None else ""
        return f"<ProcessJob {self.name} {self.status.name}{pid}>"

    # -- state ------------------------------------------------------------------------------

    def _set_status(self, status: JobStatus) -> None:
        # the table by identity: hashing an enum member runs Python code (it is per-job work)
        current = self.status
        if current is JobStatus.QUEUED:
            legal = status is not JobStatus.QUEUED
        elif current is JobStatus.RUNNING:
            legal = status is not JobStatus.QUEUED and status is not JobStatus.RUNNING
        else:
            legal = False
        if not legal:
            assert status not in _TRANSITIONS[current]
            raise RuntimeError(f"illegal job transition {self.status.name} -> {status.name}")
        self.status = status

    def _begin(self, pid: int) -> bytes:
        self._set_status(JobStatus.RUNNING)
        self.pid = pid
        self._started_at = time.monotonic()
        payload = self._payload
        assert payload is not None
        self._payload = None
        return payload

    def _finish(
        self,
        status: JobStatus,
        *,
        result: Any = None,
        exception: BaseException | None = None,
        cpu: float | None = None,
        peak_rss: int | None = None,
    ) -> None:
        if self._done.done():
            return
        self._set_status(status)
        self.pid = None
        self._payload = None
        self._ended_at = time.monotonic()
        if cpu is not None:
            self._final_cpu = cpu
        if peak_rss is not None:
            self._final_peak = peak_rss
        channel = self._channel
        if channel is not None:
            self._channel = None
            # what was sent to this job and not begun goes nowhere: the next job on this
            # worker must not wait behind it (the worker would discard it anyway)
            channel.drop_messages()
            if channel.on_drain == self._on_drain:
                channel.on_drain = None
        self._wake_sender()
        self._event_filter = None
        self._result = result
        self._exception = exception
        self._done.set_result(None)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()
        self._wake_consumer()
        for callback in self._callbacks:
            self._loop.call_soon(callback, self)
        self._callbacks.clear()

    def done(self) -> bool:
        """Whether the job ended (completed, failed or cancelled)."""
        return self._done.done()

    def result(self) -> Any:
        """The job's result; raises its error if it failed or was cancelled.

        Raises ``RuntimeError`` if the job has not ended yet.
        """
        if not self._done.done():
            raise RuntimeError(f"{self!r} has not finished yet; await it first")
        if self._exception is not None:
            raise self._exception
        return self._result

    def exception(self) -> BaseException | None:
        """The job's error, ``None`` if it completed. ``RuntimeError`` if not finished."""
        if not self._done.done():
            raise RuntimeError(f"{self!r} has not finished yet; await it first")
        return self._exception

    def add_done_callback(self, callback: Callable[[ProcessJob], object]) -> None:
        """Call ``callback(job)`` soon after the job ends (at once-soon if it already did)."""
        if self._done.done():
            self._loop.call_soon(callback, self)
        else:
            self._callbacks.append(callback)

    # -- waiting ----------------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, Any]:
        return self._result_when_done().__await__()

    async def _until_done(self) -> None:
        """Wait for the end of the job; cancelling the waiter does not touch the job."""
        if self._done.done():
            return
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if not waiter.done() or waiter.cancelled():
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    async def _result_when_done(self) -> Any:
        try:
            await self._until_done()
        except asyncio.CancelledError:
            if not self._done.done():
                # like awaiting a Task: the awaiter's cancellation cancels the job; wait for
                # the tree to be gone (under a shield), then let the cancellation propagate
                kill = asyncio.ensure_future(self.cancel())
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(kill)
            raise
        return self.result()

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
        if self._done.done():
            return
        if self.status is JobStatus.QUEUED:
            self._pool._drop_queued(self)
            self._finish(JobStatus.CANCELLED, exception=JobCancelled())
            return
        self._pool._kill_job(self, JobCancelled(), grace)
        await asyncio.shield(self._done)

    # -- messages to the running job --------------------------------------------------------

    async def send(self, value: Any, *, topic: str = "") -> None:
        """Send ``value`` (JSON data) to the running job, which reads it with
        ``zett_agent.process._inbox.receive(topic)`` (or ``receive_blocking``).

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
                    waiter = self._drain_waiter = self._loop.create_future()
                    try:
                        await waiter
                    finally:
                        self._drain_waiter = None
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
        channel = self._channel
        if channel is None and self.status is JobStatus.RUNNING and self._kill_reason is None:
            worker = self._pool._busy.get(self)
            if worker is not None and worker.channel is not None:
                channel = self._channel = worker.channel
                channel.on_drain = self._on_drain
        if (
            channel is None
            or channel.closed
            or self.status is not JobStatus.RUNNING
            or self._kill_reason is not None
        ):
            state = "being stopped" if self._kill_reason is not None else self.status.value
            raise RuntimeError(
                f"cannot send to {self!r}: it is {state}; messages go only to a running job "
                "(check job.status, or wait for job.events() to show it runs)"
            )
        return channel

    def _on_drain(self) -> None:
        self._wake_sender()

    def _wake_sender(self) -> None:
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _set_event_filter(self, accept: Callable[[Any, int], bool] | None) -> None:
        """Let ``accept(value, cost)`` take each event before it is buffered (for the runner
        layer: a broker serving the job's requests). It runs on the event loop for every
        event, must be quick and must not raise; ``True`` means it took the event, which then
        never appears in ``events()`` nor counts against the buffers. Cleared when the job
        ends."""
        self._event_filter = accept

    # -- events -----------------------------------------------------------------------------

    def _push_event(self, value: Any, cost: int) -> None:
        """Store an event; without a consumer, drop the oldest beyond ``max_buffered_events``."""
        accept = self._event_filter
        if accept is not None and accept(value, cost):
            return
        self._events.append((value, cost))
        self._held += cost
        if len(self._events) > self._max_events and not self._consumer:
            self._pool._free(self._drop_oldest())
        self._wake_consumer()

    def _drop_oldest(self) -> tuple[Any] | None:
        """Forget the oldest buffered event (nobody reads them); return it in a 1-tuple for
        the caller to free, or ``None`` if there is none."""
        if not self._events:
            return None
        value, cost = self._events.popleft()
        self._held -= cost
        self.dropped_events += 1
        return (value,)

    @property
    def _events_full(self) -> bool:
        return len(self._events) >= self._max_events

    def _wake_consumer(self) -> None:
        waiter = self._event_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def events(self) -> AsyncIterator[Any]:
        """Iterate over what the child passed to ``emit()``, in order; ends when the job ends.

        One consumer per job (a second call raises ``RuntimeError``). While a consumer exists
        and ``max_buffered_events`` are waiting, the pool stops reading the child's socket, so
        the child's ``emit`` blocks (backpressure); likewise once the events waiting hold more
        than the pool's ``max_buffered_bytes``. Before anyone calls ``events()`` the oldest
        events are dropped beyond either bound (counted in ``dropped_events``), so ``await job``
        alone never deadlocks. The iterator does not raise the job's error; await the job.
        """
        if self._consumer:
            raise RuntimeError(f"events() of {self!r} already has a consumer")
        self._consumer = True
        return _EventStream(self)

    # -- usage ------------------------------------------------------------------------------

    def usage(self) -> JobUsage:
        """Resources of the job: live from ``/proc`` while running, final after it ends.

        Live numbers are the worker process's own (plus the children it has already reaped):
        finding its live descendants would mean scanning all of ``/proc``, which costs the host's
        event loop milliseconds, tens of them on a busy machine. Final numbers are the worker's
        ``getrusage``. ``elapsed`` counts from dispatch to the end (0 while queued).
        """
        started = self._started_at
        if started is None:
            return JobUsage(0.0, 0, 0, 0.0)
        if self._ended_at is not None:
            return JobUsage(self._final_cpu, 0, self._final_peak, self._ended_at - started)
        cpu, rss = 0.0, 0
        pid = self.pid
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
    def __init__(self, job: ProcessJob) -> None:
        self._job = job

    def __aiter__(self) -> _EventStream:
        return self

    async def __anext__(self) -> Any:
        job = self._job
        while True:
            if job._events:
                value, cost = job._events.popleft()
                job._held -= cost
                job._pool._events_consumed(job)
                return value
            if job._done.done():
                raise StopAsyncIteration
            job._event_waiter = job._loop.create_future()
            try:
                await job._event_waiter
            finally:
                job._event_waiter = None
