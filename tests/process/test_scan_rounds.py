"""Scan containment's freeze, tried at the moment its lists are read one after the other.

``_scan.freeze_and_kill`` reads the children of every stopped member in turn. A member caught
while it exits (a pid-hopping process between its fork and its exit) dies with ``SIGSTOP``
pending, and its live child moves to the subreaper: if the subreaper's list was read first in
that round, the child shows up in no list of it. These tests put that exit exactly there, with
real processes: the member is SIGKILLed (a stopped process still dies of it) right after the
subreaper's list and before its own.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from support.jobs import GUARD
from support.liveness import alive
from zett_agent.process._containment import _scan

#: a subreaper W with a child Z, which has a child Z' (each waits): prints "W Z Z'"
TREE = """
import os, signal, sys
from zett_agent.process import _linux
_linux.set_child_subreaper()
r, w = os.pipe()
if os.fork() == 0:              # Z
    if os.fork() == 0:          # Z'
        os.write(w, str(os.getpid()).encode() + b"\\n")
        while True:
            signal.pause()
    while True:
        signal.pause()
pid = os.read(r, 64).decode().strip()
children = open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()
print(os.getpid(), children[0], pid, flush=True)
while True:
    signal.pause()
"""

#: runs in which the member's exit can land between the two lists before one does (a run where
#: the member's list comes first in its round shows nothing and is tried again)
ATTEMPTS = 40


@contextlib.contextmanager
def tree() -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    """Start the tree; yield ``(W, Z, Z')``; at the end kill and reap all three.

    Once W is dead, Z and Z' (zombies or, after a failed kill, alive) are this process's
    children (the leak guard makes it a subreaper), so their pids stay theirs until reaped here.
    """
    process = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE)
    members: list[int] = []
    try:
        assert process.stdout is not None
        w, z, grandchild = (int(pid) for pid in process.stdout.readline().split())
        assert w == process.pid
        members = [z, grandchild]
        yield process, z, grandchild
    finally:
        _end(process, members)


def _end(process: subprocess.Popen[bytes], members: list[int]) -> None:
    """Kill and reap W, then its members (this process's children once W is dead: the leak
    guard makes it a subreaper, so their pids stay theirs until reaped here)."""
    process.kill()
    process.wait(GUARD)
    if process.stdout is not None:
        process.stdout.close()
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


@pytest.mark.skipif(not _scan._HAVE_CHILDREN_FILE, reason="needs /proc/PID/task/TID/children")
def test_a_child_moved_to_the_subreaper_mid_round_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Z is stopped in round two; after W's list is read, Z dies and Z' moves under W; Z's own
    list is then empty. Z' is still found, stopped and killed."""
    real = _scan.children
    conclusive = 0
    for _ in range(ATTEMPTS):
        with tree() as (process, z, grandchild):
            reads: list[int] = []
            monkeypatch.setattr(_scan, "children", exits_between(real, process.pid, z, reads))
            fd = os.pidfd_open(process.pid)
            try:
                killed = _scan.freeze_and_kill({process.pid: fd}, pidfds={process.pid: fd})
                assert _scan.wait_dead(killed, GUARD)
            finally:
                os.close(fd)
                monkeypatch.setattr(_scan, "children", real)
            if reads.index(z) > reads.index(process.pid, 1):
                conclusive += 1
                assert not alive(grandchild), "the reparented child outlived the kill"
                assert grandchild in killed
        if conclusive >= 3:
            break
    assert conclusive, f"in {ATTEMPTS} runs Z's list was never read after W's in its round"


def exits_between(
    real: Callable[..., set[int]], w: int, z: int, reads: list[int]
) -> Callable[..., set[int]]:
    """``_scan.children``, but Z exits (SIGKILL, waited for) just before its list is first read
    if W's was read twice by then (once in round one, once in round two, Z's round); every
    pid read is appended to ``reads``."""

    def children(pid: int, procs: dict[int, tuple[int, str]] | None = None) -> set[int]:
        if pid == z and z not in reads and reads.count(w) >= 2:
            with _pidfd(z) as fd:
                os.kill(z, signal.SIGKILL)
                _readable(fd)
        reads.append(pid)
        return real(pid, procs)

    return children


@contextlib.contextmanager
def _pidfd(pid: int) -> Iterator[int]:
    fd = os.pidfd_open(pid)
    try:
        yield fd
    finally:
        os.close(fd)


def _readable(fd: int) -> None:
    assert select.select([fd], [], [], GUARD)[0], "the member did not exit"


# -- a member that runs again after its stop ------------------------------------------------------

#: a subreaper W with a child Z; Z says "continued" on the report pipe whenever it is resumed,
#: and forks a child Z'' (which reports its pid, then waits) for every byte it reads from the go
#: pipe. Prints "W Z"
RESUMABLE = """
import os, signal, sys
from zett_agent.process import _linux
_linux.set_child_subreaper()
go, report = int(sys.argv[1]), int(sys.argv[2])
if os.fork() == 0:              # Z
    signal.signal(signal.SIGCONT, lambda *_: os.write(report, b"continued\\n"))
    while os.read(go, 1):
        if os.fork() == 0:      # Z''
            os.write(report, b"%d\\n" % os.getpid())
            while True:
                signal.pause()
    os._exit(0)
children = open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()
print(os.getpid(), children[0], flush=True)
while True:
    signal.pause()
"""


@pytest.mark.skipif(not _scan._HAVE_CHILDREN_FILE, reason="needs /proc/PID/task/TID/children")
def test_a_member_resumed_after_its_stop_is_stopped_again_before_the_kill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Z, stopped in round two, is resumed (``SIGCONT``, as another member of its tree could)
    as its list is read, and would fork as soon as it is told to. The freeze stops it again
    before it ends: when the first ``SIGKILL`` goes out Z is stopped and cannot fork, and
    nothing of the tree outlives the kill. (Were Z left running, the go byte written then would
    make it fork a child that no list ever showed.)"""
    go_r, go_w = os.pipe()
    report_r, report_w = os.pipe()
    process = subprocess.Popen(
        [sys.executable, "-c", RESUMABLE, str(go_r), str(report_w)],
        stdout=subprocess.PIPE,
        pass_fds=(go_r, report_w),
    )
    os.close(go_r)
    os.close(report_w)
    reports = os.fdopen(report_r, "rb", buffering=0)
    members: list[int] = []
    try:
        assert process.stdout is not None
        w, z = (int(pid) for pid in process.stdout.readline().split())
        members.append(z)
        real_children, real_signal = _scan.children, _scan._signal
        resumed: list[int] = []
        at_kill: list[str] = []

        def children(pid: int, procs: dict[int, tuple[int, str]] | None = None) -> set[int]:
            if pid == z and not resumed:
                os.kill(z, signal.SIGCONT)
                assert _line(reports) == b"continued"
                resumed.append(z)
            return real_children(pid, procs)

        def send(pid: int, signum: int, pidfds: dict[int, int]) -> bool:
            if signum == signal.SIGKILL and not at_kill:
                found = _scan.state(z)
                at_kill.append(found[1] if found else "gone")
                if at_kill[0] not in "Tt":
                    os.write(go_w, b"g")
                    members.append(int(_line(reports)))  # Z forked: Z'' is alive
            return real_signal(pid, signum, pidfds)

        monkeypatch.setattr(_scan, "children", children)
        monkeypatch.setattr(_scan, "_signal", send)
        fd = os.pidfd_open(w)
        try:
            killed = _scan.freeze_and_kill({w: fd}, pidfds={w: fd})
            assert _scan.wait_dead(killed, GUARD)
        finally:
            os.close(fd)
        assert resumed == [z], "Z's list was never read"
        assert at_kill == ["T"], f"Z was {at_kill} when the kill began, not stopped again"
        assert z in killed
        assert [pid for pid in members if alive(pid)] == []
    finally:
        os.close(go_w)
        reports.close()
        _end(process, members)


def _line(stream: Any) -> bytes:
    """One line from ``stream`` (a pipe), within ``GUARD``."""
    assert select.select([stream], [], [], GUARD)[0], "the tree did not report"
    return bytes(stream.readline().strip())
