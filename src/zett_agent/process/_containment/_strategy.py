"""How the host kills a worker's process tree and learns that it is dead: two strategies.

``CgroupContainment`` (preferred): every worker runs in a cgroup of its own, which every process
its job starts inherits. Kill is one write to ``cgroup.kill``; death is ``cgroup.events``
reading ``populated 0``, reported through inotify. Nothing can fork its way out of the kill,
and nothing depends on the launcher.

``ScanContainment`` (fallback, where no writable cgroup v2 exists): the host freezes and kills
the worker's tree by ``/proc`` walks in a thread of its own (``_scan``), and waits on pidfds
until every killed process exited. Processes that left the tree (the job cleared its worker's
subreaper flag, or the worker died first) are reparented to the launcher, which kills them in
its orphan sweep after every worker exit; so under this strategy a tree counts as dead once
the launcher reported the worker's exit too (or was replaced, which kills its whole tree).

Both report to the pool through each tree's callbacks on the event loop. Every method is
non-blocking for the loop. This module holds what they share (``Tree``, the ``Containment``
interface) and ``create``; the strategies are ``_cgroup_containment`` and
``_scan_containment``.
"""

from __future__ import annotations

import abc
import asyncio
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .._janitor import Janitor
from .._limits import ProcessLimits

__all__ = ["_PROBE", "Containment", "Tree"]

#: bytes read by a cleanliness probe: more than one line of what a clean worker shows
_PROBE = 64


@dataclass(eq=False)
class Tree:
    """The host's handle on one worker's tree."""

    pid: int
    pidfd: int
    #: the worker's cgroup directory (cgroup containment)
    cgroup: str | None = None
    #: inotify watch on its cgroup.events while a death is awaited
    wd: int | None = None
    #: pidfds of the processes left in its cgroup while a death is awaited (cgroup containment)
    members: list[int] = field(default_factory=list)
    killing: bool = False
    dead: bool = False
    #: the worker process itself exited (its pidfd became readable)
    exited: bool = False
    #: what tells its threads and what is below it, kept open once the worker is reused (read
    #: again with ``pread``): ``cgroup.threads`` and ``cgroup.stat`` (cgroup containment),
    #: ``/proc/PID/stat`` and its thread's ``children`` (scan containment)
    threads_fd: int = -1
    stat_fd: int = -1
    #: ``cgroup.threads`` of a worker alone in its cgroup, split (cgroup containment)
    alone: list[bytes] = field(default_factory=list)
    callbacks: list[Callable[[], None]] = field(default_factory=list)


class Containment(abc.ABC):
    """The interface the pool uses; one instance per pool."""

    #: ``"cgroup"`` or ``"scan"``
    mode: str
    #: whether a tree counts as dead only once the launcher also reported the worker's exit
    needs_exit_report: bool
    #: whether a worker that answered its last job may be left to exit on its own for a moment
    #: before it is killed (where a kill costs more than waiting for the exit)
    lets_workers_exit: bool = False
    #: ProcessLimits fields this pool can enforce tree-wide
    tree_limits: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._janitor: Janitor | None = None

    def open(self, loop: asyncio.AbstractEventLoop, janitor: Janitor) -> None:
        """Get ready on ``loop``.

        Raises ``OSError`` with the reason if this strategy cannot work here. Removals whose cost a
        job decides go to ``janitor``, off the loop.
        """
        self._loop = loop
        self._janitor = janitor

    @abc.abstractmethod
    def launcher_args(self) -> dict[str, str]:
        """What the launcher needs to know (cgroup paths)."""

    def launcher_starting(self) -> None:  # noqa: B027 - a no-op where nothing is marked
        """A launcher is about to start (the first, or one replacing a lost one)."""

    @abc.abstractmethod
    def adopt(self, pid: int, pidfd: int, name: str) -> Tree:
        """A new worker: its pid, a pidfd of it, and the name the launcher gave its cgroup."""

    @abc.abstractmethod
    def apply(self, tree: Tree, limits: ProcessLimits) -> None:
        """Set the tree-wide limits of ``limits`` on ``tree`` before it gets its job."""

    @abc.abstractmethod
    def kill(self, trees: Iterable[Tree]) -> None:
        """SIGKILL every process of ``trees``; each tree's callbacks run once it is dead."""

    @abc.abstractmethod
    def terminate(self, tree: Tree) -> None:
        """Send SIGTERM to the processes of ``tree`` (the courtesy before a kill)."""

    @abc.abstractmethod
    def is_clean(self, tree: Tree) -> bool:
        """Whether the tree is just the worker process, with one thread (reusable)."""

    @abc.abstractmethod
    def kill_launcher(
        self, pid: int, pidfd: int, trees: Iterable[Tree], done: Callable[[], None]
    ) -> None:
        """Kill a launcher that is lost and everything it started; ``done`` runs after."""

    def cpu_seconds(self, tree: Tree) -> float | None:
        """CPU time of the whole tree so far, when the strategy can tell."""
        return None

    def recheck(self, tree: Tree) -> None:  # noqa: B027 - a no-op where nothing can be lost
        """Look again whether a tree being killed is dead.

        Look again whether a tree being killed is dead (after a hint such as the worker's
        exit), in case a notification was lost.
        """

    def forget(self, tree: Tree) -> None:
        """The worker is buried: release what is held for it."""
        for fd in (tree.pidfd, tree.threads_fd, tree.stat_fd):
            if fd >= 0:
                os.close(fd)
        tree.pidfd = tree.threads_fd = tree.stat_fd = -1

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything (after the launcher exited).

        Removals still to do are handed to the janitor, which the pool closes next.
        """

    def _dead(self, tree: Tree) -> None:
        if tree.dead:
            return
        tree.dead = True
        callbacks, tree.callbacks = tree.callbacks, []
        for callback in callbacks:
            callback()
