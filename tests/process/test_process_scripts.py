"""End-to-end with separate host processes: a SIGKILLed host leaves nothing behind, and a host
script's ``__main__`` never runs again in the children."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

# Runs the host under a child subreaper that reaps everything, so that "gone" can be checked
# honestly: PID 1 on this machine never reaps, and a zombie must not count as gone by accident.
HARNESS = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
read_end, write_end = os.pipe()
host = os.posix_spawn(sys.executable, [sys.executable, sys.argv[1]], os.environ,
                      file_actions=[(os.POSIX_SPAWN_DUP2, write_end, 1)])
os.close(write_end)
with os.fdopen(read_end) as stream:
    sys.stdout.write(stream.readline())
    sys.stdout.flush()
    while True:  # every descendant of the host becomes our child once its parent dies
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
print("all reaped", flush=True)
"""

HOST = r"""
import asyncio, json, os, subprocess, time
from zett_agent.process import ProcessPool, emit

def job():
    sleeper = subprocess.Popen(["sleep", "600"])
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            time.sleep(600)
        os._exit(0)
    os.waitpid(middle, 0)
    emit([os.getpid(), sleeper.pid, int(os.read(r, 32))])
    while True:
        pass

async def main():
    pool = ProcessPool(2)
    await pool.start()
    jobs = [pool.submit(job) for _ in range(2)]
    pids = []
    for j in jobs:
        async for event in j.events():
            pids += event
            break
    print(json.dumps({"host": os.getpid(), "launcher": pool._launcher.pid, "pids": pids}),
          flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""

MAIN_SCRIPT = r"""
import asyncio, os, sys
from zett_agent.process import ProcessPool

with open(sys.argv[1], "a") as log:
    log.write(f"imported in {os.getpid()}\n")

class Point:
    def __init__(self, x):
        self.x = x

def work(point):
    return [point.x * 2, os.getpid()]

async def main():
    async with ProcessPool(2) as pool:
        results = [await pool.submit(work, Point(i)) for i in range(3)]
    assert [r[0] for r in results] == [0, 2, 4], results
    assert os.getpid() not in [r[1] for r in results]
    print("ok")

if __name__ == "__main__":
    asyncio.run(main())
"""


def _readline(stream: object, timeout: float) -> str:
    fd = stream.fileno()  # type: ignore[attr-defined]
    ready, _, _ = select.select([fd], [], [], timeout)
    assert ready, "no output within the hang guard"
    return stream.readline()  # type: ignore[attr-defined,no-any-return]


def test_sigkilled_host_leaves_nothing_alive_after_one_second(tmp_path: Path) -> None:
    (tmp_path / "harness.py").write_text(HARNESS)
    (tmp_path / "host.py").write_text(HOST)
    harness = subprocess.Popen(
        [sys.executable, str(tmp_path / "harness.py"), str(tmp_path / "host.py")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        info = json.loads(_readline(harness.stdout, 30))
        everyone = [info["host"], info["launcher"], *info["pids"]]
        assert len(everyone) == 8
        assert all(psutil.pid_exists(pid) for pid in everyone)
        os.kill(info["host"], signal.SIGKILL)
        killed = time.monotonic()
        assert _readline(harness.stdout, 5).strip() == "all reaped"
        elapsed = time.monotonic() - killed
        assert elapsed < 1.0, f"descendants outlived the host by {elapsed:.3f} s"
        print(f"all descendants reaped {elapsed * 1000:.1f} ms after the host was SIGKILLed")
        assert not any(psutil.pid_exists(pid) for pid in everyone)
    finally:
        harness.kill()
        harness.wait()
        assert harness.stdout is not None
        harness.stdout.close()


def test_main_module_side_effects_never_run_again_in_children(tmp_path: Path) -> None:
    script, log = tmp_path / "script.py", tmp_path / "log"
    script.write_text(MAIN_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert len(log.read_text().splitlines()) == 1
