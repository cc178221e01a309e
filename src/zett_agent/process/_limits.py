"""Per-job resource limits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ProcessLimits"]


@dataclass(frozen=True)
class ProcessLimits:
    """Limits applied to one job.

    - ``timeout``: wall-clock seconds, measured by the parent from dispatch; when it passes the
      job's whole process tree is killed and the job fails with ``JobTimeout``.
    - ``memory_bytes``: ``RLIMIT_AS`` of the worker (inherited by its children). A
      ``MemoryError`` in the job, or a death by signal while this limit is set, fails the job
      with ``LimitExceeded("memory_bytes", ...)``.
    - ``cpu_seconds``: ``RLIMIT_CPU`` of the worker (rounded up to whole seconds, the kernel's
      unit); the kernel sends ``SIGXCPU`` and the job fails with ``LimitExceeded("cpu_seconds")``.
    - ``max_open_files``: ``RLIMIT_NOFILE`` of the worker.
    - ``env``: when given, replaces the child's environment entirely.
    - ``cwd``: working directory of the job.

    A worker that ran a job with any of the child-side limits set is never reused.

    Raises ``ValueError`` for a non-positive number.
    """

    timeout: float | None = None
    memory_bytes: int | None = None
    cpu_seconds: float | None = None
    max_open_files: int | None = None
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    #: computed once (read for every job): whether any child-side limit is set
    _in_child: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("timeout", "memory_bytes", "cpu_seconds", "max_open_files"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"ProcessLimits.{name} must be positive or None, got {value!r}")
        in_child = any(
            value is not None
            for value in (self.memory_bytes, self.cpu_seconds, self.max_open_files, self.env)
        )
        object.__setattr__(self, "_in_child", in_child or self.cwd is not None)

    @property
    def applies_in_child(self) -> bool:
        """Whether the worker process must change itself (rlimits, env or cwd) for this job."""
        return self._in_child

    def child_spec(self) -> dict[str, Any]:
        """The plain data the worker needs to apply the child-side limits."""
        return {
            "memory_bytes": self.memory_bytes,
            "cpu_seconds": self.cpu_seconds,
            "max_open_files": self.max_open_files,
            "env": None if self.env is None else {str(k): str(v) for k, v in self.env.items()},
            "cwd": self.cwd,
        }
