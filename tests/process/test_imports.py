"""Importing the engine has no side effect a host could trip on: it starts no process (a host
that reaps every child, or counts them, never sees one it did not start)."""

from __future__ import annotations

import subprocess
import sys

#: counts the SIGCHLD this process gets while it imports the engine (a child that ran and
#: ended sends one), and prints the count
PROBE = """
import signal
ended = []
signal.signal(signal.SIGCHLD, lambda *_: ended.append(1))
import zett_agent.process, zett_agent.process._child._launcher, zett_agent.process._child._worker
print(len(ended))
"""


def test_importing_the_engine_starts_no_process() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0", "the import started a process (and it ended)"
