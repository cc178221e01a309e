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
  job raises ``TypeError`` from ``submit``). Child to parent: JSON only, in length-prefixed
  frames with a size cap; the parent never unpickles child data.
- ``cancel()``, timeouts, protocol errors and ``close()`` kill the job's whole process tree
  (grandchildren and ``setsid`` escapees included) and return only once it is gone. A job
  never leaves processes behind, even when it ends normally.
- Outcomes: the result, or ``JobFailed`` (the job raised), ``WorkerCrashed`` (died),
  ``JobTimeout``, ``LimitExceeded``, ``ProtocolError``, ``JobCancelled``, ``PoolClosed``; all
  subclasses of ``ProcessError``.
- If the host dies, even by SIGKILL, the launcher kills every worker tree and exits.
"""

from __future__ import annotations

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
from ._job import JobStatus, JobUsage, ProcessJob
from ._limits import ProcessLimits
from ._pool import ProcessPool
from ._worker import emit

__all__ = [
    "JobCancelled",
    "JobFailed",
    "JobStatus",
    "JobTimeout",
    "JobUsage",
    "LimitExceeded",
    "PoolClosed",
    "ProcessError",
    "ProcessJob",
    "ProcessLimits",
    "ProcessPool",
    "ProtocolError",
    "WorkerCrashed",
    "emit",
]
