"""The session's Ray cluster: a head node and two worker nodes on 127.0.0.1, for every test
that runs children on Ray (tests/ray_runner, and the ``ray`` runner of the runner contract).

The cluster runs in a host process outside pytest's process tree (``ray_cluster_host.py``), so
Ray's daemons are not this process's descendants. ``ray_leak_guard`` is the suite's leak guard
for Ray tests: it also asks the host for *leftovers* (any process below a Ray worker, or
re-parented to the host, a child subreaper, is something a child left behind, while the
cluster's own daemons and workers are not); sockets the Ray driver opens to new workers are
Ray's connection cache, not a test's leak.

Importing this module sets Ray's environment, which Ray reads once when it is imported: the
suite's conftest imports it before anything imports Ray. Ray itself is imported only by the
fixture, which skips, saying why, where the ray extra is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

# Keep every address on loopback: with this, Ray does not replace 127.0.0.1 by the machine's IP.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# Under `uv run`, Ray would ship this checkout to every worker and start them with `uv run`;
# the cluster's workers already run in this environment.
os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"

HERE = Path(__file__).parent
#: the Ray tests' folder: the cluster's workers import its child modules by name
RAY_TESTS = HERE.parent / "ray_runner"
#: the session cluster: CPUs are Ray's bookkeeping, sized for a 2-core, 24 GiB machine
NODES: dict[str, dict[str, Any]] = {
    "head": {"num_cpus": 1},
    "w1": {"num_cpus": 1, "resources": {"w1": 4}},
    "w2": {"num_cpus": 1, "resources": {"w2": 4}},
}
NO_RAY = "the Ray tests need the ray extra: uv sync --extra ray"
#: seconds the leak guard gives a process in the kernel's exit to be gone (a hang guard: a
#: process that lives on is a leftover however long one waits)
EXIT_GRACE = 5.0


def cluster_pythonpath() -> str:
    """``PYTHONPATH`` of the cluster's processes (and of drivers the tests start): the Ray
    tests' folder and ``tests/`` (``support``), before whatever this process was given."""
    return os.pathsep.join([str(RAY_TESTS), str(HERE.parent), os.environ.get("PYTHONPATH", "")])


def driver(script: str, *args: str, stdin: bool = False) -> subprocess.Popen[str]:
    """A Ray driver in a process of its own: ``script`` (a file of the Ray tests' folder) run
    with ``args``, its stdout a text pipe (and its stdin, with ``stdin``), its stderr dropped;
    its ``PYTHONPATH`` is the Ray tests' folder and ``tests/``."""
    return subprocess.Popen(
        [sys.executable, str(RAY_TESTS / script), *args],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(RAY_TESTS), str(HERE.parent)])},
    )


class ClusterHost:
    """Talks to ``ray_cluster_host.py``: one JSON command per line, one JSON answer per line."""

    def __init__(self) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": cluster_pythonpath(),
            "ZETT_RAY_HOST_LOG": os.environ.get("ZETT_RAY_HOST_LOG", os.devnull),
        }
        launcher = subprocess.Popen(
            [sys.executable, str(HERE / "ray_cluster_host.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=str(RAY_TESTS),
        )
        launcher.wait(timeout=30)  # it forks the host and exits: the host is not our child
        assert launcher.stdin is not None and launcher.stdout is not None
        self._stdin = launcher.stdin
        self._stdout = launcher.stdout
        self.info: dict[str, Any] = {}

    def call(self, op: str, timeout: float = 120.0, **args: Any) -> dict[str, Any]:
        self._stdin.write((json.dumps({"op": op, **args}) + "\n").encode())
        self._stdin.flush()
        ready, _, _ = select.select([self._stdout], [], [], timeout)
        assert ready, f"the cluster host did not answer {op!r} within {timeout} s"
        answer: dict[str, Any] = json.loads(self._stdout.readline())
        assert "error" not in answer, answer.get("tb", answer["error"])
        return answer

    def close(self) -> None:
        self._stdin.close()
        self._stdout.close()


def _ray_processes(session_dir: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if session_dir in cmdline or os.path.basename(session_dir) in cmdline:
            found.append(f"{proc.pid} {cmdline[:100]}")
    return found


def _fds() -> dict[int, str]:
    out = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return out


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[dict[str, Any]]:
    """Start the cluster and connect this process as its driver; tear both down at the end.

    Teardown checks that no process of the cluster is left on the machine. (The driver keeps a
    few fds after ``ray.shutdown()``: Ray's log files and event fds, measured on 2.60.)
    """
    ray = pytest.importorskip("ray", reason=NO_RAY)
    host = ClusterHost()
    try:
        info = host.call("start", nodes=NODES, timeout=240)
        host.info = info
        ray.init(address=info["address"], log_to_driver=False)
        yield {**info, "host": host}
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        answer = host.call("shutdown", timeout=120)
        host.close()
    assert not answer["alive"], f"Ray processes survived the cluster's shutdown: {answer}"
    left = _ray_processes(info["session_dir"])
    assert not left, f"Ray processes left on the machine: {left}"


def ray_leak_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """The body of a ``no_leaks`` fixture for Ray tests: the suite's leak guard, plus the
    cluster's leftovers (when the test uses the cluster); Ray's own sockets are exempt."""
    threads_before = {t.ident for t in threading.enumerate()}
    fds_before = set(_fds())
    yield
    leftover = psutil.Process().children(recursive=True)
    described = [f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in leftover if p.is_running()]
    for proc in leftover:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    assert not described, f"test left processes behind: {described}"
    # Ray's C++ threads that call into Python show up as _DummyThread entries: Ray's, not ours
    threads = [
        t
        for t in threading.enumerate()
        if t.ident not in threads_before
        and t.is_alive()
        and not isinstance(t, threading._DummyThread)
    ]
    assert not threads, f"test left threads: {threads}"
    leaked = {
        fd: target
        for fd, target in _fds().items()
        if fd not in fds_before and not target.startswith("socket:")
    }
    assert not leaked, f"test left file descriptors open: {leaked}"
    if "ray_cluster" in request.fixturenames:
        host: ClusterHost = request.getfixturevalue("ray_cluster")["host"]
        # a process the test's cancel or close killed may still be in the kernel's exit (its
        # memory released, its command line empty, not yet a zombie): what is still there
        # after EXIT_GRACE lives on, and is a leftover
        answer = host.call("wait_clean", within=EXIT_GRACE)
        assert not answer["leftovers"], f"a child left processes on the cluster: {answer}"
        assert not answer["cgroups"], f"a child's cgroup was left on the cluster: {answer}"
