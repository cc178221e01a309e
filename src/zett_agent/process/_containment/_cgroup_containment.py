"""cgroup containment: a cgroup v2 per worker, killed with one write, dead when it empties.

Every worker runs in a cgroup of its own, which every process its job starts inherits. Kill
is one write to ``cgroup.kill``; death is ``cgroup.events`` reading ``populated 0``, reported
through inotify. Nothing can fork its way out of the kill, and nothing depends on the launcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable

from .._janitor import Janitor
from .._limits import ProcessLimits
from .._linux import Inotify
from . import _cgroup
from ._strategy import _PROBE, Containment, Tree

__all__ = ["CgroupContainment"]


class CgroupContainment(Containment):
    mode = "cgroup"
    needs_exit_report = False

    def __init__(self) -> None:
        super().__init__()
        self._pool: _cgroup.PoolCgroup | None = None
        self._inotify: Inotify | None = None
        self._watched: dict[int, Tree] = {}
        #: what to call once a lost launcher's workers are all dead, and the watch for that
        self._lost: list[Callable[[], None]] = []
        self._lost_wd: int | None = None

    def open(self, loop: asyncio.AbstractEventLoop, janitor: Janitor) -> None:
        super().open(loop, janitor)
        self._pool = _cgroup.PoolCgroup.create()
        self.tree_limits = frozenset(
            name
            for name, (controller, _file) in _cgroup.TREE_CONTROLLERS.items()
            if controller in self._pool.controllers
        )
        self._inotify = Inotify()
        loop.add_reader(self._inotify.fd, self._on_inotify)
        if self._pool.stale:
            janitor.defer(_remove_stale, self._pool.stale, janitor.stopping.is_set)

    @property
    def path(self) -> str:
        assert self._pool is not None
        return self._pool.path

    def launcher_args(self) -> dict[str, str]:
        assert self._pool is not None
        return {
            "launcher": self._pool.launcher,
            "workers": self._pool.workers,
            "pool": self._pool.path,
            # where the host runs: the launcher moves back there to remove the pool's cgroups
            # after the host died (a process cannot remove the cgroup it is in)
            "home": os.path.dirname(os.path.dirname(self._pool.path)),
        }

    def launcher_starting(self) -> None:
        assert self._pool is not None
        self._pool.touch()  # other pools leave it alone while its launcher starts

    def adopt(self, pid: int, pidfd: int, name: str) -> Tree:
        assert self._pool is not None
        if "/" in name or not name.startswith("w-"):
            raise ValueError(f"a worker cgroup name {name!r:.40} from the launcher")
        return Tree(pid, pidfd, f"{self._pool.workers}/{name}")

    def apply(self, tree: Tree, limits: ProcessLimits) -> None:
        assert tree.cgroup is not None
        for name, value in limits.tree_wide.items():
            _controller, filename = _cgroup.TREE_CONTROLLERS[name]
            _cgroup.write(f"{tree.cgroup}/{filename}", str(value))
        if limits.tree_memory_bytes is not None:
            # the OOM killer ends the whole tree, not one process of it
            with contextlib.suppress(OSError):
                _cgroup.write(f"{tree.cgroup}/memory.oom.group", "1")

    def kill(self, trees: Iterable[Tree]) -> None:
        for tree in trees:
            if tree.dead:
                continue
            tree.killing = True
            assert tree.cgroup is not None
            if not _cgroup.kill(tree.cgroup):
                self._dead(tree)  # already removed: empty
            elif tree.exited:
                self._watch(tree)
            # else the worker's pidfd reports its death, and ``recheck`` looks then: usually
            # the whole tree is gone by that time, and no inotify watch is needed (adding and
            # removing one costs the loop several hundred microseconds)

    def _watch(self, tree: Tree) -> None:
        """Dead now if the cgroup is empty; else when inotify says it emptied."""
        assert self._inotify is not None and tree.cgroup is not None
        if not _cgroup.populated(tree.cgroup):
            self._unwatch(tree)
            self._dead(tree)
            return
        if tree.wd is None:
            try:
                tree.wd = self._inotify.add_watch(f"{tree.cgroup}/cgroup.events")
            except FileNotFoundError:
                self._dead(tree)
                return
            self._watched[tree.wd] = tree
        # watched first, then read: a change between the two is not missed
        if not _cgroup.populated(tree.cgroup):
            self._unwatch(tree)
            self._dead(tree)

    def _unwatch(self, tree: Tree) -> None:
        if tree.wd is not None and self._inotify is not None:
            self._watched.pop(tree.wd, None)
            self._inotify.rm_watch(tree.wd)
            tree.wd = None

    def _on_inotify(self) -> None:
        assert self._inotify is not None
        for wd, _mask in self._inotify.read():
            tree = self._watched.get(wd)
            if tree is not None and tree.cgroup is not None and not _cgroup.populated(tree.cgroup):
                self._unwatch(tree)
                self._dead(tree)
        if self._lost and self._pool is not None and not _cgroup.populated(self._pool.workers):
            self._finish_lost()

    def terminate(self, tree: Tree) -> None:
        assert tree.cgroup is not None
        try:
            pids = _cgroup.read(f"{tree.cgroup}/cgroup.procs").split()
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), signal.SIGTERM)

    def is_clean(self, tree: Tree) -> bool:
        """Whether the worker's subtree is clean.

        The worker's own cgroup holds just its one thread, and no cgroup was made below it
        (a process the job hid in a cgroup of its own is in the subtree, not in this list).
        """
        assert tree.cgroup is not None
        try:
            if tree.threads_fd < 0:
                tree.threads_fd = os.open(
                    f"{tree.cgroup}/cgroup.threads", os.O_RDONLY | os.O_CLOEXEC
                )
                tree.stat_fd = os.open(f"{tree.cgroup}/cgroup.stat", os.O_RDONLY | os.O_CLOEXEC)
                tree.alone = [str(tree.pid).encode()]
            # a short read is enough: a second thread makes it longer than the one id, and
            # whatever is cut off cannot make it equal
            if os.pread(tree.threads_fd, _PROBE, 0).split() != tree.alone:
                return False
            stat = os.pread(tree.stat_fd, _PROBE, 0)
        except OSError:
            return False
        # "nr_descendants N\n...": live cgroups below this one, however the job made them
        return stat.startswith(b"nr_descendants 0\n")

    def cpu_seconds(self, tree: Tree) -> float | None:
        if tree.cgroup is None:
            return None
        try:
            text = _cgroup.read(f"{tree.cgroup}/cpu.stat")
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
        return None

    def kill_launcher(
        self, pid: int, pidfd: int, trees: Iterable[Tree], done: Callable[[], None]
    ) -> None:
        assert self._pool is not None and self._inotify is not None
        # every worker it forked is in the workers' cgroup, reported to us or not yet
        _cgroup.kill(self._pool.launcher)
        _cgroup.kill(self._pool.workers)
        self.kill(trees)
        self._lost.append(done)
        if self._lost_wd is None:
            with contextlib.suppress(OSError):
                self._lost_wd = self._inotify.add_watch(f"{self._pool.workers}/cgroup.events")
        if not _cgroup.populated(self._pool.workers):
            self._finish_lost()

    def _finish_lost(self) -> None:
        """Every process the lost launcher started is gone: a new one may start."""
        if self._lost_wd is not None and self._inotify is not None:
            self._inotify.rm_watch(self._lost_wd)
            self._lost_wd = None
        lost, self._lost = self._lost, []
        for done in lost:
            done()

    def recheck(self, tree: Tree) -> None:
        if tree.killing and not tree.dead:
            self._watch(tree)  # dead at once if it is empty, else when it empties

    def forget(self, tree: Tree) -> None:
        self._unwatch(tree)
        for fd in (tree.threads_fd, tree.stat_fd):
            if fd >= 0:
                os.close(fd)  # before the cgroup is removed
        tree.threads_fd = tree.stat_fd = -1
        if tree.dead and tree.cgroup is not None:
            # removed here, not by the launcher: the host watches it until it is empty. One
            # rmdir in the common case; what the job built below it is removed off the loop
            try:
                os.rmdir(tree.cgroup)
            except FileNotFoundError:
                pass
            except OSError:
                assert self._janitor is not None
                self._janitor.defer(_cgroup.remove_tree, tree.cgroup, self._janitor.stopping.is_set)
        super().forget(tree)

    def close(self) -> None:
        if self._inotify is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._inotify.fd)
            self._inotify.close()
            self._inotify = None
        self._watched.clear()
        if self._pool is not None:
            assert self._janitor is not None
            self._janitor.defer(self._pool.remove, self._janitor.stopping.is_set)
            self._pool = None


#: how long the removal of dead hosts' pools retries: their killed processes take milliseconds to
#: exit, one stuck in the kernel longer; what is left then stays for the next pool
_STALE_RETRY = 2.0


def _remove_stale(paths: list[str], stop: Callable[[], bool]) -> None:
    """In the janitor's thread.

    Remove what dead hosts' pools left, once their killed processes exited.
    """
    deadline = time.monotonic() + _STALE_RETRY
    while paths and not stop():
        paths = [path for path in paths if not _cgroup.remove_tree(path, stop)]
        if not paths or time.monotonic() > deadline:
            return
        time.sleep(0.05)
