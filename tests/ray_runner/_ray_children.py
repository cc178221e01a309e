"""What the Ray tests run as children: functions and agent tools (imported by name in the Ray
workers; the cluster's PYTHONPATH holds this folder and ``tests/``).

Children that the test must watch report to it through a datagram socket (``beacon``): every
node of the test cluster is this machine.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from zett_agent.runners.ray import emit
from zett_agent.tools import AgentTool

PR_SET_CHILD_SUBREAPER = 36


def beacon(path: str, payload: dict[str, Any]) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(json.dumps(payload).encode(), path)


def echo(value: Any, events: int = 0) -> Any:
    for i in range(events):
        emit({"i": i})
    return {"value": value, "pid": os.getpid()}


async def echo_async(value: Any) -> Any:
    emit({"async": True})
    return value


def raises(message: str) -> None:
    raise ValueError(message)


def segfault() -> None:
    emit("about to crash")
    ctypes.string_at(0)


def hard_exit(code: int) -> None:
    os._exit(code)


def not_json() -> Any:
    return {1, 2}


def start_tree() -> dict[str, int]:
    """Start a plain child and a ``setsid`` double-fork escapee; return the pids."""
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    read, write = os.pipe()
    escaper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            "if os.fork():\n    os._exit(0)\n"
            "os.setsid()\n"
            f"os.write({write}, str(os.getpid()).encode())\n"
            "time.sleep(3600)\n",
        ],
        pass_fds=(write,),
    )
    escaper.wait()
    os.close(write)
    escapee = int(os.read(read, 32))
    os.close(read)
    return {"worker": os.getpid(), "plain": plain.pid, "escapee": escapee}


def spin_with_tree(seconds: float = 3600.0) -> None:
    """Start a tree, report its pids as an event, then spin in pure Python, never yielding."""
    emit(start_tree())
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


def _pids_matching(text: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as handle:
                    cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(int(name))
    return found


def hostile(kill_helpers: bool = True) -> None:
    """A child that fights its containment, then spins.

    With ``kill_helpers`` it waits until its node has a zett reaper actor, then kills every
    reaper and every task sentinel it finds. Always: clears its worker's subreaper flag and
    starts a grandchild that clears its environment, double-forks and calls ``setsid``.
    Reports the pids it started and the helpers it killed.
    """
    killed = []
    if kill_helpers:
        deadline = time.monotonic() + 60  # the reaper starts with the child (a hang guard)
        while not _pids_matching("ray::_Reaper") and time.monotonic() < deadline:
            time.sleep(0.02)
        for pid in _pids_matching("ray::_Reaper") + _pids_matching("_ray_contain.py sentinel"):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    read, write = os.pipe()
    escaper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, time\n"
            "if os.fork():\n    os._exit(0)\n"
            "os.setsid()\n"
            "if os.fork():\n    os._exit(0)\n"
            f"os.write({write}, str(os.getpid()).encode())\n"
            "time.sleep(3600)\n",
        ],
        env={},  # no marker: invisible to a scan by environment
        pass_fds=(write,),
    )
    escaper.wait()
    os.close(write)
    escapee = int(os.read(read, 32))
    os.close(read)
    emit({"worker": os.getpid(), "escapee": escapee, "killed": killed})
    while True:
        pass


def tree_then_return() -> dict[str, int]:
    """Leave a plain child and a setsid escapee behind, then return normally."""
    return start_tree()


def tree_then_segfault(beacon_path: str) -> None:
    """Start a tree, tell the test its pids, then crash the worker.

    Through a beacon, not ``emit``: an event still in the worker when it crashes is lost.
    """
    beacon(beacon_path, start_tree())
    ctypes.string_at(0)


def burn(seconds: float) -> float:
    """CPU-bound pure Python for about ``seconds`` of CPU time."""
    start = time.process_time()
    n = 0
    while time.process_time() - start < seconds:
        for _ in range(10_000):
            n += 1
    return time.process_time() - start


def allocate(megabytes: int) -> int:
    chunk = bytearray(megabytes * 2**20)
    return len(chunk)


def wait_forever() -> None:
    emit({"pid": os.getpid()})
    time.sleep(3600)


# -- agent tools for the extension tests -------------------------------------------------------


def _spin_tree(beacon_path: str) -> str:
    """Start a tree, tell the test its pids, spin forever (pure Python, never yields)."""
    beacon(beacon_path, start_tree())
    while True:
        pass


def _announce_and_wait(beacon_path: str, label: str) -> str:
    beacon(beacon_path, {"label": label, "pid": os.getpid()})
    time.sleep(3600)
    return "unreachable"


def _wait_for_gate(gate: str) -> str:
    """Return what the test writes to the FIFO ``gate`` (the child runs until then)."""
    with open(gate, "rb") as fifo:
        return fifo.read().decode()


def _segfault() -> str:
    ctypes.string_at(0)
    return "unreachable"


def _burn(seconds: float) -> str:
    """Burn ``seconds`` of CPU; return when it started and ended (CLOCK_MONOTONIC, which every
    node of the test cluster shares)."""
    started = time.monotonic()
    end = time.process_time() + seconds
    digest = b""
    while time.process_time() < end:
        for _ in range(1000):
            digest = hashlib.sha256(digest).digest()
    return f"{started} {time.monotonic()}"


def _progress() -> str:
    from zett_agent.process import emit as process_emit  # what child tools use everywhere

    process_emit({"kind": "progress", "done": 2, "total": 3})
    return "reported"


def _schema(**properties: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
    }


SPIN_TREE = AgentTool("spin_tree", "Spin.", _schema(beacon_path="string"), _spin_tree)
ANNOUNCE = AgentTool(
    "announce", "Wait.", _schema(beacon_path="string", label="string"), _announce_and_wait
)
SEGFAULT = AgentTool("segfault", "Crash.", _schema(), _segfault)
BURN = AgentTool("burn", "Burn CPU.", _schema(seconds="number"), _burn)
GATE = AgentTool("gate", "Wait for the gate.", _schema(gate="string"), _wait_for_gate)
PROGRESS = AgentTool("progress", "Report progress.", _schema(), _progress)
