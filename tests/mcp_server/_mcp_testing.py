"""What the MCP server tests share: the command, FIFOs, and checks by pid."""

from __future__ import annotations

import asyncio
import contextlib
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

    async def read_line_async(self, within: float = HANG_GUARD) -> str:
        """``read_line`` without blocking the event loop: waits for the FIFO to be readable."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(within):
            while b"\n" not in self._buffer:
                readable: asyncio.Future[None] = loop.create_future()
                loop.add_reader(self.fd, _set_once, readable)
                try:
                    await readable
                finally:
                    loop.remove_reader(self.fd)
                with contextlib.suppress(BlockingIOError):
                    self._buffer += os.read(self.fd, 4096)
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def close(self) -> None:
        os.close(self.fd)


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


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


#: the children's own tools, after the five
CHILD_TOOLS = ["worker"]


def worker_arguments(tool: str | None = None, **arguments: object) -> dict[str, str]:
    """The arguments of the ``worker`` child's own tool: call ``tool`` with ``arguments``."""
    return {"prompt": order(tool, **arguments)}


class HttpServer:
    """``zett-agent mcp ... --http 127.0.0.1:0`` in a process of its own.

    ``url`` and ``token`` are what it printed; its stderr is read to the end by a thread, so it
    never blocks on a full pipe.
    """

    def __init__(self, *args: str, cwd: Path = HERE, target: str = CHILDREN) -> None:
        import subprocess
        import threading

        self.process = subprocess.Popen(
            [ZETT_AGENT, "mcp", target, "--http", "127.0.0.1:0", *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()
        serving = self.wait_line("zett-agent mcp: serving ")
        self.url = serving.rsplit(" ", 1)[1]
        self.token = ""
        if "--token-file" not in args:
            self.token = self.wait_line("zett-agent mcp: bearer token").rsplit(" ", 1)[1]
        self.headers = {"Authorization": f"Bearer {self.token}"}

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # end of output
            self._changed.notify_all()

    def wait_line(self, prefix: str, within: float = HANG_GUARD) -> str:
        """The first line of its stderr that starts with ``prefix`` (waiting for it)."""
        deadline = time.monotonic() + within
        with self._changed:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                if self.process.poll() is not None and self.lines and self.lines[-1] == "":
                    raise AssertionError(f"the server ended: {self.lines}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no line {prefix!r} within {within} s: {self.lines}")
                self._changed.wait(left)

    def stop(self, signum: int = 15) -> int:
        """Stop it with ``signum`` and return its exit status (negative: died of a signal)."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            status = self.process.wait(timeout=HANG_GUARD)
        finally:
            self._drain.join(timeout=HANG_GUARD)
            assert self.process.stderr is not None
            self.process.stderr.close()
        return status


@contextmanager
def http_server(*args: str, cwd: Path = HERE, target: str = CHILDREN) -> Iterator[HttpServer]:
    """A running HTTP server, stopped (SIGTERM) when the block ends; nothing of it is left."""
    server = HttpServer(*args, cwd=cwd, target=target)
    try:
        yield server
    finally:
        pids = [server.process.pid]
        with contextlib.suppress(psutil.NoSuchProcess):
            pids += [p.pid for p in psutil.Process(server.process.pid).children(recursive=True)]
        server.stop()
        reap(pids)


def reap(pids: list[int], within: float = HANG_GUARD) -> dict[int, int]:
    """Wait until every one of ``pids`` is gone, reaping those that are this process's
    children (the test is a subreaper: orphans of a killed process come here). Returns the exit
    status of each one reaped."""
    statuses: dict[int, int] = {}
    for pid in pids:
        try:
            process = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        try:
            status = process.wait(timeout=within)
        except psutil.TimeoutExpired:
            raise AssertionError(f"still alive {within} s after the kill: {pid}") from None
        if status is not None:
            statuses[pid] = status
    return statuses


class RawServer:
    """``zett-agent mcp`` on pipes, spoken to in raw JSON-RPC lines: a client of no SDK.

    ``answer(id)`` returns the answer to a request, keeping the notifications that came
    before it in ``notifications``. ``close()`` closes its stdin (the client leaves) and
    returns its exit status.
    """

    def __init__(self, *args: str, target: str = CHILDREN, cwd: Path = HERE) -> None:
        import subprocess

        self.process = subprocess.Popen(
            [ZETT_AGENT, "mcp", target, *args],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._in = self.process.stdin
        self._out = self.process.stdout.fileno()
        self._buffer = b""
        self.notifications: list[dict[str, object]] = []
        self._answers: dict[object, dict[str, object]] = {}
        self._ids = iter(range(1, 10**9))

    def send(self, message: object) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode()
        self._in.write(data + b"\n")
        self._in.flush()

    def request(self, method: str, params: dict[str, object] | None = None) -> int:
        """Send a request; return its id."""
        number = next(self._ids)
        message: dict[str, object] = {"jsonrpc": "2.0", "id": number, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return number

    def call(self, method: str, params: dict[str, object] | None = None) -> dict[str, object]:
        """Send a request and return its answer (the whole message)."""
        return self.answer(self.request(method, params))

    def initialize(self, version: str = "2025-11-25") -> dict[str, object]:
        answer = self.call(
            "initialize",
            {
                "protocolVersion": version,
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        )
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    def next_message(self, within: float = HANG_GUARD) -> dict[str, object]:
        deadline = time.monotonic() + within
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no message within {within} s")
            ready, _, _ = select.select([self._out], [], [], left)
            if ready:
                chunk = os.read(self._out, 1 << 20)
                if not chunk:
                    raise EOFError("the server closed its stdout")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        value: dict[str, object] = json.loads(line)
        return value

    def answer(self, number: object, within: float = HANG_GUARD) -> dict[str, object]:
        while number not in self._answers:
            message = self.next_message(within)
            if "id" in message and "method" not in message:
                self._answers[message["id"]] = message
            else:
                self.notifications.append(message)
        return self._answers.pop(number)

    def notification(self, method: str, text: str = "") -> dict[str, object]:
        """The first notification of ``method`` whose JSON has ``text`` (waiting for it)."""
        seen = 0
        while True:
            for message in self.notifications[seen:]:
                if message.get("method") == method and text in json.dumps(message):
                    return message
            seen = len(self.notifications)
            message = self.next_message()
            if "id" in message and "method" not in message:
                self._answers[message["id"]] = message
            else:
                self.notifications.append(message)

    def close(self) -> int:
        pids = [self.process.pid]
        with contextlib.suppress(psutil.NoSuchProcess):
            pids += [p.pid for p in psutil.Process(self.process.pid).children(recursive=True)]
        with contextlib.suppress(BrokenPipeError):
            self._in.close()
        status = self.process.wait(timeout=HANG_GUARD)
        assert self.process.stdout is not None
        self.process.stdout.close()
        reap(pids)
        return status
