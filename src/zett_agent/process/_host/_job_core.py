"""A job as its pool runs it: its lifecycle, its outcome, its event buffer, its seat in the pool.

``ProcessJob`` is the caller's face of a job; ``JobCore`` is the pool's side of the same job.
The pool makes one per ``submit``, queues and dispatches it, pushes its events and settles
it; ``ProcessJob`` delegates to it. The core asks the pool for what only the pool knows
through its ``JobSeat`` (drop the job from the queue, kill it, its worker's channel), so
neither side touches the other's private state.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .._sandbox._egress import Egress
from ._proxy import EgressLog

if TYPE_CHECKING:
    from .._limits import ProcessLimits
    from .._sandbox._options import Sandbox
    from ._channel import Channel
    from ._proxy import EgressProxy

__all__ = ["JobCore", "JobSeat", "JobStatus"]


class JobStatus(enum.Enum):
    """Lifecycle of a job.

    ``QUEUED -> RUNNING -> COMPLETED | FAILED | CANCELLED``; a queued job can also end directly
    (``CANCELLED``, or ``FAILED`` when no worker could be started). Any other transition is a bug
    and raises ``RuntimeError``.
    """

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


_QUEUED, _RUNNING = JobStatus.QUEUED, JobStatus.RUNNING

_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    # a queued job fails without running only when no worker process can be started
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.RUNNING: frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.COMPLETED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}


class JobSeat(Protocol):
    """What a job may ask of the pool that runs it (the pool owns the job's lifecycle)."""

    def drop_queued(self, core: JobCore) -> None:
        """Take the queued job out of the queue (no-op if it is not there)."""

    def kill(self, core: JobCore, reason: BaseException, grace: float | None) -> None:
        """Kill the job's tree; it settles with ``reason`` once the tree is dead."""

    def channel_of(self, core: JobCore) -> Channel | None:
        """The channel of the running job's worker, or None."""

    def free(self, dropped: tuple[Any] | None) -> None:
        """Free a dropped event's value without stalling the loop."""

    def events_consumed(self, core: JobCore) -> None:
        """The consumer took an event: resume the worker's socket if there is room again."""


class JobCore:
    """The pool's side of one job: lifecycle, outcome, event buffer, tree, message channel."""

    # What most jobs never change is a class attribute, assigned per job only when it changes:
    # a job is made per submit, and each assignment in ``__init__`` is work per job (past about
    # 30 of them, CPython also gives up the compact attribute layout of its instances).

    status = JobStatus.QUEUED
    #: what the worker enforced, as it reported before the job's code ran (``sandbox_report``)
    sandbox_report: dict[str, Any] | None = None
    #: the sandboxed job's scratch directory, removed once its tree is dead
    scratch: str | None = None
    #: the worker's pid while the job runs, else None
    pid: int | None = None
    #: events dropped because nobody iterated ``events()`` and the buffer was full
    dropped_events = 0
    #: whether the job ended
    finished = False
    result: Any = None
    exception: BaseException | None = None
    #: memory counted for the buffered events (an upper bound, see ``_decode``)
    held = 0
    event_waiter: asyncio.Future[None] | None = None
    #: whether ``events()`` has a consumer
    consumer = False
    started_at: float | None = None
    ended_at: float | None = None
    final_cpu = 0.0
    final_peak = 0
    #: set when the pool starts killing the job: the outcome it will end with
    kill_reason: BaseException | None = None
    #: the worker's channel, once something was sent to the running job
    channel: Channel | None = None
    drain_waiter: asyncio.Future[None] | None = None
    #: takes each event before it is buffered; returns True when it consumed it
    event_filter: Callable[[Any, int], bool] | None = None
    #: what an ``Egress`` job's proxy decided (``None``: the job has no Egress)
    egress: EgressLog | None = None
    #: the proxy serving an ``Egress`` job, once its worker handed over its listener
    proxy: EgressProxy | None = None
    #: resolved once no process of the job's tree is left (see ``ProcessJob.wait_gone``)
    gone: asyncio.Future[None] | None = None
    tree_is_gone = False

    def __init__(
        self,
        seat: JobSeat,
        loop: asyncio.AbstractEventLoop,
        payload: bytes,
        limits: ProcessLimits,
        name: str,
        max_buffered_events: int,
        sandbox: Sandbox | None = None,
    ) -> None:
        self.seat = seat
        self.loop = loop
        self.payload: bytes | None = payload
        self.limits = limits
        self.sandbox = sandbox
        #: the job changes its worker for good: the worker runs no other job after it
        #: (``_job.retire_worker``)
        self.retires_worker = False
        if sandbox is not None and isinstance(sandbox.network, Egress):
            self.egress = EgressLog()
        self.name = name
        #: one future per ``await job``/``wait()``/``cancel()`` in progress, resolved by
        #: ``finish``: awaiting it directly costs one event-loop iteration less per job than a
        #: shielded future of the job's own
        self.waiters: list[asyncio.Future[None]] = []
        #: events not yet taken by ``events()``, with the memory each is counted for
        self.events: deque[tuple[Any, int]] = deque()
        self.max_events = max_buffered_events
        #: what ``add_done_callback`` registered, each bound to its ``ProcessJob`` already
        self.callbacks: list[Callable[[], object]] = []

    def __repr__(self) -> str:
        return f"<JobCore {self.name} {self.status.name}>"

    # -- lifecycle --------------------------------------------------------------------------

    def set_status(self, status: JobStatus) -> None:
        """Move to ``status``; ``RuntimeError`` for a transition the lifecycle forbids."""
        # the table by identity: hashing an enum member runs Python code (it is per-job work)
        current = self.status
        if current is _QUEUED:
            legal = status is not _QUEUED
        elif current is _RUNNING:
            legal = status is not _QUEUED and status is not _RUNNING
        else:
            legal = False
        if not legal:
            assert status not in _TRANSITIONS[current]
            raise RuntimeError(f"illegal job transition {self.status.name} -> {status.name}")
        self.status = status

    def begin(self, pid: int) -> bytes:
        """The job starts in worker ``pid``: return its payload (the core lets go of it)."""
        self.set_status(_RUNNING)
        self.pid = pid
        self.started_at = time.monotonic()
        payload = self.payload
        assert payload is not None
        self.payload = None
        return payload

    def finish(
        self,
        status: JobStatus,
        *,
        result: Any = None,
        exception: BaseException | None = None,
        cpu: float | None = None,
        peak_rss: int | None = None,
    ) -> None:
        """Settle the job (no-op if it already ended): wake its waiters, run its callbacks."""
        if self.finished:
            return
        never_ran = self.status is JobStatus.QUEUED
        self.set_status(status)
        self.finished = True
        if never_ran:
            self.tree_gone()
        self.pid = None
        self.payload = None
        self.ended_at = time.monotonic()
        if cpu is not None:
            self.final_cpu = cpu
        if peak_rss is not None:
            self.final_peak = peak_rss
        channel = self.channel
        if channel is not None:
            self.channel = None
            # what was sent to this job and not begun goes nowhere: the next job on this
            # worker must not wait behind it (the worker would discard it anyway)
            channel.drop_messages()
            if channel.on_drain == self.wake_sender:
                channel.on_drain = None
        if self.drain_waiter is not None:
            self.wake_sender()
        if self.event_filter is not None:
            self.event_filter = None
        # (the defaults are None: an assignment of None would only grow the instance)
        if result is not None:
            self.result = result
        if exception is not None:
            self.exception = exception
        waiters = self.waiters
        if waiters:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            waiters.clear()
        if self.event_waiter is not None:
            self.wake_consumer()
        if self.proxy is not None:
            self.proxy.close()  # the job is over: so are its connections
        if self.callbacks:
            for callback in self.callbacks:
                self.loop.call_soon(callback)
            self.callbacks.clear()

    def tree_gone(self) -> None:
        """The pool saw the job's tree end: its worker was buried, or reused clean."""
        self.tree_is_gone = True
        if self.gone is not None and not self.gone.done():
            self.gone.set_result(None)

    # -- messages to the running job --------------------------------------------------------

    def send_channel(self) -> Channel | None:
        """The channel messages go to while the job runs and is not being killed, else None."""
        channel = self.channel
        if channel is None and self.status is _RUNNING and self.kill_reason is None:
            channel = self.seat.channel_of(self)
            if channel is not None:
                self.channel = channel
                channel.on_drain = self.wake_sender
        if (
            channel is None
            or channel.closed
            or self.status is not _RUNNING
            or self.kill_reason is not None
        ):
            return None
        return channel

    def wake_sender(self) -> None:
        """Wake the first waiting sender: the channel took messages, or the job ended."""
        waiter = self.drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- events -----------------------------------------------------------------------------

    def set_event_filter(self, accept: Callable[[Any, int], bool] | None) -> None:
        """Let ``accept(value, cost)`` take events before they are buffered (cleared at the end)."""
        self.event_filter = accept

    def push_event(self, value: Any, cost: int) -> None:
        """Store an event; without a consumer, drop the oldest beyond ``max_buffered_events``."""
        accept = self.event_filter
        if accept is not None and accept(value, cost):
            return
        self.events.append((value, cost))
        self.held += cost
        if len(self.events) > self.max_events and not self.consumer:
            self.seat.free(self.drop_oldest())
        self.wake_consumer()

    def drop_oldest(self) -> tuple[Any] | None:
        """Forget the oldest buffered event (nobody reads them).

        Return it in a 1-tuple for the caller to free, or ``None`` if there is none.
        """
        if not self.events:
            return None
        value, cost = self.events.popleft()
        self.held -= cost
        self.dropped_events += 1
        return (value,)

    @property
    def events_full(self) -> bool:
        """Whether ``max_buffered_events`` are waiting for the consumer."""
        return len(self.events) >= self.max_events

    def take_event(self) -> Any:
        """Hand the oldest buffered event to the consumer (there must be one)."""
        value, cost = self.events.popleft()
        self.held -= cost
        self.seat.events_consumed(self)
        return value

    def wake_consumer(self) -> None:
        """Wake the consumer waiting in ``events()``."""
        waiter = self.event_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
