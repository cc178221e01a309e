"""Finding and killing a process tree without cgroups: freeze, enumerate, kill.

Descendants are found by a scan of ``/proc/*/stat`` (parent pid and state; this kernel has no
``/proc/PID/task/TID/children``). A process tree can change while it is being scanned, so the
tree is frozen first: every member found gets ``SIGSTOP`` (a stopped process can neither fork
nor reap), and the scan repeats until it finds no new member and every member is seen stopped.
Only then does everything get ``SIGKILL``. Killed processes become zombies that end up with the
nearest subreaper (the worker, then the launcher), which reaps them.

Imported by the launcher and the worker, so it imports nothing heavy.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

__all__ = ["children_of", "descendants", "freeze_and_kill", "scan", "signal_tree"]

#: process states in which a process can no longer fork: stopped, traced, zombie, dead
_FROZEN_STATES = frozenset("TtZXx")

#: how long to keep rescanning a tree that will not settle before killing what was found
_FREEZE_DEADLINE = 0.02


def scan() -> dict[int, tuple[int, str]]:
    """Return ``{pid: (ppid, state)}`` for every process visible in ``/proc``."""
    out: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            data = os.read(fd, 1024)
        except OSError:
            continue
        finally:
            os.close(fd)
        # the command name is in parentheses and may contain spaces or parentheses
        rest = data[data.rfind(b")") + 2 :].split(b" ", 2)
        if len(rest) < 2:
            continue
        out[int(name)] = (int(rest[1]), rest[0].decode("ascii", "replace"))
    return out


def children_of(procs: dict[int, tuple[int, str]], pid: int) -> set[int]:
    """Direct children of ``pid`` in a ``scan()`` result."""
    return {child for child, (ppid, _state) in procs.items() if ppid == pid}


def descendants(procs: dict[int, tuple[int, str]], roots: Iterable[int]) -> set[int]:
    """``roots`` that still exist plus all their descendants in a ``scan()`` result."""
    by_parent: dict[int, list[int]] = {}
    for pid, (ppid, _state) in procs.items():
        by_parent.setdefault(ppid, []).append(pid)
    found = {pid for pid in roots if pid in procs}
    todo = list(found)
    while todo:
        for child in by_parent.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _send(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def signal_tree(roots: Iterable[int], signum: int) -> set[int]:
    """Send ``signum`` to ``roots`` and every descendant found by one scan; return them."""
    tree = descendants(scan(), roots)
    return {pid for pid in tree if _send(pid, signum)}


def _state(pid: int) -> str | None:
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 1024)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data[data.rfind(b")") + 2 :][:1].decode("ascii", "replace")


def _await_stopped(pids: Iterable[int], deadline: float) -> None:
    for pid in pids:
        while (state := _state(pid)) is not None and state not in _FROZEN_STATES:
            if time.monotonic() > deadline:
                return
            # the target must get a CPU to act on SIGSTOP, and it may be queued behind us:
            # sleep (sched_yield does not reliably hand the CPU over)
            time.sleep(0.0001)


def freeze_and_kill(roots: Iterable[int]) -> set[int]:
    """Stop ``roots`` and all their descendants until the tree is stable, then SIGKILL it all.

    Returns every pid that was signalled; each one is dead or dying when this returns, and will
    be reaped by its subreaper. Blocks for about one ``/proc`` scan per level of the tree that
    is still forking (a single scan for a tree that is just its roots); a tree that never
    settles is killed after ``_FREEZE_DEADLINE`` as far as it was found.
    """
    root_set = set(roots)
    if not root_set:
        return set()
    stopped = {pid for pid in root_set if _send(pid, signal.SIGSTOP)}
    deadline = time.monotonic() + _FREEZE_DEADLINE
    # wait until the roots are really stopped: from then on they cannot fork, so a scan that
    # finds no new process proves the tree complete
    _await_stopped(stopped, deadline)
    while True:
        procs = scan()
        tree = descendants(procs, root_set)
        new = tree - stopped
        for pid in new:
            if _send(pid, signal.SIGSTOP):
                stopped.add(pid)
        if not new and all(procs[pid][1] in _FROZEN_STATES for pid in tree):
            break
        if time.monotonic() > deadline:
            break
        _await_stopped(new, deadline)  # as for the roots: stopped before the next scan
    for pid in stopped:
        _send(pid, signal.SIGKILL)
    return stopped
