"""The few Linux process controls the engine needs: ``prctl``, ``inotify``, the scheduler's.

``prctl``, ``inotify`` and ``sched_setattr`` go through ctypes; a session's niceness for the
scheduler's autogroups through ``/proc/self/autogroup``. Imported by the launcher and the worker,
so it imports nothing heavy.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

__all__ = [
    "Inotify",
    "get_child_subreaper",
    "libc",
    "linux_problem",
    "nice_own_session",
    "prctl",
    "requested_slice",
    "set_child_subreaper",
    "set_parent_death_signal",
    "short_slice_request",
    "take_slice",
]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37

#: the C library, one handle for the engine's modules (``_seccomp`` keeps its own: its
#: ``prctl`` takes a pointer): the symbols this process already has loaded, libc's among them.
#: Not ``ctypes.util.find_library``, which runs ``ldconfig -p`` in a child process at import
#: (a child of every host, launcher and Ray worker) and imports ``subprocess``.
libc = ctypes.CDLL(None, use_errno=True)
#: ``prctl(option, arg2, arg3, arg4, arg5)`` with integer arguments
prctl = libc.prctl
prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
prctl.restype = ctypes.c_int


def _call(option: int, value: int) -> None:
    if prctl(option, value, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}, {value}) failed: {os.strerror(errno)}")


def set_child_subreaper(enabled: bool = True) -> None:
    """Make orphaned descendants of this process reparent to it instead of to PID 1."""
    _call(_PR_SET_CHILD_SUBREAPER, int(enabled))


def get_child_subreaper() -> bool:
    """Whether this process is a child subreaper."""
    out = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.addressof(out), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return bool(out.value)


def set_parent_death_signal(signum: int) -> None:
    """Ask the kernel to send ``signum`` to this process when its parent thread dies."""
    _call(_PR_SET_PDEATHSIG, signum)


def nice_own_session(niceness: int) -> bool:
    """Give this process's session ``niceness``; ``False`` when the kernel says: later.

    With autogroups on (``kernel.sched_autogroup_enabled``, the default of most distributions),
    the scheduler shares the CPU between sessions first, each with the weight of its autogroup's
    niceness (0 when made), and only then between the tasks of a session by theirs. The
    launcher makes the one session of its pool (``setsid``): without this, its niced workers
    would take the host's CPU as a session at niceness 0. A no-op at niceness 0 and without
    autogroups. The kernel takes one such change a tenth of a second from an account without
    ``CAP_SYS_ADMIN`` (``EAGAIN``), machine-wide: the caller asks again later.
    """
    if niceness <= 0:
        return True  # a new autogroup's niceness is 0; lowering it is not ours to ask
    try:
        fd = os.open("/proc/self/autogroup", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return True  # a kernel without autogroups
    try:
        os.write(fd, str(niceness).encode())
    except BlockingIOError:
        return False
    except OSError:
        pass  # refused (a security module): the session keeps niceness 0
    finally:
        os.close(fd)
    return True


#: ``sched_getattr`` and ``sched_setattr`` of this machine, or ``None`` for one not listed
_SCHED_CALLS = {
    "x86_64": (315, 314),
    "i686": (352, 351),
    "aarch64": (275, 274),  # the generic table's, as below
    "riscv64": (275, 274),
    "loongarch64": (275, 274),
}.get(os.uname().machine)
#: ``struct sched_attr`` of its first version: size, policy, flags, nice, priority, runtime,
#: deadline, period
_SCHED_ATTR = struct.Struct("IIQiIQQQ")
#: the policies a slice applies to: ``SCHED_OTHER`` and ``SCHED_BATCH``
_FAIR = (0, 3)
#: the shortest slice the kernel takes (0.1 ms)
SHORT_SLICE_NS = 100_000


def _sched_attr(pid: int = 0) -> tuple[int, ...] | None:
    """``pid``'s ``struct sched_attr`` (its first version's fields), or ``None``; 0: this one."""
    if _SCHED_CALLS is None:
        return None
    attr = ctypes.create_string_buffer(_SCHED_ATTR.size)
    if libc.syscall(_SCHED_CALLS[0], pid, attr, _SCHED_ATTR.size, 0) != 0:
        return None
    return _SCHED_ATTR.unpack(attr.raw)


def requested_slice(pid: int = 0) -> int | None:
    """The slice ``pid`` (0: this process) asked the scheduler for, in nanoseconds, or ``None``.

    The default slice's length when it did not ask; ``None`` where it cannot be read.
    """
    attr = _sched_attr(pid)
    return None if attr is None else attr[5]


def short_slice_request(nice: int) -> ctypes.Array[ctypes.c_char] | None:
    """A request for the shortest slice at niceness ``nice``, for ``take_slice``; or ``None``.

    Linux 6.12's scheduler (EEVDF) lets a task ask for the length of its slice
    (``sched_attr.sched_runtime``). A task waking up, the host's event loop for one, preempts a
    running task only once that one has run its slice; a worker asking for 0.1 ms (the kernel's
    least) instead of the default (0.75 ms times one plus the log2 of the CPUs, at most 3 ms:
    1.4 ms read back on two cores) yields its CPU to a waking host sooner. The share of CPU
    each gets is unchanged (it is their weights), and tasks that contend for a CPU still take
    turns at the scheduler's tick. Applies to the normal and the batch policies only, with
    this process's policy and flags; needs no privilege for a process of the same user. An
    older kernel takes the call and ignores the slice. ``None`` on an unknown machine, or for a
    real-time or idle policy (the host's choice, left as it is).

    Made here (the launcher) and taken by each worker itself, at its first job: a task that
    wakes with a shorter slice than the running one preempts it, so a spare that had it would
    take the host's CPU the moment the host hands it a job, and the host would wait through the
    job's start (and a one-job worker's whole job and exit) before it reads the answer.
    """
    attr = _sched_attr(0)
    if _SCHED_CALLS is None or attr is None:
        return None
    _, policy, flags, _, priority, _, deadline, period = attr
    if policy not in _FAIR:
        return None
    wanted = _SCHED_ATTR.pack(
        _SCHED_ATTR.size, policy, flags, nice, priority, SHORT_SLICE_NS, deadline, period
    )
    return ctypes.create_string_buffer(wanted)


def take_slice(request: ctypes.Array[ctypes.c_char]) -> bool:
    """Make ``short_slice_request``'s request for this process; whether the kernel took it."""
    assert _SCHED_CALLS is not None
    done: int = libc.syscall(_SCHED_CALLS[1], 0, request, 0)
    return done == 0


