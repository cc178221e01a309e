"""What a job ends with when its worker answered with an error, or died without an answer.

Pure mappings, no state: a worker's error report becomes ``JobFailed`` (or ``LimitExceeded``
when a ``MemoryError`` meets a memory limit); a death becomes the pool's kill reason when the
pool killed it, else ``WorkerCrashed``, or ``LimitExceeded`` when a limit explains the signal.
"""

from __future__ import annotations

import signal
from typing import Any

from .._errors import (
    JobCancelled,
    JobFailed,
    LimitExceeded,
    PoolClosed,
    ProcessError,
    WorkerCrashed,
)
from .._limits import ProcessLimits
from ._job_core import JobStatus

__all__ = ["death_outcome", "failure_error", "signal_name"]


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal 77`` for a number that names no signal."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def failure_error(
    limits: ProcessLimits, type_name: str, text: str, traceback_text: str, peak: int
) -> ProcessError:
    """The error of a job whose code raised (as its worker reported it)."""
    error: ProcessError = JobFailed(type_name, text, traceback_text)
    memory = limits.memory_bytes
    if type_name == "MemoryError" and memory is not None:
        failed = error
        error = LimitExceeded("memory_bytes", memory, peak)
        error.__cause__ = failed
    return error


def death_outcome(
    limits: ProcessLimits, report: dict[str, Any], reason: BaseException | None
) -> tuple[JobStatus, BaseException, float, int]:
    """How a job whose worker died without answering ends: status, error, CPU and peak RSS.

    ``report`` is the launcher's exit report of the worker (empty if none came); ``reason``
    the pool's kill reason, which wins when there is one.
    """
    cpu, peak = float(report.get("cpu") or 0.0), int(report.get("maxrss") or 0)
    if reason is not None:
        status = (
            JobStatus.CANCELLED
            if isinstance(reason, JobCancelled | PoolClosed)
            else JobStatus.FAILED
        )
        return status, reason, cpu, peak
    signum = report.get("signal")
    crashed = WorkerCrashed(
        report.get("code"), None if signum is None else signal_name(int(signum))
    )
    error: ProcessError = crashed
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
    return JobStatus.FAILED, error, cpu, peak
