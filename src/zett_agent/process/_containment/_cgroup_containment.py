"""cgroup containment: a cgroup v2 per worker, killed with one write, dead when it empties.

Every worker runs in a cgroup of its own, which every process its job starts inherits. Kill
is one write to ``cgroup.kill``; death is ``cgroup.events`` reading ``populated 0``, reported
through inotify. Nothing can fork its way out of the kill, and nothing depends on the launcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from .._janitor import Janitor
from .._limits import ProcessLimits
from .._linux import Inotify
from . import _cgroup, _scan
from ._strategy import _PROBE, Containment, Tree

__all__ = ["CgroupContainment"]

log = logging.getLogger("zett_agent.process")

#: killed processes still in a cgroup whose exits are awaited by pidfd (more: inotify alone)
_MEMBERS = 16
#: trees killed at once whose workers' children the loop kills itself (more: the kill thread)
_FEW_TREES = 8
#: bytes read of a list of pids (a thread's ``children``, ``cgroup.procs``): room for
#: ``_MEMBERS`` of them and more
_CHILDREN_READ = 512


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
        self._executor: ThreadPoolExecutor | None = None

    def open(self, loop: asyncio.AbstractEventLoop, janitor: Janitor) -> None:
        super().open(loop, janitor)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="zett-agent-kill")
        # the kill thread starts now, not at the first kill: a kill never needs a new thread
        # (at interpreter exit none may start, and a host at its process limit has none to give)
        self._executor.submit(int)
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
        """Kill the trees: each worker at once, through its pidfd; the rest in the kill thread.

        A write to ``cgroup.kill`` takes the kernel's cgroup mutex, which it may hold for
        milliseconds while other cgroups are made or removed (measured: up to 11 ms): the loop
        must not wait for it. So the loop signals the worker and its children itself (no lock:
        the usual tree, a job and the few processes it started, dies at once), and the kill
        thread writes ``cgroup.kill``, which nothing in the tree escapes.
        """
        batch = []
        trees = [tree for tree in trees if not (tree.dead or tree.killing)]
        # a few trees (a cancel, a timeout) die fastest killed from here; many at once (a
        # close) would cost the loop a read of each worker's children: the workers alone are
        # killed here then, what they started by the kill thread's writes
        quick = len(trees) <= _FEW_TREES
        for tree in trees:
            tree.killing = True
            assert tree.cgroup is not None
            if tree.pidfd >= 0 and not tree.exited:
                if quick:
                    _kill_worker_and_children(tree)
                else:
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(tree.pidfd, signal.SIGKILL)
            batch.append((tree, tree.cgroup))
        if not batch:
            return
        assert self._executor is not None
        try:
            self._executor.submit(self._kill_batch, batch)
        except RuntimeError:  # the interpreter is exiting and the thread is gone: kill here
            self._kill_batch(batch)

    def _kill_batch(self, batch: list[tuple[Tree, str]]) -> None:
        """In the kill thread (or, at interpreter exit, the loop's)."""
        results = []
        for tree, cgroup in batch:
            try:
                found = _cgroup.kill(cgroup)
            except OSError as exc:  # the tree is watched all the same: it may die yet
                log.warning("could not kill the cgroup %s: %s", cgroup, exc)
                found = True
            results.append((tree, found))
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self._killed, results)

    def _killed(self, results: list[tuple[Tree, bool]]) -> None:
        for tree, found in results:
            if tree.dead:
                continue
            if not found:
                self._dead(tree)  # already removed: empty
            elif tree.exited:
                self._watch(tree)
            # else the worker's pidfd reports its death, and ``recheck`` looks then: usually
            # the whole tree is gone by that time, and no inotify watch is needed (adding and
            # removing one costs the loop several hundred microseconds)

    def _watch(self, tree: Tree) -> None:
        """Dead now if the cgroup is empty; else when it empties.

        Told by inotify; and, since the kernel sends a cgroup file's notifications at most
        every 20 ms (``cgroup_file_notify``), also by the pidfds of the few killed processes
        still in it: the cgroup is looked at again once they all exited, without that delay.
        """
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
        elif not tree.members:
            self._await_members(tree)

    def _await_members(self, tree: Tree) -> None:
        """Look at the cgroup again once the processes now in it exited.

        At most ``_MEMBERS`` of them; more, or processes in cgroups below it, are left to
        inotify.
        """
        assert self._loop is not None and tree.cgroup is not None
        try:
            with open(f"{tree.cgroup}/cgroup.procs", "rb") as procs:
                data = procs.read(_CHILDREN_READ)
        except OSError:
            return
        pids = data.split()
        if len(data) == _CHILDREN_READ or len(pids) > _MEMBERS:
            return  # more than a few: not parsed on the loop
        for pid in pids:
            try:
                fd = os.pidfd_open(int(pid))
            except (OSError, ValueError):
                continue  # gone already (or no descriptor left: inotify still tells)
            tree.members.append(fd)
            self._loop.add_reader(fd, self._member_exited, tree, fd)

    def _member_exited(self, tree: Tree, fd: int) -> None:
        assert self._loop is not None
        self._loop.remove_reader(fd)
        os.close(fd)
        tree.members.remove(fd)
        if tree.members or tree.dead or tree.cgroup is None:
            return  # others to wait for, or settled meanwhile
        if not _cgroup.populated(tree.cgroup):
            self._unwatch(tree)
            self._dead(tree)

    def _unwatch(self, tree: Tree) -> None:
        if tree.wd is not None and self._inotify is not None:
            self._watched.pop(tree.wd, None)
            self._inotify.rm_watch(tree.wd)
            tree.wd = None
        if tree.members:
            assert self._loop is not None
            for fd in tree.members:
                self._loop.remove_reader(fd)
                os.close(fd)
            tree.members.clear()

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
            # removed by the host, not by the launcher: the host watches it until it is empty.
            # Off the loop: an rmdir takes the kernel's cgroup mutex, which may be held for
            # milliseconds (by a kill, by cgroups being made)
            assert self._janitor is not None
            self._janitor.defer(_remove_worker_cgroup, tree.cgroup, self._janitor.stopping.is_set)
        super().forget(tree)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for tree in list(self._watched.values()):
            self._unwatch(tree)
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


