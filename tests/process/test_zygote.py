"""A zygote: processes that import a pool configuration once and fork the launchers of many
pools (``process._child._zygote``: its gate, which holds the secret, and its template, which
forks), and who may talk to it.

Each test's zygote watches a ``sleep`` the test holds, and ends when the test kills it; the
test then reaps it (this process is the tests' child subreaper, so the gate, whose first
parent exits at once, is reparented here, and the template too once the gate ended).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import psutil
import pytest

from support.jobs import GUARD
from zett_agent.process import ProcessError, ProcessPool
from zett_agent.process._containment import _scan
from zett_agent.process._host._pool import use_zygote
from zett_agent.process._host._zygote_client import Zygote, _parts
from zett_agent.process._wire._zygote_proof import NONCE, PROOF, proof, socket_name

from . import _jobs


def _parent(pid: int) -> int:
    found = _scan.state(pid)
    assert found is not None, f"process {pid} is gone"
    return found[0]


def _wait_gone(pids: list[int], within: float = GUARD) -> None:
    """Wait until each of ``pids`` exited (pidfds: no polling), then reap those that are ours,
    in order (a gate before its template: the template is reparented here as the gate exits)."""
    fds = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds.append(os.pidfd_open(pid))
    try:
        for fd in fds:
            assert select.select([fd], [], [], within)[0], f"a process of {pids} lives on"
    finally:
        for fd in fds:
            os.close(fd)
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


@contextlib.contextmanager
def zygote_of_this_test(idle: float = 600.0) -> Iterator[Zygote]:
    """A zygote setting that watches a ``sleep`` of the test; on the way out, the ``sleep`` is
    killed and every zygote it watched (a child of this process by then) ends and is reaped."""
    held = subprocess.Popen(["sleep", "600"])
    start = _scan.start_time(held.pid)
    assert start is not None
    try:
        yield Zygote(secrets.token_bytes(32), (held.pid, start), idle)
    finally:
        gates = [p for p in psutil.Process().children() if "_zygote" in " ".join(p.cmdline())]
        templates = [t.pid for g in gates for t in g.children()]
        held.kill()
        held.wait()
        _wait_gone([g.pid for g in gates] + templates)


async def test_pools_that_hold_one_secret_get_launchers_from_one_zygote(
    containment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with zygote_of_this_test() as zygote:
        first, second = (
            ProcessPool(1, containment=containment),
            ProcessPool(1, containment=containment),
        )
        use_zygote(first, zygote)
        use_zygote(second, zygote)
        async with first:
            # what a launcher takes is its host's as the pool starts, not the zygote's
            monkeypatch.setenv("ZETT_TEST_ZYGOTE", "second")
            before = os.umask(0o027)
            try:
                await second.start()
            finally:
                os.umask(before)
            async with second:
                launchers = [int(p.containment_info["launcher_pid"]) for p in (first, second)]
                templates = {_parent(pid) for pid in launchers}
                assert len(templates) == 1 and os.getpid() not in templates
                (zygote_pid,) = templates
                assert "_zygote" in " ".join(psutil.Process(zygote_pid).cmdline())
                assert _parent(_parent(zygote_pid)) == os.getpid()  # the gate: reparented here
                assert await first.submit(_jobs.add, 1, 2) == 3
                assert "ZETT_TEST_ZYGOTE" not in await first.submit(_jobs.environ)
                seen = await second.submit(_jobs.environ)
                assert seen["ZETT_TEST_ZYGOTE"] == "second"
                assert await second.submit(_jobs.cwd) == os.getcwd()
                assert await second.submit(_jobs.umask) == 0o027 != before
                # each launcher in a session of its own, as a spawned one is
                assert len({os.getsid(pid) for pid in (*launchers, zygote_pid)}) == 3
            _wait_gone([launchers[1]])  # a closed pool's launcher exits
            assert psutil.pid_exists(zygote_pid)  # the zygote serves on


async def test_a_launcher_of_a_zygote_kills_every_tree_once_its_host_died() -> None:
    host = textwrap.dedent(
        """
        import asyncio, json, os, sys
        from zett_agent.process import ProcessPool
        from zett_agent.process._host._pool import use_zygote
        from zett_agent.process._host._zygote_client import Zygote
        sys.path[:0] = {!r}
        import cloudpickle
        import _jobs
        cloudpickle.register_pickle_by_value(_jobs)

        async def main():
            watch = json.loads(sys.argv[2])
            pool = ProcessPool(1)
            use_zygote(pool, Zygote(bytes.fromhex(sys.argv[1]), tuple(watch), 600.0))
            await pool.start()
            job = pool.submit(_jobs.spawn_tree)
            async for pids in job.events():
                break
            print(json.dumps([int(pool.containment_info["launcher_pid"]), *pids]), flush=True)
            await asyncio.Event().wait()

        asyncio.run(main())
        """
    ).format([os.path.dirname(_jobs.__file__), os.path.dirname(os.path.dirname(_jobs.__file__))])
    with zygote_of_this_test() as zygote:
        assert zygote.watch is not None
        proc = subprocess.Popen(  # noqa: ASYNC220 (returns at once)
            [sys.executable, "-c", host, zygote.secret.hex(), json.dumps(list(zygote.watch))],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        try:
            assert select.select([proc.stdout], [], [], GUARD)[0], "the host said nothing"
            launcher, worker, sleeper, escapee = json.loads(proc.stdout.readline())
            zygote_pid = _parent(launcher)
            assert zygote_pid != proc.pid
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
        # no parent-death signal reaches it (its parent is the zygote): its host's pidfd does
        _wait_gone([launcher, worker, sleeper, escapee])
        assert psutil.pid_exists(zygote_pid)


async def test_a_listener_without_the_secret_gets_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A process that took the zygote's name first (it can read it in ``/proc/net/unix``) is
    not believed: the pool hands it nothing and starts its launcher itself."""
    secret = secrets.token_bytes(32)
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    squatter.bind(socket_name(secret, _parts((), "")))
    squatter.listen(1)
    got: list[object] = []

    def pretend() -> None:
        conn, _ = squatter.accept()
        with conn:
            conn.settimeout(GUARD)
            nonce = conn.recv(NONCE)
            conn.send(proof(secrets.token_bytes(32), b"zygote", nonce) + os.urandom(NONCE))
            data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 2)
            got.extend([data, fds])
            for fd in fds:
                os.close(fd)

    thread = threading.Thread(target=pretend)
    thread.start()
    try:
        pool = ProcessPool(1)
        use_zygote(pool, Zygote(secret, None, 1.0))
        with caplog.at_level(logging.WARNING, logger="zett_agent.process"):
            async with pool:
                assert _parent(int(pool.containment_info["launcher_pid"])) == os.getpid()
                assert await pool.submit(_jobs.add, 2, 3) == 5
    finally:
        thread.join(GUARD)
        squatter.close()
    assert got == [b"", []]  # the host hung up: no request, no control socket
    assert "did not prove it is the zygote" in caplog.text


