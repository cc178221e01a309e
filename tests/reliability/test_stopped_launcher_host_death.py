"""The reproduction of issue 15, part 2, as a test: a job sends SIGSTOP to its launcher while
nothing is owed to the host, then the host dies (SIGKILL). Before every worker had a Landlock
domain of its own, the launcher, the worker and a ``setsid`` grandchild stayed alive for good,
in both containments: the stopped launcher never saw the host die. Now the SIGSTOP is denied,
and within a second of the host's death nothing it started is left.

The host runs under the harness of ``test_host_death`` (a child subreaper that reaps every
orphan and reports when the last one was reaped).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from test_host_death import HARNESS, _readline

from zett_agent.process._landlock import abi

_ABI, _WHY = abi()

HOST = textwrap.dedent(
    r"""
    import asyncio, json, os, signal, sys, time

    from zett_agent.process import ProcessPool, emit

    CONTAINMENT = sys.argv[1]

    def stop_the_launcher_and_hide():
        # a daemon-like grandchild first, then the attack on our own parent
        read_end, write_end = os.pipe()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.write(write_end, str(os.getpid()).encode())
                while True:
                    time.sleep(1)
            os._exit(0)
        os.wait()
        grandchild = int(os.read(read_end, 32))
        try:
            os.kill(os.getppid(), signal.SIGSTOP)
            outcome = "stopped"
        except PermissionError:
            outcome = "denied"
        emit({"worker": os.getpid(), "grandchild": grandchild, "outcome": outcome})
        while True:
            time.sleep(1)

    async def main():
        async with ProcessPool(1, spare_workers=0, containment=CONTAINMENT) as pool:
            job = pool.submit(stop_the_launcher_and_hide)
            async for seen in job.events():
                break
            # nothing is owed to the host now: no request, no exit report
            print(json.dumps({"host": os.getpid(), "launcher": pool._launcher.pid, **seen}),
                  flush=True)
            await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@pytest.mark.skipif(_ABI < 6, reason=f"needs Landlock ABI 6; this kernel has {_ABI}: {_WHY}")
def test_a_job_cannot_stop_its_launcher_so_host_death_still_kills_everything(
    containment: str, tmp_path: Path
) -> None:
    (tmp_path / "harness.py").write_text(HARNESS)
    (tmp_path / "host.py").write_text(HOST)
    harness = subprocess.Popen(
        [sys.executable, str(tmp_path / "harness.py"), str(tmp_path / "host.py"), containment],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert harness.stdout is not None and harness.stderr is not None
    try:
        line = _readline(harness.stdout, 60)
        assert line, harness.stderr.read()
        info = json.loads(line)
        assert info["outcome"] == "denied", info
        launcher = psutil.Process(info["launcher"])
        assert launcher.status() != psutil.STATUS_STOPPED
        descendants = [info["launcher"], info["worker"], info["grandchild"]]
        assert all(psutil.pid_exists(pid) for pid in descendants)
        os.kill(info["host"], signal.SIGKILL)
        report = json.loads(_readline(harness.stdout, 30))
        assert report["host_status"] == -signal.SIGKILL, harness.stderr.read()
        assert report["after_host"] < 1.0, report
        # the harness ends only once it has no child left: nothing the host started runs
        assert info["launcher"] in report["reaped"], report
        assert not [pid for pid in descendants if psutil.pid_exists(pid)]
    finally:
        harness.kill()
        harness.wait()
        harness.stdout.close()
        harness.stderr.close()
