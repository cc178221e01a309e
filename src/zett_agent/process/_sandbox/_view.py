"""A sandboxed job's own view of the machine: a mount namespace and an IPC namespace.

Landlock decides which files a job may read and write, but not their metadata: ``chmod``,
``utime``, ``*setxattr`` and ``chown`` on a file the job may not write still reach the
kernel's permission check, which a job running as uid 0 passes for every root-owned file. And
System V IPC (shared memory, semaphores, message queues) and POSIX message queues are named by
keys, not paths, in a namespace the job would share with its host. So the worker, before it
enters Landlock (which forbids mounting once entered), gives the job namespaces of its own:

1. ``unshare(CLONE_NEWNS | CLONE_NEWIPC)`` (root), or with ``CLONE_NEWUSER`` too, mapping the
   host's uid and gid to themselves (a host that is not root: what an unprivileged user may
   make); the IPC namespace is empty, so the host's segments, semaphores and queues do not
   exist for the job, while its own work among its processes; with ``Egress`` a network
   namespace too, whose only interface is loopback (``loopback_listener``);
2. every mount of the copy made private (nothing done here propagates back to the host);
3. the writable paths (the scratch directory, ``write=``) cloned as they are (``open_tree``);
4. every mount made read-only, recursively (``mount_setattr``);
5. the clones moved back onto their paths, so they alone are writable;
6. the working directory entered again (the old one is in the read-only mount), and a standard
   stream that is a directory replaced by ``/dev/null`` (a descriptor inherited from the host
   points into the host's mounts, not this view).

A metadata call by path outside the writable paths then fails with ``EROFS``; through a
descriptor the job inherited, the seccomp filter denies it (``_seccomp``). The namespaces go
with the job's last process.

Imported by the worker, so it imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import socket
import stat
import struct

from .._linux import libc

__all__ = ["loopback_listener", "make_view"]

_CLONE_NEWNS = 0x00020000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_CLONE_NEWUSER = 0x10000000
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_AT_EMPTY_PATH = 0x1000
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_MOUNT_ATTR_RDONLY = 0x1
_MS_PRIVATE = 1 << 18
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
#: the congestion control of the job's network namespace (see ``loopback_listener``)
_LOOPBACK_CONGESTION = b"reno"
_CONGESTION_CONTROL = "/proc/sys/net/ipv4/tcp_congestion_control"
# the same numbers on every architecture (the mount API came after they were unified)
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442

_syscall = libc.syscall
_syscall.restype = ctypes.c_long
_unshare = libc.unshare


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


def _check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def _set_attr(attr: _MountAttr, what: str) -> None:
    _check(
        _syscall(
            _SYS_MOUNT_SETATTR,
            _AT_FDCWD,
            b"/",
            _AT_RECURSIVE,
            ctypes.byref(attr),
            ctypes.sizeof(attr),
        ),
        what,
    )


def _map_ids(uid: int, gid: int) -> None:
    """Map the host's uid and gid to themselves in a user namespace just made."""
    for name, text in (
        ("setgroups", "deny"),
        ("gid_map", f"{gid} {gid} 1"),
        ("uid_map", f"{uid} {uid} 1"),
    ):
        _write_proc(f"/proc/self/{name}", text.encode(), strict=True)


