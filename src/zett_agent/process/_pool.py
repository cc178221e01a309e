"""``ProcessPool``: runs jobs in worker processes, supervised from the asyncio event loop.

Structure: one launcher process per pool (``_launcher``) forks workers ahead of demand and
reaps them; the pool talks to it over one control socket, and to each worker over that
worker's own socket (``_channel``). Everything is driven by event-loop callbacks: the control
socket, the launcher's pidfd, each worker's socket and pidfd, and the containment's own
notifications (``_containment``: a cgroup per worker, or /proc freezes in a kill thread).

The host never trusts a worker or the launcher with a job's fate:

- a job ends with the first of: its result or error message, the death of its worker, or a
  kill by the pool (cancel, timeout, protocol error, close), whose reason then wins;
- a kill is the host's own (``Containment.kill``), and a killed job settles only once its
  whole tree is confirmed dead;
- a worker that will run no other job is killed as soon as its last answer arrives, so
  nothing a job started (a forged early result, a daemon thread, a double-forked process)
  outlives its result; a worker to be reused must be checked clean first;
- the launcher must answer every request within ``_LAUNCHER_DEADLINE`` (at once if it is
  seen stopped); a launcher that died or stopped answering is replaced, its workers' trees are
  killed and their jobs fail with an error that says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import resource
import signal
import socket
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import _containment, _landlock, _sandbox, _scratch
from ._channel import Channel
from ._containment import Containment
from ._control import LauncherHandle
from ._decode import Message
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
from ._graveyard import Graveyard
from ._janitor import Janitor
from ._job import JobStatus, ProcessJob
from ._limits import ProcessLimits, check_limits
from ._linux import linux_problem
from ._pickling import pickle_job
from ._protocol import FLAG_LAST, FLAG_SANDBOX, HEADER
from ._sandbox import Sandbox, SandboxUnavailable, check_sandbox
from ._supervised import Worker, WorkerState
from ._supervisor import LauncherSupervisor

if TYPE_CHECKING:
    from ._executor import PoolExecutor

__all__ = ["ProcessPool"]

_NO_LIMITS = ProcessLimits()
#: how long close() waits for the launcher to exit before SIGKILLing it, and for the trees
_CLOSE_TIMEOUT = 5.0
#: how long a worker that closed its socket mid-job may live on before it is killed as a
#: protocol breaker (a dying worker closes its socket just before its pidfd reports the death)
_EOF_GRACE = 1.0
#: longest delay of the fork that replaces a spare which just took a job, while another spare
#: is still ready (see ``_top_up``)
_REPLACE_DELAY = 0.005
#: how long a worker that answered its last job may take to exit on its own before it is
#: killed (under containments where waiting is cheaper than a kill)
_EXIT_GRACE = 0.1
_CONTAINMENTS = ("auto", "cgroup", "scan")
#: the Landlock ABI cap sent to workers when the pool pretends nothing (any kernel's is lower)
_ANY_ABI = 1 << 16


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _count(name: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` if it is an int in ``[low, high]``; else ``TypeError``/``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"ProcessPool({name}=...) must be an int, got {type(value).__name__} {value!r:.40}"
        )
    if value < low or (high is not None and value > high):
        upper = "" if high is None else f" and at most {high}"
        raise ValueError(f"ProcessPool({name}=...) must be at least {low}{upper}, got {value}")
    return value


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
      process per job). A job with limits other than ``timeout`` always retires its worker, and
      so does a job that leaves a thread or a process behind.
    - ``max_frame_bytes``: size cap of one event or result from a child (its encoded size); a
      bigger one fails the job with ``ProtocolError`` and kills its tree.
    - ``max_buffered_events`` and ``max_buffered_bytes``: what the parent holds per job of the
      events nobody has read yet, in number and in decoded memory (see ``ProcessJob.events``).
      ``max_buffered_bytes`` also bounds the decoded size of one event or result: a child
      cannot make the parent hold more for a job than this (a small frame of JSON can decode
      into many times its size; the bound counts the decoded size).
    - ``kill_grace``: default seconds between SIGTERM and SIGKILL when a job is killed.
    - ``preload``: modules imported once in the launcher, so forked workers start warm.
    - ``nice``: added to every worker's niceness as it is forked, before it runs anything
      (0 to 19; default 0): CPU-heavy jobs then never compete with the host's event loop for
      a core, not even while they unpickle and start.
    - ``containment``: how job trees are contained and killed: ``"cgroup"`` (a cgroup v2 per
      worker: kills are atomic, nothing can fork or double-fork out of them; needs a writable
      cgroup v2 hierarchy and Linux 5.14), ``"scan"`` (freezes found by walking ``/proc``, and
      a subreaper that kills orphans), or ``"auto"`` (the default: cgroup where it works).
      ``containment`` reads the mode in use once the pool started; ``containment_info`` says
      more, the Landlock scoping of the workers included.
    - ``scope_workers``: put every worker in a Landlock domain of its own before any job runs
      (default True; needs Landlock ABI 6, Linux 6.12): nothing a job starts can then signal,
      ``pidfd_send_signal``, ``ptrace``, read the memory of, or connect to an abstract UNIX
      socket of, a process outside its worker's tree (the launcher, this host, other pools).
      As root this costs nothing else. On a host that is not root, Landlock needs
      ``no_new_privs``, which each worker then sets: setuid programs (``sudo``) no longer gain
      privileges in jobs; pass ``scope_workers=False`` where unsandboxed jobs need them (the
      jobs can then stop or kill the launcher, and signal the host).
    - ``landlock_abi`` and ``seccomp``: use at most this Landlock ABI (``None``: the kernel's;
      0: none) and seccomp or not (default True), pretending an older kernel: for tests of what
      a pool does on one (a sandbox that is ``required`` then fails with
      ``SandboxUnavailable``, and workers are not scoped below ABI 6).

    Processes: one launcher process (a child subreaper) forks the workers and reaps them. If
    this process dies, even by SIGKILL, the launcher kills every worker tree and exits. Start
    the pool from the thread that will keep running for its whole life (the launcher's
    parent-death signal fires when that thread ends). Linux 5.3 or newer only.

    Raises ``TypeError`` for an argument of the wrong type and ``ValueError`` for one out of
    range, naming it.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        spare_workers: int | None = None,
        max_jobs_per_worker: int = 1,
        max_frame_bytes: int = 64 * 1024 * 1024,
        max_buffered_events: int = 1024,
        max_buffered_bytes: int = 256 * 1024 * 1024,
        kill_grace: float = 0.0,
        preload: Sequence[str] = (),
        containment: str = "auto",
        nice: int = 0,
        scope_workers: bool = True,
        landlock_abi: int | None = None,
        seccomp: bool = True,
    ) -> None:
        # set first: __del__ must work on a pool whose constructor failed
        self._started = False
        self._closed = False
        self._close_task: asyncio.Task[None] | None = None
        self._supervisor: LauncherSupervisor | None = None
        self._workers: dict[int, Worker] = {}
        if max_workers is None:
            max_workers = os.cpu_count() or 1
        self.max_workers = _count("max_workers", max_workers, 1)
        if spare_workers is None:
            spare_workers = min(2, self.max_workers)
        self.spare_workers = _count("spare_workers", spare_workers, 0)
        self.max_jobs_per_worker = _count("max_jobs_per_worker", max_jobs_per_worker, 1)
        self.max_frame_bytes = _count("max_frame_bytes", max_frame_bytes, 16, 2**40)
        self.max_buffered_events = _count("max_buffered_events", max_buffered_events, 1)
        self.max_buffered_bytes = _count("max_buffered_bytes", max_buffered_bytes, 1 << 16)
        if isinstance(kill_grace, bool) or not isinstance(kill_grace, int | float):
            raise TypeError(f"ProcessPool(kill_grace=...) must be seconds, got {kill_grace!r:.40}")
        if not 0 <= kill_grace < 3600:
            raise ValueError(f"ProcessPool(kill_grace=...) must be in [0, 3600), got {kill_grace}")
        self.kill_grace = float(kill_grace)
        if isinstance(preload, str) or not all(isinstance(name, str) for name in preload):
            raise TypeError("ProcessPool(preload=...) takes a sequence of module names (str)")
        self.preload = tuple(preload)
        self.nice = _count("nice", nice, 0, 19)
        if containment not in _CONTAINMENTS:
            raise ValueError(
                f"ProcessPool(containment=...) must be one of {', '.join(_CONTAINMENTS)}, got "
                f"{containment!r:.40}"
            )
        self._mode = containment
        for name, flag in (("scope_workers", scope_workers), ("seccomp", seccomp)):
            if not isinstance(flag, bool):
                raise TypeError(f"ProcessPool({name}=...) must be True or False, got {flag!r:.40}")
        self.scope_workers = scope_workers
        self.landlock_abi = (
            None if landlock_abi is None else _count("landlock_abi", landlock_abi, 0, _ANY_ABI)
        )
        self.seccomp = seccomp
        #: the sandboxed jobs' base directory, made on the first sandboxed submit
        self._scratch_base: _scratch.Base | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._containment: Containment | None = None
        self._broken: str | None = None
        self._queue: deque[ProcessJob] = deque()
        self._idle: deque[Worker] = deque()
        self._busy: dict[ProcessJob, Worker] = {}
        self._spawning = 0
        self._replace_timer: asyncio.TimerHandle | None = None
        self._graveyard: Graveyard | None = None
        self._janitor = Janitor()
        #: resolved when the last worker is buried (close() waits on it)
        self._burial_waiter: asyncio.Future[None] | None = None
        self._job_counter = 0

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        supervisor = self._supervisor
        if not self._started or self._close_task is not None or supervisor is None:
            return
        if not supervisor.handles:
            return
        _warn(
            f"unclosed {self!r}; use 'async with ProcessPool()' or 'await pool.close()'",
            ResourceWarning,
            source=self,
        )
        # only reachable once the event loop is gone; EOF makes the launcher kill every tree
        supervisor.abandon()
        for worker in self._workers.values():
            if worker.channel is not None:
                with contextlib.suppress(OSError):
                    worker.channel.sock.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._started else "new"
        return (
            f"<ProcessPool {state} containment={self.containment} max_workers={self.max_workers}"
            f" busy={len(self._busy)} queued={len(self._queue)} idle={len(self._idle)}>"
        )

    @property
    def running(self) -> int:
        """Jobs running now (each in its own worker process); at most ``max_workers``."""
        return len(self._busy)

    @property
    def queued(self) -> int:
        """Jobs submitted and waiting for a worker because ``max_workers`` are running."""
        return len(self._queue)

    @property
    def _launcher(self) -> LauncherHandle | None:
        """The current launcher (tests look at it)."""
        return self._supervisor.current if self._supervisor is not None else None

    @property
    def containment(self) -> str:
        """``"cgroup"`` or ``"scan"`` once started; before that, the mode asked for."""
        return self._containment.mode if self._containment is not None else self._mode

    @property
    def containment_info(self) -> dict[str, Any]:
        """How this pool contains its jobs, as JSON data (``{"mode": ...}`` only before start).

        - ``mode``: ``"cgroup"`` or ``"scan"`` (see ``containment``);
        - ``landlock_abi``: the Landlock ABI workers use (0: none; lower than
          ``kernel_landlock_abi`` when the pool pretends an older kernel);
        - ``scoped_workers``: whether each worker runs in a Landlock domain of its own that
          scopes signals and abstract UNIX sockets (see ``scope_workers``);
        - ``supervisors``: what a job can do to its launcher and this host, in a sentence;
        - ``reason``: why the workers are not scoped, when they are not;
        - ``no_new_privs``: whether workers run with ``no_new_privs`` (set for their domain on a
          host that is not root, inherited inside a sandbox).
        """
        info: dict[str, Any] = {"mode": self.containment}
        launcher = self._launcher
        landlock = launcher.hello.get("landlock") if launcher is not None else None
        if not isinstance(landlock, dict):
            return info
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

    @property
    def tree_limits(self) -> frozenset[str]:
        """The ``ProcessLimits`` fields this pool enforces on whole trees (``max_processes``,
        ``tree_memory_bytes``): those whose cgroup controller is enabled. Empty before start
        and under scan containment."""
        return self._containment.tree_limits if self._containment is not None else frozenset()

    # -- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> ProcessPool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Set up containment, start the launcher and the spare workers; no-op if started.

        Raises ``PoolClosed`` after ``close()``, and ``ProcessError`` if the engine cannot run
        here (not Linux, ``containment="cgroup"`` without a writable cgroup v2; the message says
        what is missing) or the launcher cannot start (for example a ``preload`` module fails
        to import; the message says which).

        Cancellation: the launcher is killed and reaped before the cancellation propagates.

        Blocks the event loop once, for the ``posix_spawn`` of the launcher: about 0.3 ms,
        several ms when the CPUs are busy. It cannot move to a helper thread: the launcher's
        parent-death signal fires when the thread that spawned it ends.
        """
        if self._closed:
            raise PoolClosed("start() after close(); create a new ProcessPool")
        if self._started:
            return
        problem = linux_problem()
        if problem is not None:
            raise ProcessError(problem)
        loop = asyncio.get_running_loop()
        try:
            containment = _containment.create(self._mode)
            containment.open(loop, self._janitor)
        except OSError as exc:
            raise ProcessError(f"cannot contain worker processes: {exc}") from exc
        self._loop = loop
        self._containment = containment
        self._graveyard = Graveyard(loop)
        self._supervisor = LauncherSupervisor(
            loop,
            self,
            preload=self.preload,
            max_frame_bytes=self.max_frame_bytes,
            cgroups={
                **containment.launcher_args(),
                # the launcher takes these out again (its arguments travel in one dict)
                "landlock_abi": str(-1 if self.landlock_abi is None else self.landlock_abi),
                "scope_workers": "1" if self.scope_workers else "0",
            },
            nice=self.nice,
            before_start=containment.launcher_starting,
        )
        self._started = True
        _raise_fd_limit(2 * self.max_workers + 2 * self.spare_workers + 64)
        try:
            await self._supervisor.start()
        except BaseException:
            await self.close()
            raise
        self._top_up()

    async def close(self) -> None:
        """Cancel every job, kill every process tree, reap everything, close every fd.

        Queued jobs end ``CANCELLED`` with ``PoolClosed``; running jobs are killed and end the
        same way once their trees are gone. Idempotent: later calls wait for the first one.
        Bounded: a launcher that does not exit within a few seconds is SIGKILLed.

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
        if self._replace_timer is not None:
            self._replace_timer.cancel()
            self._replace_timer = None
        supervisor = self._supervisor
        assert supervisor is not None
        while self._queue:
            self._queue.popleft()._finish(
                JobStatus.CANCELLED,
                exception=PoolClosed("the pool was closed before the job started"),
            )
        closed = PoolClosed("the pool was closed while the job ran")
        for job in list(self._busy):
            self._kill_job(job, closed, 0.0)
        self._end_all(list(self._workers.values()))
        await supervisor.close()
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT):
                await supervisor.gone.wait()
                await self._workers_buried()
        except TimeoutError:
            supervisor.kill()
            await supervisor.gone.wait()
        for worker in list(self._workers.values()):
            self._bury(worker, force=True)
        assert self._containment is not None
        self._containment.close()
        if self._graveyard is not None:
            self._graveyard.close()
        base = self._scratch_base
        if base is not None:
            self._janitor.defer(_scratch.remove_tree, base.path, self._janitor.stopping.is_set)
        # what jobs left to remove (cgroups they built, scratch directories): bounded, the
        # rest stays for the next pool's sweep
        try:
            await self._janitor.close(_CLOSE_TIMEOUT)
        finally:
            if base is not None:
                base.close()  # what is left of it is a stale base from now on

    async def _workers_buried(self) -> None:
        while self._workers:
            waiter = asyncio.get_running_loop().create_future()
            self._burial_waiter = waiter
            await waiter

    def executor(self) -> PoolExecutor:
        """A ``concurrent.futures.Executor`` over this started pool (``PoolExecutor``):
        ``submit`` from any thread, ``map``, ``shutdown``, ``loop.run_in_executor(executor,
        fn, *args)``; ``future.cancel()`` kills a running job's tree, and a crash fails only
        its own future. Its ``shutdown()`` leaves the pool open.

        Raises ``RuntimeError`` before ``start()`` and ``PoolClosed`` after ``close()``.
        """
        if self._closed:
            raise PoolClosed("executor() after close(); create a new ProcessPool")
        if not self._started or self._loop is None:
            raise RuntimeError("ProcessPool.executor() before start(); start the pool first")
        from ._executor import PoolExecutor

        return PoolExecutor(self, self._loop)

    # -- submitting -------------------------------------------------------------------------

    def submit(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        limits: ProcessLimits | None = None,
        sandbox: Sandbox | None = None,
        **kwargs: Any,
    ) -> ProcessJob:
        """Queue ``fn(*args, **kwargs)`` to run in a worker process; return its job at once.

        ``fn`` may be sync or async (an async result is run with ``asyncio.run`` in the child),
        and may be a lambda, a closure or come from ``__main__``: it is sent with cloudpickle.
        Its result must be JSON data (a large ``str`` travels as raw UTF-8). Never waits
        for a worker: the job queues if all ``max_workers`` are busy. The job is pickled here,
        synchronously, so huge arguments cost loop time in this call.

        ``sandbox`` (a ``Sandbox``) confines the job: its worker enforces it before unpickling
        anything of the job, reports what it enforced (``ProcessJob.sandbox_report``, before the
        job runs) and runs no other job; the job's scratch directory is removed once its tree is
        dead. A required sandbox that cannot be enforced here fails the job with
        ``SandboxUnavailable`` before its code runs.

        Raises ``TypeError`` if ``fn`` is not callable, ``limits`` is not a ``ProcessLimits``,
        ``sandbox`` not a ``Sandbox``, or a value cannot be pickled (naming it; the pool is
        unaffected); ``ValueError`` for tree-wide limits this pool cannot enforce (see
        ``tree_limits``), for ``Sandbox(user=...)`` on a host that is not root or naming an
        account that cannot run the interpreter, and for ``ProcessLimits.env``/``cwd`` with a
        sandbox; ``PoolClosed`` after ``close()`` or once the pool gave up on its launcher;
        ``RuntimeError`` before ``start()``. Must be called from the event loop thread that
        started the pool.

        On crash: a job whose worker dies ends with ``WorkerCrashed`` (or ``LimitExceeded`` when
        a limit explains the death); other jobs are not affected.
        """
        if not callable(fn):
            raise TypeError(
                f"ProcessPool.submit() takes a function to run first, got "
                f"{type(fn).__name__} {fn!r:.40}"
            )
        limits = check_limits(limits, "ProcessPool.submit(limits=...)") or _NO_LIMITS
        sandbox = check_sandbox(sandbox, "ProcessPool.submit(sandbox=...)")
        if sandbox is not None and (limits.env is not None or limits.cwd is not None):
            raise ValueError(
                "ProcessLimits.env and .cwd do not combine with a sandbox: its environment is "
                "minimal plus Sandbox.env, and its working directory is its scratch directory; "
                "pass the variables as Sandbox(env={...})"
            )
        if self._closed or self._broken is not None:
            raise PoolClosed(
                self._broken or "submit() after close(); create a new ProcessPool for new jobs"
            )
        if not self._started or self._loop is None or self._containment is None:
            raise RuntimeError(
                "ProcessPool.submit() before start(); use 'async with ProcessPool() as pool:' "
                "or 'await pool.start()' first"
            )
        missing = set(limits.tree_wide) - self._containment.tree_limits
        if missing:
            raise ValueError(
                f"this pool cannot enforce ProcessLimits.{', '.join(sorted(missing))} (limits on "
                f"a whole process tree need containment='cgroup' with the matching cgroup v2 "
                f"controller enabled; this pool uses containment={self.containment!r} and "
                f"enforces {sorted(self.tree_limits) or 'none'}); use memory_bytes/cpu_seconds "
                "(per process) instead, or run where the controllers are delegated"
            )
        payload = pickle_job(fn, args, kwargs, limits)
        scratch = None
        if sandbox is not None:
            scratch, header = self._sandbox_header(sandbox)
            payload = b"".join((HEADER.pack(len(header)), header, payload))
        self._job_counter += 1
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        job = ProcessJob(
            self,
            self._loop,
            payload,
            limits,
            f"#{self._job_counter} {name}",
            self.max_buffered_events,
            sandbox,
        )
        job._scratch = scratch
        self._queue.append(job)
        self._dispatch(replace_now=False)
        return job

    def _sandbox_header(self, sandbox: Sandbox) -> tuple[str, bytes]:
        """The job's scratch directory and the policy its worker enforces (as JSON)."""
        account = _sandbox.resolve_account(sandbox.user)
        base = self._scratch_base
        if base is None:
            try:
                base = self._scratch_base = _scratch.Base()
            except OSError as exc:
                raise ProcessError(
                    f"cannot make the sandboxes' scratch directory: {exc}; set TMPDIR to a "
                    "writable directory"
                ) from exc
            # what pools whose host died left behind (off the loop: it lists a directory)
            self._janitor.defer(_remove_stale_bases, self._janitor.stopping.is_set)
        scratch = base.job_path()
        policy = _sandbox.policy(
            sandbox,
            account,
            scratch,
            landlock_abi=_ANY_ABI if self.landlock_abi is None else self.landlock_abi,
            seccomp=self.seccomp,
        )
        return scratch, policy

    def _drop_queued(self, job: ProcessJob) -> None:
        with contextlib.suppress(ValueError):
            self._queue.remove(job)

    # -- scheduling -------------------------------------------------------------------------

    def _dispatch(self, *, replace_now: bool = True) -> None:
        while self._queue and self._idle and len(self._busy) < self.max_workers:
            worker = self._worker_for(self._queue[0])
            if worker is None:
                break
            self._run(self._queue.popleft(), worker)
        self._top_up(replace_now=replace_now)

    def _worker_for(self, job: ProcessJob) -> Worker | None:
        """An idle worker for ``job``: a sandboxed job needs one that never ran a job (a job
        before it could have changed what the worker enforces). None when only used ones are
        idle: one of them is retired, and the fork that replaces it brings a fresh one."""
        if job.sandbox is None or self.max_jobs_per_worker == 1:
            return self._idle.popleft()
        for worker in reversed(self._idle):  # spares are at the right end
            if worker.jobs_done == 0:
                self._idle.remove(worker)
                return worker
        self._end(self._idle[0])
        return None

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
        if self._closed or self._broken is not None or self._launcher is None:
            return
        assert self._supervisor is not None
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
        self._supervisor.request({"op": "spawn", "n": missing})

    def _replace_due(self) -> None:
        self._replace_timer = None
        self._top_up()

    def _run(self, job: ProcessJob, worker: Worker) -> None:
        assert self._loop is not None and self._containment is not None
        assert worker.channel is not None
        if job.limits.tree_wide:
            try:
                self._containment.apply(worker.tree, job.limits)
            except OSError as exc:
                self._end(worker)
                error = ProcessError(f"could not set the job's tree-wide limits: {exc}")
                job._finish(JobStatus.FAILED, exception=error)
                return
        payload = job._begin(worker.pid)
        if not self._busy:
            assert self._supervisor is not None
            self._supervisor.watch(self._has_jobs)
        worker.to(WorkerState.BUSY)
        worker.job = job
        self._busy[job] = worker
        sandboxed = job.sandbox is not None
        last = (
            sandboxed
            or job.limits.applies_in_child
            or worker.jobs_done + 1 >= self.max_jobs_per_worker
        )
        worker.last = last
        worker.scratch = job._scratch
        flags = (FLAG_LAST if last else 0) | (FLAG_SANDBOX if sandboxed else 0)
        data = b"".join((HEADER.pack(len(payload) + 1), bytes((flags,)), payload))
        worker.channel.send(data)
        if job.limits.timeout is not None:
            worker.set_timer(
                "timeout", self._loop.call_later(job.limits.timeout, self._on_timeout, job)
            )

    def _has_jobs(self) -> bool:
        return bool(self._busy)

    def _on_timeout(self, job: ProcessJob) -> None:
        timeout = job.limits.timeout
        assert timeout is not None
        self._kill_job(job, JobTimeout(timeout), None)

    # -- workers: messages ------------------------------------------------------------------

    def on_worker(self, launcher: LauncherHandle, message: dict[str, Any], fds: list[int]) -> None:
        """The launcher forked a worker: its socket and pidfd are in ``fds``."""
        loop, containment = self._loop, self._containment
        assert loop is not None and containment is not None
        self._spawning = max(0, self._spawning - 1)
        if len(fds) != 2 or launcher is not self._launcher or self._closed:
            for fd in fds:
                os.close(fd)
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=fds[0])
        pid = int(message["pid"])
        tree = containment.adopt(pid, fds[1], str(message.get("cg", "")))
        worker = Worker(pid, tree, launcher)
        worker.channel = Channel(
            loop,
            sock,
            self.max_frame_bytes,
            lambda message: self._on_message(worker, message),
            lambda: self._on_frame(worker),
            lambda: self._on_eof(worker),
            lambda reason: self._protocol_error(worker, reason),
            self._graveyard.bury if self._graveyard is not None else lambda value: None,
        )
        self._workers[pid] = worker
        loop.add_reader(tree.pidfd, self._on_worker_exited, worker)
        self._idle.append(worker)
        worker.channel.start()
        self._dispatch()

    def _on_message(self, worker: Worker, message: Message) -> None:
        job = worker.job
        if job is None or job.done() or job._kill_reason is not None:
            self._protocol_error(worker, f"a {message.kind} arrived while the worker had no job")
            return
        if job.sandbox is not None and job.sandbox_report is None:
            if message.kind != "sandbox":
                reason = f"a {message.kind} arrived before the worker reported the job's sandbox"
                self._protocol_error(worker, reason)
                return
            self._on_sandbox_report(worker, job, message.value)
            return
        if message.kind == "event":
            job._push_event(message.value, message.cost)
            return
        if message.kind == "sandbox":
            self._protocol_error(worker, "a sandbox report from a running job")
            return
        assert message.usage is not None
        cpu, peak = message.usage
        if message.kind == "result":
            self._answered(worker, JobStatus.COMPLETED, message.value, None, cpu, peak)
            return
        assert message.error is not None
        type_name, text, traceback_text = message.error
        error: ProcessError = JobFailed(type_name, text, traceback_text)
        memory = job.limits.memory_bytes
        if type_name == "MemoryError" and memory is not None:
            failed = error
            error = LimitExceeded("memory_bytes", memory, peak)
            error.__cause__ = failed
        self._answered(worker, JobStatus.FAILED, None, error, cpu, peak)

    def _on_sandbox_report(self, worker: Worker, job: ProcessJob, report: dict[str, Any]) -> None:
        """The worker confined itself (its job has not run yet): keep what it enforced, or fail
        the job when the sandbox could not be enforced as required."""
        job.sandbox_report = report
        refused = report.get("refused")
        if refused is None:
            return
        missing = report.get("missing")
        names = tuple(str(name) for name in missing) if isinstance(missing, dict) else ()
        error = SandboxUnavailable(str(refused), names)
        self._answered(worker, JobStatus.FAILED, None, error, 0.0, 0)

    def _on_frame(self, worker: Worker) -> None:
        """After each frame: keep what the job holds within ``max_buffered_bytes``."""
        job, channel = worker.job, worker.channel
        if job is None or channel is None:
            return
        assembling = channel.assembler.held
        budget = self.max_buffered_bytes
        if assembling > budget:
            self._protocol_error(
                worker,
                f"one event or result decodes into more than max_buffered_bytes={budget} "
                "bytes; send less data per event or result, or raise "
                "ProcessPool(max_buffered_bytes=...)",
            )
            return
        if job._consumer:
            if job._held + assembling > budget or job._events_full:
                channel.pause()  # resumed by _events_consumed
        else:
            while job._held + assembling > budget and (dropped := job._drop_oldest()):
                self._free(dropped)

    def _free(self, dropped: tuple[Any] | None) -> None:
        """Free a value the engine gives up on without stalling the loop (``Graveyard``)."""
        if dropped is not None and self._graveyard is not None:
            self._graveyard.bury(dropped[0])

    def _events_consumed(self, job: ProcessJob) -> None:
        worker = self._busy.get(job)
        if worker is None or worker.channel is None or not worker.channel.paused:
            return
        if (
            len(job._events) <= self.max_buffered_events // 2
            and job._held <= self.max_buffered_bytes // 2
        ):
            worker.channel.resume()

    def _answered(
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
        assert job is not None and self._containment is not None
        worker.job = None
        self._busy.pop(job, None)
        worker.cancel_timers()
        job._finish(status, result=result, exception=error, cpu=cpu, peak_rss=peak)
        worker.jobs_done += 1
        reusable = not (
            worker.last or self._closed or worker.exited_at is not None or worker.orphaned
        )
        if reusable and self._containment.is_clean(worker.tree):
            worker.to(WorkerState.IDLE)
            if self._containment.needs_exit_report:
                # a job may have switched the subreaper flag off and double-forked: such an
                # orphan was reparented to the launcher, which kills it in its sweep
                assert self._supervisor is not None
                self._supervisor.sweep_if_orphans(self._workers.keys())
            # a used worker goes first: its jobs left it warm, and spares stay untouched
            self._idle.appendleft(worker)
        elif (
            self._containment.lets_workers_exit
            and worker.last
            and worker.exited_at is None
            and not self._closed
        ):
            # it exits on its own right after its last answer (its leftovers are the
            # launcher's to sweep); one that does not within _EXIT_GRACE is killed
            assert self._loop is not None
            worker.to(WorkerState.ENDING)
            worker.set_timer("exit", self._loop.call_later(_EXIT_GRACE, self._end, worker))
        else:
            # nothing it or its job started may outlive the answer
            self._end(worker)
        self._dispatch()

    def _protocol_error(self, worker: Worker, reason: str) -> None:
        job = worker.job
        if job is not None and not job.done():
            self._kill_job(job, ProtocolError(reason), 0.0)
        elif worker.state is not WorkerState.DEAD:
            self._end(worker)
        self._top_up()

    def _on_eof(self, worker: Worker) -> None:
        if worker.state is WorkerState.ENDING:
            self._check_gone(worker)
            return
        job = worker.job
        if job is not None and not job.done() and worker.exited_at is None:
            # no answer can come any more: unless the worker's death shows meanwhile, it
            # closed its socket and lives on, and the job must not hang
            assert self._loop is not None
            worker.set_timer("eof", self._loop.call_later(_EOF_GRACE, self._on_eof_grace, worker))
        elif worker.state is WorkerState.IDLE:
            self._end(worker)
            self._top_up()

    def _on_eof_grace(self, worker: Worker) -> None:
        job = worker.job
        if job is not None and not job.done() and worker.exited_at is None:
            reason = "the child closed its result channel while its job still ran"
            self._kill_job(job, ProtocolError(reason), 0.0)

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
        if worker is None:
            return
        grace = self.kill_grace if grace is None else grace
        if grace > 0 and worker.state is WorkerState.BUSY:
            assert self._loop is not None and self._containment is not None
            worker.cancel_timer("timeout")
            self._containment.terminate(worker.tree)
            worker.set_timer("term", self._loop.call_later(grace, self._end, worker))
            # answers that arrive meanwhile are ignored: the kill's reason wins
            if worker.channel is not None:
                worker.channel.close()
            return
        self._end(worker)

    def _end(self, worker: Worker) -> None:
        """The worker runs no more jobs: kill its tree; it is buried once that is confirmed."""
        self._end_all([worker])

    def _end_all(self, workers: list[Worker]) -> None:
        containment = self._containment
        assert containment is not None
        ending = []
        for worker in workers:
            if worker.state is WorkerState.DEAD:
                continue
            if worker.state is not WorkerState.ENDING:
                if worker in self._idle:
                    self._idle.remove(worker)
                worker.to(WorkerState.ENDING)
            worker.cancel_timer("timeout")
            worker.cancel_timer("term")
            worker.cancel_timer("exit")
            job = worker.job
            # a killed job's later frames do not matter; a crashed one's may hold its answer
            if worker.channel is not None and (job is None or job._kill_reason is not None):
                worker.channel.close()
            if not worker.tree.killing:
                worker.tree.callbacks.append(functools.partial(self._check_gone, worker))
                ending.append(worker)
        if ending:
            containment.kill(worker.tree for worker in ending)

    def _on_worker_exited(self, worker: Worker) -> None:
        """The worker's pidfd is readable: its process exited (not necessarily its tree)."""
        loop = self._loop
        assert loop is not None
        loop.remove_reader(worker.tree.pidfd)
        worker.exited_at = time.monotonic()
        worker.tree.exited = True
        if worker.report is None and not worker.orphaned and self._supervisor is not None:
            # its parent reaps it and reports (unless that report came first: the control
            # socket and the pidfd are read in any order): a launcher that does not is found out
            self._supervisor.owe_report(worker.launcher, worker.pid, worker.exited_at)
        if worker.state is WorkerState.DEAD:
            return
        assert self._containment is not None
        self._containment.recheck(worker.tree)
        self._end(worker)
        self._top_up()

    def _check_gone(self, worker: Worker) -> None:
        """Bury the worker once its tree is dead and nothing more is awaited from it."""
        if worker.state is not WorkerState.ENDING or not worker.tree.dead:
            return
        containment = self._containment
        assert containment is not None
        job = worker.job
        crashed = job is not None and not job.done() and job._kill_reason is None
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
        self._bury(worker)

    def _bury(self, worker: Worker, *, force: bool = False) -> None:
        if worker.state is WorkerState.DEAD:
            return
        if worker.state is not WorkerState.ENDING:
            if not force:
                raise RuntimeError(f"{worker!r} buried while not ending")
            worker.state = WorkerState.ENDING
        worker.to(WorkerState.DEAD)
        worker.cancel_timers()
        loop, containment = self._loop, self._containment
        assert loop is not None and containment is not None
        if worker.exited_at is None:
            loop.remove_reader(worker.tree.pidfd)
            if worker.report is None and not worker.orphaned and self._supervisor is not None:
                # its tree was seen dead before its pidfd said so: its report is owed all the
                # same (a launcher that never sends it is found out)
                self._supervisor.owe_report(worker.launcher, worker.pid, time.monotonic())
        if worker.channel is not None:
            worker.channel.close()
        containment.forget(worker.tree)
        if worker.scratch is not None:
            # its tree is dead: nothing writes there any more (its size is the job's choice)
            self._janitor.defer(_scratch.remove_tree, worker.scratch, self._janitor.stopping.is_set)
            worker.scratch = None
        self._workers.pop(worker.pid, None)
        job = worker.job
        worker.job = None
        if job is not None:
            self._busy.pop(job, None)
            if not job.done():
                self._settle_dead(job, worker)
        waiter = self._burial_waiter
        if waiter is not None and not self._workers and not waiter.done():
            waiter.set_result(None)
        self._dispatch()

    def _settle_dead(self, job: ProcessJob, worker: Worker) -> None:
        report = worker.report or {}
        cpu, peak = float(report.get("cpu") or 0.0), int(report.get("maxrss") or 0)
        reason = job._kill_reason
        if reason is not None:
            status = (
                JobStatus.CANCELLED
                if isinstance(reason, JobCancelled | PoolClosed)
                else JobStatus.FAILED
            )
            job._finish(status, exception=reason, cpu=cpu, peak_rss=peak)
            return
        signum = report.get("signal")
        crashed = WorkerCrashed(
            report.get("code"), None if signum is None else _signal_name(int(signum))
        )
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

    # -- the launcher (LauncherSupervisor's owner) --------------------------------------------

    def on_exit_report(self, launcher: LauncherHandle, message: dict[str, Any]) -> None:
        """The launcher reaped a worker."""
        worker = self._workers.get(int(message.get("pid", -1)))
        if worker is not None and worker.launcher is launcher:
            worker.report = message
            assert self._containment is not None
            self._containment.recheck(worker.tree)
            self._check_gone(worker)

    def on_spawn_failed(self, message: dict[str, Any]) -> None:
        self._spawning = max(0, self._spawning - 1)
        if self._queue and not self._workers:
            self._queue.popleft()._finish(
                JobStatus.FAILED,
                exception=ProcessError(
                    f"could not start a worker process ({message.get('error')}); the "
                    "machine is out of processes or memory"
                ),
            )

    def on_lost(self, launcher: LauncherHandle, why: str) -> None:
        """The launcher died or stopped answering: kill everything it started; the supervisor
        starts a new one once that is done."""
        containment, supervisor = self._containment, self._supervisor
        assert containment is not None and supervisor is not None
        self._spawning = 0
        reason = f"the pool's launcher process failed ({why}) and was replaced"
        cause = ProcessError(f"the pool's launcher process {launcher.pid} failed: {why}")
        workers = [w for w in self._workers.values() if w.launcher is launcher]
        for worker in workers:
            job = worker.job
            if job is not None and not job.done() and job._kill_reason is None:
                error = WorkerCrashed(None, None, reason)
                error.__cause__ = cause
                job._kill_reason = error
        self._end_all(workers)
        self.on_gone(launcher)
        containment.kill_launcher(
            launcher.pid,
            launcher.pidfd,
            [worker.tree for worker in workers],
            lambda: supervisor.replace(why),
        )

    def on_gone(self, launcher: LauncherHandle) -> None:
        """No exit report will come from ``launcher`` any more."""
        workers = [w for w in self._workers.values() if w.launcher is launcher]
        for worker in workers:
            worker.orphaned = True
        for worker in workers:
            self._check_gone(worker)

    def on_ready(self) -> None:
        self._top_up()

    def on_give_up(self, message: str) -> None:
        self._broken = message
        while self._queue:
            self._queue.popleft()._finish(JobStatus.CANCELLED, exception=PoolClosed(message))


def _remove_stale_bases(stop: Callable[[], bool]) -> None:
    """In the janitor's thread: remove the sandbox directories of pools whose host is gone."""
    for path in _scratch.stale_bases():
        if stop():
            return
        _scratch.remove_tree(path, stop)


def _raise_fd_limit(needed: int) -> None:
    """Raise this process's soft ``RLIMIT_NOFILE`` towards ``needed`` (two descriptors per
    worker: its socket and a pidfd) if the hard limit allows; never lower it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
