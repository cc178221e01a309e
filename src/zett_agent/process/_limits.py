"""Per-job resource limits, checked when they are made."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._checks import check_env

__all__ = ["ProcessLimits", "check_limits"]

#: the largest value the kernel takes for an rlimit (RLIM_INFINITY is 2**64 - 1)
_RLIM_MAX = 2**63 - 1
#: longest timeout: asyncio's timers take seconds as floats; a year is more than any job needs
_MAX_TIMEOUT = 365 * 24 * 3600.0

#: name -> (kind, lowest, highest, what it is); kind "int" takes int only, "seconds" int or float
_NUMBERS: dict[str, tuple[str, float, float, str]] = {
    "timeout": ("seconds", 0.0, _MAX_TIMEOUT, "wall-clock seconds"),
    "memory_bytes": ("int", 1, _RLIM_MAX, "bytes of address space per process"),
    "cpu_seconds": ("seconds", 0.0, float(_RLIM_MAX), "CPU seconds per process"),
    "max_open_files": ("int", 1, 2**31 - 1, "open file descriptors per process"),
    "max_processes": ("int", 1, 2**31 - 1, "processes and threads in the job's tree"),
    "tree_memory_bytes": ("int", 1, _RLIM_MAX, "bytes of memory of the job's whole tree"),
}


def _check_number(name: str, value: object) -> None:
    kind, low, high, unit = _NUMBERS[name]
    accepted = "an int" if kind == "int" else "an int or a float"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"ProcessLimits.{name} must be {accepted} ({unit}) or None, got "
            f"{type(value).__name__} {value!r:.60}"
        )
    if kind == "int" and not isinstance(value, int):
        raise TypeError(
            f"ProcessLimits.{name} must be an int ({unit}), got {value!r}; round it, for "
            f"example {name}={math.ceil(value) if math.isfinite(value) else 'None'}"
        )
    if kind == "int":
        fits = low <= value <= high
        accepted = f"from {low:,} to {int(high):,}"
    else:
        fits = math.isfinite(value) and low < value <= high
        accepted = f"greater than 0 and at most {high:,.0f}"
    if not fits:
        hint = " (use None for no limit)" if value == math.inf else ""
        raise ValueError(f"ProcessLimits.{name} must be {accepted} ({unit}), got {value!r}{hint}")


@dataclass(frozen=True)
class ProcessLimits:
    """Limits applied to one job. Every field defaults to ``None``: no limit.

    - ``timeout``: wall-clock seconds, measured by the parent from dispatch; when it passes the
      job's whole process tree is killed and the job fails with ``JobTimeout``.
    - ``memory_bytes``: ``RLIMIT_AS`` (address space, not resident memory) of the worker and,
      inherited, of each process it starts: each process on its own, not their sum. A
      ``MemoryError`` in the job, or a death by signal while this limit is set, fails the job
      with ``LimitExceeded("memory_bytes", ...)``.
    - ``cpu_seconds``: ``RLIMIT_CPU`` of the worker (rounded up to whole seconds, the kernel's
      unit), likewise per process; the kernel sends ``SIGXCPU`` and the job fails with
      ``LimitExceeded("cpu_seconds")``.
    - ``max_open_files``: ``RLIMIT_NOFILE`` of the worker.
    - ``max_processes``: processes (and threads) of the job's whole tree at once, the cgroup's
      ``pids.max``: a fork beyond it fails in the job with ``BlockingIOError``.
    - ``tree_memory_bytes``: memory of the job's whole tree, the cgroup's ``memory.max``; the
      kernel's OOM killer ends the tree and the job fails with ``LimitExceeded``.
    - ``env``: when given, replaces the child's environment entirely.
    - ``cwd``: working directory of the job.

    ``max_processes`` and ``tree_memory_bytes`` bound the tree as a whole, so they need cgroup
    containment with the ``pids`` or ``memory`` controller enabled (see
    ``ProcessPool.tree_limits``); ``submit`` refuses a job that sets one where the pool cannot
    enforce it. A worker that ran a job with any limit other than ``timeout`` is never reused.

    Raises ``TypeError`` for a value of the wrong type (a float where bytes or a count are
    expected, a string, a bool) and ``ValueError`` for one out of range (zero, negative, NaN,
    infinite, beyond what the kernel accepts); both name the field and what it accepts.
    """

    timeout: float | None = None
    memory_bytes: int | None = None
    cpu_seconds: float | None = None
    max_open_files: int | None = None
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    max_processes: int | None = None
    tree_memory_bytes: int | None = None
    #: computed once (read for every job): whether any child-side limit is set
    _in_child: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in _NUMBERS:
            value = getattr(self, name)
            if value is not None:
                _check_number(name, value)
        if self.env is not None:
            check_env("ProcessLimits.env", self.env)
        if self.cwd is not None and not isinstance(self.cwd, str):
            raise TypeError(
                f"ProcessLimits.cwd must be a str path or None, got {type(self.cwd).__name__}"
            )
        in_child = any(
            value is not None
            for value in (
                self.memory_bytes,
                self.cpu_seconds,
                self.max_open_files,
                self.env,
                self.cwd,
                self.max_processes,
                self.tree_memory_bytes,
            )
        )
        object.__setattr__(self, "_in_child", in_child)

    @property
    def applies_in_child(self) -> bool:
        """Whether the job changes its worker (rlimits, env, cwd, cgroup limits).

        Such a worker runs no other job afterwards.
        """
        return self._in_child

    @property
    def tree_wide(self) -> dict[str, int]:
        """The limits that need a cgroup controller: ``{field name: value}``."""
        out = {}
        if self.max_processes is not None:
            out["max_processes"] = self.max_processes
        if self.tree_memory_bytes is not None:
            out["tree_memory_bytes"] = self.tree_memory_bytes
        return out

    def child_spec(self) -> dict[str, Any]:
        """The plain data the worker needs to apply the per-process limits."""
        return {
            "memory_bytes": self.memory_bytes,
            "cpu_seconds": self.cpu_seconds,
            "max_open_files": self.max_open_files,
            "env": None if self.env is None else dict(self.env),
            "cwd": self.cwd,
        }


def check_limits(limits: object, where: str) -> ProcessLimits | None:
    """Return ``limits`` if it is a ``ProcessLimits`` or ``None``.

    Else raise ``TypeError`` naming ``where`` it was passed and how to build one.
    """
    if limits is None or isinstance(limits, ProcessLimits):
        return limits
    if isinstance(limits, Mapping):
        fix = f"ProcessLimits(**{dict(limits)!r:.80})"
    else:
        fix = "ProcessLimits(timeout=..., memory_bytes=...)"
    raise TypeError(
        f"{where} takes a zett_agent.process.ProcessLimits or None, got "
        f"{type(limits).__name__}; pass {fix}"
    )
