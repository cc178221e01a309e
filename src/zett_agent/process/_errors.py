"""The errors of the process engine: one base class, one meaning per subclass.

A job ends with exactly one of these (or with its result). Each message says what happened and
what to change so it does not happen again; details of a lower-level cause are chained with
``from`` (see ``__cause__``). ``asyncio.CancelledError`` is never wrapped.
"""

from __future__ import annotations

__all__ = [
    "JobCancelled",
    "JobFailed",
    "JobTimeout",
    "LimitExceeded",
    "PoolClosed",
    "ProcessError",
    "ProtocolError",
    "WorkerCrashed",
]


class ProcessError(Exception):
    """Base class of every error the process engine raises for a job or a pool."""


class JobFailed(ProcessError):
    """The job's function raised in the child.

    ``type_name`` is the remote exception's type (``"ValueError"``, ``"mypkg.MyError"``),
    ``message`` its ``str()``, ``traceback_text`` the child's formatted traceback. The remote
    exception object itself is never sent back: the parent does not unpickle child data.
    """

    def __init__(self, type_name: str, message: str, traceback_text: str = "") -> None:
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text
        super().__init__(type_name, message, traceback_text)

    def __str__(self) -> str:
        text = (
            f"the job raised {self.type_name}: {self.message}"
            if self.message
            else (f"the job raised {self.type_name}")
        )
        return text

    def __reduce__(self) -> tuple[type[JobFailed], tuple[str, str, str]]:
        return (type(self), (self.type_name, self.message, self.traceback_text))


class WorkerCrashed(ProcessError):
    """The child process died before it sent a result.

    Exactly one of ``exitcode`` (it exited, e.g. ``os._exit(3)``) or ``signal_name`` (it was
    killed by a signal, e.g. ``"SIGSEGV"``) is set when the exit status is known. Both are
    ``None`` when it is not: then ``reason`` says why (the pool's launcher process died or
    stopped answering, and took the worker with it; the details are in ``__cause__``).
    """

    def __init__(
        self, exitcode: int | None, signal_name: str | None, reason: str | None = None
    ) -> None:
        self.exitcode = exitcode
        self.signal_name = signal_name
        self.reason = reason
        super().__init__(exitcode, signal_name, reason)

    def __str__(self) -> str:
        if self.reason is not None:
            return f"the worker process was killed before sending a result: {self.reason}"
        if self.signal_name is not None:
            how = f"was killed by {self.signal_name}"
        elif self.exitcode is not None:
            how = f"exited with code {self.exitcode}"
        else:
            how = "disappeared (its exit status is unknown)"
        return (
            f"the worker process {how} before sending a result; the job's code crashed the "
            "process (native crash, os._exit, os.abort, or a signal from outside)"
        )

    def __reduce__(
        self,
    ) -> tuple[type[WorkerCrashed], tuple[int | None, str | None, str | None]]:
        return (type(self), (self.exitcode, self.signal_name, self.reason))


class JobTimeout(ProcessError):
    """The job ran longer than ``ProcessLimits.timeout`` seconds; its process tree was killed."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        super().__init__(timeout)

    def __str__(self) -> str:
        return (
            f"the job did not finish within its timeout of {self.timeout:g} s and its process "
            "tree was killed; raise ProcessLimits.timeout or make the job do less"
        )

    def __reduce__(self) -> tuple[type[JobTimeout], tuple[float]]:
        return (type(self), (self.timeout,))


def human_bytes(value: float) -> str:
    """``536870912`` -> ``"512 MiB"``; ``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            text = f"{value:.1f}".rstrip("0").rstrip(".")
            return f"{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


#: what each limit measures, and how the measured value reads, for LimitExceeded's message
_MEASURES = {
    "memory_bytes": (
        "address space per process (RLIMIT_AS counts memory reserved, not only memory used, "
        "so the peak resident size{reached} can be far lower)",
        " of {}",
    ),
    "cpu_seconds": ("CPU time per process (RLIMIT_CPU{reached})", "; used {}"),
    "tree_memory_bytes": ("memory of the whole process tree (memory.max{reached})", "; peak {}"),
    "max_processes": ("processes of the whole tree (pids.max{reached})", "; {}"),
}


class LimitExceeded(ProcessError):
    """The job hit a resource limit of its ``ProcessLimits``.

    ``limit`` names the field (``"memory_bytes"``, ``"cpu_seconds"``, ``"tree_memory_bytes"``),
    ``value`` is the configured limit, ``reached`` what was measured (peak resident bytes for
    memory, CPU seconds for CPU; ``None`` when unknown).
    """

    def __init__(self, limit: str, value: float, reached: float | None) -> None:
        self.limit = limit
        self.value = value
        self.reached = reached
        super().__init__(limit, value, reached)

    def _amount(self, value: float) -> str:
        if self.limit.endswith("bytes"):
            return human_bytes(value)
        if self.limit == "cpu_seconds":
            return f"{value:g} s"
        return f"{value:g}"

    def __str__(self) -> str:
        measures, reached = _MEASURES.get(self.limit, (self.limit + "{reached}", "; {}"))
        shown = "" if self.reached is None else reached.format(self._amount(self.reached))
        return (
            f"the job exceeded its limit {self.limit}={self._amount(self.value)}: "
            f"{measures.format(reached=shown)}; raise ProcessLimits.{self.limit} or make the "
            "job use less"
        )

    def __reduce__(self) -> tuple[type[LimitExceeded], tuple[str, float, float | None]]:
        return (type(self), (self.limit, self.value, self.reached))


class ProtocolError(ProcessError):
    """The child wrote bytes that break the frame protocol; its process tree was killed.

    Typical causes: something in the job wrote to the pool's private socket, or a frame was
    larger than ``max_frame_bytes``.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)

    def __str__(self) -> str:
        return f"the worker broke the pool protocol and was killed: {self.reason}"

    def __reduce__(self) -> tuple[type[ProtocolError], tuple[str]]:
        return (type(self), (self.reason,))


class PoolClosed(ProcessError):
    """The pool was closed: the job was dropped or killed, or ``submit`` came after ``close``."""

    def __init__(self, message: str = "the process pool is closed") -> None:
        super().__init__(message)


class JobCancelled(ProcessError):
    """The job was cancelled with ``ProcessJob.cancel()`` (or its awaiter was cancelled)."""

    def __init__(self, message: str = "the job was cancelled and its process tree killed") -> None:
        super().__init__(message)
