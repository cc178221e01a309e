"""The worker's side of a ``Sandbox``: confine this process before the job's code runs.

``confine(policy, keep_fd)`` runs in a fresh worker, after the job frame arrived and before the
job is unpickled (unpickling can run code of the job). In this order:

1. the scratch directory is made (mode 0700, owned by the job's account) and becomes the
   working directory;
2. every descriptor but stdin, stdout, stderr and the worker's socket is closed;
3. the environment is replaced by the policy's minimal one, and the host's environment is wiped
   from memory (the block the process was started with, and Python's copies of it);
4. ``no_new_privs``;
5. Landlock: the file system (read and execute the policy's read paths, write the scratch
   directory and the write paths, nothing else), TCP bind and connect (``network="none"``,
   ABI 4), signal and abstract UNIX socket scoping (ABI 6);
6. the seccomp filter (``_seccomp``);
7. the account: as root, no supplementary groups, then the job's gid and uid (every capability
   goes with the uid), or, for uid 0, every capability dropped with the securebits locked; the
   result is checked (no capability left, the ids as asked); then ``PR_SET_DUMPABLE`` 0 (no
   core dump; no process of the same account may ``ptrace`` it).

It returns the report of what was enforced (and how long that took, ``seconds``), which the
worker sends to the host before the job runs. A report with ``"refused"`` means the job must
not run: something the policy requires is missing, or a step that must not fail failed (an
account change that did not happen). Whatever was done by then stays done: the worker exits
right after.

Imported by the worker, so it imports nothing heavy.
"""

from __future__ import annotations

import binascii
import ctypes
import json
import os
import sys
import threading
import time
from typing import Any

from . import _caps, _landlock, _seccomp

__all__ = ["confine", "warm_up"]

_PR_SET_DUMPABLE = 4
#: where a bytes object's data starts (its header, without the trailing NUL)
_BYTES_DATA = bytes.__basicsize__ - 1
#: what a required sandbox needs: signal and abstract-socket scoping, Linux 6.12
_REQUIRED_ABI = _landlock.ABI_SCOPE
_KERNEL_OF_ABI = {1: "5.13", 2: "5.19", 3: "6.2", 4: "6.7", 5: "6.10", 6: "6.12", 7: "6.15"}

_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_prctl.restype = ctypes.c_int
_memset = ctypes.memset
# bound here, in the launcher: a name looked up on a CDLL costs a dlsym in every worker
_clearenv = _libc.clearenv


def _environment_block() -> tuple[int, int]:
    """Where the environment this process was started with lies in its memory (fields 50 and
    51 of ``/proc/PID/stat``): read once, in the launcher; its workers have it at the same
    addresses."""
    try:
        with open(f"/proc/{os.getpid()}/stat", "rb") as handle:
            stat = handle.read()
        fields = stat[stat.rfind(b")") + 2 :].split()  # from field 3 on
        start, end = int(fields[47]), int(fields[48])
    except (OSError, ValueError, IndexError):
        return 0, 0
    return (start, end) if 0 < start < end and end - start < 1 << 24 else (0, 0)


_ENV_BLOCK = _environment_block()


class _Refused(Exception):
    """A step that must succeed failed; the message says which and why."""


def _kernel(abi: int) -> str:
    return f"Linux {_KERNEL_OF_ABI.get(abi, 'newer')}"


def _wipe_environment(env: dict[str, str]) -> None:
    """Replace the environment with ``env`` and overwrite the host's values in memory.

    ``os.environ.clear()`` alone leaves the values readable in this process: in the block the
    interpreter was started with (on the stack, where ``/proc/PID/environ`` reads it) and in
    Python's ``bytes`` copies of them. Values of one byte are shared objects and stay.
    """
    # os.environ.clear() would decode every value into a str first (a copy left in freed
    # memory): unset each variable by its bytes name, wipe the bytes values, drop them
    variables: dict[bytes, bytes] = getattr(os.environ, "_data", {})
    _clearenv()  # libc's own list: every variable at once
    for old in variables.values():
        if len(old) > 1:
            _memset(id(old) + _BYTES_DATA, 0, len(old))
    variables.clear()
    start, end = _ENV_BLOCK
    if start:
        _memset(start, 0, end - start)
    # not os.environ.update: its generic mapping code costs ten times more in a fresh fork
    for key, value in env.items():
        name, data = key.encode(), value.encode()
        os.putenv(name, data)
        variables[name] = data
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = None  # type: ignore[attr-defined]  # found again from TMPDIR


