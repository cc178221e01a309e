"""A host under a child-subreaper harness, for the tests where the host of a pool dies.

``HARNESS`` starts the host script with its arguments, passes on the host's first line of
output, then reaps every orphan of the host's tree (they are reparented to it) and finally
prints one JSON line: ``after_host`` (seconds from the host's death to the last reap),
``host_status`` and ``reaped``. So "gone" is checked honestly: PID 1 on this machine never
reaps, and a zombie must not count as gone by accident.
"""

from __future__ import annotations

import select
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

HARNESS = textwrap.dedent(
    r"""
    import ctypes, json, os, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    read_end, write_end = os.pipe()
    host = os.posix_spawn(sys.executable, [sys.executable, *sys.argv[1:]], os.environ,
                          file_actions=[(os.POSIX_SPAWN_DUP2, write_end, 1)])
    os.close(write_end)
    with os.fdopen(read_end) as stream:
        sys.stdout.write(stream.readline())
        sys.stdout.flush()
    host_died = None
    reaped = []
    while True:  # every descendant of the host becomes our child once its parent dies
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid == host:
            host_died = time.monotonic()
            host_status = os.waitstatus_to_exitcode(status)
        else:
            reaped.append(pid)
    print(json.dumps({"after_host": time.monotonic() - host_died, "host_status": host_status,
                      "reaped": reaped}), flush=True)
    """
)


def read_line(stream: IO[str], timeout: float) -> str:
    """The next line of ``stream``; ``AssertionError`` if none starts within ``timeout`` s."""
    ready, _, _ = select.select([stream.fileno()], [], [], timeout)
    assert ready, "no output within the hang guard"
    return stream.readline()


@contextmanager
def harnessed_host(tmp_path: Path, host: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """Run the host script ``host`` with ``args`` under the harness (text pipes for stdout and
    stderr); on the way out the harness is killed and reaped and its pipes closed."""
    (tmp_path / "harness.py").write_text(HARNESS)
    (tmp_path / "host.py").write_text(host)
    harness = subprocess.Popen(
        [sys.executable, str(tmp_path / "harness.py"), str(tmp_path / "host.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert harness.stdout is not None and harness.stderr is not None
    try:
        yield harness
    finally:
        harness.kill()
        harness.wait()
        harness.stdout.close()
        harness.stderr.close()