def linux_problem() -> str | None:
    """Why the process engine cannot run here, in one line, or ``None`` if it can.

    It needs Linux 5.3 or newer (``pidfd_open``, ``pidfd_send_signal``, child subreapers).
    """
    if not sys.platform.startswith("linux"):
        return (
            f"zett_agent.process needs Linux (pidfds, prctl, /proc), and this is "
            f"{sys.platform}; run the host on Linux (a VM or container), or use "
            "zett_agent.runners.InProcessRunner for development (no isolation, no hard kill)"
        )
    release = os.uname().release
    try:
        major, minor = (int(part) for part in release.split(".")[:2])
    except ValueError:
        return None  # an unusual release string: try, and let the calls fail if they must
    if (major, minor) < (5, 3):
        return (
            f"zett_agent.process needs Linux 5.3 or newer (pidfd_open), and this kernel is "
            f"{release}; upgrade the kernel or use zett_agent.runners.InProcessRunner"
        )
    return None


# -- inotify ---------------------------------------------------------------------------------

IN_MODIFY = 0x00000002
IN_IGNORED = 0x00008000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")


class Inotify:
    """A non-blocking inotify descriptor: readable when a watched file changed.

    The engine watches ``cgroup.events`` files with it: the kernel reports each change of a
    cgroup's ``populated`` state as a modification.
    """

    def __init__(self) -> None:
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"inotify_init1: {os.strerror(errno)}")
        self.fd: int = fd

    def add_watch(self, path: str, mask: int = IN_MODIFY) -> int:
        """Watch ``path``; return the watch descriptor.

        Raises ``OSError`` (``ENOENT`` if the file is gone, ``ENOSPC`` when the user's watch limit
        is reached).
        """
        wd = libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"inotify_add_watch({path}): {os.strerror(errno)}")
        return int(wd)

    def rm_watch(self, wd: int) -> None:
        """Stop watching (ignores a watch the kernel already dropped, e.g. for a removed file)."""
        libc.inotify_rm_watch(self.fd, wd)

    def read(self) -> list[tuple[int, int]]:
        """``(wd, mask)`` of every pending event; empty when none is pending."""
        out: list[tuple[int, int]] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                out.append((wd, mask))
                offset += _EVENT.size + length

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
