"""A job that stops its launcher cannot outlive the host: it sends SIGSTOP to its launcher while
nothing is owed to the host, then the host dies (SIGKILL). Before every worker had a Landlock
domain of its own, the launcher, the worker and a ``setsid`` grandchild stayed alive for good,
in both containments: the stopped launcher never saw the host die. Now the SIGSTOP is denied,
and within a second of the host's death nothing it started is left.

The host runs under the harness of ``support.host_death`` (a child subreaper that reaps every
orphan and reports when the last one was reaped).
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

import psutil
import pytest

from support.host_death import harnessed_host, read_line
from zett_agent.process._sandbox._landlock import abi

_ABI, _WHY = abi()

HOST = textwrap.dedent(
    r"""
    import asyncio, json, os, signal, sys, time

    CONTAINMENT = sys.argv[1]
    sys.path.insert(0, sys.argv[2])  # tests/, for the shared child behaviour

    from support.children import setsid_escapee
    from zett_agent.process import ProcessPool, emit
    from zett_agent.process._host._pool import engine_of

    def stop_the_launcher_and_hide():
        grandchild = setsid_escapee()  # a daemon-like grandchild first, then the attack
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
            launcher = engine_of(pool).launcher.pid
            print(json.dumps({"host": os.getpid(), "launcher": launcher, **seen}), flush=True)
            await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@pytest.mark.skipif(_ABI < 6, reason=f"needs Landlock ABI 6; this kernel has {_ABI}: {_WHY}")
def test_a_job_cannot_stop_its_launcher_so_host_death_still_kills_everything(
    containment: str, tmp_path: Path
) -> None:
    tests = str(Path(__file__).parents[1])
    with harnessed_host(tmp_path, HOST, containment, tests) as harness:
        line = read_line(harness.stdout, 60)
        assert line, harness.stderr.read()
        info = json.loads(line)
        assert info["outcome"] == "denied", info
        launcher = psutil.Process(info["launcher"])
        assert launcher.status() != psutil.STATUS_STOPPED
        descendants = [info["launcher"], info["worker"], info["grandchild"]]
        assert all(psutil.pid_exists(pid) for pid in descendants)
        os.kill(info["host"], signal.SIGKILL)
        report = json.loads(read_line(harness.stdout, 30))
        assert report["host_status"] == -signal.SIGKILL, harness.stderr.read()
        assert report["after_host"] < 1.0, report
        # the harness ends only once it has no child left: nothing the host started runs
        assert info["launcher"] in report["reaped"], report
        assert not [pid for pid in descendants if psutil.pid_exists(pid)]
