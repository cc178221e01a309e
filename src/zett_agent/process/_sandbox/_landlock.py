"""Landlock through ctypes: the ABI the kernel offers, and rulesets for files, TCP and scoping.

Landlock (Linux 5.13 and newer) lets a process restrict itself and every process it starts
afterwards; the restriction (a *domain*) can only grow stricter, never looser, and nested domains
stack. Three system calls: ``landlock_create_ruleset`` (444), ``landlock_add_rule`` (445) and
``landlock_restrict_self`` (446), the same numbers on every architecture (they were added after
the numbering was unified).

What each ABI version adds, and what this module does with it (best effort, as the kernel's
``Documentation/userspace-api/landlock.rst`` describes: handle only the rights the running ABI
knows, so a ruleset built for a newer kernel still works on an older one, with less):

====  ======  ===========================================================================
ABI   Linux   adds
====  ======  ===========================================================================
1     5.13    file system rights (read, write, execute, make and remove entries)
2     5.19    ``REFER`` (renames and links across directories; always denied on ABI 1)
3     6.2     ``TRUNCATE`` (before it, ``truncate`` of a readable file is not controlled)
4     6.7     TCP ``bind`` and ``connect``
5     6.10    ``IOCTL_DEV`` (ioctl on device files)
6     6.12    scoping: no signal to, no connection to an abstract UNIX socket of, a process
              outside the domain
7     6.15    audit logging flags (not used here)
====  ======  ===========================================================================

Whatever the ABI, a process in a domain cannot ``ptrace`` (nor read ``/proc/PID/mem``,
``environ`` and the like of) a process outside its domain.

Imported by the launcher and the workers, so it imports nothing heavy.
"""

from __future__ import annotations

import ctypes
import os
import stat
from typing import Any

from .._linux import libc, prctl
from . import _caps

__all__ = [
    "ABI_SCOPE",
    "ABI_TCP",
    "ACCESS_FS_EXECUTE",
    "ACCESS_FS_READ_DIR",
    "ACCESS_FS_READ_FILE",
    "ACCESS_FS_TRUNCATE",
    "ACCESS_FS_WRITE_FILE",
    "Ruleset",
    "abi",
    "fs_rights",
    "no_new_privs",
    "read_rights",
    "scope_self",
    "set_no_new_privs",
    "worker_scoping",
    "write_rights",
]

_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2

# the rights of <linux/landlock.h> this module names; the others of ABI 1 (bits 4 to 12 but
# 6 and 11: remove a directory or file, make a directory, regular file, socket, FIFO or
# symlink) are only handled and granted as a whole, through _FS_ABI1
ACCESS_FS_EXECUTE = 1 << 0
ACCESS_FS_WRITE_FILE = 1 << 1
ACCESS_FS_READ_FILE = 1 << 2
ACCESS_FS_READ_DIR = 1 << 3
ACCESS_FS_MAKE_CHAR = 1 << 6
ACCESS_FS_MAKE_BLOCK = 1 << 11
_FS_ABI1 = (1 << 13) - 1  # the 13 rights of ABI 1
ACCESS_FS_REFER = 1 << 13  # ABI 2
ACCESS_FS_TRUNCATE = 1 << 14  # ABI 3
ACCESS_FS_IOCTL_DEV = 1 << 15  # ABI 5

ACCESS_NET_BIND_TCP = 1 << 0  # ABI 4
ACCESS_NET_CONNECT_TCP = 1 << 1

SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

#: the first ABI with TCP rules, and the first with signal and abstract-socket scoping
ABI_TCP = 4
ABI_SCOPE = 6