async def test_a_peer_without_the_secret_gets_no_launcher() -> None:
    with zygote_of_this_test() as zygote:
        pool = ProcessPool(1)
        use_zygote(pool, zygote)
        async with pool:
            zygote_pid = _parent(int(pool.containment_info["launcher_pid"]))
            before = {p.pid for p in psutil.Process(zygote_pid).children()}
            peer = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            spare_a, spare_b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            with peer, spare_a, spare_b:
                peer.settimeout(GUARD)
                peer.connect(socket_name(zygote.secret, _parts((), "")))
                peer.send(os.urandom(NONCE))
                answer = peer.recv(PROOF + NONCE)
                assert len(answer) == PROOF + NONCE
                request = {"host_pid": os.getpid(), "max_frame_bytes": 1 << 20, "cgroups": {}}
                forged = os.urandom(PROOF) + json.dumps(request).encode()
                socket.send_fds(peer, [forged], [spare_b.fileno()])
                assert peer.recv(4096) == b""  # hung up on, without an answer
            assert {p.pid for p in psutil.Process(zygote_pid).children()} == before
            assert await pool.submit(_jobs.add, 1, 1) == 2  # and it serves the pools on


async def test_a_zygote_ends_once_idle_and_when_what_it_watches_ends() -> None:
    with zygote_of_this_test(idle=0.2) as zygote:
        pool = ProcessPool(1)
        use_zygote(pool, zygote)
        async with pool:
            launcher = int(pool.containment_info["launcher_pid"])
            template = _parent(launcher)
            gate = _parent(template)
        # no launcher left: the template ends after ``idle``, and the gate with it
        _wait_gone([launcher, gate, template])
    with zygote_of_this_test() as zygote:
        pool = ProcessPool(1)
        use_zygote(pool, zygote)
        async with pool:
            template = _parent(int(pool.containment_info["launcher_pid"]))
            gate = _parent(template)
    # (the context's exit killed the ``sleep`` it watched, and waited for both to end)
    assert not psutil.pid_exists(gate) and not psutil.pid_exists(template)


async def test_a_module_the_zygote_cannot_import_fails_the_start_as_without_it() -> None:
    with zygote_of_this_test() as zygote:
        pool = ProcessPool(1, preload=("zett_test_no_such_module",))
        use_zygote(pool, zygote)
        with pytest.raises(ProcessError, match="zett_test_no_such_module"):
            await pool.start()
        await pool.close()


@pytest.mark.parametrize("stopped", ["gate", "template"])
async def test_a_stopped_zygote_is_killed_and_the_pool_starts_its_own(
    stopped: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A job that stops either process of the zygote (where the kernel lets it: below Linux
    6.12) costs the next pool a quarter of a second, not its start timeout; the zygote is
    killed, and the pools that have launchers keep them."""
    with zygote_of_this_test() as zygote:
        first, second = ProcessPool(1), ProcessPool(1)
        use_zygote(first, zygote)
        use_zygote(second, zygote)
        async with first:
            template = _parent(int(first.containment_info["launcher_pid"]))
            gate = _parent(template)
            os.kill(gate if stopped == "gate" else template, signal.SIGSTOP)
            with caplog.at_level(logging.WARNING, logger="zett_agent.process"):
                async with second:
                    assert _parent(int(second.containment_info["launcher_pid"])) == os.getpid()
                    assert await second.submit(_jobs.add, 1, 2) == 3
            if stopped == "gate":
                assert "is stopped; it was killed" in caplog.text
            assert "no launcher from the zygote" in caplog.text
            _wait_gone([gate, template])
            assert await first.submit(_jobs.add, 2, 2) == 4  # its launcher lives on
