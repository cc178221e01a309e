"""The process engine: an asyncio-native process pool with hard kill, limits and streaming.

::

    async with ProcessPool(max_workers=4) as pool:
        job = pool.submit(fn, *args, limits=ProcessLimits(timeout=30, memory_bytes=2**30))
        async for event in job.events():   # what fn passed to emit() in the child
            ...
        result = await job                 # or: await job.cancel()

- Every job runs in a worker process (a fresh one per job by default), forked ahead of demand
  by a per-pool launcher process that never imports the host's ``__main__``.
- Parent to child: cloudpickle (lambdas, closures, ``__main__`` functions work; an unpicklable
  job raises ``TypeError`` from ``submit``). Child to parent: JSON only, in small frames whose
  decoded size counts against a per-job budget (``max_buffered_bytes``); the parent never
  unpickles child data, and data JSON would change (a non-``str`` key) is refused. The one
  door that does unpickle, by choice, is the ``concurrent.futures`` Executor's default mode
  (``ProcessPoolExecutor``, ``pool.executor()``): the standard library's semantics, for jobs the
  program trusts (``results="json"`` keeps the strict wire).
- Containment (``ProcessPool(containment=...)``): a cgroup v2 per worker where the machine
  allows (kill with ``cgroup.kill``, atomic against forks), else freezes found by walking
  ``/proc``. ``cancel()``, timeouts, protocol errors and ``close()`` kill the job's whole process
  tree (grandchildren and ``setsid`` escapees included) from the host, and return only once it
  exited; a job's processes are killed as soon as its answer arrives.
- Nothing a job can do to its worker or to the launcher changes what the supervisor does: exit
  statuses, forged frames, a cleared subreaper flag, a stopped or killed launcher (which is
  replaced; the jobs it ran fail naming why). On Linux 6.12 and newer every worker is in a
  Landlock domain of its own, so no job can signal or ``ptrace`` its launcher, the host or any
  process outside its tree in the first place (``ProcessPool.containment_info``).
- ``submit(fn, sandbox=Sandbox(...))`` confines a job before any of its code runs: the files it
  may read and write (Landlock), no network, a seccomp filter, a minimal environment, a scratch
  directory, and an unprivileged account (or uid 0 without any capability) when the host is
  root. ``sandbox_support()`` says what this machine can enforce; a required sandbox that it
  cannot fails the job with ``SandboxUnavailable``.
- Outcomes: the result, or ``JobFailed`` (the job raised), ``WorkerCrashed`` (died),
  ``JobTimeout``, ``LimitExceeded``, ``ProtocolError``, ``JobCancelled``, ``PoolClosed``; all
  subclasses of ``ProcessError``.
- If the host dies, even by SIGKILL, the launcher kills every worker tree and exits.

Linux 5.3 or newer (pidfds); cgroup containment needs a writable cgroup v2 hierarchy and 5.14.
"""

from __future__ import annotations

from ._child._worker import emit
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
from ._host._executor import PoolExecutor
from ._host._job import JobStatus, JobUsage, ProcessJob
from ._host._pool import ProcessPool
from ._host._process_executor import ProcessPoolExecutor
from ._limits import ProcessLimits
from ._sandbox._egress import Egress
from ._sandbox._options import Sandbox, SandboxUnavailable, sandbox_support

__all__ = [
    "Egress",
    "JobCancelled",
    "JobFailed",
    "JobStatus",
    "JobTimeout",
    "JobUsage",
    "LimitExceeded",
    "PoolClosed",
    "PoolExecutor",
    "ProcessError",
    "ProcessJob",
    "ProcessLimits",
    "ProcessPool",
    "ProcessPoolExecutor",
    "ProtocolError",
    "Sandbox",
    "SandboxUnavailable",
    "WorkerCrashed",
    "emit",
    "sandbox_support",
]
