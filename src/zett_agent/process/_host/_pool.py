"""``ProcessPool``: runs jobs in worker processes, supervised from the asyncio event loop.

Structure: one launcher process per pool (``_launcher``) forks workers ahead of demand and
reaps them; the pool talks to it over one control socket, and to each worker over that
worker's own socket (``_channel``). Everything is driven by event-loop callbacks: the control
socket, the launcher's pidfd, each worker's socket and pidfd, and the containment's own
notifications (``_containment``: a cgroup per worker, or /proc freezes in a kill thread).
``ProcessPool`` checks its options and its jobs; what runs them is its ``PoolEngine``
(``_engine``, built on ``_dispatch``, ``_reaping`` and ``_answers``), and each job's state
is a ``JobCore`` (``_job_core``) that the engine holds and the job's ``ProcessJob`` fronts.

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
import inspect
import os
import resource
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..._checks import check_choice, check_flag, check_int, check_names, check_seconds
from .._containment import _choice
from .._errors import PoolClosed, ProcessError
from .._limits import ProcessLimits, check_limits
from .._linux import linux_problem
from .._sandbox import _options as _sandbox
from .._sandbox import _policy
from .._sandbox._options import Sandbox, check_sandbox
from .._wire._protocol import HEADER
from ._dispatch import _NO_LIMITS, PoolOptions
from ._engine import PoolEngine
from ._executor import PoolExecutor
from ._job import ProcessJob
from ._job_core import JobCore
from ._pickling import pickle_job
from ._supervisor import LauncherSupervisor
from ._zygote_client import Zygote

if TYPE_CHECKING:
    pass

__all__ = ["ProcessPool", "engine_of"]

_CONTAINMENTS = ("auto", "cgroup", "scan")
#: the Landlock ABI cap sent to workers when the pool pretends nothing (any kernel's is lower)
_ANY_ABI = 1 << 16


def _function_name(value: object) -> str | None:
    """``ProcessPool(warm_up=...)`` checked: ``None`` or ``"package.module:function"``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(
            f"ProcessPool(warm_up=...) takes 'module:function' (a str), got {type(value).__name__}"
        )
    module, colon, function = value.partition(":")
    if (
        not colon
        or not function.isidentifier()
        or not all(part.isidentifier() for part in module.split("."))
    ):
        raise ValueError(
            f"ProcessPool(warm_up={value!r:.80}) must name a function as 'package.module:function'"
        )
    return value


