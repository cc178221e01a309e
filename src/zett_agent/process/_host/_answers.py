"""What workers send: new workers arriving, their messages, their answers, their EOF.

The launcher hands over each new worker (its socket and pidfd); from then on every frame of
its socket comes here. An event goes to its job's buffer within the pool's bounds, an answer
settles the job and retires or reuses the worker, and anything out of turn is a protocol error
that kills the job's tree.
"""

from __future__ import annotations

import functools
import os
import socket
from typing import TYPE_CHECKING, Any

from .._errors import ProtocolError
from .._sandbox._egress import Egress
from .._sandbox._options import SandboxUnavailable
from ._channel import Channel
from ._job_core import JobStatus
from ._outcome import failure_error
from ._owned import OwnedSocket
from ._proxy import EgressProxy
from ._reaping import Reaper
from ._supervised import Worker, WorkerState

if TYPE_CHECKING:
    from .._wire._decode import Message
    from ._control import LauncherHandle
    from ._job_core import JobCore

__all__ = ["WorkerEvents"]

#: how long a worker that closed its socket mid-job may live on before it is killed as a
#: protocol breaker (a dying worker closes its socket just before its pidfd reports the death)
_EOF_GRACE = 1.0
#: how long a worker that answered its last job may take to exit on its own before it is
#: killed (under containments where waiting is cheaper than a kill)
_EXIT_GRACE = 0.1
_IDLE = WorkerState.IDLE


