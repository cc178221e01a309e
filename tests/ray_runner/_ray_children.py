"""Functions the Ray tests run as children (imported by name in the Ray workers)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from typing import Any

from zett_agent.runners.ray import emit


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


def spin_with_tree(seconds: float = 3600.0) -> None:
    """Start a plain grandchild and a setsid double-fork escapee, report their pids, spin."""
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
    emit({"worker": os.getpid(), "plain": plain.pid, "escapee": escapee})
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass  # pure Python, never yields


def tree_then_return() -> dict[str, int]:
    """Leave a plain child and a setsid escapee behind, then return normally."""
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    escaper = subprocess.Popen(
        ["setsid", "sh", "-c", "sleep 3600 >/dev/null 2>&1 & echo $!"],
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = escaper.communicate()
    return {"plain": plain.pid, "escapee": int(out.strip())}


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


def burn_span(seconds: float) -> list[float]:
    """``burn`` that reports when it started and ended (CLOCK_MONOTONIC is machine-wide)."""
    started = time.monotonic()
    burn(seconds)
    return [started, time.monotonic()]
