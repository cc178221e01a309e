"""Scan containment: where no writable cgroup v2 exists, trees found and killed via ``/proc``.

The host freezes and kills the worker's tree by ``/proc`` walks in a thread of its own
(``_scan``), and waits on pidfds until every killed process exited. Processes that left the
tree (the job cleared its worker's subreaper flag, or the worker died first) are reparented to
the launcher, which kills them in its orphan sweep after every worker exit; so under this
strategy a tree counts as dead once the launcher reported the worker's exit too (or was
replaced, which kills its whole tree).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from .._janitor import Janitor
from .._limits import ProcessLimits
from . import _scan
from ._strategy import _PROBE, Containment, Tree

__all__ = ["ScanContainment"]


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
        # the kill thread starts now, not at the first kill: a kill never needs a new thread
        # (at interpreter exit none may start, and a host at its process limit has none to give)
        self._executor.submit(int)

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
        try:
            self._executor.submit(self._kill_rounds)
        except RuntimeError:  # the interpreter is exiting and the thread is gone: kill here
            self._kill_rounds()

    def _kill_rounds(self) -> None:
        """In the kill thread.

        One freeze-and-kill per round for everything pending (batched: cancelling many trees at once
        costs one walk, not one per tree).
        """
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
        """One thread, and no child, from two ``pread`` of files kept open.

        They are ``/proc/PID/stat`` (its thread count) and the one thread's ``children``,
        opened while the worker's pidfd shows it alive and failing once it is gone, so a
        reused pid is never read.
        """
        if not _scan._HAVE_CHILDREN_FILE:
            try:
                threads = os.listdir(f"/proc/{tree.pid}/task")
            except OSError:
                return False
            return threads == [str(tree.pid)] and not _scan.children(tree.pid)
        if tree.threads_fd < 0 and not self._open_probes(tree):
            return False
        try:
            stat = os.pread(tree.threads_fd, 1024, 0)
            # the command name is in parentheses and may hold any; field 20 is num_threads
            fields = stat[stat.rfind(b")") + 2 :].split(b" ", 18)
            if len(fields) < 19 or fields[17] != b"1":
                return False
            return not os.pread(tree.stat_fd, _PROBE, 0)
        except OSError:
            return False

    @staticmethod
    def _open_probes(tree: Tree) -> bool:
        """Open the worker's ``/proc/PID/stat`` and its thread's ``children`` for ``is_clean``.

        False (nothing kept open) when the worker is gone.
        """
        fds: list[int] = []
        try:
            fds.append(os.open(f"/proc/{tree.pid}/stat", os.O_RDONLY | os.O_CLOEXEC))
            path = f"/proc/{tree.pid}/task/{tree.pid}/children"
            fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
            # the pid is only a number: were the worker reaped before these were opened, they
            # could show another process. Alive after the opens (its pidfd can still be
            # signalled), they are the worker's; from then on they fail once it is gone
            signal.pidfd_send_signal(tree.pidfd, 0)
        except OSError:
            for fd in fds:
                os.close(fd)
            return False
        tree.threads_fd, tree.stat_fd = fds
        return True

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
