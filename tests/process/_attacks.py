"""Jobs that attack the engine's containment the way a hostile (or buggy) child would.

Every process they start records itself in a file as ``pid starttime``
(``support.survivors.record``), so a test can check each one is dead even after its pid was
reused (a fork bomb wraps pids around fast). Shipped to the workers by value (see
``conftest.py``); ``record`` travels by reference (the workers inherit the host's ``sys.path``,
which holds ``tests/``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from support.survivors import record
from zett_agent.process import emit

_PR_SET_CHILD_SUBREAPER = 36


def _sleep_forever() -> None:
    while True:
        time.sleep(60)


def growing_tree(path: str, depth: int, forks: int) -> None:
    """Every process records itself and forks ``forks`` children, each of which does the same,
    down to ``depth`` levels; tells the parent it started at once, so the kill meets a tree that
    is still growing."""
    emit("growing")
    level = 0
    while True:
        record(path)
        if level >= depth:
            _sleep_forever()
        for _ in range(forks):
            if os.fork() == 0:
                level += 1
                break
        else:
            _sleep_forever()


def forge_result_then_spin(path: str) -> None:
    """Write a valid result frame of our own, then keep running: the engine must end us."""
    from zett_agent.process._child._worker import _channel_fd
    from zett_agent.process._wire._protocol import HEADER

    record(path)
    payload = b'{"k":"result","v":"forged","u":{"cpu":0.0,"maxrss":0}}'
    os.write(_channel_fd(), HEADER.pack(len(payload)) + payload)
    while True:
        pass


def thread_forking_sleepers(path: str) -> str:
    """Leave a daemon thread that forks a sleeper every 10 ms, then return."""
    record(path)

    def fork_forever() -> None:
        while True:
            if os.fork() == 0:
                record(path)
                _sleep_forever()
            time.sleep(0.01)

    threading.Thread(target=fork_forever, daemon=True).start()
    time.sleep(0.05)  # a few sleepers exist before the answer
    return "returned"


def leave_a_thread(path: str, fail: bool) -> str:
    """Leave a sleeping daemon thread behind, then return (or raise with ``fail``)."""
    record(path)
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    if fail:
        raise RuntimeError("failed, leaving a thread")
    return "returned"


def exit_with_status(path: str, status: int) -> None:
    """Fork a sleeper, then exit with ``status`` (90 was once the engine's "clean exit")."""
    record(path)
    if os.fork() == 0:
        record(path)
        _sleep_forever()
    time.sleep(0.05)  # the sleeper recorded itself
    os._exit(status)


def escape_subreaper(path: str, then: str) -> str:
    """Switch the worker's subreaper flag off, then double-fork a ``setsid`` escapee, which is
    reparented past the worker; then return, or sleep until cancelled or timed out."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) == 0
    record(path)
    ready_r, ready_w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            record(path)
            os.write(ready_w, b"x")
            _sleep_forever()
        os._exit(0)
    os.waitpid(middle, 0)
    os.read(ready_r, 1)
    emit("escaped")
    if then == "return":
        return "returned"
    _sleep_forever()
    raise AssertionError("unreachable")


def stop_the_launcher(path: str) -> None:
    """SIGSTOP our own parent (the pool's launcher), then sleep."""
    record(path)
    os.kill(os.getppid(), signal.SIGSTOP)
    emit("stopped it")
    _sleep_forever()


def kill_the_launcher(path: str) -> None:
    """Start a plain and a ``setsid`` grandchild, then SIGKILL our own parent (the launcher)."""
    record(path)
    code = (
        "import sys, time; sys.path[:0] = [sys.argv[1]]; from support.survivors import record; "
        "record(sys.argv[2]); print(flush=True); time.sleep(600)"
    )
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    plain = subprocess.Popen([sys.executable, "-c", code, tests, path], stdout=subprocess.PIPE)
    escaped = subprocess.Popen(
        [sys.executable, "-c", code, tests, path], stdout=subprocess.PIPE, start_new_session=True
    )
    for child in (plain, escaped):
        assert child.stdout is not None
        child.stdout.readline()
    os.kill(os.getppid(), signal.SIGKILL)
    emit("killed it")
    _sleep_forever()


def amplify(items: int) -> Any:
    """A small JSON text that decodes into a lot of memory: ``[{}, {}, ...]``."""
    return [{}] * items


def emit_amplified(items: int, count: int) -> str:
    for _ in range(count):
        emit([{}] * items)
    return "emitted"


def cgroup_of_nested_worker() -> dict[str, Any]:
    """Run a pool inside this job (as a nested child agent would); report where its worker
    lives, and where this job lives."""
    import asyncio

    from zett_agent.process import ProcessPool

    def where() -> str:
        with open("/proc/self/cgroup") as handle:
            return handle.read()

    async def main() -> dict[str, Any]:
        async with ProcessPool(1, spare_workers=0) as pool:
            inner = await pool.submit(where)
            return {"outer": where(), "inner": inner, "containment": pool.containment}

    return asyncio.run(main())


def nested_sleeper(path: str) -> None:
    """Run a pool inside this job whose job records itself and sleeps; report, then wait."""
    import asyncio

    from zett_agent.process import ProcessPool

    def sleeper(path: str) -> None:
        record(path)
        emit("inner running")
        _sleep_forever()

    async def main() -> None:
        async with ProcessPool(1, spare_workers=0) as pool:
            job = pool.submit(sleeper, path)
            async for _event in job.events():
                break
            emit("nested")
            await job

    record(path)
    asyncio.run(main())
