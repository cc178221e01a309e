"""End-to-end with separate host processes: a SIGKILLed host leaves nothing behind, and a host
script's ``__main__`` never runs again in the children."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from support.host_death import harnessed_host, read_line

HOST = r"""
import asyncio, json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])  # tests/, for the shared child behaviour
from support.children import setsid_escapee
from zett_agent.process import ProcessPool, emit
from zett_agent.process._host._pool import engine_of

def job():
    sleeper = subprocess.Popen(["sleep", "600"])
    emit([os.getpid(), sleeper.pid, setsid_escapee()])
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
    print(json.dumps({"host": os.getpid(), "launcher": engine_of(pool).launcher.pid, "pids": pids}),
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


def test_sigkilled_host_leaves_nothing_alive_after_one_second(tmp_path: Path) -> None:
    # under support.host_death's harness: "gone" is checked honestly (it reaps every orphan)
    with harnessed_host(tmp_path, HOST, str(Path(__file__).parents[1])) as harness:
        info = json.loads(read_line(harness.stdout, 30))
        everyone = [info["host"], info["launcher"], *info["pids"]]
        assert len(everyone) == 8
        assert all(psutil.pid_exists(pid) for pid in everyone)
        os.kill(info["host"], signal.SIGKILL)
        elapsed = json.loads(read_line(harness.stdout, 5))["after_host"]
        assert elapsed < 1.0, f"descendants outlived the host by {elapsed:.3f} s"
        print(f"all descendants reaped {elapsed * 1000:.1f} ms after the host was SIGKILLed")
        assert not any(psutil.pid_exists(pid) for pid in everyone)


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