class WorkerEvents(Reaper):
    """Dispatch and the kill path, plus what the workers send."""

    def on_worker(self, launcher: LauncherHandle, message: dict[str, Any], fds: list[int]) -> None:
        """The launcher forked a worker: its socket and pidfd are in ``fds``."""
        loop, containment = self.loop, self.containment
        assert loop is not None and containment is not None
        self.spawning = max(0, self.spawning - 1)
        if len(fds) != 2 or launcher is not self.launcher or self.closed:
            for fd in fds:
                os.close(fd)
            return
        sock = OwnedSocket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=fds[0])
        pid = int(message["pid"])
        tree = containment.adopt(pid, fds[1], str(message.get("cg", "")))
        worker = Worker(pid, tree, launcher)
        worker.channel = Channel(
            loop,
            sock,
            self.options.max_frame_bytes,
            functools.partial(self.on_message, worker),  # no lambda: a Python call less
            functools.partial(self.on_frame, worker),
            lambda: self.on_eof(worker),
            lambda reason: self.protocol_error(worker, reason),
            self.graveyard.bury if self.graveyard is not None else lambda value: None,
        )
        self.workers[pid] = worker
        loop.add_reader(tree.pidfd, self.on_worker_exited, worker)
        self.idle.append(worker)
        worker.channel.start()
        self.dispatch()

    def on_message(self, worker: Worker, message: Message) -> None:
        """A whole event, result, error or sandbox report from the worker."""
        job = worker.job
        if job is None or job.finished or job.kill_reason is not None:
            self.protocol_error(worker, f"a {message.kind} arrived while the worker had no job")
            return
        kind = message.kind
        if job.sandbox is not None and job.sandbox_report is None:
            if kind != "sandbox":
                reason = f"a {kind} arrived before the worker reported the job's sandbox"
                self.protocol_error(worker, reason)
                return
            self.on_sandbox_report(worker, job, message.value)
            return
        if kind == "event":
            job.push_event(message.value, message.cost)
            return
        if kind == "sandbox":
            self.protocol_error(worker, "a sandbox report from a running job")
            return
        assert message.usage is not None
        cpu, peak, leaving = message.usage
        if leaving:
            # the worker found what its job left and exits after this answer: however clean
            # it reads while exiting, it must not get another job
            worker.last = True
        if kind == "result":
            self.answered(worker, JobStatus.COMPLETED, message.value, None, cpu, peak)
            return
        assert message.error is not None
        type_name, text, traceback_text = message.error
        error = failure_error(job.limits, type_name, text, traceback_text, peak)
        self.answered(worker, JobStatus.FAILED, None, error, cpu, peak)

    def on_sandbox_report(self, worker: Worker, job: JobCore, report: dict[str, Any]) -> None:
        """The worker confined itself (its job has not run yet).

        Keep what it enforced, or fail the job when the sandbox could not be enforced as required.
        """
        job.sandbox_report = report
        refused = report.get("refused")
        if refused is None:
            if job.egress is not None:
                self.serve_egress(worker, job)
            return
        channel = worker.channel
        if channel is not None and (fd := channel.take_fd()) is not None:
            os.close(fd)
        missing = report.get("missing")
        names = tuple(str(name) for name in missing) if isinstance(missing, dict) else ()
        error = SandboxUnavailable(str(refused), names)
        self.answered(worker, JobStatus.FAILED, None, error, 0.0, 0)

    def serve_egress(self, worker: Worker, job: JobCore) -> None:
        """Start the proxy of an ``Egress`` job on the listener its worker handed over.

        The descriptor must be a listening TCP socket (IPv4 or IPv6); anything else, or none,
        is a protocol error of the worker (whose code, not the job's, sent it).
        """
        assert worker.channel is not None and job.egress is not None and job.sandbox is not None
        fd = worker.channel.take_fd()
        listener = None
        if fd is not None:
            try:
                listener = socket.socket(fileno=fd)
                if (
                    listener.type != socket.SOCK_STREAM
                    or listener.family not in (socket.AF_INET, socket.AF_INET6)
                    or not listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                ):
                    raise OSError("not a listening TCP socket")
            except OSError:
                if listener is not None:
                    listener.close()
                else:
                    os.close(fd)
                listener = None
        if listener is None:
            self.protocol_error(worker, "the worker sent no listening socket for its Egress job")
            return
        egress = job.sandbox.network
        assert isinstance(egress, Egress)
        job.proxy = EgressProxy(egress, job.egress)
        job.proxy.start(listener)

    def on_frame(self, worker: Worker) -> None:
        """After each frame: keep what the job holds within ``max_buffered_bytes``."""
        job, channel = worker.job, worker.channel
        if job is None or channel is None:
            return
        assembling = channel.assembler.held
        budget = self.options.max_buffered_bytes
        if assembling > budget:
            self.protocol_error(
                worker,
                f"one event or result decodes into more than max_buffered_bytes={budget} "
                "bytes; send less data per event or result, or raise "
                "ProcessPool(max_buffered_bytes=...)",
            )
            return
        if job.consumer:
            if job.held + assembling > budget or job.events_full:
                channel.pause()  # resumed by events_consumed
        else:
            while job.held + assembling > budget and (dropped := job.drop_oldest()):
                self.free(dropped)

    def free(self, dropped: tuple[Any] | None) -> None:
        """Free a value the engine gives up on without stalling the loop (``Graveyard``)."""
        if dropped is not None and self.graveyard is not None:
            self.graveyard.bury(dropped[0])

    def events_consumed(self, job: JobCore) -> None:
        """The consumer took an event (``JobSeat``): resume a paused socket at half the bounds."""
        worker = self.busy.get(job)
        if worker is None or worker.channel is None or not worker.channel.paused:
            return
        if (
            len(job.events) <= self.options.max_buffered_events // 2
            and job.held <= self.options.max_buffered_bytes // 2
        ):
            worker.channel.resume()

    def answered(
        self,
        worker: Worker,
        status: JobStatus,
        result: Any,
        error: BaseException | None,
        cpu: float,
        peak: int,
    ) -> None:
        """The job sent its result or error: settle it, then retire or reuse the worker."""
        job = worker.job
        assert job is not None and self.containment is not None
        worker.job = None
        self.busy.pop(job, None)
        worker.cancel_timers()
        job.finish(status, result=result, exception=error, cpu=cpu, peak_rss=peak)
        worker.jobs_done += 1
        reusable = not (
            worker.last
            or job.retires_worker
            or self.closed
            or worker.exited_at is not None
            or worker.orphaned
        )
        if reusable and self.containment.is_clean(worker.tree):
            job.tree_gone()  # its tree is the worker alone, which lives on, clean
            worker.to(_IDLE)
            if self.containment.needs_exit_report:
                # a job may have switched the subreaper flag off and double-forked: such an
                # orphan was reparented to the launcher, which kills it in its sweep
                assert self.supervisor is not None
                self.supervisor.sweep_if_orphans(self.workers.keys())
            # a used worker goes first: its jobs left it warm, and spares stay untouched
            self.idle.appendleft(worker)
            self.dispatch()
            return
        # its tree is gone once the worker is buried (``ProcessJob.wait_gone``)
        worker.answered = job
        if (
            self.containment.lets_workers_exit
            and worker.last
            and worker.exited_at is None
            and not self.closed
        ):
            # it exits on its own right after its last answer (its leftovers are the
            # launcher's to sweep); one that does not within _EXIT_GRACE is killed
            assert self.loop is not None
            worker.to(WorkerState.ENDING)
            worker.set_timer("exit", self.loop.call_later(_EXIT_GRACE, self.end, worker))
        else:
            # nothing it or its job started may outlive the answer
            self.end(worker)
        if self.queue:
            self.dispatch()
        else:
            self.top_up()  # what dispatch does with nothing queued

    def protocol_error(self, worker: Worker, reason: str) -> None:
        """The worker broke the protocol: kill its job, or end it."""
        job = worker.job
        if job is not None and not job.finished:
            self.kill(job, ProtocolError(reason), 0.0)
        elif worker.state is not WorkerState.DEAD:
            self.end(worker)
        self.top_up()

    def on_eof(self, worker: Worker) -> None:
        """The worker closed its socket."""
        if worker.state is WorkerState.ENDING:
            self.check_gone(worker)
            return
        job = worker.job
        if job is not None and not job.finished and worker.exited_at is None:
            # no answer can come any more: unless the worker's death shows meanwhile, it
            # closed its socket and lives on, and the job must not hang
            assert self.loop is not None
            worker.set_timer("eof", self.loop.call_later(_EOF_GRACE, self.on_eof_grace, worker))
        elif worker.state is WorkerState.IDLE:
            self.end(worker)
            self.top_up()

    def on_eof_grace(self, worker: Worker) -> None:
        """The worker closed its socket mid-job and lives on: kill its job."""
        job = worker.job
        if job is not None and not job.finished and worker.exited_at is None:
            reason = "the child closed its result channel while its job still ran"
            self.kill(job, ProtocolError(reason), 0.0)