def _kill_worker_and_children(tree: Tree) -> None:
    """SIGKILL the worker and its children now, without the cgroup mutex.

    Best effort: the kill thread's ``cgroup.kill`` that follows is what nothing escapes. The
    worker is stopped first (with a stop pending it can fork no more), its children are read
    (at most ``_MEMBERS``), and each is signalled through a pidfd opened while its parent is
    still the worker (so a pid the worker reaped and the system gave away is never hit).
    """
    try:
        signal.pidfd_send_signal(tree.pidfd, signal.SIGSTOP)
    except OSError:
        return
    children = _few_children(tree.pid)
    if len(children) <= _MEMBERS:
        for child in children:
            try:
                fd = os.pidfd_open(child)
            except OSError:
                continue
            try:
                found = _scan.state(child)
                if found is not None and found[0] == tree.pid:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(fd)
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(tree.pidfd, signal.SIGKILL)


def _few_children(pid: int) -> set[int]:
    """The children of ``pid`` when it has at most ``_MEMBERS`` threads and children, else none.

    A few small reads: a job's thousands of threads or children are not walked on the loop
    (``cgroup.kill`` gets them).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read(4096).rpartition(b")")[2].split()
        if int(fields[17]) > _MEMBERS:
            return set()
        children: set[int] = set()
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as listed:
                data = listed.read(_CHILDREN_READ)
            if len(data) == _CHILDREN_READ:
                return set()  # more than a few
            children.update(int(child) for child in data.split())
    except (OSError, ValueError, IndexError):
        return set()
    return children if len(children) <= _MEMBERS else set()


def _remove_worker_cgroup(cgroup: str, stop: Callable[[], bool]) -> None:
    """One rmdir in the common case; what the job built below it, one cgroup after another."""
    try:
        os.rmdir(cgroup)
    except FileNotFoundError:
        pass
    except OSError:
        _cgroup.remove_tree(cgroup, stop)


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