def warm_up() -> None:
    """Touch what ``confine`` will touch, changing nothing (an idle spare runs it).

    A worker is a fresh fork: the first write to each page it shares with the launcher copies
    that page, and on a virtual machine each copy costs tens of microseconds. Confining touches
    pages all over (the environment's values, libc's environment, the ctypes and Landlock
    calls), which made up half of its cost when done cold.
    """
    for value in getattr(os.environ, "_data", {}).values():
        if len(value) > 1:
            cell = ctypes.c_char.from_address(id(value) + _BYTES_DATA)
            cell.value = cell.value  # the same byte: the page is copied now, not later
    os.putenv(b"ZETT_AGENT_WARM_UP", b"1")  # libc's environment array, and its allocator
    os.unsetenv(b"ZETT_AGENT_WARM_UP")
    json.loads('{"shared":{"defaults":["/usr/lib"]},"job":{"env":{"A":"b"},"required":true}}')
    start, end = _ENV_BLOCK
    for address in range(start, end, 4096) if start else ():
        cell = ctypes.c_char.from_address(address)
        cell.value = cell.value
    try:
        version, _why = _landlock.abi()
        if version:
            ruleset = _landlock.Ruleset(version, fs=True, tcp=True, scoped=True)
            try:
                ruleset.allow("/", _landlock.read_rights(version))
            finally:
                ruleset.close()  # never entered: nothing is restricted
        _caps.held()
        _seccomp.prepare(b"\0" * 8)
    except OSError:
        pass


def _scratch(path: str, account: dict[str, Any]) -> None:
    try:
        os.mkdir(path, 0o700)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _Refused(f"could not make the scratch directory {path}: {exc}") from None
    try:
        if account["mode"] == "user":
            os.fchown(fd, account["uid"], account["gid"])
        os.fchmod(fd, 0o700)
        os.fchdir(fd)
    except OSError as exc:
        raise _Refused(f"could not prepare the scratch directory {path}: {exc}") from None
    finally:
        os.close(fd)


def _landlock_rules(policy: dict[str, Any], version: int, absent: list[str]) -> _landlock.Ruleset:
    """The job's ruleset; the paths of ``read=`` and ``write=`` that do not exist go to
    ``absent`` (the defaults are the host's, which exist)."""
    ruleset = _landlock.Ruleset(version, fs=True, tcp=policy["network"] == "none", scoped=True)
    try:
        read = _landlock.read_rights(version)
        for path in policy["defaults"]:
            ruleset.allow(path, read)
        for path in policy["read"]:
            if not ruleset.allow(path, read):
                absent.append(path)
        device = (
            _landlock.ACCESS_FS_READ_FILE
            | _landlock.ACCESS_FS_WRITE_FILE
            | _landlock.ACCESS_FS_TRUNCATE
        )
        for path in policy["devices"]:
            ruleset.allow(path, device)
        write = _landlock.write_rights(version)
        ruleset.allow(policy["scratch"], write)
        for path in policy["write"]:
            if not ruleset.allow(path, write):
                absent.append(path)
    except BaseException:
        ruleset.close()
        raise
    return ruleset


def _account(account: dict[str, Any]) -> None:
    mode, uid, gid = account["mode"], int(account["uid"]), int(account["gid"])
    try:
        if mode == "user":
            _caps.drop_bounding()
            _caps.clear_ambient()
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            _caps.drop_all()
        elif mode == "root":
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            _caps.drop_bounding()
            _caps.lock_securebits()
            _caps.clear_ambient()
            _caps.drop_all()
        else:
            _caps.clear_ambient()
            if _caps.has(_caps.CAP_SETPCAP):
                _caps.drop_bounding()
            _caps.drop_all()
    except OSError as exc:
        raise _Refused(f"could not change the job's account ({mode}, uid {uid}): {exc}") from None
    held = _caps.held()
    if any(held):
        raise _Refused(f"capabilities are left after dropping them all: {held}")
    if mode == "user" and (
        os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups()
    ):
        raise _Refused(f"the account change to uid {uid} gid {gid} did not take effect")
    if _prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise _Refused("prctl(PR_SET_DUMPABLE, 0) failed")


