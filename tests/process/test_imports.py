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


#: what the launcher and its workers import, and which of the host's modules came with it
CHILD_SIDE = """
import sys
import zett_agent.process._child._launcher, zett_agent.process._child._worker
host = ("asyncio", "psutil", "concurrent.futures", "zett_agent.process._host._pool",
        "zett_agent.process._host._engine", "zett_agent.process._host._executor")
print(",".join(name for name in host if name in sys.modules))
"""


def test_the_child_side_imports_none_of_the_hosts_engine() -> None:
    """The launcher imports the workers' side only: ``zett_agent.process`` loads its public
    names on first access, so the pool's launcher starts without the host's engine (it booted
    in about 60 ms instead of 160 on the shared machine)."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD_SIDE], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"the child side imported {done.stdout.strip()}"


#: what a pool's launcher imports for child agents, and which modules of sandbox egress came
CHILD_RUNTIME = """
import importlib, sys
import cloudpickle, zett_agent.process._child._launcher, zett_agent.process._child._worker
from zett_agent.runners._preload import RUNTIME_MODULES
for name in RUNTIME_MODULES:
    importlib.import_module(name)
print(",".join(name for name in ("zett_agent.process._sandbox._egress",) if name in sys.modules))
"""


def test_the_child_runtime_imports_no_egress_rules() -> None:
    """A child unpickles a definition that may hold a ``Sandbox``, but builds no egress rules
    unless its definition holds an ``Egress`` (whose unpickling imports them): their module
    cost 2.4 ms of every pool's start."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD_RUNTIME],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"the child runtime imported {done.stdout.strip()}"


def test_the_public_names_still_load_on_first_access() -> None:
    import zett_agent.process as process
    from zett_agent.process._host._pool import ProcessPool

    assert process.ProcessPool is ProcessPool
    assert "ProcessPool" in dir(process)
