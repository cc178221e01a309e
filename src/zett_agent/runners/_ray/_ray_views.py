"""Whether a process id or a path means the same thing here as in another process.

A tree the driver kills from outside is named by pids and paths its node reported; they are
valid here only if this process sees the same kernel, pid namespace and mount namespace
(``views``), and a pid names the same process only with its start time (``process_start``),
which survives pid reuse (read by the engine's ``start_time``). Light: imported by Ray
workers, reapers and the driver.
"""

from __future__ import annotations

import os

from zett_agent.process._containment._scan import start_time as process_start

__all__ = ["process_start", "views"]


def views() -> list[str]:
    """What makes one process's paths and pids valid in another.

    What makes one process's paths and pids valid in another: the same kernel (boot id), the same
    pid namespace and the same mount namespace. Equal lists: equal views.
    """
    out = []
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            out.append(handle.read().strip())
    except OSError:
        out.append("")
    for name in ("pid", "mnt"):
        try:
            out.append(os.readlink(f"/proc/self/ns/{name}"))
        except OSError:
            out.append("")
    return out
