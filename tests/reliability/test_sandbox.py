"""Hostile children under ``Sandbox``: each way out is tried for real and denied, and the
legitimate use next to it still works. Both containments, asyncio and uvloop.

On this kind of machine the host is root and the interpreter lives under ``/root`` (mode 0700),
so the default account cannot run it and jobs run as uid 0 with every capability dropped; the
unprivileged-account path is run for real by ``test_sandbox_account.py`` with a world-readable
interpreter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import _confined_children as confined
import pytest

from zett_agent.process import (
    JobFailed,
    JobStatus,
    ProcessJob,
    ProcessLimits,
    ProcessPool,
    ProtocolError,
    Sandbox,
    SandboxUnavailable,
)
from zett_agent.process._host._pool import engine_of
from zett_agent.process._sandbox._landlock import abi
from zett_agent.process._sandbox._seccomp import available

GUARD = 30.0
_ABI, _WHY = abi()
_SECCOMP, _SECCOMP_WHY = available()
pytestmark = pytest.mark.skipif(
    _ABI < 6 or not _SECCOMP,
    reason=f"a required sandbox needs Landlock ABI 6 and seccomp: ABI {_ABI} ({_WHY}), "
    f"seccomp {_SECCOMP} ({_SECCOMP_WHY})",
)


@pytest.fixture
def secret() -> Iterator[Path]:
    """A secret file under the host's home directory."""
    path = Path(os.path.expanduser("~")) / f".zett-test-secret-{os.urandom(6).hex()}"
    path.write_text("the host's secret\n")
    path.chmod(0o600)
    yield path
    path.unlink()


def cgroup_procs(pool: ProcessPool) -> list[str]:
    """``cgroup.procs`` files a job could move itself into: its pool's, and the hierarchy's."""
    paths = [
        p
        for p in ("/sys/fs/cgroup/unified/cgroup.procs", "/sys/fs/cgroup/cgroup.procs")
        if os.path.exists(p)
    ]
    containment = engine_of(pool).containment
    if containment is not None and containment.mode == "cgroup":
        base = containment.path  # type: ignore[attr-defined]
        paths += [f"{base}/cgroup.procs", f"{base}/workers/cgroup.procs"]
    return paths


def exists(path: str) -> bool:
    return os.path.exists(path)


async def first_event(job: ProcessJob) -> Any:
    async with asyncio.timeout(GUARD):
        async for event in job.events():
            return event
    raise AssertionError(f"{job!r} ended without an event: {job.exception()!r}")


async def gone(path: str) -> None:
    """The scratch directory is removed once the job's tree is dead (by the janitor)."""
    deadline = asyncio.get_running_loop().time() + GUARD
    while exists(path):
        assert asyncio.get_running_loop().time() < deadline, f"{path} is still there"
        await asyncio.sleep(0.005)


