"""A pool's way to its zygote (``_child._zygote``): find it, start it, get a launcher from it.

The zygote is started when none listens for the pool's configuration; it then forks the
pool's launcher.

Blocking and bounded by a deadline: the pool calls it from a thread. Anything that goes wrong
(no zygote can start, it does not prove itself, it does not answer in time) raises
``ZygoteUnavailable``, and the pool starts its launcher itself, as without a zygote.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._containment import _scan
from .._wire._zygote_proof import LIMITS, NONCE, PROOF, proof, socket_name, valid

__all__ = ["Zygote", "ZygoteUnavailable", "fork_launcher"]

#: seconds between two looks at whether a zygote that has not answered yet is stopped
_STOPPED_LOOK = 0.25

_BOOTSTRAP = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    "from zett_agent.process._child._zygote import main; main()"
)


class ZygoteUnavailable(Exception):
    """No launcher came from the zygote; the message says why."""


@dataclass(frozen=True)
class Zygote:
    """Where a pool gets its launchers: the zygote of ``secret`` and the pool's imports.

    ``watch``: ``(pid, start time)`` of the process whose end ends the zygote (a Ray node's
    raylet), or ``None``; ``idle``: seconds the zygote lives on without a launcher alive.
    Pools that hold the same ``secret`` and import the same modules share one zygote.
    """

    secret: bytes
    watch: tuple[int, int] | None = None
    idle: float = 60.0


def _parts(preload: Sequence[str], warm_up: str) -> list[str]:
    """What makes two pools' launchers the same: the interpreter, its path, its imports."""
    return [sys.executable, json.dumps(sys.path), str(os.getuid()), warm_up, *preload]


def fork_launcher(
    zygote: Zygote,
    preload: Sequence[str],
    warm_up: str,
    control: int,
    request: dict[str, Any],
    timeout: float,
) -> tuple[int, int]:
    """Have the zygote fork a launcher whose control socket is ``control``: its pid and pidfd.

    ``request``: what ``_launcher.serve_forked`` takes (``max_frame_bytes``, ``cgroups``,
    ``nice``); this process's pid, environment, working directory, umask, niceness and limits
    are added. Starts the zygote when none listens. Raises ``ZygoteUnavailable``.
    """
    import resource

    deadline = time.monotonic() + timeout
    parts = _parts(preload, warm_up)
    name = socket_name(zygote.secret, parts)
    umask = _umask()
    request = {
        **request,
        "host_pid": os.getpid(),
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "umask": umask,
        "priority": os.getpriority(os.PRIO_PROCESS, 0),
        "limits": {name: resource.getrlimit(getattr(resource, name)) for name in LIMITS},
    }
    started = False
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.settimeout(_left(deadline))
            try:
                sock.connect(name)
            except ConnectionRefusedError:
                if started:
                    raise ZygoteUnavailable("the zygote it started does not listen") from None
                _start(zygote, parts, preload, warm_up, deadline)
                started = True
                continue
            return _ask(sock, zygote.secret, control, request, deadline)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ZygoteUnavailable(f"{type(exc).__name__}: {exc}") from None
        finally:
            sock.close()


def _umask() -> int:
    """This process's umask, read without changing it.

    ``os.umask`` sets it to read it, for every thread of the process, and the host's other
    threads go on making files meanwhile.
    """
    with open("/proc/self/status", "rb") as handle:
        for line in handle:
            if line.startswith(b"Umask:"):
                return int(line.split()[1], 8)
    raise ZygoteUnavailable("this kernel does not show the umask in /proc/self/status")


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the zygote did not answer in time")
    return left


