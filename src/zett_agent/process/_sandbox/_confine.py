"""The worker's side of a ``Sandbox``: confine this process before the job's code runs.

``confine(policy, keep_fd)`` runs in a fresh worker, after the job frame arrived and before the
job is unpickled (unpickling can run code of the job). In this order:

1. the scratch directory is made (mode 0700, owned by the job's account) and becomes the
   working directory;
1b. the job's own mount and IPC namespaces, with a view of the file system that is read-only
   but for the scratch directory and the write paths (``_view``); where they cannot be made,
   the seccomp filter denies what they would have stopped (file metadata, System V IPC);
2. every descriptor but stdin, stdout, stderr and the worker's socket is closed (and a ruleset
   an idle spare prepared, see ``_ruleset``);
3. the environment is replaced by the policy's minimal one, and the host's environment is wiped
   from memory (the block the process was started with, and Python's copies of it);
4. ``no_new_privs``;
5. Landlock: the file system (read and execute the policy's read paths, write the scratch
   directory and the write paths, nothing else), TCP bind and connect (``network="none"``,
   ABI 4), signal and abstract UNIX socket scoping (ABI 6), in the ruleset a spare prepared
   for the policy's kind when there is one (``_ruleset``);
6. the seccomp filter (``_seccomp``, decoded ahead by the spare too);
7. the account: as root, no supplementary groups, then the job's gid and uid (every capability
   goes with the uid), or, for uid 0, a gid other than the host's and every capability dropped
   with the securebits locked; the result is checked (no capability left, the ids as asked);
   then ``PR_SET_DUMPABLE`` 0 (no core dump; no process of the same account may ``ptrace`` it).

It returns the report of what was enforced (and how long that took, ``seconds``), which the
worker sends to the host before the job runs. A report with ``"refused"`` means the job must
not run: something the policy requires is missing, or a step that must not fail failed (an
account change that did not happen). Whatever was done by then stays done: the worker exits
right after.

Imported by the worker, so it imports nothing heavy.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time
from typing import Any

from .._linux import libc, prctl
from . import _caps, _landlock, _ruleset, _seccomp, _view

__all__ = ["confine", "warm_up"]

_PR_SET_DUMPABLE = 4
#: where a bytes object's data starts (its header, without the trailing NUL)
_BYTES_DATA = bytes.__basicsize__ - 1
#: what a required sandbox needs: signal and abstract-socket scoping, Linux 6.12
_REQUIRED_ABI = _landlock.ABI_SCOPE
_KERNEL_OF_ABI = {1: "5.13", 2: "5.19", 3: "6.2", 4: "6.7", 5: "6.10", 6: "6.12", 7: "6.15"}

_memset = ctypes.memset
# bound here, in the launcher: a name looked up on a CDLL costs a dlsym in every worker
_clearenv = libc.clearenv


def _environment_block() -> tuple[int, int]:
    """Find the environment block in this process's memory.

    Where the environment this process was started with lies in its memory (fields 50 and
    51 of ``/proc/PID/stat``): read once, in the launcher; its workers have it at the same
    addresses.
    """
    try:
        with open(f"/proc/{os.getpid()}/stat", "rb") as handle:
            stat = handle.read()
        fields = stat[stat.rfind(b")") + 2 :].split()  # from field 3 on
        start, end = int(fields[47]), int(fields[48])
    except (OSError, ValueError, IndexError):
        return 0, 0
    return (start, end) if 0 < start < end and end - start < 1 << 24 else (0, 0)


_ENV_BLOCK = _environment_block()


def _sample_policy() -> bytes:
    """A policy document the size and shape of a real one (see ``_policy.policy``)."""
    paths = [f"/usr/{'s' * n}" for n in range(4, 52, 2)]  # of every common length
    scratch = "/tmp/zett-agent-sandbox-warmup0/job-1"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": scratch}
    shared = {
        "defaults": paths[:16],
        "default_files": paths[16:],
        "devices": ["/dev/null"],
        "account": {"mode": "user", "uid": 65534, "gid": 65534},
        "account_why": "w" * 320,
        "landlock_abi": 7,
        "seccomp": "A" * 1940,
        "seccomp_without_view": "A" * 1940,
        "seccomp_reason": None,
    }
    job = {
        "read": paths[:2],
        "write": paths[:2],
        "scratch": scratch,
        "network": "none",
        "env": {**env, "TMPDIR": scratch},
        "required": True,
    }
    return json.dumps({"shared": shared, "job": job}, separators=(",", ":")).encode()


_SAMPLE_POLICY = _sample_policy()


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
    for name, value in getattr(os.environ, "_data", {}).items():
        # the names too: dropping them writes their reference counts
        for data in (name, value):
            _touch(id(data) + _BYTES_DATA, len(data))
    os.putenv(b"ZETT_AGENT_WARM_UP", b"1")  # libc's environment array, and its allocator
    os.unsetenv(b"ZETT_AGENT_WARM_UP")
    # a policy of a real one's size and shape: decoding it leaves the allocator's pages for
    # the real one copied (it was a tenth of confining when done cold)
    parts = json.loads(_SAMPLE_POLICY)
    sample = {**parts["shared"], **parts["job"]}
    start, end = _ENV_BLOCK
    if start:
        _touch(start, end - start)
    # running a function writes its code object (the interpreter counts its first calls, then
    # specializes it) and the reference counts of what it names: those pages are copied now
    for address, size in _CONFINING_OBJECTS:
        _touch(address, size)
    try:
        version, _why = _landlock.abi()
        if version:
            # the ruleset a job gets, on paths that exist, never entered: nothing is restricted
            sample["defaults"] = sample["read"] = sample["write"] = ["/"] * 8
            sample["default_files"] = ["/etc/hosts"]
            sample["devices"], sample["scratch"] = ["/"], "/"
            _ruleset.job_ruleset(sample, version, [])[0].close()
        _caps.held()
        _caps.bounding()  # the same calls as dropping it, reading it instead
        _seccomp.prepare(b"\0" * 8)
    except OSError:
        pass


def _touch(address: int, size: int) -> None:
    """Write each page of ``size`` bytes at ``address`` with the byte it holds (copy it now)."""
    for page in range(address, address + size, 4096):
        cell = ctypes.c_char.from_address(page)
        cell.value = cell.value
    if size > 1:
        last = ctypes.c_char.from_address(address + size - 1)
        last.value = last.value


def _scratch(path: str, account: dict[str, Any]) -> None:
    try:
        os.mkdir(path, 0o700)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _Refused(f"could not make the scratch directory {path}: {exc}") from None
    try:
        if account["mode"] == "user":
            os.fchown(fd, account["uid"], account["gid"])
        if os.fstat(fd).st_mode & 0o7777 != 0o700:  # a umask took more than mkdir asked
            os.fchmod(fd, 0o700)  # (a sandboxed job's own pool may not: its filter denies it)
        os.fchdir(fd)
    except OSError as exc:
        raise _Refused(f"could not prepare the scratch directory {path}: {exc}") from None
    finally:
        os.close(fd)


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
    if prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise _Refused("prctl(PR_SET_DUMPABLE, 0) failed")


def _own_view(policy: dict[str, Any], account: dict[str, Any], report: dict[str, Any]) -> bool:
    """Give the job its namespaces and read-only view (``_view``); whether it has them.

    Records in the report what it got (``"namespaces"``), or why not (``"view"`` false and
    ``"view_why"``: the seccomp filter then denies what the view would have stopped).
    """
    scratch = policy["scratch"]
    writable = [scratch, *(path for path in policy["write"] if os.path.exists(path))]
    egress = policy["network"] == "egress"
    try:
        why, made = _view.make_view(scratch, writable, account["mode"] != "same", egress)
    except OSError as exc:
        raise _Refused(f"the job's read-only view could not be finished: {exc}") from None
    report["view"] = why is None
    if why is None:
        report["namespaces"] = made
        if egress:
            _egress(policy, report)
    elif egress:
        report["missing"]["netns"] = (
            f"{why}: no network namespace of its own, so Egress cannot route the job through "
            "its parent's proxy (root, or unprivileged user namespaces, are needed)"
        )
        raise _Refused(
            "the sandbox's Egress needs a network namespace for the job: "
            + report["missing"]["netns"]
        )
    else:
        report["view_why"] = (
            f"{why}: no namespaces of its own, so the seccomp filter denies changing any "
            "file's metadata and System V IPC instead"
        )
    return why is None


def _egress(policy: dict[str, Any], report: dict[str, Any]) -> None:
    """In the job's new network namespace: its one way out, a listener the host's proxy serves.

    The listener's descriptor goes to the host with the report (``"egress_fd"``, taken off the
    report by the worker); its port is the only TCP port the job may connect to (Landlock), and
    the proxy variables of the job's environment name it.
    """
    try:
        listener = _view.loopback_listener()
    except OSError as exc:
        raise _Refused(f"could not open the job's way to its proxy: {exc}") from None
    port = int(listener.getsockname()[1])
    policy["egress_port"] = port
    proxy = f"http://127.0.0.1:{port}"
    env = policy["env"]
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = proxy
    report["egress"] = {"port": port}
    report["egress_fd"] = listener.detach()


def _close_all_but(keep_fd: int, *also: int) -> None:
    """Close every descriptor but stdio, ``keep_fd``, ``also`` and a prepared ruleset's."""
    keep = [keep_fd, *also]
    prepared = _ruleset.prepared_fd()
    if prepared >= 0:
        keep.append(prepared)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


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
        view = _own_view(policy, account, report)
        _close_all_but(keep_fd, *([report["egress_fd"]] if "egress_fd" in report else []))
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
                ruleset, report["prepared"] = _ruleset.job_ruleset(policy, version, absent)
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

        program = policy.get("seccomp" if view else "seccomp_without_view")
        if program is None:
            missing["seccomp"] = str(policy.get("seccomp_reason") or "no seccomp here")
        else:
            try:
                _ruleset.load_seccomp(program, policy)
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
        if "egress_fd" in report:
            os.close(report.pop("egress_fd"))
    _ruleset.discard()
    report["seconds"] = round(time.perf_counter() - began, 6)
    return report