def _write_proc(path: str, value: bytes, strict: bool = False) -> None:
    """Write ``value`` to ``path`` under ``/proc``; an ``OSError`` is raised only if ``strict``."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, value)
        finally:
            os.close(fd)
    except OSError:
        if strict:
            raise


def _unshare_namespaces(privileged: bool, network: bool) -> str:
    """Enter the new namespaces; what they are, for the report. Raises ``OSError``."""
    flags, names = _CLONE_NEWNS | _CLONE_NEWIPC, ["mount", "ipc"]
    if network:
        flags |= _CLONE_NEWNET
        names.append("net")
    if not privileged:
        flags |= _CLONE_NEWUSER
        names.insert(0, "user")
    uid, gid = os.geteuid(), os.getegid()
    _check(_unshare(flags), f"unshare({' | '.join('CLONE_NEW' + n.upper() for n in names)})")
    if not privileged:
        _map_ids(uid, gid)
    if network:
        _write_proc(_CONGESTION_CONTROL, _LOOPBACK_CONGESTION)  # see ``loopback_listener``
    return ", ".join(names)


def loopback_listener() -> socket.socket:
    """In a network namespace just made: bring ``lo`` up, listen on ``127.0.0.1``, any port.

    The job's one way out: its worker hands this socket to the host, whose proxy accepts on it
    (``zett_agent.process._host._proxy``). Raises ``OSError``.

    Every socket of the namespace sends unpaced, with Reno: the namespace took the host's
    default congestion control, and where that is BBR the kernel paces each send to the rate it
    measured, with a timer between bursts; over loopback that only costs CPU and leaves the
    job, the relay and the server waiting on one another (a 1 GB download through the proxy ran
    at 0.5 to 0.6 of a direct one's speed, 0.7 to 0.8 without). ``_unshare_namespaces`` makes
    Reno the namespace's default (the job's own sockets), and this listener chooses it too, so
    the proxy's side of each connection, the one that sends a download, is born with it even
    where the default could not be written. Reno is built into every kernel and allowed to
    every account; a refusal leaves the default (slower, not wrong).
    """
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(probe, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))
    finally:
        probe.close()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(OSError):
            listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, _LOOPBACK_CONGESTION)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
    except BaseException:
        listener.close()
        raise
    return listener


def make_view(
    scratch: str, writable: list[str], privileged: bool, network: bool = False
) -> tuple[str | None, str]:
    """Give this process its own namespaces and a read-only view but for ``writable``.

    ``scratch`` is the job's working directory (entered again at the end); ``writable`` the
    paths that stay writable (the scratch directory first), each existing. ``privileged``:
    this process may make mount and IPC namespaces itself (root with ``CAP_SYS_ADMIN``);
    otherwise a user namespace is made for them. ``network``: a network namespace too (only
    loopback, down until ``loopback_listener``).

    Returns ``(None, namespaces)`` when the view is in place, ``(why not, "")`` when not even
    the namespaces could be made (nothing changed: the caller denies what the view would have
    stopped instead). Raises ``OSError`` when the namespaces were made but the view was not
    finished: the job must not run then.
    """
    try:
        made = _unshare_namespaces(privileged, network)
    except OSError as exc:
        return str(exc), ""
    _set_attr(_MountAttr(0, 0, _MS_PRIVATE, 0), "making the job's mounts private")
    clones: list[tuple[str, int]] = []
    try:
        for path in writable:
            fd = _check(
                _syscall(
                    _SYS_OPEN_TREE,
                    _AT_FDCWD,
                    os.fsencode(path),
                    _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE,
                ),
                f"open_tree({path})",
            )
            clones.append((path, fd))
        _set_attr(_MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0), "making the job's view read-only")
        for path, fd in clones:
            _check(
                _syscall(
                    _SYS_MOVE_MOUNT,
                    fd,
                    b"",
                    _AT_FDCWD,
                    os.fsencode(path),
                    _MOVE_MOUNT_F_EMPTY_PATH,
                ),
                f"move_mount(onto {path})",
            )
    finally:
        for _path, fd in clones:
            os.close(fd)
    os.chdir(scratch)
    _no_directory_streams()
    return None, made


def _no_directory_streams() -> None:
    """Replace a standard stream that is a directory with ``/dev/null``.

    A descriptor inherited from the host names a file in the host's mounts: the ``*at`` calls
    resolve paths relative to a directory descriptor in its mount, past this view.
    """
    null = -1
    try:
        for fd in (0, 1, 2):
            try:
                is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
            except OSError:
                continue
            if is_dir:
                if null < 0:
                    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
                os.dup2(null, fd)
    finally:
        if null >= 0:
            os.close(null)
