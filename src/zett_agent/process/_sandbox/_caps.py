"""Linux capabilities through ctypes: look at them, and drop every one for good.

A sandboxed job that stays uid 0 (because no unprivileged account can run the interpreter) must
hold no capability at all and never regain one: the bounding set is emptied (no ``execve`` can
grant what is not in it), the ambient set cleared, the effective, permitted and inheritable
sets emptied with ``capset``, and the securebits locked so that uid 0 means nothing special to
``execve`` and ``setuid`` any more.

Imported by the launcher and the workers, so it imports nothing heavy.
"""

from __future__ import annotations

import ctypes
import os

from .._linux import libc, prctl

__all__ = [
    "CAP_SETGID",
    "CAP_SETPCAP",
    "CAP_SETUID",
    "CAP_SYS_ADMIN",
    "bounding",
    "clear_ambient",
    "drop_all",
    "drop_bounding",
    "has",
    "held",
    "lock_securebits",
]

CAP_SETGID = 6
CAP_SETUID = 7
CAP_SETPCAP = 8
CAP_SYS_ADMIN = 21

_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_PR_CAPBSET_READ = 23
_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
#: noroot, no-setuid-fixup, keep-caps off, no-ambient-raise: each one with its lock bit
_SECUREBITS_LOCKED = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80


def _last_cap() -> int:
    """The highest capability this kernel knows (read once: a forked worker inherits it)."""
    try:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 63  # the kernel's sets are 64 bits wide


_MAX_CAP = _last_cap()


class _Header(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _Data(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


# bound here, in the launcher: a name looked up on a CDLL costs a dlsym in every worker
_capget = libc.capget
_capset = libc.capset


def _error(what: str) -> OSError:
    errno = ctypes.get_errno()
    return OSError(errno, f"{what}: {os.strerror(errno)}")


def held() -> tuple[int, int, int]:
    """``(effective, permitted, inheritable)`` of this thread, as 64-bit masks."""
    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    if _capget(ctypes.byref(header), data) != 0:
        raise _error("capget")
    return (
        data[0].effective | data[1].effective << 32,
        data[0].permitted | data[1].permitted << 32,
        data[0].inheritable | data[1].inheritable << 32,
    )


def has(cap: int) -> bool:
    """Whether ``cap`` is in this thread's effective set."""
    try:
        return bool(held()[0] >> cap & 1)
    except OSError:
        return False


def bounding() -> int:
    """The bounding set as a mask (capabilities the kernel does not know read as absent)."""
    mask = 0
    for cap in range(_MAX_CAP + 1):
        if prctl(_PR_CAPBSET_READ, cap, 0, 0, 0) == 1:
            mask |= 1 << cap
    return mask


def drop_bounding() -> None:
    """Empty the bounding set (needs ``CAP_SETPCAP``; raises ``OSError`` without it).

    Each drop that returns 0 took effect: nothing is left to check afterwards.
    """
    for cap in range(_MAX_CAP + 1):
        if prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise _error(f"prctl(PR_CAPBSET_DROP, {cap})")


def clear_ambient() -> None:
    """Empty the ambient set (always allowed; a no-op on kernels without ambient sets)."""
    if prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        if errno != 22:  # EINVAL: a kernel older than 4.3 has no ambient set
            raise _error("prctl(PR_CAP_AMBIENT_CLEAR_ALL)")


def lock_securebits() -> None:
    """Lock the securebits.

    Lock the securebits so uid 0 gains nothing on ``execve`` and a ``setuid`` changes no
    capability (needs ``CAP_SETPCAP``).
    """
    if prctl(_PR_SET_SECUREBITS, _SECUREBITS_LOCKED, 0, 0, 0) != 0:
        raise _error("prctl(PR_SET_SECUREBITS)")


def drop_all() -> None:
    """Empty the effective, permitted and inheritable sets (always allowed)."""
    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    if _capset(ctypes.byref(header), data) != 0:
        raise _error("capset")