#: the functions ``confine`` runs (``warm_up`` copies their code objects' pages)
_CONFINING: tuple[Any, ...] = (
    confine,
    _scratch,
    _wipe_environment,
    _ruleset.job_ruleset,
    _ruleset.shared_rules,
    _ruleset.new_ruleset,
    _ruleset.prepared_fd,
    _ruleset.discard,
    _ruleset._prepared_for,
    _ruleset._take_prepared,
    _ruleset.load_seccomp,
    _close_all_but,
    _account,
    _describe_account,
    _landlock.abi,
    _landlock.set_no_new_privs,
    _landlock.read_rights,
    _landlock.write_rights,
    _landlock.fs_rights,
    _landlock.Ruleset.__init__,
    _landlock.Ruleset.allow,
    _landlock.Ruleset.restrict_self,
    _landlock.Ruleset.close,
    _own_view,
    _egress,
    _view.make_view,
    _view._unshare_namespaces,
    _view._set_attr,
    _view._check,
    _view._no_directory_streams,
    _seccomp.load,
    _seccomp.install,
    _seccomp.prepare,
    _caps.held,
    _caps.has,
    _caps.drop_bounding,
    _caps.clear_ambient,
    _caps.lock_securebits,
    _caps.drop_all,
)


def _named_objects(functions: tuple[Any, ...]) -> tuple[tuple[int, int], ...]:
    """Where the objects running ``functions`` writes to lie: ``(address, size)`` each.

    Each function, its code (all of it), its constants, the names it uses and the objects
    they name (globals, and the attributes of the modules it names). Made once, in the
    launcher: these objects live as long as their modules.
    """
    found: dict[int, int] = {}

    def add(obj: object, size: int = 1) -> None:
        found[id(obj)] = max(size, found.get(id(obj), 1))

    def visit(code: Any, names: dict[str, Any]) -> None:
        # the object with its bytecode inline, never past it (sys.getsizeof adds what a
        # debugger attached elsewhere)
        kind = type(code)
        add(code, kind.__basicsize__ + kind.__itemsize__ * (len(code.co_code) // 2))
        for const in code.co_consts:
            if hasattr(const, "co_code"):
                visit(const, names)
            else:
                add(const)
        modules = []
        for name in code.co_names:
            add(name)
            if name in names:
                add(names[name])
                if isinstance(names[name], type(os)):
                    modules.append(names[name])
        for module in modules:
            for name in code.co_names:
                if name in module.__dict__:
                    add(module.__dict__[name])

    for function in functions:
        add(function)
        visit(function.__code__, function.__globals__)
    return tuple(found.items())


_CONFINING_OBJECTS = _named_objects(_CONFINING)
