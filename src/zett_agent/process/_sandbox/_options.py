"""``Sandbox``: what a job may touch, decided by the host and enforced in its worker.

The host turns a ``Sandbox`` into a *policy* (``_policy``: plain JSON, the paths, the
environment, the account, the seccomp filter as BPF) once per job, in ``submit``; the policy
travels in front of the pickled job, and the worker enforces it (``_confine``) before it
unpickles anything, so no code of the job runs outside the sandbox. The worker reports what it
enforced before the job runs; the host keeps that report on the job (``ProcessJob.sandbox_report``).

Also here: ``sandbox_support()`` (what this machine can enforce) and the account checks that
make ``user=`` an error at the call when it cannot work.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import stat
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..._checks import check_choice, check_env, check_flag
from .._errors import ProcessError
from . import _caps, _landlock, _seccomp

if TYPE_CHECKING:
    from ._egress import Egress

#: the module of ``Egress``: an ``Egress`` exists only once it was imported
_EGRESS_MODULE = f"{__package__}._egress"

__all__ = [
    "NOBODY",
    "Account",
    "Sandbox",
    "SandboxUnavailable",
    "check_sandbox",
    "resolve_account",
    "sandbox_support",
]

#: the account a sandboxed job runs as when the host is root and ``user=`` names none
NOBODY = 65534
#: Landlock ABI a ``required`` sandbox needs: signal and abstract-socket scoping (Linux 6.12)
REQUIRED_ABI = _landlock.ABI_SCOPE
#: what ``Sandbox.network`` accepts
_NETWORKS = ("none", "all")
#: the kernel that first had each ABI, for messages
KERNEL_OF_ABI = {1: "5.13", 2: "5.19", 3: "6.2", 4: "6.7", 5: "6.10", 6: "6.12", 7: "6.15"}


class SandboxUnavailable(ProcessError):
    """A sandboxed job could not be confined as its ``Sandbox`` asks, so it did not run.

    Raised (as the job's outcome) when ``Sandbox(required=True)`` and something is missing on
    this machine; the message names what and which kernel or setting provides it. ``missing``
    lists the missing parts (``"landlock"``, ``"scoping"``, ``"tcp"``, ``"seccomp"``,
    ``"account"``...).
    """

    def __init__(self, message: str, missing: Sequence[str] = ()) -> None:
        self.missing = tuple(missing)
        super().__init__(message)

    def __reduce__(self) -> tuple[type[SandboxUnavailable], tuple[str, tuple[str, ...]]]:
        return (type(self), (str(self), self.missing))


def _paths(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str | bytes | os.PathLike) or not isinstance(value, Sequence):
        raise TypeError(
            f"Sandbox.{name} must be a list of paths, got {type(value).__name__} "
            f"{value!r:.60}; write {name}=[{value!r:.40}]"
        )
    out = []
    for item in value:
        if not isinstance(item, str | os.PathLike):
            raise TypeError(
                f"Sandbox.{name} takes str or os.PathLike paths, got {type(item).__name__} "
                f"{item!r:.40}"
            )
        path = os.fspath(item)
        if not isinstance(path, str):
            raise TypeError(f"Sandbox.{name} takes str paths, got bytes {path!r:.40}")
        if not os.path.isabs(path) or "\0" in path:
            raise ValueError(
                f"Sandbox.{name} paths must be absolute, got {path!r:.80}; write "
                f"os.path.abspath({path!r:.40})"
            )
        out.append(os.path.normpath(path))
    return tuple(out)


@dataclass(frozen=True)
class Sandbox:
    """What one job may touch, enforced by the kernel.

    What one job may touch, enforced by the kernel in its worker before any of its code runs
    and inherited by every process it starts. Checked at construction like ``ProcessLimits``.

    - ``read``: paths the job may read (and execute) beyond the defaults: the interpreter's
      prefix, standard library and site-packages, every ``sys.path`` entry of the host, the
      shared libraries, the CA certificates and the few files of ``/etc`` name resolution and
      TLS read, ``/dev/null``, ``/dev/zero`` and ``/dev/urandom``. Nothing else: not the home
      directory, not the rest of ``/etc``, not ``/proc``.
    - ``write``: paths it may write (and read) beyond its scratch directory. The scratch
      directory is made for the job (mode 0700, owned by its account), is its working
      directory, ``HOME`` and ``TMPDIR``, and is removed with everything in it when the job
      ends.
    - ``network``: ``"none"`` (default: no socket can be created, no TCP bind or connect, no
      datagram; connected ``AF_UNIX`` pairs still work), ``"all"``, or an ``Egress``: a
      network namespace of the job's own with only loopback, whose one way out is a proxy in
      the parent that allows the listed hosts only (``HTTPS_PROXY``, ``HTTP_PROXY`` and
      ``ALL_PROXY`` name it; every decision is counted on the job).
    - ``env``: variables added to the minimal environment (``PATH``, ``LANG``, ``HOME``,
      ``TMPDIR``); nothing of the host's environment reaches the job.
    - ``user``: the account the job runs as when the host is root (uid or name). Default: uid
      and gid 65534 when that account can read and run the interpreter and the job's code,
      else uid 0 with every capability dropped (``user=0`` asks for that). Naming an account
      that cannot run the interpreter, or any ``user=`` on a host that is not root, is a
      ``ValueError`` at ``submit`` (and where a subagent definition is made).
    - ``required``: ``True`` (default) fails the job with ``SandboxUnavailable`` before its
      code runs when any part cannot be enforced here (see ``sandbox_support()``); ``False``
      runs it with what can be, and ``ProcessJob.sandbox_report`` says what that was.

    Raises ``TypeError`` for a value of the wrong type and ``ValueError`` for a bad one (a
    relative path, an unknown network mode, an invalid variable name), naming the field.
    """

    read: Sequence[str | os.PathLike[str]] = ()
    write: Sequence[str | os.PathLike[str]] = ()
    network: Literal["none", "all"] | Egress = "none"
    env: Mapping[str, str] | None = None
    user: int | str | None = None
    required: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "read", _paths("read", self.read))
        object.__setattr__(self, "write", _paths("write", self.write))
        if not _is_egress(self.network):
            check_choice("Sandbox(network=...)", self.network, _NETWORKS)
        if self.env is not None:
            check_env("Sandbox.env", self.env)
            object.__setattr__(self, "env", dict(self.env))
        user = self.user
        if user is not None:
            if isinstance(user, bool) or not isinstance(user, int | str):
                raise TypeError(
                    f"Sandbox.user must be a uid (int), an account name (str) or None, got "
                    f"{type(user).__name__} {user!r:.40}"
                )
            if isinstance(user, int) and not 0 <= user < 2**32 - 1:
                raise ValueError(f"Sandbox.user must be a uid from 0 to 4294967294, got {user}")
            if isinstance(user, str) and (not user or "\0" in user):
                raise ValueError(f"Sandbox.user must be an account name, got {user!r:.40}")
        check_flag("Sandbox(required=...)", self.required)

    @property
    def network_kind(self) -> Literal["none", "all", "egress"]:
        """``"none"``, ``"all"``, or ``"egress"`` for an ``Egress``."""
        network = self.network
        return network if isinstance(network, str) else "egress"  # checked when made


def _is_egress(value: object) -> bool:
    """Whether ``value`` is an ``Egress``, without importing its module when none was made.

    A child imports ``Sandbox`` (its definition may hold one) but builds no egress rules: their
    module (address parsing, four frozen dataclasses) cost 2.4 ms of every pool's start.
    """
    module = sys.modules.get(_EGRESS_MODULE)
    return module is not None and isinstance(value, module.Egress)


# -- the account ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Account:
    """Who a sandboxed job runs as.

    ``mode`` is ``"user"`` (``uid``/``gid``, no groups, no capability), ``"root"`` (uid 0 with
    the nobody account's gid, every capability dropped and locked out) or ``"same"`` (the
    host is not root: its own uid, any capability dropped). ``why`` says why, when it is not
    the account that was asked for (the default one could not run the interpreter).
    """

    mode: Literal["user", "root", "same"]
    uid: int
    gid: int
    why: str | None = None


def _privileged() -> bool:
    """Whether this process may change its uid and gid (root with the capabilities)."""
    if os.geteuid() != 0:
        return False
    try:
        effective = _caps.held()[0]  # one capget for the three (this runs on every submit)
    except OSError:
        return False
    return all(
        effective >> cap & 1 for cap in (_caps.CAP_SETUID, _caps.CAP_SETGID, _caps.CAP_SETPCAP)
    )


def _needed_paths() -> list[tuple[str, bool]]:
    """What an account must reach to run the interpreter and the job's code.

    (path, must be executable).
    """
    paths: list[tuple[str, bool]] = [(sys.executable, True)]
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError):
            paths.append((sysconfig.get_path(name), False))
    for entry in sys.path:
        paths.append((entry or os.getcwd(), False))
    return paths


def _mode_allows(st: os.stat_result, uid: int, gid: int, want: int) -> bool:
    if st.st_uid == uid:
        bits = st.st_mode >> 6
    elif st.st_gid == gid:
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    return bits & want == want


def _blocked(path: str, uid: int, gid: int, executable: bool) -> str | None:
    """Why ``uid``/``gid`` (no supplementary groups) cannot reach and read ``path``, or None.

    Walks every component with ``stat``: ``os.access`` checks the real uid of this process,
    not the account's. ACLs are not looked at (the mode bits decide).
    """
    for candidate in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
        try:
            final = os.stat(candidate)
        except OSError:
            return None  # a sys.path entry that does not exist needs nothing
        parts = candidate.split("/")[1:]
        current = "/"
        for part in ["", *parts[:-1]]:
            current = os.path.join(current, part) if part else current
            try:
                st = os.stat(current)
            except OSError:
                return None
            if not _mode_allows(st, uid, gid, 1):
                return (
                    f"{current} is mode {stat.S_IMODE(st.st_mode):04o}, owned by uid "
                    f"{st.st_uid} gid {st.st_gid}, so uid {uid} cannot enter it (needed for "
                    f"{path})"
                )
        want = 5 if stat.S_ISDIR(final.st_mode) or executable else 4
        if not _mode_allows(final, uid, gid, want):
            return (
                f"{candidate} is mode {stat.S_IMODE(final.st_mode):04o}, owned by uid "
                f"{final.st_uid} gid {final.st_gid}, so uid {uid} cannot "
                f"{'run' if executable else 'read'} it"
            )
    return None


@functools.lru_cache(maxsize=16)
def _interpreter_problem(uid: int, gid: int, path_key: tuple[str, ...]) -> str | None:
    for path, executable in _needed_paths():
        problem = _blocked(path, uid, gid, executable)
        if problem is not None:
            return problem
    return None


def interpreter_problem(uid: int, gid: int) -> str | None:
    """Why an account cannot run this interpreter, if it cannot.

    Why account ``uid``/``gid`` cannot read and run this interpreter and the code on
    ``sys.path``, or ``None`` when it can (cached per ``sys.path``).
    """
    return _interpreter_problem(uid, gid, tuple(sys.path))


def _lookup(user: int | str) -> tuple[int, int]:
    if isinstance(user, int):
        try:
            return user, pwd.getpwuid(user).pw_gid
        except KeyError:
            return user, user  # an id without an entry: its own number as the group
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ValueError(
            f"Sandbox(user={user!r:.40}): there is no such account on this machine; name an "
            "existing one or give a uid"
        ) from None
    return entry.pw_uid, entry.pw_gid


def _other_gid(gid: int, nobody_gid: int) -> int:
    """``gid``, or the nobody account's group when ``gid`` is one of the host's groups.

    A job never shares a group with its host: the kernel lets a process change another's
    resource limits (``prlimit``) and trace it only when every id matches, and group-owned
    files and IPC objects of the host stay the host's.
    """
    host = {os.getgid(), os.getegid(), *os.getgroups()}
    if gid not in host:
        return gid
    return nobody_gid if nobody_gid not in host else NOBODY


def resolve_account(user: int | str | None) -> Account:
    """The account a job of ``Sandbox(user=user)`` runs as on this host.

    Raises ``ValueError`` when ``user`` is given on a host that is not root, names no account,
    or names one that cannot read and run the interpreter (the message says which path stops
    it). The answer is kept per ``user``, privileges and ``sys.path`` (it looks at the account
    database and the file system).
    """
    return _resolve_account(user, _privileged(), os.geteuid(), tuple(sys.path))


@functools.lru_cache(maxsize=32)
def _resolve_account(
    user: int | str | None, privileged: bool, euid: int, path_key: tuple[str, ...]
) -> Account:
    if not privileged:
        if user is not None:
            raise ValueError(
                f"Sandbox(user={user!r:.40}) needs a host running as root (with CAP_SETUID, "
                f"CAP_SETGID and CAP_SETPCAP); this one runs as uid {os.geteuid()}, so its "
                "sandboxed jobs run as that uid. Drop user=, or run the host as root"
            )
        return Account("same", os.geteuid(), os.getegid())
    nobody_gid = _lookup(NOBODY)[1]
    if user is None:
        uid, gid = _lookup(NOBODY)
        problem = interpreter_problem(uid, gid)
        if problem is None:
            return Account("user", uid, _other_gid(gid, nobody_gid))
        return Account(
            "root",
            0,
            _other_gid(0, nobody_gid),
            f"uid {uid} cannot run the interpreter ({problem}); the job runs as uid 0 with "
            "every capability dropped instead. Install Python where that account can read it "
            "(a world-readable prefix) to run jobs as an unprivileged account",
        )
    uid, gid = _lookup(user)
    if uid == 0:
        return Account("root", 0, _other_gid(0, nobody_gid))
    gid = _other_gid(gid, nobody_gid)
    problem = interpreter_problem(uid, gid)
    if problem is not None:
        raise ValueError(
            f"Sandbox(user={user!r:.40}): uid {uid} cannot run the interpreter: {problem}. "
            "Make the interpreter and the job's code readable to that account, or drop user= "
            "(the job then runs as uid 0 with every capability dropped)"
        )
    return Account("user", uid, gid)


def check_sandbox(sandbox: object, where: str) -> Sandbox | None:
    """``sandbox`` if it is a ``Sandbox`` (its account checked for this host) or ``None``.

    ``TypeError`` naming ``where`` otherwise, ``ValueError`` for an account that cannot work.
    """
    if sandbox is None:
        return None
    if not isinstance(sandbox, Sandbox):
        raise TypeError(
            f"{where} takes a zett_agent.process.Sandbox or None, got "
            f"{type(sandbox).__name__}; write Sandbox(read=[...], network='none')"
        )
    if sandbox.user is not None:
        resolve_account(sandbox.user)
    return sandbox


# -- the machine --------------------------------------------------------------------------------


def _kernel_for(abi: int) -> str:
    return f"Linux {KERNEL_OF_ABI.get(abi, 'newer')}"


def _read_number(path: str) -> int | None:
    try:
        with open(path, "rb") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return None


def _namespaces_problem(privileged: bool) -> str | None:
    """Why a job cannot get namespaces of its own here (a guess made without trying), or None.

    Root makes them with ``CAP_SYS_ADMIN``; another account through a user namespace, which
    the kernel's settings may forbid. The worker reports what it really got (``"view"``).
    """
    if privileged:
        if _caps.has(_caps.CAP_SYS_ADMIN):
            return None
        return "the host runs as root without CAP_SYS_ADMIN, so it cannot make namespaces"
    if _read_number("/proc/sys/user/max_user_namespaces") == 0:
        return "user namespaces are switched off (user.max_user_namespaces is 0)"
    if _read_number("/proc/sys/kernel/unprivileged_userns_clone") == 0:
        return "unprivileged user namespaces are switched off (kernel.unprivileged_userns_clone)"
    if _read_number("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == 1:
        return "AppArmor restricts unprivileged user namespaces"
    return None


def sandbox_support() -> dict[str, Any]:
    """What this machine can enforce for a ``Sandbox``, as JSON data.

    ``landlock_abi`` (0 when there is no Landlock), ``seccomp`` (bool), ``can_change_user``
    (the host is root and may run jobs as another account), ``default_user`` (the uid a job runs
    as when ``user=`` names none: 65534, or 0 with every capability dropped when that account
    cannot run the interpreter, or the host's own uid), ``namespaces`` (whether a job gets mount
    and IPC namespaces of its own, and with them a read-only view of the file system outside
    its writable paths: root, or unprivileged user namespaces; without, the seccomp filter
    denies every metadata and System V IPC call instead), ``required_ok`` (whether a
    ``required=True`` sandbox runs here) and ``reasons``: for each thing missing or weaker, why
    and what provides it.
    """
    version, landlock_reason = _landlock.abi()
    seccomp_ok, seccomp_reason = _seccomp.available()
    reasons: dict[str, str] = {}
    if landlock_reason is not None:
        reasons["landlock"] = landlock_reason
    elif version < REQUIRED_ABI:
        reasons["scoping"] = (
            f"Landlock ABI {version} cannot scope signals and abstract UNIX sockets (ABI "
            f"{REQUIRED_ABI}, {_kernel_for(REQUIRED_ABI)}, is needed)"
        )
    if version and version < _landlock.ABI_TCP:
        reasons["tcp"] = (
            f"Landlock ABI {version} has no TCP rules (ABI {_landlock.ABI_TCP}, "
            f"{_kernel_for(_landlock.ABI_TCP)}); seccomp still denies sockets"
        )
    if seccomp_reason is not None:
        reasons["seccomp"] = seccomp_reason
    privileged = _privileged()
    account = resolve_account(None)
    namespaces_why = _namespaces_problem(privileged)
    if namespaces_why is not None:
        reasons["namespaces"] = namespaces_why
    if not privileged:
        reasons["can_change_user"] = (
            f"the host runs as uid {os.geteuid()}, not as root: sandboxed jobs run as that uid"
        )
    elif account.why is not None:
        reasons["default_user"] = account.why
    return {
        "landlock_abi": version,
        "seccomp": seccomp_ok,
        "can_change_user": privileged,
        "default_user": account.uid,
        "namespaces": namespaces_why is None,
        "required_ok": version >= REQUIRED_ABI and seccomp_ok,
        "reasons": reasons,
    }
