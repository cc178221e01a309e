"""The kill path: ending workers, confirming their trees dead, burying them.

A job is killed by the host (``Containment.kill``), never by asking its worker, and settles
only once its whole tree is confirmed dead; a worker is buried once its tree is dead and what
was awaited from it (its exit report, its last frames) arrived. A job whose worker is buried
before it answered ends as ``_outcome.death_outcome`` says.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import TYPE_CHECKING

from .._sandbox import _scratch
from ._dispatch import Dispatcher
from ._job_core import JobStatus
from ._outcome import death_outcome
from ._supervised import Worker, WorkerState

if TYPE_CHECKING:
    from ._job_core import JobCore

__all__ = ["Reaper"]


class Reaper(Dispatcher):
    """Dispatch, plus the kill path: kill jobs, end workers, bury them."""

    def kill(self, job: JobCore, reason: BaseException, grace: float | None) -> None:
        """Kill the job (``JobSeat``): a queued one ends now, a running one once its tree is dead.

        ``reason`` is what it ends with (unless another kill came first). A running job's tree
        gets SIGTERM and ``grace`` seconds (default ``kill_grace``) before the kill.
        """
        if job.finished:
            return
        if job.status is JobStatus.QUEUED:
            self.drop_queued(job)
            job.finish(JobStatus.CANCELLED, exception=reason)
            return
        if job.kill_reason is None:
            job.kill_reason = reason
        worker = self.busy.get(job)
        if worker is None:
            return
        grace = self.options.kill_grace if grace is None else grace
        if grace > 0 and worker.state is WorkerState.BUSY:
            assert self.loop is not None and self.containment is not None
            worker.cancel_timer("timeout")
            self.containment.terminate(worker.tree)
            worker.set_timer("term", self.loop.call_later(grace, self.end, worker))
            # answers that arrive meanwhile are ignored: the kill's reason wins
            if worker.channel is not None:
                worker.channel.close()
            return
        self.end(worker)

    def end(self, worker: Worker) -> None:
        """The worker runs no more jobs: kill its tree; it is buried once that is confirmed."""
        self.end_all([worker])

    def end_all(self, workers: list[Worker]) -> None:
        """End each worker (as ``end``), killing their trees in one go."""
        containment = self.containment
        assert containment is not None
        ending = []
        seen_dead = []
        for worker in workers:
            if worker.state is WorkerState.DEAD:
                continue
            if worker.state is not WorkerState.ENDING:
                if worker in self.idle:
                    self.idle.remove(worker)
                worker.to(WorkerState.ENDING)
            worker.cancel_timer("timeout")
            worker.cancel_timer("term")
            worker.cancel_timer("exit")
            job = worker.job
            # a killed job's later frames do not matter; a crashed one's may hold its answer
            if worker.channel is not None and (job is None or job.kill_reason is not None):
                worker.channel.close()
            if not worker.tree.killing:
                worker.tree.callbacks.append(functools.partial(self.check_gone, worker))
                ending.append(worker)
            elif worker.tree.dead:
                # its death was confirmed while it waited for what it had left to say (its
                # last frames): ended now, it is buried without another word from its tree
                seen_dead.append(worker)
        if ending:
            containment.kill(worker.tree for worker in ending)
        for worker in seen_dead:
            self.check_gone(worker)

    def on_worker_exited(self, worker: Worker) -> None:
        """The worker's pidfd is readable: its process exited (not necessarily its tree)."""
        loop = self.loop
        assert loop is not None
        loop.remove_reader(worker.tree.pidfd)
        worker.exited_at = time.monotonic()
        worker.tree.exited = True
        if worker.report is None and not worker.orphaned and self.supervisor is not None:
            # its parent reaps it and reports (unless that report came first: the control
            # socket and the pidfd are read in any order): a launcher that does not is found out
            self.supervisor.owe_report(worker.launcher, worker.pid, worker.exited_at)
        if worker.state is WorkerState.DEAD:
            return
        assert self.containment is not None
        self.containment.recheck(worker.tree)
        self.end(worker)
        self.top_up()

    def check_gone(self, worker: Worker) -> None:
        """Bury the worker once its tree is dead and nothing more is awaited from it."""
        if worker.state is not WorkerState.ENDING or not worker.tree.dead:
            return
        containment = self.containment
        assert containment is not None
        job = worker.job
        crashed = job is not None and not job.finished and job.kill_reason is None
        report_due = worker.report is None and not worker.orphaned
        if report_due and (crashed or containment.needs_exit_report):
            if worker.exited_at is None:
                # the tree is dead, so the worker is too: its pidfd will say so shortly
                return
            return
        channel = worker.channel
        if crashed and channel is not None and not channel.closed and not channel.drained:
            # its last frames (perhaps its answer) are still to be read, at the consumer's
            # pace: the end of the stream is near, since the tree is dead
            return
        self.bury(worker)

    def bury(self, worker: Worker, *, force: bool = False) -> None:
        """Forget a dead worker: settle its job, remove its scratch, dispatch the queue.

        ``force`` buries one that is not ending (at close, once waiting for it timed out).
        """
        if worker.state is WorkerState.DEAD:
            return
        if worker.state is not WorkerState.ENDING:
            if not force:
                raise RuntimeError(f"{worker!r} buried while not ending")
            worker.state = WorkerState.ENDING
        worker.to(WorkerState.DEAD)
        worker.cancel_timers()
        loop, containment = self.loop, self.containment
        assert loop is not None and containment is not None
        if worker.exited_at is None:
            loop.remove_reader(worker.tree.pidfd)
            if worker.report is None and not worker.orphaned and self.supervisor is not None:
                # its tree was seen dead before its pidfd said so: its report is owed all the
                # same (a launcher that never sends it is found out)
                self.supervisor.owe_report(worker.launcher, worker.pid, time.monotonic())
        if worker.channel is not None:
            worker.channel.close()
        containment.forget(worker.tree)
        if worker.scratch is not None:
            # its tree is dead: nothing writes there any more (its size is the job's choice)
            self.janitor.defer(_scratch.remove_tree, worker.scratch, self.janitor.stopping.is_set)
            worker.scratch = None
        self.workers.pop(worker.pid, None)
        job = worker.job
        worker.job = None
        if job is not None:
            self.busy.pop(job, None)
            if not job.finished:
                self.settle_dead(job, worker)
            job.tree_gone()
        if worker.answered is not None:
            worker.answered.tree_gone()
            worker.answered = None
        waiter = self.burial_waiter
        if waiter is not None and not self.workers and not waiter.done():
            waiter.set_result(None)
        self.dispatch()

    def settle_dead(self, job: JobCore, worker: Worker) -> None:
        """Settle the job of a worker buried before it answered (``_outcome.death_outcome``)."""
        status, error, cpu, peak = death_outcome(job.limits, worker.report or {}, job.kill_reason)
        job.finish(status, exception=error, cpu=cpu, peak_rss=peak)

    async def workers_buried(self) -> None:
        """Wait until every worker is buried."""
        while self.workers:
            waiter = asyncio.get_running_loop().create_future()
            self.burial_waiter = waiter
            await waiter
