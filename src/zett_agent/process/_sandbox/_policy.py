"""A sandboxed job's policy: the ``Sandbox`` as the plain JSON its worker enforces.

Made by the host once per job (in ``submit``): the paths it may read and write (its own plus
what an interpreter needs), its environment, its account, and the seccomp filter as BPF. The
worker enforces it (``_confine``) before it unpickles anything of the job.
"""

from __future__ import annotations

import binascii
import contextlib
import functools
import json
import os
import sys
import sysconfig

from . import _seccomp
from ._options import Account, Sandbox

__all__ = ["policy"]


#: files of /etc that name resolution and TLS read (and nothing else of /etc)
_ETC = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/ld.so.cache",
    "/etc/ssl/certs",
    "/etc/ssl/cert.pem",
    "/etc/ssl/openssl.cnf",
    "/etc/pki/tls/certs",
    "/etc/pki/tls/cert.pem",
    "/etc/pki/ca-trust/extracted",
    "/etc/ca-certificates",
)
_LIBRARIES = ("/lib", "/lib32", "/lib64", "/libx32", "/usr/lib", "/usr/lib32", "/usr/lib64")
_SHARED = ("/usr/local/lib", "/usr/share/ca-certificates", "/usr/lib/ssl")
_READ_DEVICES = ("/dev/zero", "/dev/urandom", "/dev/random")
_RW_DEVICES = ("/dev/null",)
_PATH = "/usr/local/bin:/usr/bin:/bin"


@functools.lru_cache(maxsize=4)
def _default_read(path_key: tuple[str, ...]) -> tuple[str, ...]:
    paths: dict[str, None] = {}
    for prefix in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix):
        paths[prefix] = None
    paths[os.path.dirname(sys.executable)] = None
    paths[os.path.realpath(sys.executable)] = None
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError):
            paths[sysconfig.get_path(name)] = None
    for entry in path_key:
        paths[os.path.abspath(entry or os.getcwd())] = None
    try:
        import certifi

        paths[os.path.dirname(certifi.where())] = None
    except ImportError:
        pass
    import ssl  # here: loading it costs the host's first import of the engine 10 ms

    verify = ssl.get_default_verify_paths()
    for found in (verify.cafile, verify.capath, verify.openssl_cafile, verify.openssl_capath):
        if found:
            paths[found] = None
    for path in (*_LIBRARIES, *_SHARED, *_ETC, *_READ_DEVICES):
        paths[path] = None
    return _covering(paths)


def _covering(paths: dict[str, None]) -> tuple[str, ...]:
    """The paths to write rules for.

    The paths that exist, without those beneath another one of the list (a rule on a
    directory covers everything below it): fewer rules for the worker to add per job.
    """
    found = sorted({os.path.realpath(path) for path in paths if os.path.exists(path)})
    kept: list[str] = []
    for path in found:
        if not any(path == top or path.startswith(top.rstrip("/") + "/") for top in kept):
            kept.append(path)
    # a symlink to a file elsewhere is opened through its target: the rule is on the target
    return tuple(kept)


def _bpf(network: str, view: bool) -> tuple[str | None, str | None]:
    """The seccomp program as base64 (compiled once per process), or why there is none.

    ``view``: the program for a job that got its own namespaces and read-only view; without,
    it also denies what the view would have stopped (see ``_seccomp``).
    """
    ok, reason = _seccomp.available()
    if not ok:
        return None, reason
    try:
        program = _seccomp.program(network, view)
    except OSError as exc:
        return None, f"the seccomp filter could not be built: {exc}"
    return binascii.b2a_base64(program, newline=False).decode("ascii"), None


@functools.lru_cache(maxsize=16)
def _shared_part(
    account: Account, network: str, landlock_abi: int, seccomp: bool, path_key: tuple[str, ...]
) -> str:
    """The policy's shared part, encoded once.

    The part of the policy every job of one kind shares, as JSON (made once: encoding it
    per job would cost the host's event loop for nothing).
    """
    defaults = _default_read(path_key)
    if seccomp:
        program, seccomp_reason = _bpf(network, view=True)
        # egress needs the job's namespaces: without them it does not run at all
        without_view = None if network == "egress" else _bpf(network, view=False)[0]
    else:
        program, seccomp_reason = None, "seccomp is switched off for this pool (seccomp=False)"
        without_view = None
    return json.dumps(
        {
            # split here, where they were found, so the worker need not fstat each one
            "defaults": [path for path in defaults if os.path.isdir(path)],
            "default_files": [path for path in defaults if not os.path.isdir(path)],
            "devices": list(_RW_DEVICES),
            "network": network,
            "account": {"mode": account.mode, "uid": account.uid, "gid": account.gid},
            "account_why": account.why,
            "landlock_abi": landlock_abi,
            "seccomp": program,
            # for a worker that could not make the job's namespaces (the view)
            "seccomp_without_view": without_view,
            "seccomp_reason": seccomp_reason,
        },
        separators=(",", ":"),
    )


def shared_part(sandbox: Sandbox, account: Account, *, landlock_abi: int, seccomp: bool) -> str:
    """What every job of ``sandbox``'s kind shares of its policy, as JSON (made once).

    ``landlock_abi`` is the highest ABI the pool may use (lower than the kernel's to pretend an
    older one); ``seccomp=False`` pretends there is no seccomp. A pool's spares prepare for the
    latest one (``_ruleset.prepare``).
    """
    return _shared_part(account, sandbox.network_kind, landlock_abi, seccomp, tuple(sys.path))


def policy(sandbox: Sandbox, scratch: str, shared: str) -> bytes:
    """The policy the worker enforces for one job, as JSON (see ``_confine.confine``).

    What jobs of its kind share (``shared``, from ``shared_part``), and the job's own part:
    ``{"shared": ..., "job": ...}``.
    """
    env = {
        "PATH": _PATH,
        "LANG": os.environ.get("LANG") or "C.UTF-8",
        "HOME": scratch,
        "TMPDIR": scratch,
    }
    env.update(sandbox.env or {})
    job = {
        "read": sandbox.read,
        "write": sandbox.write,
        "scratch": scratch,
        "network": sandbox.network_kind,
        "env": env,
        "required": sandbox.required,
    }
    return f'{{"shared":{shared},"job":{json.dumps(job, separators=(",", ":"))}}}'.encode()