def _count(name: str, value: object, low: int, high: int | None = None) -> int:
    return check_int(f"ProcessPool({name}=...)", value, low, high)


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
    - ``warm_up``: ``"module:function"``, a function the launcher runs once, after
      ``preload`` and before it forks any worker, to rehearse what jobs will run. A forked
      worker pays a copy-on-write page fault, and keeps a private copy, for every page the
      first run of a code path writes to (the interpreter's specialised bytecode, caches built
      on first use); run once in the launcher, those writes land in pages every worker shares.
      It must leave no thread running (the pool then fails to start, naming them); asyncio's
      policy is reset after it, and what it raises is ignored. The launcher imports the
      module and fails to start, naming the error, if it cannot be found.
    - ``nice``: added to every worker's niceness as it is forked, before it runs anything
      (0 to 19; default 0), and given to the pool's session: the workers share one session,
      their launcher's, which the scheduler's autogroups weigh against the host's session as
      one program. At 0 the pool and its host share the CPU as equals; above it, CPU-heavy
      jobs yield a core to the host's event loop, even while they unpickle and start. Whatever
      the niceness, each worker asks for the scheduler's shortest slice (Linux 6.12), so a host
      that wakes up takes a busy worker's CPU within 0.1 ms.
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
        warm_up: str | None = None,
        containment: str = "auto",
        nice: int = 0,
        scope_workers: bool = True,
        landlock_abi: int | None = None,
        seccomp: bool = True,
    ) -> None:
        # set first: __del__ must work on a pool whose constructor failed
        self.__started = False
        self.__close_task: asyncio.Task[None] | None = None
        self.__zygote: Zygote | None = None
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
        self.kill_grace = check_seconds("ProcessPool(kill_grace=...)", kill_grace, high=3600)
        self.preload = check_names("ProcessPool(preload=...)", preload, "module names")
        self.warm_up = _function_name(warm_up)
        self.nice = _count("nice", nice, 0, 19)
        self.__mode = check_choice("ProcessPool(containment=...)", containment, _CONTAINMENTS)
        self.scope_workers = check_flag("ProcessPool(scope_workers=...)", scope_workers)
        check_flag("ProcessPool(seccomp=...)", seccomp)
        self.landlock_abi = (
            None if landlock_abi is None else _count("landlock_abi", landlock_abi, 0, _ANY_ABI)
        )
        self.seccomp = seccomp
        self.__engine = PoolEngine(
            PoolOptions(
                max_workers=self.max_workers,
                spare_workers=self.spare_workers,
                max_jobs_per_worker=self.max_jobs_per_worker,
                max_frame_bytes=self.max_frame_bytes,
                max_buffered_events=self.max_buffered_events,
                max_buffered_bytes=self.max_buffered_bytes,
                kill_grace=self.kill_grace,
            )
        )
        self.__job_counter = 0

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        if not self.__started or self.__close_task is not None:
            return
        engine = self.__engine
        supervisor = engine.supervisor
        if supervisor is None:
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
        for worker in engine.workers.values():
            if worker.channel is not None:
                with contextlib.suppress(OSError):
                    worker.channel.sock.close()

    def __repr__(self) -> str:
        engine = self.__engine
        state = "closed" if engine.closed else "running" if self.__started else "new"
        return (
            f"<ProcessPool {state} containment={self.containment} max_workers={self.max_workers}"
            f" busy={len(engine.busy)} queued={len(engine.queue)} idle={len(engine.idle)}>"
        )

    @property
    def running(self) -> int:
        """Jobs running now (each in its own worker process); at most ``max_workers``."""
        return len(self.__engine.busy)

    @property
    def queued(self) -> int:
        """Jobs submitted and waiting for a worker because ``max_workers`` are running."""
        return len(self.__engine.queue)

    @property
    def containment(self) -> str:
        """``"cgroup"`` or ``"scan"`` once started; before that, the mode asked for."""
        containment = self.__engine.containment
        return containment.mode if containment is not None else self.__mode

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
          host that is not root, inherited inside a sandbox);
        - ``launcher_pid``: the current launcher's pid (every worker tree is below it), and
          ``cgroup``: the pool's cgroup directory (cgroup mode), which holds the launcher and
          every worker tree: what a supervisor outside this process kills when this process
          cannot (the Ray runner's reaper does).
        """
        return self.__engine.describe(self.containment)

    @property
    def tree_limits(self) -> frozenset[str]:
        """The limits this pool enforces on whole trees.

        The ``ProcessLimits`` fields this pool enforces on whole trees (``max_processes``,
        ``tree_memory_bytes``): those whose cgroup controller is enabled. Empty before start
        and under scan containment.
        """
        containment = self.__engine.containment
        return containment.tree_limits if containment is not None else frozenset()

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
        parent-death signal fires when the thread that spawned it ends. (A pool given a zygote,
        ``use_zygote``, asks it for its launcher from a helper thread instead, and spawns one
        itself only when the zygote gives none.)
        """
        engine = self.__engine
        if engine.closed:
            raise PoolClosed("start() after close(); create a new ProcessPool")
        if self.__started:
            return
        problem = linux_problem()
        if problem is not None:
            raise ProcessError(problem)
        loop = asyncio.get_running_loop()
        try:
            containment = _choice.create(self.__mode)
            containment.open(loop, engine.janitor)
        except OSError as exc:
            raise ProcessError(f"cannot contain worker processes: {exc}") from exc
        supervisor = LauncherSupervisor(
            loop,
            engine,
            preload=self.preload,
            warm_up=self.warm_up or "",
            max_frame_bytes=self.max_frame_bytes,
            cgroups={
                **containment.launcher_args(),
                # the launcher takes these out again (its arguments travel in one dict)
                "landlock_abi": str(-1 if self.landlock_abi is None else self.landlock_abi),
                "scope_workers": "1" if self.scope_workers else "0",
            },
            nice=self.nice,
            before_start=containment.launcher_starting,
            zygote=self.__zygote,
        )
        engine.attach(loop, containment, supervisor)
        self.__started = True
        _raise_fd_limit(2 * self.max_workers + 2 * self.spare_workers + 64)
        try:
            await supervisor.start()
        except BaseException:
            await self.close()
            raise
        engine.top_up()

    async def close(self) -> None:
        """Cancel every job, kill every process tree, reap everything, close every fd.

        Queued jobs end ``CANCELLED`` with ``PoolClosed``; running jobs are killed and end the
        same way once their trees are gone. Idempotent: later calls wait for the first one.
        Bounded: a launcher that does not exit within a few seconds is SIGKILLed.

        Cancellation: the shutdown continues in the background; a later ``close()`` waits
        for it.
        """
        if self.__close_task is None:
            engine = self.__engine
            if not self.__started:
                engine.closed = True
                return
            assert engine.loop is not None
            self.__close_task = engine.loop.create_task(engine.shutdown())
        await asyncio.shield(self.__close_task)

    def executor(self, *, results: str = "pickle") -> PoolExecutor:
        """A ``concurrent.futures.Executor`` over this started pool (``PoolExecutor``).

        ``submit`` from any thread, ``map``, ``shutdown``, ``loop.run_in_executor(executor, fn,
        *args)``; ``future.cancel()`` kills a running job's tree, and a crash fails only its own
        future. Its ``shutdown()`` leaves the pool open.

        ``results="pickle"`` (the default): results and exceptions come back pickled, as the
        standard library's executor returns them: the host unpickles what this executor's jobs
        return, so every job of this pool must be trusted (a job can tamper with a worker a
        later job reuses); ``results="json"``: JSON data and ``JobFailed``, as ``submit``
        (docs/threat-model.md). The host's ``multiprocessing`` authkey is not sent to a shared
        pool's workers (``ProcessPoolExecutor`` sends it to its own).

        Raises ``RuntimeError`` before ``start()``, ``PoolClosed`` after ``close()``, and
        ``ValueError`` for another ``results``.
        """
        mode = check_choice("ProcessPool.executor(results=...)", results, ("pickle", "json"))
        loop = self.__engine.loop
        if self.__engine.closed:
            raise PoolClosed("executor() after close(); create a new ProcessPool")
        if not self.__started or loop is None:
            raise RuntimeError("ProcessPool.executor() before start(); start the pool first")
        return PoolExecutor(self, loop, results="pickle" if mode == "pickle" else "json")

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
        if limits is None:
            limits = _NO_LIMITS
        else:
            limits = check_limits(limits, "ProcessPool.submit(limits=...)") or _NO_LIMITS
        if sandbox is not None:
            sandbox = check_sandbox(sandbox, "ProcessPool.submit(sandbox=...)")
        if sandbox is not None and (limits.env is not None or limits.cwd is not None):
            raise ValueError(
                "ProcessLimits.env and .cwd do not combine with a sandbox: its environment is "
                "minimal plus Sandbox.env, and its working directory is its scratch directory; "
                "pass the variables as Sandbox(env={...})"
            )
        engine = self.__engine
        loop, containment = engine.loop, engine.containment
        if engine.closed or engine.broken is not None:
            raise PoolClosed(
                engine.broken or "submit() after close(); create a new ProcessPool for new jobs"
            )
        if not self.__started or loop is None or containment is None:
            raise RuntimeError(
                "ProcessPool.submit() before start(); use 'async with ProcessPool() as pool:' "
                "or 'await pool.start()' first"
            )
        # tree-wide limits are among those that apply in the child (none by default)
        missing = (
            set(limits.tree_wide) - containment.tree_limits
            if limits is not _NO_LIMITS and limits.applies_in_child
            else None
        )
        if missing:
            raise ValueError(
                f"this pool cannot enforce ProcessLimits.{', '.join(sorted(missing))} (limits on "
                f"a whole process tree need containment='cgroup' with the matching cgroup v2 "
                f"controller enabled; this pool uses containment={self.containment!r} and "
                f"enforces {sorted(self.tree_limits) or 'none'}); use memory_bytes/cpu_seconds "
                "(per process) instead, or run where the controllers are delegated"
            )
        payload = pickle_job(fn, args, kwargs, limits)
        if not engine.coroutines and inspect.iscoroutinefunction(fn):
            engine.coroutines = True
        scratch = None
        if sandbox is not None:
            scratch, header = self.__sandbox_header(sandbox)
            payload = b"".join((HEADER.pack(len(header)), header, payload))
        self.__job_counter += 1
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        core = JobCore(
            engine,
            loop,
            payload,
            limits,
            f"#{self.__job_counter} {name}",
            self.max_buffered_events,
            sandbox,
        )
        if scratch is not None:
            core.scratch = scratch
        engine.queue.append(core)
        engine.dispatch(replace_now=False)
        return ProcessJob(core)

    def __sandbox_header(self, sandbox: Sandbox) -> tuple[str, bytes]:
        """The job's scratch directory and the policy its worker enforces (as JSON)."""
        account = _sandbox.resolve_account(sandbox.user)
        shared = _policy.shared_part(
            sandbox,
            account,
            landlock_abi=_ANY_ABI if self.landlock_abi is None else self.landlock_abi,
            seccomp=self.seccomp,
        )
        scratch = self.__engine.job_scratch(shared)
        return scratch, _policy.policy(sandbox, scratch, shared)


def _raise_fd_limit(needed: int) -> None:
    """Raise the soft limit on open files for the workers.

    Raise this process's soft ``RLIMIT_NOFILE`` towards ``needed`` (two descriptors per
    worker: its socket and a pidfd) if the hard limit allows; never lower it.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def engine_of(pool: ProcessPool) -> PoolEngine:
    """The engine of ``pool``: its workers, jobs, launcher and containment.

    For the engine's own modules and its tests. The pool keeps it name-mangled
    (``ProcessPool.__engine``), so a subclass's attributes never collide with it.
    """
    engine: PoolEngine = vars(pool)["_ProcessPool__engine"]
    return engine


def use_zygote(pool: ProcessPool, zygote: Zygote) -> None:
    """Have ``pool`` get its launchers forked by ``zygote`` (``_child._zygote``), from ``start``.

    For the Ray runner's node pools, many of which on one machine import the same modules.
    Set before ``start``; a pool whose zygote gives no launcher starts its own.
    """
    vars(pool)["_ProcessPool__zygote"] = zygote
