"""Helpers of the Ray tests: whether processes are dead, waiting on pidfds."""

from __future__ import annotations

import os
import select
import time

import psutil


def gone(pid: int) -> bool:
    """Whether a process is dead (reaped, or a zombie awaiting its parent)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Pids still alive after waiting on their pidfds (a hang guard, not a sleep)."""
    deadline = time.monotonic() + timeout
    alive = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(fd)
        if not gone(pid):
            alive.append(pid)
    return alive
