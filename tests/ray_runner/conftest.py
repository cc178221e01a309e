"""The Ray tests' cluster: a head node and two worker nodes, once per session, on 127.0.0.1.

The cluster runs in a host process outside pytest's process tree (``_cluster_host.py``), so
Ray's daemons are not this process's descendants. The leak guard is replaced here by one that
also asks the host for *leftovers*: any process below a Ray worker, or re-parented to the host
(a child subreaper), is something a child left behind, while the cluster's own daemons and
workers are not. Sockets the Ray driver opens to new workers are Ray's connection cache, not a
test's leak.
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

ray = pytest.importorskip("ray", reason="the Ray tests need the ray extra: uv sync --extra ray")

HERE = Path(__file__).parent
#: the session cluster: CPUs are Ray's bookkeeping, sized for a 2-core, 24 GiB machine
NODES: dict[str, dict[str, Any]] = {
    "head": {"num_cpus": 1},
    "w1": {"num_cpus": 1, "resources": {"w1": 4}},
    "w2": {"num_cpus": 1, "resources": {"w2": 4}},
}


class ClusterHost:
    """Talks to ``_cluster_host.py``: one JSON command per line, one JSON answer per line."""

    def __init__(self) -> None:
        env = {
            **os.environ,
            # the children's modules: this folder's and tests/ (the scripted models)
            "PYTHONPATH": os.pathsep.join(
                [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]
            ),
            "ZETT_RAY_HOST_LOG": os.environ.get("ZETT_RAY_HOST_LOG", os.devnull),
        }
        launcher = subprocess.Popen(
            [sys.executable, str(HERE / "_cluster_host.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=str(HERE),
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


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """The suite's leak guard, plus the cluster's leftovers; Ray's own sockets are exempt."""
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
        answer = host.call("leftovers")
        assert not answer["leftovers"], f"a child left processes on the cluster: {answer}"
        assert not answer["cgroups"], f"a child's cgroup was left on the cluster: {answer}"
