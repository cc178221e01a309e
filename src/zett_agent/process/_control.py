"""The host's handle on the launcher process: start it, talk to it, reap it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from typing import Any

from ._launcher import CONTROL_FD

__all__ = ["LauncherHandle"]

_BOOTSTRAP = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    "from zett_agent.process._launcher import main; main()"
)


class LauncherHandle:
    """A started launcher: its pid, a pidfd (readable once it exited) and the control socket.

    Everything is non-blocking; the pool registers ``sock`` and ``pidfd`` with its event loop.
    """

    def __init__(self, *, preload: tuple[str, ...], max_frame_bytes: int) -> None:
        host_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        child_fd = child_sock.fileno()
        extra = None
        try:
            if child_fd == CONTROL_FD:
                extra = os.dup(child_fd)
                child_fd = extra
            argv = [
                sys.executable,
                "-c",
                _BOOTSTRAP,
                json.dumps(sys.path),
                str(os.getpid()),
                str(max_frame_bytes),
                json.dumps(list(preload)),
            ]
            self.pid = os.posix_spawn(
                sys.executable,
                argv,
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, child_fd, CONTROL_FD),
                ],
                setpgroup=0,
                setsigdef=(signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE),
                setsigmask=(),
            )
        except BaseException:
            host_sock.close()
            raise
        finally:
            child_sock.close()
            if extra is not None:
                os.close(extra)
        self.sock = host_sock
        self.sock.setblocking(False)
        self.pidfd = os.pidfd_open(self.pid)
        self.returncode: int | None = None
        self._outbox: list[bytes] = []

    def send(self, message: dict[str, Any]) -> bool:
        """Queue ``message``; return True if it could not be written at once (caller must
        call ``flush`` when the socket is writable)."""
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
        return json.loads(data), fds

    def try_reap(self) -> bool:
        """Reap the launcher if it exited (call when ``pidfd`` is readable)."""
        if self.returncode is not None:
            return True
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            self.returncode = -1
            return True
        if pid == 0:
            return False
        self.returncode = os.waitstatus_to_exitcode(status)
        return True

    def kill(self) -> None:
        """SIGKILL the launcher (last resort of ``close``); its workers die with it."""
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def close(self) -> None:
        self.sock.close()
        os.close(self.pidfd)