#: rights that apply to a file (a rule on a file may only grant these)
_FILE_RIGHTS = ACCESS_FS_EXECUTE | ACCESS_FS_WRITE_FILE | ACCESS_FS_READ_FILE
_FILE_RIGHTS |= ACCESS_FS_TRUNCATE | ACCESS_FS_IOCTL_DEV


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _NetPortAttr(ctypes.Structure):
    _fields_ = (("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64))


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


_syscall = libc.syscall
_syscall.restype = ctypes.c_long

_PR_SET_NO_NEW_PRIVS = 38
_PR_GET_NO_NEW_PRIVS = 39

_abi: int | None = None
_abi_reason: str | None = None


def _error(what: str) -> OSError:
    errno = ctypes.get_errno()
    return OSError(errno, f"{what}: {os.strerror(errno)}")


def abi() -> tuple[int, str | None]:
    """``(ABI version, None)`` of the running kernel's Landlock, or ``(0, why there is none)``.

    Asked once per process (the answer is kept, so a forked worker inherits it for free).
    """
    global _abi, _abi_reason
    if _abi is None:
        if os.uname().sysname != "Linux":
            _abi, _abi_reason = 0, "Landlock is a Linux feature"
        else:
            version = _syscall(
                _SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION
            )
            if version >= 0:
                _abi, _abi_reason = int(version), None
            else:
                errno = ctypes.get_errno()
                _abi = 0
                if errno == 38:  # ENOSYS
                    _abi_reason = (
                        "this kernel has no Landlock (Linux 5.13 or newer with "
                        "CONFIG_SECURITY_LANDLOCK=y is needed)"
                    )
                elif errno == 95:  # EOPNOTSUPP
                    _abi_reason = (
                        "Landlock is built into this kernel but not enabled; add landlock to "
                        "the lsm= kernel boot parameter (or CONFIG_LSM)"
                    )
                else:
                    _abi_reason = f"Landlock is not usable here: {os.strerror(errno)}"
    return _abi, _abi_reason


def fs_rights(version: int) -> int:
    """Every file system right an ABI knows.

    Every file system right ABI ``version`` knows (what a ruleset handles, so that all of
    it is denied unless a rule grants it).
    """
    if version < 1:
        return 0
    rights = _FS_ABI1
    if version >= 2:
        rights |= ACCESS_FS_REFER
    if version >= 3:
        rights |= ACCESS_FS_TRUNCATE
    if version >= 5:
        rights |= ACCESS_FS_IOCTL_DEV
    return rights


def read_rights(version: int) -> int:
    """Read and execute (files), list (directories)."""
    return (ACCESS_FS_EXECUTE | ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR) & fs_rights(version)


def write_rights(version: int) -> int:
    """Everything but making device files.

    Read, write, truncate, make and remove entries, rename within, execute what was written.
    """
    return fs_rights(version) & ~(ACCESS_FS_MAKE_CHAR | ACCESS_FS_MAKE_BLOCK)


def set_no_new_privs() -> None:
    """``PR_SET_NO_NEW_PRIVS``.

    No execve of this process or its descendants gains privileges (setuid bits and file capabilities
    are ignored). Needed by Landlock and seccomp without ``CAP_SYS_ADMIN``. Cannot be undone.
    """
    if prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _error("prctl(PR_SET_NO_NEW_PRIVS)")


def no_new_privs() -> bool:
    """Whether ``no_new_privs`` is set for this process."""
    return bool(prctl(_PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1)


class Ruleset:
    """One Landlock ruleset under construction.

    ``restrict_self`` enforces it on this thread (and every process it starts from then on).
    ``version`` is the ABI to build for: rights and scopes it does not know are left out.
    """

    def __init__(self, version: int, *, fs: bool, tcp: bool, scoped: bool) -> None:
        self.version = version
        self.handled_fs = fs_rights(version) if fs else 0
        handled_net = (
            ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP if tcp and version >= ABI_TCP else 0
        )
        scopes = SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET if scoped and version >= ABI_SCOPE else 0
        attr = _RulesetAttr(self.handled_fs, handled_net, scopes)
        self.tcp = bool(handled_net)
        self.scoped = bool(scopes)
        fd = _syscall(
            _SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0
        )
        if fd < 0:
            raise _error("landlock_create_ruleset")
        self.fd = int(fd)
        #: one rule's attributes, filled in again for each rule
        self._attr = _PathBeneathAttr(0, -1)
        self._attr_ref = ctypes.byref(self._attr)

    def allow(self, path: str, rights: int, *, directory: bool | None = None) -> bool:
        """Grant rights beneath a path.

        Grant ``rights`` (masked to what is handled) beneath ``path`` (a directory) or on it
        (a file: only the rights that apply to files). ``directory`` says which it is when the
        caller knows (saves a ``fstat``; a directory that turned into a file since makes the
        kernel refuse the rule, with ``OSError``). False when ``path`` does not exist; other
        failures raise ``OSError``.
        """
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return False
        try:
            allowed = rights & self.handled_fs
            if directory is None:
                directory = stat.S_ISDIR(os.fstat(fd).st_mode)
            if not directory:
                allowed &= _FILE_RIGHTS
            if not allowed:
                return True
            attr = self._attr
            attr.allowed_access = allowed
            attr.parent_fd = fd
            if _syscall(_SYS_ADD_RULE, self.fd, _RULE_PATH_BENEATH, self._attr_ref, 0) != 0:
                raise _error(f"landlock_add_rule({path})")
            return True
        finally:
            os.close(fd)

    def allow_connect(self, port: int) -> None:
        """Grant connecting to TCP ``port`` (any address); raises ``OSError`` when refused.

        Only in a ruleset that handles TCP (``tcp=True``, ABI 4): without, nothing is
        restricted and nothing needs granting.
        """
        if not self.tcp:
            return
        attr = _NetPortAttr(ACCESS_NET_CONNECT_TCP, port)
        if _syscall(_SYS_ADD_RULE, self.fd, _RULE_NET_PORT, ctypes.byref(attr), 0) != 0:
            raise _error(f"landlock_add_rule(connect to port {port})")

    def restrict_self(self) -> None:
        """Enter the domain.

        Needs ``no_new_privs`` or ``CAP_SYS_ADMIN``; raises ``OSError`` (``E2BIG``: 16 domains are
        nested already).
        """
        if _syscall(_SYS_RESTRICT_SELF, self.fd, 0) != 0:
            raise _error("landlock_restrict_self")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def scope_self(version: int) -> None:
    """Enter a Landlock domain that scopes signals and abstract sockets.

    Enter a domain of its own that only scopes signals and abstract UNIX sockets (no file
    system or network rule): from then on this process and everything it starts can signal,
    ``ptrace`` or connect to an abstract socket of a process only inside the domain (itself, its
    descendants, and domains nested in it). Needs ``version >= ABI_SCOPE``; sets
    ``no_new_privs`` first unless the process has ``CAP_SYS_ADMIN`` (root). Raises
    ``OSError`` when the kernel refuses.
    """
    if version < ABI_SCOPE:
        raise OSError(95, f"Landlock ABI {version} has no scoping (ABI {ABI_SCOPE} is needed)")
    ruleset = Ruleset(version, fs=False, tcp=False, scoped=True)
    try:
        if not _has_sys_admin():
            set_no_new_privs()
        ruleset.restrict_self()
    finally:
        ruleset.close()


def _has_sys_admin() -> bool:
    return _caps.has(_caps.CAP_SYS_ADMIN)


def worker_scoping(cap: int, wanted: bool) -> dict[str, Any]:
    """Whether workers can each enter a scoping Landlock domain.

    Whether workers can each enter a Landlock domain that scopes signals and abstract UNIX
    sockets: asked of the kernel once, and tried once in a short-lived child (the kernel may
    refuse a domain nested too deep). ``cap`` is the highest ABI the pool allows (-1: any).
    """
    kernel, why = abi()
    version = kernel if cap < 0 else min(kernel, cap)
    info: dict[str, Any] = {"kernel_abi": kernel, "abi": version, "scoped": False, "reason": None}
    if not wanted:
        info["reason"] = "switched off for this pool (ProcessPool(scope_workers=False))"
    elif version < ABI_SCOPE:
        pretend = f"the pool pretends ABI {version}; " if version < kernel else ""
        info["reason"] = (
            f"{pretend}Landlock ABI {version} cannot scope signals and abstract UNIX sockets "
            f"(ABI {ABI_SCOPE}, Linux 6.12, is needed)" + (f": {why}" if why else "")
        )
    else:
        pid = os.fork()
        if pid == 0:
            try:
                scope_self(version)
            except OSError as exc:
                os._exit(exc.errno or 1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            info["scoped"] = True
        else:
            info["reason"] = f"the kernel refused a worker's Landlock domain: {os.strerror(code)}"
    return info
