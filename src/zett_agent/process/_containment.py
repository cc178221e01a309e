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

Both report to the pool through ``on_dead(worker_id)`` on the event loop. Every method is
non-blocking for the loop.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from . import _cgroup, _scan
from ._janitor import Janitor
from ._limits import ProcessLimits
from ._linux import Inotify

__all__ = ["CgroupContainment", "Containment", "ScanContainment", "Tree", "create"]


@dataclass(eq=False)
class Tree:
    """The host's handle on one worker's tree."""

    pid: int
    pidfd: int
    #: the worker's cgroup directory (cgroup containment)
    cgroup: str | None = None
    #: inotify watch on its cgroup.events while a death is awaited
    wd: int | None = None
    killing: bool = False
    dead: bool = False
    #: the worker process itself exited (its pidfd became readable)
    exited: bool = False
    #: ``cgroup.threads`` and ``cgroup.stat`` kept open once the worker is reused (read again
    #: with ``pread``)
    threads_fd: int = -1
    stat_fd: int = -1
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
        """Get ready on ``loop``; raises ``OSError`` with the reason if this strategy cannot
        work here. Removals whose cost a job decides go to ``janitor``, off the loop."""
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
        """Look again whether a tree being killed is dead (after a hint such as the worker's
        exit), in case a notification was lost."""

    def forget(self, tree: Tree) -> None:
        """The worker is buried: release what is held for it."""
        for fd in (tree.pidfd, tree.threads_fd, tree.stat_fd):
            if fd >= 0:
                os.close(fd)
        tree.pidfd = tree.threads_fd = tree.stat_fd = -1

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything (after the launcher exited); removals still to do are handed to
        the janitor, which the pool closes next."""

    def _dead(self, tree: Tree) -> None:
        if tree.dead:
            return
        tree.dead = True
        callbacks, tree.callbacks = tree.callbacks, []
        for callback in callbacks:
            callback()


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
        """The worker's own cgroup holds just its one thread, and no cgroup was made below it
        (a process the job hid in a cgroup of its own is in the subtree, not in this list)."""
        assert tree.cgroup is not None
        try:
            if tree.threads_fd < 0:
                tree.threads_fd = os.open(
                    f"{tree.cgroup}/cgroup.threads", os.O_RDONLY | os.O_CLOEXEC
                )
                tree.stat_fd = os.open(f"{tree.cgroup}/cgroup.stat", os.O_RDONLY | os.O_CLOEXEC)
            if os.pread(tree.threads_fd, 4096, 0).split() != [str(tree.pid).encode()]:
                return False
            stat = os.pread(tree.stat_fd, 4096, 0)
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


class ScanContainment(Containment):
    mode = "scan"
    needs_exit_report = True
    lets_workers_exit = True

    def __init__(self) -> None:
        super().__init__()
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        #: trees waiting for the kill thread, each with a pidfd of its own for the thread (the
        #: tree's may be closed by ``forget`` while the thread still works on it: a lost
        #: launcher's trees are buried once it is dead), and whether a batch is under way
        self._pending: list[tuple[Tree, int]] = []
        self._running = False

    def open(self, loop: asyncio.AbstractEventLoop, janitor: Janitor) -> None:
        super().open(loop, janitor)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="zett-agent-kill")

    def launcher_args(self) -> dict[str, str]:
        return {}

    def adopt(self, pid: int, pidfd: int, name: str) -> Tree:
        return Tree(pid, pidfd)

    def apply(self, tree: Tree, limits: ProcessLimits) -> None:
        if limits.tree_wide:
            raise AssertionError("tree-wide limits reached a scan-containment pool")

    def kill(self, trees: Iterable[Tree]) -> None:
        batch = []
        for tree in trees:
            if tree.dead or tree.killing:
                continue
            if tree.exited:
                # nothing left for the host to find under a dead root: what it left was
                # reparented to the launcher, whose orphan sweep (reported with the worker's
                # exit, which this containment waits for) kills it
                tree.killing = True
                self._dead(tree)
            else:
                batch.append(tree)
        if not batch:
            return
        for tree in batch:
            tree.killing = True
        handed = [(tree, os.dup(tree.pidfd) if tree.pidfd >= 0 else -1) for tree in batch]
        with self._lock:
            self._pending.extend(handed)
            if self._running:
                return  # the thread takes them in its next round
            self._running = True
        assert self._executor is not None
        self._executor.submit(self._kill_rounds)

    def _kill_rounds(self) -> None:
        """In the kill thread: one freeze-and-kill per round for everything pending (batched:
        cancelling many trees at once costs one walk, not one per tree)."""
        try:
            self._rounds()
        except BaseException:
            with self._lock:  # the next kill starts the thread again
                self._running = False
            raise

    def _rounds(self) -> None:
        while True:
            with self._lock:
                handed, self._pending = self._pending, []
                if not handed:
                    self._running = False
                    return
            pidfds = {tree.pid: fd for tree, fd in handed if fd >= 0}
            try:
                killed = _scan.freeze_and_kill(pidfds, pidfds=pidfds)
                _scan.wait_dead(killed)
            finally:
                for fd in pidfds.values():
                    os.close(fd)
            assert self._loop is not None
            batch = [tree for tree, _fd in handed]
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self._loop.call_soon_threadsafe(self._batch_dead, batch)

    def _batch_dead(self, batch: list[Tree]) -> None:
        for tree in batch:
            self._dead(tree)

    def terminate(self, tree: Tree) -> None:
        assert self._executor is not None
        self._executor.submit(_scan.signal_tree, [tree.pid], signal.SIGTERM)

    def is_clean(self, tree: Tree) -> bool:
        try:
            threads = os.listdir(f"/proc/{tree.pid}/task")
        except OSError:
            return False
        return threads == [str(tree.pid)] and not _scan.children(tree.pid)

    def kill_launcher(
        self, pid: int, pidfd: int, trees: Iterable[Tree], done: Callable[[], None]
    ) -> None:
        # one freeze for the launcher and every worker: while the launcher is stopped nothing
        # of its tree can be reparented out of reach, and a worker whose launcher already died
        # stopped itself (its parent-death signal is SIGSTOP here), so its tree is intact
        trees = list(trees)
        fds = {pid: os.dup(pidfd)}
        for tree in trees:
            if tree.pidfd >= 0:
                fds[tree.pid] = os.dup(tree.pidfd)
        for tree in trees:
            tree.killing = True
        assert self._executor is not None and self._loop is not None
        loop = self._loop

        def kill_all() -> None:
            try:
                _scan.wait_dead(_scan.freeze_and_kill(fds, pidfds=fds))
            finally:
                for fd in fds.values():
                    os.close(fd)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(finish)

        def finish() -> None:
            for tree in trees:
                self._dead(tree)
            done()

        self._executor.submit(kill_all)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


#: how long the removal of dead hosts' pools retries: their killed processes take milliseconds to
#: exit, one stuck in the kernel longer; what is left then stays for the next pool
_STALE_RETRY = 2.0


def _remove_stale(paths: list[str], stop: Callable[[], bool]) -> None:
    """In the janitor's thread: remove what dead hosts' pools left, once their killed
    processes exited."""
    deadline = time.monotonic() + _STALE_RETRY
    while paths and not stop():
        paths = [path for path in paths if not _cgroup.remove_tree(path, stop)]
        if not paths or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def create(mode: str) -> Containment:
    """The strategy for ``mode``: ``"cgroup"``, ``"scan"``, or ``"auto"`` (cgroup where it
    works here, else scan). Raises ``ValueError`` for another mode and ``OSError`` when
    ``"cgroup"`` is not available (the message says why)."""
    if mode == "scan":
        return ScanContainment()
    if mode not in ("cgroup", "auto"):
        raise ValueError(f"containment must be 'auto', 'cgroup' or 'scan', got {mode!r:.40}")
    problem = _cgroup.cgroup_problem()
    if problem is None:
        return CgroupContainment()
    if mode == "auto":
        return ScanContainment()
    raise OSError(f"containment='cgroup' is not available here: {problem}")
