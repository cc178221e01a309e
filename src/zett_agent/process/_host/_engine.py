"""The engine of a ``ProcessPool``: its workers and jobs, and the owner of its launcher.

``PoolEngine`` puts together dispatch (``_dispatch``), the kill path (``_reaping``) and what
the workers send (``_answers``), and adds what the launcher's supervisor reports (a worker
reaped, a fork failed, the launcher lost), the pool's shutdown, and what the pool says of
its containment (``ProcessPool.containment_info``). ``ProcessPool`` is its public face;
each job's ``JobCore`` reaches it only as its ``JobSeat``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._containment._cgroup_containment import CgroupContainment
from .._errors import PoolClosed, ProcessError, WorkerCrashed
from .._sandbox import _landlock, _scratch
from ._answers import WorkerEvents
from ._graveyard import Graveyard
from ._job_core import JobStatus

if TYPE_CHECKING:
    from .._containment._strategy import Containment
    from ._control import LauncherHandle
    from ._supervisor import LauncherSupervisor

__all__ = ["PoolEngine"]

#: how long close() waits for the launcher to exit before SIGKILLing it, and for the trees
_CLOSE_TIMEOUT = 5.0


class PoolEngine(WorkerEvents):
    """Everything a started ``ProcessPool`` runs on; its launcher supervisor's owner."""

    #: the sandboxed jobs' base directory, made on the first sandboxed submit
    scratch_base: _scratch.Base | None = None

    def attach(
        self,
        loop: asyncio.AbstractEventLoop,
        containment: Containment,
        supervisor: LauncherSupervisor,
    ) -> None:
        """The pool starts on ``loop``, contained by ``containment``, with this supervisor."""
        self.loop = loop
        self.containment = containment
        self.graveyard = Graveyard(loop)
        self.supervisor = supervisor

    def job_scratch(self, shared: str) -> str:
        """A scratch directory path for a sandboxed job whose policy shares ``shared``.

        Spares started from now on prepare for confining a job of that kind. Raises
        ``ProcessError`` when the sandboxes' base directory cannot be made.
        """
        self.prepare_for = shared
        base = self.scratch_base
        if base is None:
            try:
                base = self.scratch_base = _scratch.Base()
            except OSError as exc:
                raise ProcessError(
                    f"cannot make the sandboxes' scratch directory: {exc}; set TMPDIR to a "
                    "writable directory"
                ) from exc
            # what pools whose host died left behind (off the loop: it lists a directory)
            self.janitor.defer(_remove_stale_bases, self.janitor.stopping.is_set)
        return base.job_path()

    def describe(self, mode: str) -> dict[str, Any]:
        """What ``ProcessPool.containment_info`` says (``mode`` alone before start)."""
        info: dict[str, Any] = {"mode": mode}
        launcher = self.launcher
        landlock = launcher.hello.get("landlock") if launcher is not None else None
        if not isinstance(landlock, dict):
            return info
        assert launcher is not None
        info["launcher_pid"] = launcher.pid
        if isinstance(self.containment, CgroupContainment):
            info["cgroup"] = self.containment.path
        scoped = bool(landlock.get("scoped"))
        info["landlock_abi"] = landlock.get("abi", 0)
        info["kernel_landlock_abi"] = landlock.get("kernel_abi", 0)
        info["scoped_workers"] = scoped
        if scoped:
            info["supervisors"] = (
                "protected: no process a job starts can signal (kill, pidfd_send_signal), "
                "ptrace, read the memory of, or connect to an abstract UNIX socket of the "
                "launcher, this host or any process outside its worker's tree (Landlock "
                "scoping)"
            )
        else:
            info["supervisors"] = (
                "not protected: a job can signal the launcher and this host, and ptrace them "
                "where Yama does not forbid it; the host replaces a launcher that it finds "
                "stopped or gone"
            )
            info["reason"] = landlock.get("reason")
        info["no_new_privs"] = scoped and (os.geteuid() != 0 or _landlock.no_new_privs())
        return info

    # -- the launcher (LauncherSupervisor's owner) --------------------------------------------

    def on_exit_report(self, launcher: LauncherHandle, message: dict[str, Any]) -> None:
        """The launcher reaped a worker."""
        worker = self.workers.get(int(message.get("pid", -1)))
        if worker is not None and worker.launcher is launcher:
            worker.report = message
            assert self.containment is not None
            self.containment.recheck(worker.tree)
            self.check_gone(worker)

    def on_spawn_failed(self, message: dict[str, Any]) -> None:
        """The launcher could not fork a worker: fail a queued job if no worker is left."""
        self.spawning = max(0, self.spawning - 1)
        if self.queue and not self.workers:
            self.queue.popleft().finish(
                JobStatus.FAILED,
                exception=ProcessError(
                    f"could not start a worker process ({message.get('error')}); the "
                    "machine is out of processes or memory"
                ),
            )

    def on_lost(self, launcher: LauncherHandle, why: str) -> None:
        """The launcher died or stopped answering.

        Kill everything it started; the supervisor starts a new one once that is done.
        """
        containment, supervisor = self.containment, self.supervisor
        assert containment is not None and supervisor is not None
        self.spawning = 0
        reason = f"the pool's launcher process failed ({why}) and was replaced"
        cause = ProcessError(f"the pool's launcher process {launcher.pid} failed: {why}")
        workers = [w for w in self.workers.values() if w.launcher is launcher]
        for worker in workers:
            job = worker.job
            if job is not None and not job.finished and job.kill_reason is None:
                error = WorkerCrashed(None, None, reason)
                error.__cause__ = cause
                job.kill_reason = error
        self.end_all(workers)
        self.on_gone(launcher)
        containment.kill_launcher(
            launcher.pid,
            launcher.pidfd,
            [worker.tree for worker in workers],
            lambda: supervisor.replace(why),
        )

    def on_gone(self, launcher: LauncherHandle) -> None:
        """No exit report will come from ``launcher`` any more."""
        workers = [w for w in self.workers.values() if w.launcher is launcher]
        for worker in workers:
            worker.orphaned = True
        for worker in workers:
            self.check_gone(worker)

    def on_ready(self) -> None:
        """A launcher is ready (the first, or a replacement): ask it for workers."""
        self.top_up()

    def on_give_up(self, message: str) -> None:
        """The launcher cannot be restarted: the pool is broken, queued jobs end."""
        self.broken = message
        while self.queue:
            self.queue.popleft().finish(JobStatus.CANCELLED, exception=PoolClosed(message))

    # -- closing ----------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Cancel every job, kill every tree, stop the launcher, remove what jobs left.

        Bounded: a launcher that does not exit within ``_CLOSE_TIMEOUT`` is SIGKILLed, and the
        janitor gets as long for its removals (the rest stays for the next pool's sweep).
        """
        self.closed = True
        if self.replace_timer is not None:
            self.replace_timer.cancel()
            self.replace_timer = None
        supervisor = self.supervisor
        assert supervisor is not None
        while self.queue:
            self.queue.popleft().finish(
                JobStatus.CANCELLED,
                exception=PoolClosed("the pool was closed before the job started"),
            )
        closed = PoolClosed("the pool was closed while the job ran")
        for job in self.busy:
            if job.kill_reason is None:
                job.kill_reason = closed  # as ``kill`` without a grace: its reason, then the end
        # every tree in one batch: the containment kills a large one without reading each
        # worker's children on the loop (one write of ``cgroup.kill`` per worker in its thread)
        self.end_all(list(self.workers.values()))
        await supervisor.close()
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT):
                await supervisor.gone.wait()
                await self.workers_buried()
        except TimeoutError:
            supervisor.kill()
            await supervisor.gone.wait()
        for worker in list(self.workers.values()):
            self.bury(worker, force=True)
        assert self.containment is not None
        self.containment.close()
        if self.graveyard is not None:
            self.graveyard.close()
        base = self.scratch_base
        if base is not None:
            self.janitor.defer(_scratch.remove_tree, base.path, self.janitor.stopping.is_set)
        # what jobs left to remove (cgroups they built, scratch directories): bounded, the
        # rest stays for the next pool's sweep
        try:
            await self.janitor.close(_CLOSE_TIMEOUT)
        finally:
            if base is not None:
                base.close()  # what is left of it is a stale base from now on


def _remove_stale_bases(stop: Callable[[], bool]) -> None:
    """In the janitor's thread: remove the sandbox directories of pools whose host is gone."""
    for path in _scratch.stale_bases():
        if stop():
            return
        _scratch.remove_tree(path, stop)
