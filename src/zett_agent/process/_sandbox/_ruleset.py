"""A sandboxed job's Landlock ruleset and seccomp filter: built at the job, or ahead.

The rules every job of one kind of sandbox shares (the interpreter, ``sys.path``, the shared
libraries, the CA certificates, the devices) are most of a job's ruleset. An idle spare of a
pool that sandboxes jobs builds a ruleset with them ahead (``prepare``, from the shared part of
the pool's latest sandboxed policy, which its launcher passes on), and decodes the policy's
seccomp program; nothing is enforced then. The job's worker (``_confine``) takes the prepared
ruleset when its policy has exactly that shared part and network kind, adds its own rules (the
scratch directory, ``read=``, ``write=``) and enters it; any other job builds its own. A job
that is not sandboxed closes what was prepared before it runs (``discard``).

Imported by the workers, so it imports nothing heavy.
"""

from __future__ import annotations

import binascii
import json
from typing import Any

from . import _landlock, _seccomp

__all__ = [
    "discard",
    "job_ruleset",
    "load_seccomp",
    "new_ruleset",
    "prepare",
    "prepared_fd",
    "shared_rules",
]


def shared_rules(ruleset: _landlock.Ruleset, policy: dict[str, Any], version: int) -> None:
    """Add the rules every job of the policy's kind gets (the defaults and the devices)."""
    read = _landlock.read_rights(version)
    for path in policy["defaults"]:
        ruleset.allow(path, read, directory=True)
    for path in policy["default_files"]:
        ruleset.allow(path, read, directory=False)
    device = (
        _landlock.ACCESS_FS_READ_FILE
        | _landlock.ACCESS_FS_WRITE_FILE
        | _landlock.ACCESS_FS_TRUNCATE
    )
    for path in policy["devices"]:
        ruleset.allow(path, device)


def new_ruleset(policy: dict[str, Any], version: int) -> _landlock.Ruleset:
    """A ruleset for the policy's kind with its shared rules in it."""
    tcp = policy["network"] in ("none", "egress")  # "egress": its proxy's port only, below
    ruleset = _landlock.Ruleset(version, fs=True, tcp=tcp, scoped=True)
    try:
        shared_rules(ruleset, policy, version)
    except BaseException:
        ruleset.close()
        raise
    return ruleset


def job_ruleset(
    policy: dict[str, Any], version: int, absent: list[str]
) -> tuple[_landlock.Ruleset, bool]:
    """The job's ruleset, and whether it was prepared ahead.

    The one a spare prepared for the policy's kind when there is one (``prepare``), else a new
    one; then the job's own rules. The paths of ``read=`` and ``write=`` that do not exist go to
    ``absent`` (the defaults are the host's, which exist).
    """
    prepared = _take_prepared(policy, version)
    ruleset = prepared or new_ruleset(policy, version)
    try:
        read = _landlock.read_rights(version)
        for path in policy["read"]:
            if not ruleset.allow(path, read):
                absent.append(path)
        write = _landlock.write_rights(version)
        ruleset.allow(policy["scratch"], write)
        for path in policy["write"]:
            if not ruleset.allow(path, write):
                absent.append(path)
        if "egress_port" in policy:  # the only TCP the job may connect to: its proxy
            ruleset.allow_connect(int(policy["egress_port"]))
    except BaseException:
        ruleset.close()
        raise
    return ruleset, prepared is not None


class _Prepared:
    """What a spare made ahead for confining a job of one kind (see ``prepare``)."""

    def __init__(self, shared: dict[str, Any]) -> None:
        self.shared = shared
        self.ruleset: _landlock.Ruleset | None = None
        self.version = 0
        self.seccomp: str | None = None
        self.fprog: Any = None


_prepared: _Prepared | None = None


def prepare(shared: str) -> None:
    """Build ahead what confining a job of the pool's latest kind takes; change nothing.

    ``shared`` is the shared part of that kind's policy (``_policy``), as JSON. An idle spare
    of a sandboxing pool runs it: the Landlock ruleset with the shared rules (a file
    descriptor of this worker, not yet enforced) and the seccomp program, decoded. A job
    whose policy has exactly that shared part then adds only its own rules (``confine``); any
    other job finds nothing prepared (``discard``). Never raises: what fails is built at the
    job, as without preparation.
    """
    global _prepared
    discard()
    try:
        policy = json.loads(shared)
        prepared = _Prepared(policy)
        version = min(_landlock.abi()[0], int(policy["landlock_abi"]))
        if version >= 1:
            prepared.ruleset = new_ruleset(policy, version)
            prepared.version = version
        program = policy.get("seccomp")
        if isinstance(program, str):
            data = binascii.a2b_base64(program)
            prepared.seccomp, prepared.fprog = program, _seccomp.prepare(data)
    except (OSError, ValueError, TypeError, KeyError):
        return
    _prepared = prepared


def prepared_fd() -> int:
    """The prepared ruleset's descriptor (kept open while a job is confined), or -1."""
    prepared = _prepared
    if prepared is None or prepared.ruleset is None:
        return -1
    return prepared.ruleset.fd


def discard() -> None:
    """Close what ``prepare`` made (a job that is not sandboxed must not inherit its fd)."""
    global _prepared
    if _prepared is not None:
        if _prepared.ruleset is not None:
            _prepared.ruleset.close()
        _prepared = None


def _prepared_for(policy: dict[str, Any]) -> _Prepared | None:
    prepared = _prepared
    if prepared is None:
        return None
    shared = prepared.shared
    # the same shared part, key by key, and a job of the same network kind
    if policy["network"] != shared.get("network") or any(
        policy.get(key) != value for key, value in shared.items()
    ):
        return None
    return prepared


def _take_prepared(policy: dict[str, Any], version: int) -> _landlock.Ruleset | None:
    prepared = _prepared_for(policy)
    if prepared is None or prepared.ruleset is None or prepared.version != version:
        return None
    ruleset, prepared.ruleset = prepared.ruleset, None
    return ruleset


def load_seccomp(program: str, policy: dict[str, Any]) -> None:
    prepared = _prepared_for(policy)
    if prepared is not None and prepared.seccomp == program:
        _seccomp.install(prepared.fprog)
    else:
        _seccomp.load(binascii.a2b_base64(program))