async def test_each_way_out_is_denied_and_the_sandbox_works_inside(
    containment: str,
    secret: Path,
    abstract_server: bytes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ZETT_TEST_SECRET", "the host's key")  # before the launcher starts
    readable = tmp_path / "readable"
    readable.mkdir()
    (readable / "data.txt").write_text("shared with the job")
    outside = tmp_path / "outside.txt"
    sandbox = Sandbox(read=[readable])
    async with ProcessPool(2, containment=containment) as pool:
        job = pool.submit(
            confined.sandbox_probe,
            os.getpid(),
            str(secret),
            str(outside),
            str(readable / "data.txt"),
            abstract_server,
            cgroup_procs(pool),
            sandbox=sandbox,
        )
        async with asyncio.timeout(GUARD):
            seen: dict[str, Any] = await job
        report = job.sandbox_report
        assert report is not None
        scratch = report["scratch"]
        await gone(scratch)
    assert report["landlock_abi"] == _ABI and report["missing"] == {}, report
    assert report["filesystem"] and report["tcp"] and report["scoped"] and report["seccomp"]
    assert report["network"] == "none" and report["user"] == seen["uid"], report
    # the environment is minimal, and the scratch directory is its home, tmp and cwd
    assert set(seen["env"]) == {"PATH", "LANG", "HOME", "TMPDIR"}, seen["env"]
    assert seen["env"]["HOME"] == seen["env"]["TMPDIR"] == seen["cwd"] == scratch
    assert "ZETT_TEST_SECRET" not in seen["env"]
    assert seen["read secret"] == "EACCES" and seen["read allowed"] == "ok"
    # outside the writable paths the job's view is read-only: the kernel says so before
    # Landlock is asked
    assert seen["write outside"] == "EROFS" and not outside.exists()
    assert seen["write scratch"] == seen["write tmpdir"] == "ok"
    assert seen["signal host"] == seen["signal launcher"] == "EPERM"
    assert seen["ptrace host"] == seen["vm_readv host"] == "EPERM"
    assert seen["environ host"] == "EACCES"
    assert seen["cgroup.procs"] and set(seen["cgroup.procs"]) == {"EROFS"}, seen
    # no new socket at all under network="none" (a pathname UNIX socket is a way out too),
    # while the connected pairs asyncio needs still work
    assert seen["abstract socket"] == seen["new unix socket"] == "EPERM"
    assert seen["socketpair"] == "ok"
    # the terminal it inherited: no input pushed into it, not with high bits set either
    assert seen["push terminal input"] == ["EPERM", "EPERM"], seen
    assert seen["own child"] == "ok"


async def test_paths_that_do_not_exist_are_reported_and_the_job_runs(
    containment: str, tmp_path: Path
) -> None:
    missing = str(tmp_path / "not-there")
    async with ProcessPool(1, containment=containment) as pool:
        job = pool.submit(os.getcwd, sandbox=Sandbox(read=[missing], write=[missing + "-too"]))
        async with asyncio.timeout(GUARD):
            cwd = await job
    assert job.sandbox_report is not None and cwd == job.sandbox_report["scratch"]
    assert job.sandbox_report["absent"] == [missing, missing + "-too"]
    assert 0 < job.sandbox_report["seconds"] < GUARD


async def test_abstract_sockets_are_scoped_with_the_network_open(
    containment: str, abstract_server: bytes
) -> None:
    async with ProcessPool(1, containment=containment) as pool:
        async with asyncio.timeout(GUARD):
            seen = await pool.submit(
                confined.attack_supervisors,
                os.getpid(),
                abstract_server,
                sandbox=Sandbox(network="all"),
            )
    assert seen["abstract socket"] == "EPERM" and seen["own abstract socket"] == "ok", seen


@contextlib.asynccontextmanager
async def loopback_servers() -> AsyncIterator[tuple[int, int, asyncio.Queue[bytes]]]:
    """A TCP server and a UDP socket on 127.0.0.1; what reaches either lands in the queue."""
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.put_nowait(await reader.read(100))
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    loop = asyncio.get_running_loop()
    loop.add_reader(udp.fileno(), lambda: received.put_nowait(udp.recv(100)))
    try:
        yield server.sockets[0].getsockname()[1], udp.getsockname()[1], received
    finally:
        loop.remove_reader(udp.fileno())
        udp.close()
        server.close()
        await server.wait_closed()


async def test_the_network_is_closed_with_none_and_open_with_all(containment: str) -> None:
    async with (
        loopback_servers() as (tcp, udp, received),
        ProcessPool(2, containment=containment) as pool,
    ):
        async with asyncio.timeout(GUARD):
            closed = await pool.submit(confined.network, "127.0.0.1", tcp, udp, sandbox=Sandbox())
            assert closed == {"tcp": "EPERM", "udp": "EPERM"}, closed
            assert received.empty()
            opened = await pool.submit(
                confined.network, "127.0.0.1", tcp, udp, sandbox=Sandbox(network="all")
            )
            assert opened == {"tcp": "ok", "udp": "ok"}, opened
            got = {await received.get(), await received.get()}
    assert got == {b"tcp from the job", b"udp from the job"}


@pytest.mark.parametrize(
    ("prepared", "kind", "outcome"),
    [
        ("none", "none", "EPERM"),
        ("all", "none", "EPERM"),
        ("none", "all", "ok"),
        ("all", "all", "ok"),
    ],
)
async def test_what_a_spare_prepared_serves_only_a_job_of_the_kind_it_was_prepared_for(
    containment: str, tmp_path: Path, prepared: str, kind: str, outcome: str
) -> None:
    """A spare builds a job's ruleset ahead for the latest kind of sandbox its pool ran; a job
    of another kind gets a ruleset of its own, never the prepared one."""
    scratch = tmp_path / "scratch"
    async with (
        loopback_servers() as (tcp, udp, received),
        ProcessPool(1, containment=containment, max_jobs_per_worker=1) as pool,
    ):
        async with asyncio.timeout(GUARD):
            seen = await pool.submit(
                confined.confine_after_preparing,
                prepared,
                kind,
                str(scratch),
                "127.0.0.1",
                tcp,
                udp,
            )
    assert seen["refused"] is None, seen
    assert seen["prepared"] is (prepared == kind), seen
    assert seen["tcp"] == seen["udp"] == outcome, seen
    assert seen["fds left"] == [], seen  # the prepared ruleset's too
    assert received.qsize() == (2 if outcome == "ok" else 0)
    scratch.rmdir()


async def test_a_job_that_is_not_sandboxed_inherits_nothing_a_spare_prepared(
    containment: str,
) -> None:
    async with ProcessPool(1, containment=containment, max_jobs_per_worker=2) as pool:
        async with asyncio.timeout(GUARD):
            first = pool.submit(confined.prepare_as_a_spare, "none")
            assert await first == 1  # the worker now holds a prepared ruleset
            second = pool.submit(confined.rulesets_held)
            assert await second == 0
    assert first.pid == second.pid  # the same worker: it dropped what it prepared


async def test_a_grandchild_is_confined_the_same_way_and_dies_on_cancel(
    containment: str, secret: Path
) -> None:
    async with ProcessPool(1, containment=containment) as pool:
        job = pool.submit(confined.grandchild_probe, str(secret), os.getpid(), sandbox=Sandbox())
        seen = await first_event(job)
        pids = seen["pids"]
        grandchild = json.loads(seen["grandchild"])
        assert grandchild["read secret"] == 13 and grandchild["write outside"] == 30, grandchild
        assert grandchild["signal host"] == 1, grandchild
        assert not exists("/tmp/zett-grandchild-was-here")
        async with asyncio.timeout(GUARD):
            await job.cancel()
        assert job.status is JobStatus.CANCELLED
        assert not [pid for pid in pids if confined._alive(pid)]


async def test_a_required_sandbox_fails_before_the_job_runs_where_it_cannot_be_enforced(
    containment: str, tmp_path: Path
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    async with ProcessPool(2, containment=containment, landlock_abi=5) as pool:
        job = pool.submit(
            confined.marker_job, str(markers / "required"), sandbox=Sandbox(write=[markers])
        )
        async with asyncio.timeout(GUARD):
            await job.wait()
        error = job.exception()
        assert isinstance(error, SandboxUnavailable), error
        assert "ABI 5" in str(error) and "ABI 6" in str(error) and "Linux 6.12" in str(error)
        assert error.missing == ("scoping",), error.missing
        assert not (markers / "required").exists()  # its code never ran
        assert job.sandbox_report is not None and "refused" in job.sandbox_report
        await gone(job.sandbox_report["scratch"])
        # required=False: it runs with what can be enforced, and says what that was
        job = pool.submit(
            confined.marker_job,
            str(markers / "optional"),
            sandbox=Sandbox(write=[markers], required=False),
        )
        async with asyncio.timeout(GUARD):
            assert await job == "ran"
        report = job.sandbox_report
        assert report is not None and report["landlock_abi"] == 5, report
        assert report["filesystem"] and report["tcp"] and report["seccomp"], report
        assert report["scoped"] is False and set(report["missing"]) == {"scoping"}, report
        assert (markers / "optional").read_text() == "ran"
    async with ProcessPool(1, containment=containment, seccomp=False) as pool:
        job = pool.submit(confined.marker_job, str(markers / "no seccomp"), sandbox=Sandbox())
        async with asyncio.timeout(GUARD):
            await job.wait()
        error = job.exception()
        assert isinstance(error, SandboxUnavailable) and "seccomp" in error.missing, error
        assert not (markers / "no seccomp").exists()


async def test_code_that_runs_while_the_job_is_unpickled_is_already_confined(
    containment: str, tmp_path: Path
) -> None:
    planted = tmp_path / "planted"
    async with ProcessPool(1, containment=containment) as pool:
        job = pool.submit(
            confined.marker_job,
            str(tmp_path / "m"),
            confined.Planted(str(planted)),
            sandbox=Sandbox(),
        )
        async with asyncio.timeout(GUARD):
            await job.wait()
    error = job.exception()
    # the write meets the job's read-only view (EROFS) before Landlock
    assert isinstance(error, JobFailed) and error.type_name == "OSError", error
    assert "Read-only file system" in str(error), error
    assert not planted.exists()
    assert job.sandbox_report is not None and job.sandbox_report["filesystem"]


async def test_a_job_cannot_forge_what_its_sandbox_enforced(containment: str) -> None:
    async with ProcessPool(2, containment=containment) as pool:
        for sandbox in (None, Sandbox()):
            job = pool.submit(confined.forge_a_sandbox_report, sandbox=sandbox)
            async with asyncio.timeout(GUARD):
                await job.wait()
            error = job.exception()
            assert isinstance(error, ProtocolError) and "sandbox report" in str(error), error
            if sandbox is not None:
                assert job.sandbox_report is not None
                assert job.sandbox_report["landlock_abi"] == _ABI  # the worker's, not the job's


async def test_a_sandboxed_job_gets_a_fresh_worker_that_runs_nothing_after_it(
    containment: str,
) -> None:
    async with ProcessPool(1, containment=containment, max_jobs_per_worker=3) as pool:
        async with asyncio.timeout(GUARD):
            used = await pool.submit(os.getpid)
            again = await pool.submit(os.getpid)
            assert again == used  # reused: the pool does that
            sandboxed = await pool.submit(os.getpid, sandbox=Sandbox())
            after = await pool.submit(os.getpid)
    assert sandboxed != used, "a sandboxed job ran in a worker a job had used before"
    assert after != sandboxed, "a sandboxed job's worker ran another job"


async def test_the_host_environment_is_wiped_from_the_jobs_memory(
    containment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = "zett-secret-" + os.urandom(12).hex()
    monkeypatch.setenv("ZETT_TEST_SECRET", value)
    fifo = tmp_path / "fifos" / "go"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    keep = os.open(fifo, os.O_RDWR)
    try:
        async with ProcessPool(2, containment=containment) as pool:
            found = {}
            for name, sandbox in (("plain", None), ("sandboxed", Sandbox(write=[fifo.parent]))):
                job = pool.submit(confined.wait_with_pid, str(fifo), sandbox=sandbox)
                pid = await first_event(job)
                found[name] = occurrences(pid, value.encode())  # as root, while it waits
                os.write(keep, b"go\n")
                async with asyncio.timeout(GUARD):
                    await job
    finally:
        os.close(keep)
    assert found["plain"] > 0, "the control job should hold the host's environment"
    assert found["sandboxed"] == 0, f"{found['sandboxed']} copies of the secret in the job"


def occurrences(pid: int, needle: bytes) -> int:
    """Copies of ``needle`` in the readable memory of ``pid`` (read through /proc as root)."""
    count = 0
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            addresses, perms = line.split()[:2]
            if "r" not in perms:
                continue
            start, end = (int(part, 16) for part in addresses.split("-"))
            with contextlib.suppress(OSError, OverflowError, ValueError):
                mem.seek(start)
                count += mem.read(end - start).count(needle)
    return count


async def test_bad_combinations_are_errors_at_the_call() -> None:
    async with ProcessPool(1) as pool:
        with pytest.raises(ValueError, match=r"Sandbox\(env"):
            pool.submit(os.getpid, limits=ProcessLimits(env={}), sandbox=Sandbox())
        with pytest.raises(ValueError, match="scratch directory"):
            pool.submit(os.getpid, limits=ProcessLimits(cwd="/tmp"), sandbox=Sandbox())
        with pytest.raises(TypeError, match="Sandbox"):
            pool.submit(os.getpid, sandbox={"network": "none"})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="no such account"):
            pool.submit(os.getpid, sandbox=Sandbox(user="zett-no-such-account"))


def test_pickling_the_error_keeps_what_is_missing() -> None:
    error = SandboxUnavailable("no scoping here", ("scoping", "tcp"))
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == "no scoping here" and copy.missing == ("scoping", "tcp")
