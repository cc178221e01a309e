"""Suite-wide guards and loops.

Every test must leave no process, zombie, thread or file descriptor behind, and every async test
runs twice: under the stdlib event loop and under uvloop. While a test runs, this process is a
child subreaper: a process that escaped the tree it was started in is reparented here instead
of to PID 1, so the leak guard finds it. Tests that take ``containment`` run once per
containment strategy of the process engine.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import psutil
import pytest
import uvloop

from support.beacons import Beacons
from support.containment import CONTAINMENTS, problem

# support.ray_cluster sets Ray's environment when imported: here, before any test module can
# import ray (which reads it once)
from support.ray_cluster import ray_cluster, ray_leak_guard
from zett_agent.process import _linux
from zett_agent.process._containment import _scan


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture(scope="session", autouse=True)
def _uvloop_ready() -> None:
    """Let libuv open its process-wide signal pipe before any test's fd snapshot is taken.

    The first uvloop loop of a process opens a pipe that lives as long as the process; that is
    libuv's global state, not a leak of the test that happens to run first.
    """
    uvloop.run(asyncio.sleep(0))


def _open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


def _describe_fds(fds: set[int]) -> list[str]:
    out = []
    for fd in sorted(fds):
        try:
            out.append(f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            out.append(f"{fd} -> ?")
    return out


def _describe_process(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {proc.status()} {' '.join(proc.cmdline())[:80]}"
    except psutil.Error:
        return f"{proc.pid} (gone)"


def _descendants() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def _kill_leftovers() -> None:
    """Kill every process a failed test left, however fast it forks, and reap them.

    So one failure does not cascade into the next tests (nor slow the machine): each tree is
    frozen before it is killed, with this process still their subreaper, so nothing forked or
    orphaned meanwhile can land outside it (it would be reparented to init and live on).
    """
    for _ in range(10):  # bounded: rounds only repeat while something was left to kill
        roots = [child.pid for child in psutil.Process().children()]
        if roots:
            _scan.wait_dead(_scan.freeze_and_kill(roots))
        reaped = False
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                break
            reaped = True
        if not roots and not reaped:
            return


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A FIFO a sibling job blocks on until the test writes a line, held open here so the
    job's ``open()`` never blocks: ``(path, fd to write to)``."""
    path = str(tmp_path / "sibling")
    os.mkfifo(path)
    keep = os.open(path, os.O_RDWR)
    yield path, keep
    os.close(keep)


@pytest.fixture
def beacons(tmp_path: Path) -> Iterator[Beacons]:
    """The test's end of its children's beacons (``support.children.beacon``/``announce``)."""
    b = Beacons(str(tmp_path / "beacons"))
    yield b
    b.close()


@pytest.fixture(params=CONTAINMENTS)
def containment(request: pytest.FixtureRequest) -> str:
    """Each containment strategy of the engine; one the machine cannot offer is skipped,
    saying why (cgroup without a writable cgroup v2 hierarchy)."""
    why = problem(request.param)
    if why is not None:
        pytest.skip(why)
    return str(request.param)


__all__ = ["ray_cluster"]  # the session's Ray cluster, for every directory's Ray tests


#: how long a thread a test started may take to end after the test (a hang guard, not a wait)
THREAD_END_GUARD = 5.0


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a child process, a zombie, a thread or a file descriptor behind.

    A test marked ``ray`` (here: the ``ray`` runner of a runner-parametrized test) gets the
    session's Ray cluster before anything is counted, and Ray's leak guard.
    """
    if request.node.get_closest_marker("allow_leaks"):
        yield
        return
    if request.node.get_closest_marker("ray"):
        request.getfixturevalue("ray_cluster")
        yield from ray_leak_guard(request)
        return
    fds_before = _open_fds()
    threads_before = {t.ident for t in threading.enumerate()}
    leftover: list[psutil.Process] = []
    _linux.set_child_subreaper(True)
    try:
        yield
        leftover = _descendants()
        described = [_describe_process(p) for p in leftover]
        if leftover:
            _kill_leftovers()
    finally:
        _linux.set_child_subreaper(False)
    assert not leftover, f"test left processes behind: {described}"
    threads_after = [t for t in threading.enumerate() if t.ident not in threads_before]
    # A thread that has done its work may still be on its way out (asyncio's waitpid thread
    # hands the exit status to the loop, then returns): wait for its end, bounded, and fail
    # only on one that does not end.
    for thread in threads_after:
        thread.join(timeout=THREAD_END_GUARD)
    alive = [t for t in threads_after if t.is_alive()]
    assert not alive, f"test left threads: {alive}"
    leaked = _open_fds() - fds_before
    assert not leaked, f"test left file descriptors open: {_describe_fds(leaked)}"


#: children in the default (short) soak that ``uv run pytest`` runs
SOAK_DEFAULT_SIZE = 60


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, not in tests/soak/conftest.py, so the options work with or without a path argument.
    group = parser.getgroup("soak")
    group.addoption(
        "--soak-size",
        type=int,
        default=SOAK_DEFAULT_SIZE,
        help=f"children the soak test starts in total (default {SOAK_DEFAULT_SIZE})",
    )
    group.addoption(
        "--soak-seed",
        type=int,
        default=None,
        help="seed of the soak's random mix (default: a fresh one, printed)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "allow_leaks: opt out of the leak guard (use sparingly)")
    config.addinivalue_line(
        "markers", "ray_destroys_cluster: runs after every other Ray test (it kills the cluster)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the Ray tests last, the one that kills the cluster at the very end.

    The session's Ray cluster is torn down when the session ends: with the Ray tests last, no
    other test shares the 2 cores with Ray's daemons.
    """

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("ray_destroys_cluster"):
            return 2
        return 1 if item.get_closest_marker("ray") else 0

    items.sort(key=rank)  # stable: the order within each group stays
