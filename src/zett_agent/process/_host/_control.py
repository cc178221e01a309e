"""The host's handle on one launcher process: start it, talk to it, watch it, reap it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from typing import Any

from .._containment import _scan
from .._wire._protocol import CONTROL_FD
from ._owned import owned
from ._zygote_client import Zygote, fork_launcher

#: a launcher's exit status when it is not known (another process reaped it)
_UNKNOWN = -(1 << 16)

__all__ = ["LauncherHandle"]

_BOOTSTRAP = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    "from zett_agent.process._child._launcher import main; main()"
)


def _spawn(
    child_fd: int,
    preload: tuple[str, ...],
    max_frame_bytes: int,
    cgroups: dict[str, str],
    nice: int,
    warm_up: str,
) -> int:
    """``posix_spawn`` a launcher with ``child_fd`` as its control socket; its pid."""
    extra = None
    if child_fd == CONTROL_FD:
        extra = child_fd = os.dup(child_fd)
    try:
        argv = [
            sys.executable,
            "-c",
            _BOOTSTRAP,
            json.dumps(sys.path),
            str(os.getpid()),
            str(max_frame_bytes),
            json.dumps(list(preload)),
            json.dumps(cgroups),
            str(nice),
            warm_up,
        ]
        return os.posix_spawn(
            sys.executable,
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, child_fd, CONTROL_FD),
            ],
            setsid=True,  # the pool's session: see _launcher's docstring
            setsigdef=(signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE),
            setsigmask=(),
        )
    finally:
        if extra is not None:
            os.close(extra)


class LauncherHandle:
    """A started launcher: its pid, a pidfd (readable once it exited) and the control socket.

    Everything is non-blocking; the pool registers ``sock`` and ``pidfd`` with its event loop.
    Requests carry a sequence number the launcher answers; ``overdue`` tells since when the
    oldest unanswered one waits, which is how a stopped or stuck launcher is noticed.
    """

    def __init__(
        self,
        *,
        preload: tuple[str, ...],
        max_frame_bytes: int,
        cgroups: dict[str, str],
        nice: int = 0,
        warm_up: str = "",
        zygote: Zygote | None = None,
        timeout: float = 60.0,
    ) -> None:
        """Start the launcher: ``posix_spawn``, or a fork of ``zygote`` when one is given.

        With a zygote it blocks up to ``timeout`` seconds (the first launcher of a zygote waits
        for its imports): call it from a thread then; it raises ``ZygoteUnavailable`` when the
        zygote gives none. Without, call it from the thread that lives as long as the pool:
        a spawned launcher's parent-death signal fires when the thread that spawned it ends.
        """
        host_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid: int = 0
        pidfd = -1
        try:
            if zygote is not None:
                request = {"max_frame_bytes": max_frame_bytes, "cgroups": cgroups, "nice": nice}
                self.pid, pidfd = fork_launcher(
                    zygote, preload, warm_up, child_sock.fileno(), request, timeout
                )
            else:
                fd = child_sock.fileno()
                self.pid = _spawn(fd, preload, max_frame_bytes, cgroups, nice, warm_up)
        except BaseException:
            host_sock.close()
            raise
        finally:
            child_sock.close()
        #: whether the launcher is this process's child (a zygote's is not: its exit status
        #: is the zygote's to collect)
        self.child = pidfd < 0
        self.sock = owned(host_sock)
        self.sock.setblocking(False)
        if pidfd < 0:
            try:
                pidfd = os.pidfd_open(self.pid)
            except BaseException:
                self.sock.close()
                with contextlib.suppress(ChildProcessError):
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                raise
        self.pidfd = pidfd
        self.returncode: int | None = None
        #: its hello message, once it arrived (``landlock``: what its workers get)
        self.hello: dict[str, Any] = {}
        self._outbox: list[bytes] = []
        self._seq = 0
        #: sequence number -> when it was sent, for requests not answered yet
        self._waiting: dict[int, float] = {}

    def request(self, message: dict[str, Any]) -> bool:
        """Send a request the launcher must answer; see ``send`` for the return value."""
        self._seq += 1
        self._waiting[self._seq] = time.monotonic()
        return self.send({**message, "seq": self._seq})

    def answered(self, seq: object) -> None:
        if isinstance(seq, int):
            self._waiting.pop(seq, None)

    def overdue(self) -> float | None:
        """When the oldest unanswered request was sent (``time.monotonic``), or None."""
        return min(self._waiting.values()) if self._waiting else None

    def send(self, message: dict[str, Any]) -> bool:
        """Queue ``message``.

        Return True if it could not be written at once (caller must call ``flush`` when the socket
        is writable).
        """
        data = json.dumps(message).encode()
        if self._outbox:
            self._outbox.append(data)
            return True
        try:
            self.sock.send(data)
        except BlockingIOError:
            self._outbox.append(data)
            return True
        except OSError:
            pass  # the launcher is gone; its pidfd tells the pool
        return False

    def flush(self) -> bool:
        """Write queued messages; return True while some are still queued."""
        while self._outbox:
            try:
                self.sock.send(self._outbox[0])
            except BlockingIOError:
                return True
            except OSError:
                self._outbox.clear()
                return False
            self._outbox.pop(0)
        return False

    def receive(self) -> tuple[dict[str, Any], list[int]] | None:
        """One message and its attached fds; ``None`` if nothing is ready.

        Raises ``EOFError`` once the launcher closed its end.
        """
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, 65536, 4)
        except BlockingIOError:
            return None
        except ConnectionError:
            raise EOFError from None
        if not data:
            for fd in fds:
                os.close(fd)
            raise EOFError
        try:
            message = json.loads(data)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            for fd in fds:
                os.close(fd)
            return {"op": "garbage"}, []
        return message, fds

    def stopped(self) -> bool:
        """Whether the launcher is stopped (SIGSTOP) or traced, or already dead."""
        found = _scan.state(self.pid)
        return found is None or found[1] in "TtZXx"

    def cpu_ticks(self) -> int:
        """CPU time the launcher used so far, in clock ticks (-1 if it is gone).

        A launcher that uses CPU is working, even when it is slow to answer.
        """
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as handle:
                data = handle.read()
        except OSError:
            return -1
        fields = data[data.rfind(b")") + 2 :].split()
        return int(fields[11]) + int(fields[12]) if len(fields) > 12 else -1

    def try_reap(self) -> bool:
        """Reap the launcher if it exited (call when ``pidfd`` is readable)."""
        if self.returncode is not None:
            return True
        if not self.child:
            # the zygote's to reap; ours only if it was reparented here (this process a
            # subreaper, its zygote gone): the pidfd names that very process
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG)
            self.returncode = _UNKNOWN
            return True
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            self.returncode = _UNKNOWN
            return True
        if pid == 0:
            return False
        self.returncode = os.waitstatus_to_exitcode(status)
        return True

    def describe_exit(self) -> str:
        code = self.returncode
        if code is None:
            return "it stopped answering"
        if code == _UNKNOWN:
            return "it exited"
        if code < 0:
            try:
                return f"it was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"it was killed by signal {-code}"
        return f"it exited with status {code}"

    def kill(self) -> None:
        """SIGKILL the launcher; its workers die with it (parent-death signal)."""
        if self.pidfd < 0:
            return  # closed: it exited, and was reaped
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def close(self) -> None:
        self.sock.close()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
