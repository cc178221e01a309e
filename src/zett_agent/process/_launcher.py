"""The launcher: one small process per pool that forks workers, reaps them and kills trees.

Started by the pool with ``posix_spawn`` (never ``multiprocessing``; it never imports the host's
``__main__``). It is a child subreaper, so every orphaned descendant of every worker lands on it
and is reaped here; it runs no job code, so it always answers.

Control protocol (one ``SOCK_SEQPACKET`` socket, one JSON object per record):

host -> launcher
    ``{"op": "spawn", "n": N}``   fork N workers
    ``{"op": "term", "pid": P}``  SIGTERM worker P and its descendants
    ``{"op": "kill", "pid": P}``  freeze and SIGKILL worker P's whole tree
    ``{"op": "shutdown"}``        kill everything, reap it, exit
launcher -> host
    ``{"op": "hello", "pid": ...}`` or ``{"op": "hello", "error": ...}``
    ``{"op": "worker", "pid": P}`` with the host end of P's socket attached (SCM_RIGHTS)
    ``{"op": "spawn_failed", "error": ...}``
    ``{"op": "exit", "pid": P, "code": .., "signal": .., "cpu": .., "maxrss": ..}`` sent once P
    is reaped *and* every process of its tree that had to be killed is reaped too.

When the host goes away (EOF on the control socket, or SIGTERM from ``PR_SET_PDEATHSIG``) the
launcher kills every tree, reaps everything and exits.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import selectors
import signal
import socket
import sys
import traceback
from typing import Any

from . import _linux, _tree
from ._protocol import CLEAN_EXIT

__all__ = ["main"]

CONTROL_FD = 3


def _noop(signum: int, frame: object) -> None:
    pass


class _Launcher:
    def __init__(self, ctrl: socket.socket, max_frame_bytes: int) -> None:
        self.ctrl = ctrl
        self.max_frame_bytes = max_frame_bytes
        self.pid = os.getpid()
        #: workers forked and not yet reaped
        self.workers: set[int] = set()
        #: worker pid -> pids killed with its tree and not yet reaped
        self.killing: dict[int, set[int]] = {}
        #: exit reports waiting until every pid of their set is reaped
        self.deferred: list[tuple[dict[str, Any], set[int]]] = []
        self.stopping = False
        #: workers the host asked for and not forked yet (one per loop turn)
        self.to_spawn = 0
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.selector = selectors.DefaultSelector()

    # -- plumbing ---------------------------------------------------------------------------

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        data = json.dumps(message).encode()
        while True:
            try:
                if fds:
                    socket.send_fds(self.ctrl, [data], fds)
                else:
                    self.ctrl.send(data)
                return
            except BlockingIOError:
                select.select([], [self.ctrl], [], 1.0)
            except OSError:
                # the host is gone; shutting down is all that is left to do
                self.stopping = True
                return

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.stopping = True

    # -- main loop --------------------------------------------------------------------------

    def run(self) -> None:
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, _noop)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGHUP, self._on_sigterm)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.ctrl.setblocking(False)
        self.selector.register(self.ctrl, selectors.EVENT_READ, "ctrl")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.send({"op": "hello", "pid": self.pid})
        while not self.stopping:
            # forks wait behind everything else: a kill must not queue behind a batch of them
            timeout = 0 if self.to_spawn else None
            for key, _ in self.selector.select(timeout):
                if key.data == "ctrl":
                    self._read_control()
                else:
                    try:
                        while os.read(self.wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
            self._reap()
            if self.to_spawn and not self.stopping:
                self.to_spawn -= 1
                self._fork_worker()
        self._shutdown()

    def _read_control(self) -> None:
        while not self.stopping:
            try:
                data = self.ctrl.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.stopping = True
                return
            message = json.loads(data)
            op = message["op"]
            if op == "spawn":
                self.to_spawn += int(message["n"])
            elif op == "kill":
                pid = int(message["pid"])
                if pid in self.workers and pid not in self.killing:
                    self.killing[pid] = _tree.freeze_and_kill([pid])
            elif op == "term":
                pid = int(message["pid"])
                if pid in self.workers and pid not in self.killing:
                    _tree.signal_tree([pid], signal.SIGTERM)
            elif op == "shutdown":
                self.stopping = True

    # -- workers ----------------------------------------------------------------------------

    def _fork_worker(self) -> None:
        host_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = os.fork()
        except OSError as exc:
            host_end.close()
            worker_end.close()
            self.send({"op": "spawn_failed", "error": f"fork failed: {exc}"})
            return
        if pid == 0:
            code = 70
            try:
                host_end.close()
                self._forget_in_child()
                from . import _worker

                _worker.serve(worker_end, self.pid, self.max_frame_bytes)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        worker_end.close()
        self.workers.add(pid)
        self.send({"op": "worker", "pid": pid}, [host_end.fileno()])
        host_end.close()

    def _forget_in_child(self) -> None:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.selector.close()
        os.close(self.wake_r)
        os.close(self.wake_w)
        self.ctrl.close()

    def _orphans(self) -> set[int]:
        """Direct children that are not live workers: leftovers of dead workers' trees."""
        return _tree.children_of(_tree.scan(), self.pid) - self.workers

    def _reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            self._on_reaped(pid, status, usage)
        if self.deferred:
            still = []
            for message, pending in self.deferred:
                if pending:
                    still.append((message, pending))
                else:
                    self.send(message)
            self.deferred = still

    def _on_reaped(self, pid: int, status: int, usage: Any) -> None:
        for pending in self.killing.values():
            pending.discard(pid)
        for _, pending in self.deferred:
            pending.discard(pid)
        if pid not in self.workers:
            return
        self.workers.discard(pid)
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        message = {
            "op": "exit",
            "pid": pid,
            "code": code,
            "signal": signum,
            "cpu": usage.ru_utime + usage.ru_stime,
            "maxrss": usage.ru_maxrss * 1024,
        }
        if pid in self.killing:
            # its whole tree was frozen and killed at once: waiting for those pids is enough
            pending = self.killing.pop(pid)
        elif code != CLEAN_EXIT:
            # a worker that did not finish cleanly may have left descendants; they were
            # reparented to us before we were told of its death
            pending = _tree.freeze_and_kill(self._orphans())
        else:
            pending = set()
        self.deferred.append((message, pending))

    def _shutdown(self) -> None:
        _tree.freeze_and_kill(_tree.children_of(_tree.scan(), self.pid))
        while True:
            try:
                pid, status, usage = os.wait4(-1, 0)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            self._on_reaped(pid, status, usage)
        for message, _ in self.deferred:
            self.send(message)
        self.deferred = []


def main() -> None:
    """Entry point of the launcher process (see the module docstring)."""
    host_pid, max_frame_bytes = int(sys.argv[2]), int(sys.argv[3])
    preload = json.loads(sys.argv[4])
    ctrl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=CONTROL_FD)
    _linux.set_child_subreaper()
    _linux.set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != host_pid:
        return  # the host died before we could watch it
    launcher = _Launcher(ctrl, max_frame_bytes)
    try:
        for name in preload:
            importlib.import_module(name)
        import cloudpickle  # noqa: F401 - imported once here so every worker starts warm

        from . import _worker  # noqa: F401
    except BaseException as exc:
        launcher.send({"op": "hello", "error": f"{type(exc).__name__}: {exc}"})
        return
    # objects created so far are shared with every worker; keep the GC from touching them
    gc.freeze()
    launcher.run()
