"""Whether a process the tests started is still alive, one definition for every test."""

from __future__ import annotations

import psutil


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process: one that can still run code or hold memory.

    Not alive: gone, a zombie, or a killed process in the last step of its exit. cgroup v2
    reports a cgroup empty as its last process leaves it, in the kernel's exit path after the
    process released its address space and files and before it becomes a zombie; for that
    moment ``/proc`` still shows it, with no memory (``statm`` all zeros). Every process these
    tests start has memory while it runs.
    """
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        with open(f"/proc/{pid}/statm") as statm:
            return any(int(field) for field in statm.read().split())
    except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
        return False


def gone(pid: int) -> bool:
    """Whether ``pid`` is no live process (gone, a zombie, or in its last exit step)."""
    return not alive(pid)
