"""How queued jobs get workers: the pool's running state, dispatch and the spare workers.

``Dispatcher`` holds what a started pool knows (its queue, its idle and busy workers, its
containment and launcher) and moves jobs from the queue onto idle workers, asking the launcher
for the workers that are missing. The kill path (``_reaping``), the workers' messages
(``_answers``) and the launcher's events (``_engine``) build on it, in that order.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import JobTimeout, ProcessError
from .._janitor import Janitor
from .._limits import ProcessLimits
from .._wire._protocol import FLAG_LAST, FLAG_SANDBOX, HEADER
from ._job_core import JobStatus
from ._supervised import Worker, WorkerState

if TYPE_CHECKING:
    from .._containment._strategy import Containment
    from ._channel import Channel
    from ._control import LauncherHandle
    from ._graveyard import Graveyard
    from ._job_core import JobCore
    from ._supervisor import LauncherSupervisor

__all__ = ["_NO_LIMITS", "Dispatcher", "PoolOptions"]

#: the limits of a job submitted without any (compared by identity: nothing to apply)
_NO_LIMITS = ProcessLimits()
#: longest delay of the fork that replaces a spare which just took a job, while another spare
#: is still ready (see ``Dispatcher.top_up``)
_REPLACE_DELAY = 0.005
#: the longest policy part the spares prepare for (the launcher reads a request of 64 KiB at
#: most; a longer one, of a host with a very long ``sys.path``, is built at each job instead)
_MAX_PREPARED = 32768
#: a job frame's length and flag byte (see ``_protocol``)
_JOB_HEADER = struct.Struct(">IB")
assert _JOB_HEADER.size == HEADER.size + 1 and HEADER.format == ">I"
_BUSY = WorkerState.BUSY


@dataclass(frozen=True, slots=True)
class PoolOptions:
    """The options of a ``ProcessPool`` that its engine runs by, checked (see ``ProcessPool``)."""

    max_workers: int
    spare_workers: int
    max_jobs_per_worker: int
    max_frame_bytes: int
    max_buffered_events: int
    max_buffered_bytes: int
    kill_grace: float


class Dispatcher:
    """The running state of one pool, and dispatch: queued jobs onto idle workers."""

    def __init__(self, options: PoolOptions) -> None:
        self.options = options
        self.janitor = Janitor()
        #: set by ``attach`` when the pool starts
        self.loop: asyncio.AbstractEventLoop | None = None
        self.containment: Containment | None = None
        self.supervisor: LauncherSupervisor | None = None
        self.graveyard: Graveyard | None = None
        self.closed = False
        #: why the pool gave up on its launcher (no job can run any more)
        self.broken: str | None = None
        #: the shared part of the latest sandboxed job's policy ("" until a job was sandboxed:
        #: spares started from then on prepare for confining), and the one last sent to the
        #: launcher (sent again only when it changes)
        self.prepare_for = ""
        self.prepare_sent = ""
        #: whether a job was a coroutine function: spares started from then on run an empty
        #: event loop while they wait (see ``_worker.warm_up``)
        self.coroutines = False
        self.queue: deque[JobCore] = deque()
        self.idle: deque[Worker] = deque()
        self.busy: dict[JobCore, Worker] = {}
        self.workers: dict[int, Worker] = {}
        self.spawning = 0
        self.replace_timer: asyncio.TimerHandle | None = None
        #: resolved when the last worker is buried (close() waits on it)
        self.burial_waiter: asyncio.Future[None] | None = None

    @property
    def launcher(self) -> LauncherHandle | None:
        """The current launcher, None before start and while it is replaced."""
        return self.supervisor.current if self.supervisor is not None else None

    # -- what the kill path provides (``_reaping.Reaper``) -------------------------------------

    def end(self, worker: Worker) -> None:
        """The worker runs no more jobs: kill its tree (see ``Reaper.end``)."""
        raise NotImplementedError

    def kill(self, job: JobCore, reason: BaseException, grace: float | None) -> None:
        """Kill the job's tree (see ``Reaper.kill``)."""
        raise NotImplementedError

    # -- the queue ----------------------------------------------------------------------------

    def drop_queued(self, job: JobCore) -> None:
        """Take a queued job out of the queue (``JobSeat``)."""
        with contextlib.suppress(ValueError):
            self.queue.remove(job)

    def channel_of(self, job: JobCore) -> Channel | None:
        """The channel of the running job's worker, or None (``JobSeat``)."""
        worker = self.busy.get(job)
        return worker.channel if worker is not None else None

    # -- dispatch ---------------------------------------------------------------------------

    def dispatch(self, *, replace_now: bool = True) -> None:
        """Start queued jobs on idle workers while fewer than ``max_workers`` run; top up."""
        queue, idle = self.queue, self.idle
        while queue and idle and len(self.busy) < self.options.max_workers:
            job = queue[0]
            if job.sandbox is None or self.options.max_jobs_per_worker == 1:
                worker = idle.popleft()
            else:
                found = self.worker_for(job)
                if found is None:
                    break
                worker = found
            queue.popleft()
            self.run(job, worker)
        self.top_up(replace_now=replace_now)

    def worker_for(self, job: JobCore) -> Worker | None:
        """An idle worker for ``job``.

        A sandboxed job needs one that never ran a job (a job before it could have changed what the
        worker enforces). None when only used ones are idle: one of them is retired, and the fork
        that replaces it brings a fresh one.
        """
        if job.sandbox is None or self.options.max_jobs_per_worker == 1:
            return self.idle.popleft()
        for worker in reversed(self.idle):  # spares are at the right end
            if worker.jobs_done == 0:
                self.idle.remove(worker)
                return worker
        self.end(self.idle[0])
        return None

    def top_up(self, *, replace_now: bool = True) -> None:
        """Ask the launcher for the workers that are missing.

        One per queued job that could start, plus enough to keep ``spare_workers`` ready.

        With ``replace_now=False`` (a job was just dispatched) and another worker still ready,
        the fork that replaces the spare waits until a job ends or ``_REPLACE_DELAY`` passed:
        on a small machine, a fork and the new worker's start compete for the CPU with the job
        that just started, which more than doubled the latency of short jobs. A job that
        arrives meanwhile still finds a ready worker, and once none is left the fork is
        immediate.
        """
        queued = len(self.queue)
        if not queued and len(self.idle) + self.spawning >= self.options.spare_workers:
            return  # the common case, first: nothing to ask for
        demand = min(queued, self.options.max_workers - len(self.busy))
        missing = self.options.spare_workers + demand - len(self.idle) - self.spawning
        if missing <= 0:
            return
        if self.closed or self.broken is not None or self.launcher is None:
            return
        assert self.supervisor is not None
        if not replace_now and demand == 0 and self.idle:
            if self.replace_timer is None:
                assert self.loop is not None
                self.replace_timer = self.loop.call_later(_REPLACE_DELAY, self.replace_due)
            return
        if self.replace_timer is not None:
            self.replace_timer.cancel()
            self.replace_timer = None
        self.spawning += missing
        # once the pool runs sandboxed (coroutine) jobs its spares prepare for confining (for
        # running an event loop): it costs each spare memory of its own, which pools that never
        # sandbox (run coroutines) do not pay
        request: dict[str, Any] = {
            "op": "spawn",
            "n": missing,
            "confine": bool(self.prepare_for),
            "loop": self.coroutines,
        }
        if self.prepare_for != self.prepare_sent and len(self.prepare_for) <= _MAX_PREPARED:
            request["prepare"] = self.prepare_sent = self.prepare_for
        self.supervisor.request(request)

    def replace_due(self) -> None:
        """The delay of a spare's replacement passed (see ``top_up``)."""
        self.replace_timer = None
        self.top_up()

    def run(self, job: JobCore, worker: Worker) -> None:
        """Send ``job`` to the idle ``worker`` (or fail it if its tree limits cannot be set)."""
        assert self.loop is not None and self.containment is not None
        assert worker.channel is not None
        limits = job.limits
        in_child = limits is not _NO_LIMITS and limits.applies_in_child
        if in_child and limits.tree_wide:
            try:
                self.containment.apply(worker.tree, job.limits)
            except OSError as exc:
                self.end(worker)
                error = ProcessError(f"could not set the job's tree-wide limits: {exc}")
                job.finish(JobStatus.FAILED, exception=error)
                return
        payload = job.begin(worker.pid)
        if not self.busy:
            assert self.supervisor is not None
            self.supervisor.watch(self.has_jobs)
        worker.to(_BUSY)
        worker.job = job
        self.busy[job] = worker
        sandboxed = job.sandbox is not None
        last = sandboxed or in_child or worker.jobs_done + 1 >= self.options.max_jobs_per_worker
        worker.last = last
        if sandboxed:
            worker.scratch = job.scratch
            # an Egress job's worker sends its listener with the sandbox report
            worker.channel.expect_fd = job.egress is not None
        flags = (FLAG_LAST if last else 0) | (FLAG_SANDBOX if sandboxed else 0)
        worker.channel.send(_JOB_HEADER.pack(len(payload) + 1, flags) + payload)
        if limits.timeout is not None:
            timer = self.loop.call_later(limits.timeout, self.on_timeout, job)
            worker.set_timer("timeout", timer)

    def has_jobs(self) -> bool:
        """Whether a job runs (the supervisor watches the launcher only then)."""
        return bool(self.busy)

    def on_timeout(self, job: JobCore) -> None:
        """The job ran past ``ProcessLimits.timeout``: kill it."""
        timeout = job.limits.timeout
        assert timeout is not None
        self.kill(job, JobTimeout(timeout), None)
