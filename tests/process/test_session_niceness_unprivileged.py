"""A niced pool of a host that is not root: its session gets the pool's niceness, even when the
kernel refuses it at first.

The kernel takes one change of an autogroup's niceness a tenth of a second from an account
without ``CAP_SYS_ADMIN``, machine-wide (``EAGAIN``); every change, root's too, starts that
tenth again. Here a helper of the test, as root in a session of its own, sets its own
session's niceness every millisecond: while it does, no unprivileged launcher can nice its
session. The host, Debian's world-readable interpreter run as uid 65534, starts a ``nice=5``
pool then; its job sees the session still at 0 (and, from Linux 6.12, the shortest scheduler
slice, which its worker asked for without privilege). Once the helper stopped, the launcher's
next try goes through and a second job sees 5.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from support.world import INTERPRETER, SRC, host_world
from zett_agent.process import _linux
from zett_agent.process._sandbox import _caps

GUARD = 60
#: Linux 6.12's scheduler takes a slice a task asks for (``sched_attr.sched_runtime``)
_CUSTOM_SLICES = tuple(int(part) for part in os.uname().release.split(".")[:2]) >= (6, 12)

HOST = textwrap.dedent(
    r"""
    import os, sys
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [os.path.join(here, "packages"), sys.argv[1]]
    import asyncio, json, time
    from zett_agent.process import ProcessPool, _linux

    def session_niceness():
        with open("/proc/self/autogroup") as file:
            return int(file.read().split()[2])  # "/autogroup-123 nice 5"

    def session_niceness_once_it_is(wanted):
        # nothing tells a process its autogroup changed: look until it did (or the guard)
        deadline = time.monotonic() + 30
        while session_niceness() != wanted and time.monotonic() < deadline:
            time.sleep(0.01)
        return session_niceness()

    async def main():
        async with ProcessPool(1, nice=5) as pool:
            niceness = await pool.submit(session_niceness)
            slice_ns = await pool.submit(_linux.requested_slice)
            print(json.dumps([os.getuid(), niceness, slice_ns]), flush=True)
            sys.stdin.readline()  # the test's helper let go of the kernel's rate limit
            print(json.dumps(await pool.submit(session_niceness_once_it_is, 5)), flush=True)

    asyncio.run(main())
    """
)

#: sets its own session's niceness, every millisecond, until its stdin closes; at -20 (root
#: may), so that a loaded machine does not keep it from a CPU for the tenth of a second
HOLDER = textwrap.dedent(
    r"""
    import os, select, sys
    os.nice(-20)
    fd = os.open("/proc/self/autogroup", os.O_WRONLY)
    os.write(fd, b"-20")
    print("holding", flush=True)
    while not select.select([sys.stdin], [], [], 0.001)[0]:
        os.write(fd, b"-20")
    """
)


#: not among the engine's own constants (it never needs it)
_CAP_SYS_NICE = 23


@pytest.fixture
def world() -> Iterator[Path]:
    if not os.path.exists("/proc/self/autogroup"):
        pytest.skip("a kernel without scheduler autogroups")
    if not (_caps.has(_caps.CAP_SYS_ADMIN) and _caps.has(_CAP_SYS_NICE)):
        # the helper must change its autogroup every millisecond (only CAP_SYS_ADMIN may) at
        # a negative niceness (CAP_SYS_NICE)
        pytest.skip("the test process lacks CAP_SYS_ADMIN or CAP_SYS_NICE to hold the limit")
    with host_world(HOST) as path:
        yield path


def _line(stream: object) -> str:
    line = stream.readline()  # type: ignore[attr-defined]
    assert line, "the process ended early"
    return str(line)


def _killed(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.mark.slow
def test_an_unprivileged_pool_gets_its_niceness_once_the_kernel_lets_it(world: Path) -> None:
    before_processes = set(psutil.Process().children(recursive=True))
    with contextlib.ExitStack() as stack:
        holder = stack.enter_context(
            subprocess.Popen(
                [sys.executable, "-c", HOLDER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,  # its own autogroup: nobody else's niceness changes
            )
        )
        stack.callback(_killed, holder)
        assert _line(holder.stdout) == "holding\n"
        host = stack.enter_context(
            subprocess.Popen(
                [INTERPRETER, "-I", str(world / "host.py"), SRC],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd="/",
                user=65534,
                group=65534,
                extra_groups=[],
            )
        )
        stack.callback(_killed, host)
        uid, held, slice_ns = json.loads(_line(host.stdout))
        assert uid == 65534
        if _CUSTOM_SLICES:  # asked for without privilege, as root's workers do
            assert slice_ns == _linux.SHORT_SLICE_NS
        assert held == 0  # refused for now: the helper keeps the kernel's tenth going
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(GUARD) == 0
        assert host.stdin is not None
        host.stdin.write("go\n")
        host.stdin.flush()
        assert json.loads(_line(host.stdout)) == 5  # the launcher asked again, and got it
        _, err = host.communicate(timeout=GUARD)
        assert host.returncode == 0, err
    assert set(psutil.Process().children(recursive=True)) <= before_processes
