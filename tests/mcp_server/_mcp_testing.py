"""What the MCP server tests share: the command, FIFOs, and checks by pid."""

from __future__ import annotations

import json
import os
import select
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from support.liveness import alive

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: the console script a user runs, from this environment
ZETT_AGENT = str(Path(sys.executable).with_name("zett-agent"))
#: how long a test waits on anything at most; never reached unless something hangs
HANG_GUARD = 60.0
#: the definitions module of these tests, imported by the server from HERE
CHILDREN = "_mcp_children:DEFINITIONS"
TOOLS = ["task_start", "task_list", "task_status", "task_output", "task_cancel"]


class Fifo:
    """A FIFO held open read-write by the test, so a child's ``open`` of it never blocks and
    a read here never sees end-of-file."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = str(path)
        self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        self._buffer = b""

    def write_line(self, text: str = "go") -> None:
        os.write(self.fd, text.encode() + b"\n")

    def read_line(self, within: float = HANG_GUARD) -> str:
        deadline = time.monotonic() + within
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line on {self.path} within {within} s")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                self._buffer += os.read(self.fd, 4096)
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def close(self) -> None:
        os.close(self.fd)


@contextmanager
def fifos(tmp_path: Path, *names: str) -> Iterator[list[Fifo]]:
    made = [Fifo(tmp_path / name) for name in names]
    try:
        yield made
    finally:
        for fifo in made:
            fifo.close()


def order(tool: str | None = None, **arguments: object) -> str:
    """A prompt for a child of ``_mcp_children``: call ``tool`` with ``arguments``."""
    return json.dumps({"tool": tool, "arguments": arguments})


def start_arguments(tool: str | None = None, **arguments: object) -> dict[str, str]:
    return {
        "subagent_type": "worker",
        "description": tool or "nothing",
        "prompt": order(tool, **arguments),
    }


def tree(pid: int) -> list[int]:
    """``pid`` and every live descendant of it, now."""
    process = psutil.Process(pid)
    return [pid, *(p.pid for p in process.children(recursive=True))]


def wait_gone(pids: list[int], within: float = HANG_GUARD) -> None:
    """Wait until none of ``pids`` is alive; a hang guard, not a pause."""
    deadline = time.monotonic() + within
    while [p for p in pids if alive(p)]:
        if time.monotonic() > deadline:
            raise AssertionError(f"still alive: {[p for p in pids if alive(p)]}")
        time.sleep(0.01)
