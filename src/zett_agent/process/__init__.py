"""The process engine: an asyncio-native process pool with hard kill, limits and streaming.

See ``ProcessPool``. Every job runs in its own worker process (fresh by default), results and
events come back as JSON, and cancelling a job kills its whole process tree.
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