def _describe_account(mode: str) -> str:
    return {
        "user": "unprivileged account",
        "root": "uid 0 without capabilities",
        "same": "the host's own account",
    }[mode]


def confine(policy: dict[str, Any], keep_fd: int) -> dict[str, Any]:
    """Confine this process as ``policy`` says (see the module docstring); return the report.

    Never raises for what the kernel refuses: the report then has ``"refused"`` (the job must
    not run) or, for ``required=False``, lists what is missing in ``"missing"``.
    """
    began = time.perf_counter()
    account = policy["account"]
    report: dict[str, Any] = {
        "landlock_abi": 0,
        "filesystem": False,
        "tcp": False,
        "scoped": False,
        "seccomp": False,
        "network": policy["network"],
        "user": account["uid"],
        "gid": account["gid"],
        "account": _describe_account(account["mode"]),
        "scratch": policy["scratch"],
        "missing": {},
    }
    if policy.get("account_why"):
        report["account_why"] = policy["account_why"]
    missing: dict[str, str] = report["missing"]
    try:
        if threading.active_count() > 1:
            raise _Refused("another thread runs in the worker; a sandbox confines one thread")
        _scratch(policy["scratch"], account)
        os.closerange(3, keep_fd)
        os.closerange(keep_fd + 1, 1 << 20)
        _wipe_environment(policy["env"])
        try:
            _landlock.set_no_new_privs()
        except OSError as exc:
            raise _Refused(f"could not set no_new_privs: {exc}") from None

        kernel_abi, kernel_reason = _landlock.abi()
        cap = int(policy["landlock_abi"])
        version = min(kernel_abi, cap)
        pretend = (
            f" (the pool pretends ABI {cap}: ProcessPool(landlock_abi={cap}); this kernel has "
            f"ABI {kernel_abi})"
            if cap < kernel_abi
            else ""
        )
        if version < 1:
            missing["landlock"] = (
                f"no Landlock{pretend}: files outside the sandbox stay readable and writable"
                if pretend
                else f"{kernel_reason}: files outside the sandbox stay readable and writable"
            )
        else:
            absent: list[str] = []
            try:
                ruleset = _landlock_rules(policy, version, absent)
                try:
                    ruleset.restrict_self()
                finally:
                    ruleset.close()
            except OSError as exc:
                missing["landlock"] = f"Landlock refused the ruleset: {exc}"
            else:
                report["landlock_abi"] = version
                report["filesystem"] = True
                if absent:
                    report["absent"] = absent  # nothing to allow: they stay absent to the job
                report["tcp"] = ruleset.tcp
                report["scoped"] = ruleset.scoped
        if 0 < version < 3 and "landlock" not in missing:
            missing["truncate"] = (
                f"Landlock ABI {version}{pretend} does not control truncate(): files the job "
                f"may read it may also truncate (ABI 3, {_kernel(3)})"
            )
        if version < _REQUIRED_ABI and "landlock" not in missing:
            missing["scoping"] = (
                f"Landlock ABI {version}{pretend} cannot keep the job from signalling, or "
                "connecting to abstract UNIX sockets of, processes outside its sandbox (ABI "
                f"{_REQUIRED_ABI}, {_kernel(_REQUIRED_ABI)}, is needed)"
            )

        program = policy.get("seccomp")
        if program is None:
            missing["seccomp"] = str(policy.get("seccomp_reason") or "no seccomp here")
        else:
            try:
                _seccomp.load(binascii.a2b_base64(program))
            except OSError as exc:
                missing["seccomp"] = f"the kernel refused the seccomp filter: {exc}"
            else:
                report["seccomp"] = True
        if policy["network"] == "none" and not report["seccomp"] and not report["tcp"]:
            missing["network"] = "neither seccomp nor Landlock TCP rules: the network stays open"

        if policy["required"] and missing:
            raise _Refused(
                "the sandbox cannot be enforced entirely on this machine, and it is required: "
                + "; ".join(missing.values())
                + ". Run on a newer kernel, or pass Sandbox(required=False) to run with what "
                "this machine enforces"
            )
        _account(account)
    except _Refused as refusal:
        report["refused"] = str(refusal)
    report["seconds"] = round(time.perf_counter() - began, 6)
    return report
