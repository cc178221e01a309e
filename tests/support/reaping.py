"""Reaping what a test process adopted as a child subreaper (see tests/conftest.py).

A host that exits without ``close()``, or a pool whose launcher is killed, leaves processes
whose parent died: they are reparented to the test process, which must check they exited and
reap them (on a real machine that is PID 1's job; this one's PID 1 never reaps). Tests that
orphan processes on purpose call ``reap_adopted`` at their end; a live orphan fails them.
"""

from __future__ import annotations

import contextlib
import os
import time

import psutil


def reap_adopted(within: float = 5.0) -> list[int]:
    """Wait until no child of this process is alive (within ``within`` seconds, a hang guard),
    reap them all, return their pids; raise ``AssertionError`` naming live ones."""
    deadline = time.monotonic() + within
    while True:
        children = psutil.Process().children()
        alive = []
        for child in children:
            with contextlib.suppress(psutil.Error):
                if child.status() != psutil.STATUS_ZOMBIE:
                    alive.append(child)
        if not alive:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"adopted processes still alive: {alive}")
        time.sleep(0.01)
    reaped = []
    for child in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child.pid, 0)
            reaped.append(child.pid)
    return reaped
