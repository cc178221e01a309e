"""The unprivileged-account path of ``Sandbox``, run for real.

The suite's interpreter lives under ``/root`` (mode 0700), so its sandboxed jobs run as uid 0
without capabilities. Here a host runs on a world-readable interpreter (Debian's
``/usr/bin/python3.11``) with the engine's dependencies copied into a world-readable directory,
so its sandboxed jobs run as uid 65534: no groups, no capabilities, and the file system denied
twice over (the mode bits and Landlock).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.world import INTERPRETER, SRC, host_world

HOST = textwrap.dedent(
    r"""
    import os, sys
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [os.path.join(here, "packages"), sys.argv[1]]
    import asyncio, json, subprocess
    from zett_agent.process import ProcessPool, Sandbox, sandbox_support

    SECRET, OUTSIDE = sys.argv[2], sys.argv[3]

    def attempt(action):
        try:
            action()
        except OSError as exc:
            return exc.errno
        return "ok"

    def probe():
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getuid(), os.getgid())"],
            capture_output=True, text=True,
        )
        return {
            "ids": [os.getresuid(), os.getresgid(), os.getgroups()],
            "read secret": attempt(lambda: open(SECRET).read()),
            "write outside": attempt(lambda: open(OUTSIDE, "w").write("x")),
            "write scratch": attempt(lambda: open("in-scratch", "w").write("x")),
            "scratch": [oct(os.stat(".").st_mode & 0o777), os.stat(".").st_uid],
            "grandchild": child.stdout.split(),
        }

    async def main():
        support = sandbox_support()
        async with ProcessPool(1) as pool:
            job = pool.submit(probe, sandbox=Sandbox())
            seen = await job
            print(json.dumps({"support": support, "seen": seen, "report": job.sandbox_report}))

    asyncio.run(main())
    """
)


@pytest.fixture
def world() -> Iterator[Path]:
    """A world-readable directory with the host script and the engine's dependencies."""
    with host_world(HOST) as path:
        yield path


@pytest.mark.slow
def test_a_sandboxed_job_runs_as_an_unprivileged_account(world: Path, tmp_path: Path) -> None:
    secret = Path(os.path.expanduser("~")) / f".zett-test-secret-{os.urandom(6).hex()}"
    secret.write_text("the host's secret")
    outside = world / "outside.txt"  # world-readable parent: only the sandbox stops a write
    try:
        done = subprocess.run(
            [INTERPRETER, "-I", str(world / "host.py"), SRC, str(secret), str(outside)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
            check=False,
        )
    finally:
        secret.unlink()
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    support, seen, report = result["support"], result["seen"], result["report"]
    if support["default_user"] != 65534:
        pytest.skip(f"uid 65534 cannot run {INTERPRETER} here: {support['reasons']}")
    assert report["user"] == 65534 and report["account"] == "unprivileged account", report
    assert seen["ids"] == [[65534] * 3, [65534] * 3, []], seen
    # EROFS: the job's view is read-only outside its writable paths
    assert seen["read secret"] == 13 and seen["write outside"] == 30, seen
    assert seen["write scratch"] == "ok" and seen["scratch"] == ["0o700", 65534], seen
    assert seen["grandchild"] == ["65534", "65534"], seen  # its processes run as it does
    assert not outside.exists()
    assert sys.executable != INTERPRETER  # this suite's own jobs run as uid 0 without caps
