"""Job functions run by the process engine tests (sent to workers by value; what they use of
``support.children`` travels by reference: the workers inherit the host's ``sys.path``)."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import signal
import subprocess
import sys
import time
from typing import Any

from support.children import setsid_escapee
from zett_agent.process import emit
from zett_agent.process._wire import _protocol


def add(a: int, b: int) -> int:
    return a + b


def getpid() -> int:
    return os.getpid()


async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


def wait_for_go(fifo: str) -> str:
    """Tell the parent we run, then block until the parent writes a line to ``fifo``."""
    emit("ready")
    with open(fifo, "rb") as stream:
        return stream.readline().decode().strip()


def ready_then_spin() -> None:
    emit(os.getpid())
    while True:
        pass


def ready_then_sleep() -> None:
    emit(os.getpid())
    time.sleep(600)


def segfault() -> None:
    ctypes.string_at(0)


def exit3() -> None:
    os._exit(3)


def abort() -> None:
    os.abort()


def raise_value_error() -> None:
    raise ValueError("boom")


def raise_system_exit() -> None:
    raise SystemExit(5)


def raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


def return_unserializable() -> Any:
    return {"x": object()}


def _write_raw(data: bytes) -> None:
    from zett_agent.process._child._worker import _channel_fd

    os.write(_channel_fd(), data)


def die_mid_result() -> None:
    from zett_agent.process._child._worker import _channel_fd

    fd = _channel_fd()
    # a frame the parent accepts (under the protocol's largest), cut short by the death
    os.write(fd, _protocol.HEADER.pack(512 << 10) + b"[" + b"1," * 100_000)
    os.kill(os.getpid(), signal.SIGKILL)


def write_garbage(data: bytes) -> None:
    _write_raw(data)
    time.sleep(600)


def spawn_tree() -> None:
    """Start a grandchild, and a double-forked ``setsid`` grandchild; emit all pids; sleep."""
    sleeper = subprocess.Popen(["sleep", "600"])
    emit([os.getpid(), sleeper.pid, setsid_escapee()])
    time.sleep(600)


def leave_background_child() -> int:
    """Return while a child still runs; the engine must kill it with the job."""
    return subprocess.Popen(["sleep", "600"]).pid


def allocate(nbytes: int) -> int:
    return len(bytearray(nbytes))


def spin() -> None:
    while True:
        pass


def environ() -> dict[str, str]:
    return dict(os.environ)


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def cwd() -> str:
    return os.getcwd()


def nofile() -> list[int]:
    import resource

    return list(resource.getrlimit(resource.RLIMIT_NOFILE))


def flood(n: int) -> int:
    for i in range(n):
        emit(i)
    return n


def term_handler(path: str) -> None:
    """Exit cleanly on SIGTERM, leaving a mark in ``path``."""

    def on_term(signum: int, frame: object) -> None:
        with open(path, "w") as stream:
            stream.write("terminated")
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    emit(os.getpid())
    while True:
        time.sleep(1)


def ignore_term() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    emit(os.getpid())
    while True:
        time.sleep(1)


def print_and_return() -> str:
    print("hello from the worker", file=sys.stderr)
    return "ok"


def exit0_leaving_child() -> None:
    """Leave a background child and exit with code 0 without sending a result."""
    child = subprocess.Popen(["sleep", "600"])
    emit(child.pid)
    os._exit(0)


def text(n: int) -> str:
    return ("é✓x" * n)[:n]


def ascii_text(n: int, fill: str = "a") -> str:
    """An ASCII string of ``n`` characters that shows where every slice of it came from."""
    return "".join(chr(48 + i % 64) for i in range(min(n, 4096))) + fill * max(0, n - 4096)


def surrogate_text(n: int) -> str:
    return "x" * n + "\ud800"


def bad_text_result() -> None:
    """Announce a raw text result and send bytes that are not UTF-8."""
    from zett_agent.process._child._worker import _channel

    assert _channel is not None
    _channel._send_frame(b'{"k":"begin","m":"result"}')
    _channel._send_frame(b'{"k":"text","n":3,"c":3,"w":1,"a":false}')
    _channel._send_frame(b"\xff\xfe\xfd")
    time.sleep(600)


def fork_and_return() -> int:
    """Fork; both processes return from the job. Only the worker may answer."""
    child = os.fork()
    if child:
        os.waitpid(child, 0)
    return 1 if child else 2


def echo_size(data: str) -> int:
    return len(data)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def echo_value(value: Any) -> Any:
    return value


def fork_many(n: int) -> int:
    """Fork ``n`` sleepers (a fork beyond the tree's process limit raises)."""
    for _ in range(n):
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
    return n


def niceness() -> int:
    return os.nice(0)


def slice_and_niceness() -> tuple[int | None, int]:
    """The scheduler slice this process asked for (nanoseconds) and its niceness."""
    from zett_agent.process import _linux

    return _linux.requested_slice(), os.nice(0)


def _cgroup_of(pid: int) -> str:
    """``pid``'s cgroup v2 path."""
    with open(f"/proc/{pid}/cgroup") as f:
        return next(line[3:].strip() for line in f if line.startswith("0::"))


def launcher_threads_and_cgroup() -> tuple[int, str]:
    """How many threads this worker's launcher (its parent) has, and its cgroup v2 path."""
    launcher = os.getppid()
    return len(os.listdir(f"/proc/{launcher}/task")), _cgroup_of(launcher)


def started_at_import(module: str) -> tuple[int, str]:
    """The pid of the process ``module`` started as the launcher imported it, and its cgroup."""
    pid = int(sys.modules[module].HELPER_PID)
    return pid, _cgroup_of(pid)


def launcher_slice() -> int | None:
    """The scheduler slice this worker's launcher (its parent) asked for (nanoseconds)."""
    from zett_agent.process import _linux

    return _linux.requested_slice(os.getppid())


def session_niceness() -> tuple[str, int]:
    """This process's autogroup (its session's, for the scheduler) and that group's niceness."""
    with open("/proc/self/autogroup") as file:
        words = file.read().split()  # "/autogroup-123 nice 7"
    if not words:
        return "the default autogroup", 0  # a session never made since boot shows nothing
    name, _, nice = words
    return name, int(nice)


def session_and_group() -> dict[str, int]:
    """Who leads this process's session and its process group, and its parent."""
    return {"sid": os.getsid(0), "pgid": os.getpgid(0), "pid": os.getpid(), "ppid": os.getppid()}


def lower_session_niceness() -> str:
    """Try to put this session's niceness back to 0; what the kernel answered."""
    try:
        fd = os.open("/proc/self/autogroup", os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "done"


# -- for the concurrent.futures executor -------------------------------------------------------


def power(x: int, y: int = 2) -> int:
    return int(x**y)


def divide(x: int, y: int) -> float:
    return x / y


def sleep_then(seconds: float, value: Any) -> Any:
    time.sleep(seconds)
    return value


def tree_then_wait(path: str) -> None:
    """Start a grandchild in a session of its own, write both pids to ``path`` (a FIFO the
    test reads), then wait for ever."""
    grandchild = subprocess.Popen(["sleep", "600"], start_new_session=True)
    with open(path, "w") as stream:
        stream.write(f"{os.getpid()} {grandchild.pid}\n")
    while True:
        time.sleep(600)


def signal_then_sleep(path: str, seconds: float, value: Any) -> Any:
    """Write a line to ``path`` (a FIFO the test reads: "it runs"), sleep, return ``value``."""
    with open(path, "w") as stream:
        stream.write("running\n")
    time.sleep(seconds)
    return value


def exit_leaving_a_heavy_child(megabytes: int) -> None:
    """Start a child that holds ``megabytes`` of touched memory (its exit, once killed, takes
    a while: the kernel frees every page first), say its pid, and exit at once."""
    import mmap

    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        heavy = mmap.mmap(-1, megabytes << 20)
        chunk = b"x" * (1 << 20)
        for _ in range(megabytes):
            heavy.write(chunk)  # every page touched
        os.write(ready_w, b"1")
        while True:
            time.sleep(60)
    os.close(ready_w)
    os.read(ready_r, 1)
    emit(pid)
    os._exit(0)
