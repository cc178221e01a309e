"""Killing a Ray child's tree from outside its Ray worker, when the worker cannot do it.

The normal cancel needs no help: the task has its node's pool kill the child (see
``_ray_task``). When that is not confirmed in time (a Ray worker that is stopped, stuck, or
dead), the driver kills from outside, with the *tree* the task reported: the Ray worker (pid
and start time), its pool's launcher, and, in cgroup mode, the pool's cgroup directory, which
holds the launcher and every worker tree of that pool. ``kill_tree`` kills all of it and
waits until it is gone, with the engine's own kit (``process._cgroup``, ``process._scan``):

- cgroup mode: ``cgroup.kill`` on the pool's cgroup (atomic against forks), then the Ray
  worker and what is below it are frozen and killed;
- scan mode: the Ray worker and the launcher are frozen with everything below them (a stopped
  subreaper still collects the orphans of its tree, so nothing escapes between rounds), then
  killed.

It runs in a thread of the driver when the tree is on the driver's machine, else in the node's
*reaper* (``Reaper``, one Ray actor per node), which the driver judges by whether it answers in
time, not by whether it exists: one that does not (stopped, overloaded) is killed and
replaced. A reaper, the Ray worker and the launcher are outside every child's Landlock domain:
where the kernel scopes domains (Linux 6.12), no child can signal or trace any of them.

Stdlib and the engine's kit only (no Ray): the reaper imports it on its node.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from typing import Any

from zett_agent.process._containment import _cgroup, _scan

__all__ = ["Reaper", "kill_tree"]


def _pidfd(entry: object) -> tuple[int, int] | None:
    """``(pid, pidfd)`` of a ``[pid, start time]`` entry if that process still runs."""
    if not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], int):
        return None
    pid, start = entry
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    from zett_agent.runners._ray._ray_views import process_start

    if start is not None and process_start(pid) != start:
        os.close(fd)
        return None
    return pid, fd


def _wait_empty(cgroup: str, deadline: float) -> bool:
    """Wait until no process is left in ``cgroup``.

    Wait until no process is left in ``cgroup`` (the kernel flags ``cgroup.events`` to ``poll`` with
    POLLPRI whenever its ``populated`` line changes).
    """
    try:
        fd = os.open(f"{cgroup}/cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        return not _cgroup.populated(cgroup)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLPRI | select.POLLERR)
        while True:
            os.lseek(fd, 0, os.SEEK_SET)
            if b"populated 1" not in os.read(fd, 4096):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller.poll(int(min(left, 0.5) * 1000) + 1)  # 0.5 s: should a change be missed
    except OSError:
        return not _cgroup.populated(cgroup)
    finally:
        os.close(fd)


def kill_tree(tree: dict[str, Any], timeout: float) -> bool:
    """Kill a child's Ray worker, its pool and every tree in it; True once all are gone.

    Idempotent; correct from any process of the tree's machine that is not in it (the driver
    on the same machine, the node's reaper). Bounded by ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    roots: dict[int, int] = {}
    try:
        for key in ("worker", "launcher"):
            found = _pidfd(tree.get(key))
            if found is not None:
                roots[found[0]] = found[1]
        cgroup = tree.get("cgroup")
        if isinstance(cgroup, str) and cgroup:
            _cgroup.kill(cgroup)
        killed = _scan.freeze_and_kill(roots, pidfds=roots)
        gone = _scan.wait_dead(killed, max(0.0, deadline - time.monotonic()))
        for fd in roots.values():
            gone = _readable(fd, max(0.0, deadline - time.monotonic())) and gone
        if isinstance(cgroup, str) and cgroup:
            gone = _wait_empty(cgroup, deadline) and gone
            # its launcher was killed too, so nobody else removes it now
            with contextlib.suppress(OSError):
                _cgroup.remove_tree(cgroup)
                os.rmdir(os.path.dirname(cgroup))  # the shared one, if now empty
        return gone
    finally:
        for fd in roots.values():
            os.close(fd)


def _readable(fd: int, timeout: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    try:
        return bool(poller.poll(max(0, int(timeout * 1000))))
    except OSError:
        return False


class Reaper:
    """One per node and driver (a Ray actor, ``num_cpus=0``).

    It kills trees on its node, and passes the driver's messages on to the inboxes of the
    children there (``_ray_inbox``) when the driver runs on another machine.
    """

    def kill(self, tree: dict[str, Any], timeout: float) -> bool:
        return kill_tree(tree, timeout)

    def send(self, path: str, line: bytes, timeout: float) -> bool:
        """Hand one request to the child's inbox at ``path``; ``RuntimeError`` if not taken."""
        from zett_agent.runners._ray._ray_inbox import deliver_blocking

        return deliver_blocking(path, line, timeout)

    def stop(self, path: str, key: str, timeout: float) -> str:
        """Ask the run whose inbox is at ``path`` to stop its child (``_ray_inbox.stop_run``)."""
        from zett_agent.runners._ray._ray_inbox import stop_run_blocking

        return stop_run_blocking(path, key, timeout)

    def ping(self) -> bool:
        return True

    def pid(self) -> int:
        return os.getpid()
