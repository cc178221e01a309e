"""The sandbox's table (docs/sandbox.md), a row a test, as each account a job may run as.

A host (a real process on its own interpreter) makes objects of its own: a 0600 file and a
folder outside the sandbox, System V IPC objects and a POSIX message queue of mode 0600. Its
sandboxed job tries to reach each kind of kernel object (``_kernel_objects``) and the
legitimate use next to it; the host then checks that nothing of its own changed. Three hosts:

- ``uid 0``: the suite's interpreter, as root, ``Sandbox(user=0)``: the job runs as uid 0
  with every capability dropped (the fallback where uid 65534 cannot run the interpreter);
- ``uid 65534``: Debian's world-readable interpreter, as root, ``Sandbox(user=65534)``;
- ``host not root``: the same interpreter run as uid 65534: its jobs keep its uid, in a user
  namespace of their own.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _kernel_objects as kernel
import pytest

from support.world import INTERPRETER, SRC, World, unavailable
from zett_agent.process._sandbox._landlock import abi
from zett_agent.process._sandbox._seccomp import available

GUARD = 120
_ABI, _WHY = abi()
_SECCOMP, _SECCOMP_WHY = available()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        _ABI < 6 or not _SECCOMP,
        reason=f"a required sandbox needs Landlock ABI 6 and seccomp: ABI {_ABI} ({_WHY}), "
        f"seccomp {_SECCOMP} ({_SECCOMP_WHY})",
    ),
    pytest.mark.skipif(kernel.supported() is not None, reason=str(kernel.supported())),
]

ACCOUNTS = ("uid 0", "uid 65534", "host not root")
#: what a denied attempt may meet: the view (EROFS), Landlock or the mode bits (EACCES),
#: seccomp or a missing capability (EPERM)
DENIED = {"EPERM", "EACCES", "EROFS"}
OK = {"ok"}
#: what each attempt must meet, by row; attempts named "own ..." must work
EXPECTED: dict[str, dict[str, set[Any]]] = {
    "files": {
        "read the host's file": {"EACCES"},
        "write the host's file": DENIED,
        "make a file in the host's folder": DENIED,
    },
    "file metadata": {
        "chmod the host's file": {"EROFS"},
        "chmod the host's folder": {"EROFS"},
        "utime the host's file": {"EROFS"},
        "setxattr the host's file": {"EROFS"},
        "removexattr the host's file": {"EROFS"},
        "chown the host's file": {"EROFS"},
        "fchmod an inherited stream": {"EPERM"},
        "futimens an inherited stream": {"EPERM"},
        "fsetxattr an inherited stream": {"EPERM"},
        "setxattrat an inherited stream": {"EPERM", "ENOSYS"},  # ENOSYS: before Linux 6.13
    },
    "other processes": {
        name: {"EPERM"}
        for name in (
            "prlimit the host",
            "read the host's limits",
            "sched_setaffinity the host",
            "sched_setscheduler the host",
            "setpriority the host",
            "setpriority a process group",
            "setpriority every process of an account",
            "ioprio_set the host",
            "kill the host",
            "pidfd_send_signal the host",
            "process_vm_readv the host",
            "kcmp the host",
            "get_robust_list of the host",
            "migrate_pages of the host",
            "move_pages of the host",
            "process_madvise the host",
        )
    },
    # the job's own IPC namespace: the host's objects do not exist for it (not EACCES)
    "IPC": {
        "shmget the host's key": {"ENOENT"},
        "shmat the host's segment": {"EINVAL"},
        "segments a walk sees": {0},
        "msgget the host's key": {"ENOENT"},
        "semget the host's key": {"ENOENT"},
        "mq_open the host's queue": {"ENOENT"},
    },
    "sockets": {
        "TCP socket": {"EPERM"},
        "UDP socket": {"EPERM"},
        "UNIX socket": {"EPERM"},
        "UNIX datagram pair": {"EPERM"},
    },
    "keys": {"add_key": {"EPERM"}, "keyctl": {"EPERM"}},
    "namespaces and mounts": {
        "unshare a mount namespace": {"EPERM"},
        "unshare a user namespace": {"EPERM"},
        "setns": {"EPERM"},
        "mount": {"EPERM"},
        "open_tree": {"EPERM"},
        "open_tree_attr": {"EPERM", "ENOSYS"},  # ENOSYS: before Linux 6.15
    },
    "devices": {"read a disk": {"EACCES"}, "make a device node": {"EACCES"}},
    "time": {"clock_settime": {"EPERM"}, "settimeofday": {"EPERM"}},
    "resources and the kernel log": {
        "raise a hard limit": {"EPERM"},
        "move into another cgroup": DENIED,
        "read the kernel log": {"EPERM"},
    },
}


def _host_command(account: str, world: World | None) -> tuple[list[str], dict[str, Any]]:
    """The command that runs the host for ``account``, and ``subprocess.run`` options."""
    if account == "uid 0":
        folder = os.path.dirname(os.path.abspath(kernel.__file__))
        return [sys.executable, "-I", "-c", _RUNNER, folder, SRC, "0"], {}
    assert world is not None
    folder = str(world.packages)
    if account == "uid 65534":
        return [INTERPRETER, "-I", "-c", _RUNNER, folder, SRC, "65534"], {}
    return [INTERPRETER, "-I", "-c", _RUNNER, folder, SRC, ""], {
        "user": 65534,
        "group": 65534,
        "extra_groups": [],
    }


#: the host: import the probes from their folder, run them (``_kernel_objects.main``)
_RUNNER = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "import _kernel_objects; _kernel_objects.main(sys.argv[1:])"
)


@pytest.fixture(scope="module")
def world() -> Iterator[World | None]:
    if unavailable() is not None:
        yield None
        return
    made = World(modules=[kernel.__file__])
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture(scope="module", params=ACCOUNTS)
def observed(request: pytest.FixtureRequest, world: World | None) -> dict[str, Any]:
    """What the host of ``request.param`` saw: its ids, the probes, the report, its changes."""
    account = request.param
    if account != "uid 0" and world is None:
        pytest.skip(str(unavailable()))
    command, options = _host_command(account, world)
    folder = tempfile.mkdtemp(prefix="zett-host-objects-")
    try:
        os.chmod(folder, 0o755)
        if account == "host not root":
            os.chown(folder, 65534, 65534)
        done = subprocess.run(
            [*command, folder],
            capture_output=True,
            text=True,
            timeout=GUARD,
            cwd="/",
            check=False,
            **options,
        )
    finally:
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            (os.rmdir if os.path.isdir(path) else os.unlink)(path)
        os.rmdir(folder)
    assert done.returncode == 0, done.stderr[-3000:]
    seen: dict[str, Any] = json.loads(done.stdout)
    report = seen["report"]
    if account == "uid 65534" and report["user"] != 65534:
        pytest.skip(f"uid 65534 cannot run {INTERPRETER} here: {report.get('account_why')}")
    seen["account"] = account
    return seen


def test_the_table_has_a_row_for_each_kind_of_object() -> None:
    assert set(EXPECTED) | {"account"} == set(kernel.ROWS)


@pytest.mark.parametrize("row", sorted(EXPECTED))
def test_row(observed: dict[str, Any], row: str) -> None:
    """Each attempt on the host's objects is refused; the job's own use next to it works."""
    results = observed["seen"][row]
    expected = EXPECTED[row]
    assert set(results) == set(expected) | {name for name in results if name.startswith("own ")}
    wrong = {
        name: result
        for name, result in results.items()
        if result not in (OK if name.startswith("own ") else expected[name])
    }
    assert not wrong, (observed["account"], row, wrong)


def test_the_host_keeps_what_is_its_own(observed: dict[str, Any]) -> None:
    """Nothing of the host's changed: its file's mode, times, owner and attributes, its
    folder, its shared memory, its niceness, affinity and limits, ``/dev/null``."""
    assert observed["changed"] == {}, observed["account"]


def test_the_account_shares_no_group_with_the_host(observed: dict[str, Any]) -> None:
    (uids, gids, groups) = observed["seen"]["account"]["ids"]
    host_uids, host_gids, host_groups = observed["host"]["ids"]
    report = observed["report"]
    assert groups == []
    if observed["account"] == "host not root":
        # a host that is not root cannot change its jobs' ids: they are its own, and what the
        # kernel allows between processes of one account, seccomp and Landlock deny
        assert (uids, gids) == (host_uids, host_gids)
        assert report["account"] == "the host's own account"
        assert report["namespaces"] == "user, mount, ipc"
        return
    expected_uid = 0 if observed["account"] == "uid 0" else 65534
    assert uids == [expected_uid] * 3
    assert not set(gids) & {*host_gids, *host_groups}, (gids, host_gids, host_groups)
    assert report["namespaces"] == "mount, ipc" and report["view"] is True


def _nested(host: dict[str, Any]) -> dict[str, Any]:
    """In a sandboxed job: a pool of its own runs the metadata and IPC rows, sandboxed too."""
    import asyncio

    from zett_agent.process import ProcessPool, Sandbox

    async def run() -> dict[str, Any]:
        async with ProcessPool(1) as pool:
            job = pool.submit(_rows, host, ["file metadata", "IPC"], sandbox=Sandbox())
            return {"seen": await job, "report": job.sandbox_report}

    return asyncio.run(run())


def _rows(host: dict[str, Any], rows: list[str]) -> dict[str, Any]:
    return {row: kernel.ROWS[row](host) for row in rows}


async def test_without_namespaces_of_its_own_the_filter_denies_what_they_would_stop(
    tmp_path: Path,
) -> None:
    """A job that cannot make its namespaces (here: a sandboxed job inside a sandboxed job,
    whose filter denies ``unshare``) runs with metadata and IPC calls denied instead."""
    from zett_agent.process import ProcessPool, Sandbox

    objects = kernel.HostObjects(str(tmp_path)).make()
    try:
        before = objects.state()
        async with ProcessPool(1) as pool:
            job = pool.submit(_nested, objects.describe(), sandbox=Sandbox(user=0))
            inner = await asyncio.wait_for(job, GUARD)
        after = objects.state()
    finally:
        objects.remove()
    assert before == after
    report = inner["report"]
    assert report["view"] is False and "unshare" in report["view_why"], report
    assert report["missing"] == {}, report  # required, and enforced: by the filter instead
    metadata, ipc = inner["seen"]["file metadata"], inner["seen"]["IPC"]
    for name, result in metadata.items():
        assert result == "EPERM", (name, result)  # by path too, in its own scratch too
    for name, result in ipc.items():
        assert result == "EPERM", (name, result)