def _ask(
    sock: socket.socket, secret: bytes, control: int, request: dict[str, Any], deadline: float
) -> tuple[int, int]:
    mine = os.urandom(NONCE)
    sock.send(mine)
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    zygote_pid, uid, _gid = struct.unpack("3i", creds)
    _wait_readable(sock, zygote_pid, deadline)
    answer = sock.recv(PROOF + NONCE + 1)
    if len(answer) != PROOF + NONCE or not valid(secret, b"zygote", mine, answer[:PROOF]):
        raise ZygoteUnavailable("the socket's listener did not prove it is the zygote")
    if uid != os.getuid():
        raise ZygoteUnavailable(f"the zygote runs as user {uid}, not as this process's")
    message = proof(secret, b"host", answer[PROOF:]) + json.dumps(request).encode()
    socket.send_fds(sock, [message], [control])
    _wait_readable(sock, zygote_pid, deadline)
    reply = json.loads(sock.recv(65536))
    if not isinstance(reply, dict) or "error" in reply:
        raise ZygoteUnavailable(f"the zygote refused: {reply!r:.200}")
    pid, template = reply.get("pid"), reply.get("template")
    if not isinstance(pid, int) or not isinstance(template, int):
        raise ZygoteUnavailable(f"the zygote answered {reply!r:.200}")
    pidfd = os.pidfd_open(pid)
    # after the pidfd: it names the template's child, or nothing
    found, above = _scan.state(pid), _scan.state(template)
    if found is None or above is None or found[0] != template or above[0] != zygote_pid:
        os.close(pidfd)
        raise ZygoteUnavailable(f"the zygote's launcher {pid} is not its template's child")
    return pid, pidfd


def _wait_readable(sock: socket.socket, zygote: int, deadline: float) -> None:
    """Wait for the zygote's answer until ``deadline``.

    A zygote may take seconds to answer its first host (it imports first), but one that is
    stopped (a child stopped it, where the kernel lets it) never answers: seen stopped, it is
    killed (its launchers live on; the next pool starts a new zygote) and this pool gets none.
    """
    while not select.select([sock], [], [], min(_STOPPED_LOOK, _left(deadline)))[0]:
        found = _scan.state(zygote)
        if found is None or found[1] not in "Tt":
            continue
        with contextlib.suppress(OSError):
            # opened while the socket it holds is still open: the pid is the zygote's
            pidfd = os.pidfd_open(zygote)
            try:
                if not select.select([sock], [], [], 0)[0]:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            finally:
                os.close(pidfd)
        raise ZygoteUnavailable(f"the zygote {zygote} is stopped; it was killed")


def _start(
    zygote: Zygote, parts: list[str], preload: Sequence[str], warm_up: str, deadline: float
) -> None:
    """Start the zygote (another host may have started one: it then says ``taken``)."""
    config = {
        "secret": zygote.secret.hex(),
        "parts": parts,
        "preload": list(preload),
        "warm_up": warm_up,
        "watch": None if zygote.watch is None else list(zygote.watch),
        "idle": zygote.idle,
    }
    stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
    stdout_r, stdout_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-c", _BOOTSTRAP, json.dumps(sys.path)],
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, stdin_r, 0),
                (os.POSIX_SPAWN_DUP2, stdout_w, 1),
            ],
            setsid=True,
            setsigdef=(signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE),
            setsigmask=(),
        )
    finally:
        os.close(stdin_r)
        os.close(stdout_w)
    said = b""
    try:
        with contextlib.suppress(OSError):
            os.write(stdin_w, json.dumps(config).encode() + b"\n")
        os.close(stdin_w)
        stdin_w = -1
        while not said.endswith(b"\n"):
            ready, _, _ = select.select([stdout_r], [], [], _left(deadline))
            if not ready:
                continue
            chunk = os.read(stdout_r, 64)
            if not chunk:
                break
            said += chunk
    finally:
        if stdin_w >= 0:
            os.close(stdin_w)
        os.close(stdout_r)
        if not said.endswith(b"\n"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)  # it exits at once: after "taken", or once it forked the zygote
    if said.strip() not in (b"bound", b"taken"):
        raise ZygoteUnavailable(f"the zygote did not start (it said {said!r:.80})")
