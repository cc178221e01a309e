"""A world-readable copy of what a host needs to run on another interpreter or account.

The suite's own interpreter lives under ``/root`` (mode 0700), so no account but root can run
it. A host run on Debian's world-readable ``/usr/bin/python3.11`` (as root, so its sandboxed
jobs can run as uid 65534; or as uid 65534 itself, a host that is not root) needs the engine's
dependencies and the tests' helper modules where every account can read them: ``World``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import cloudpickle
import psutil
import pytest

import zett_agent

INTERPRETER = "/usr/bin/python3.11"
#: the folder that holds ``zett_agent``
SRC = os.path.dirname(os.path.dirname(os.path.abspath(zett_agent.__file__)))


def world_readable(path: str) -> bool:
    """Whether every account can reach and read ``path`` (the mode bits of each component)."""
    current = "/"
    for part in Path(path).parts[1:]:
        current = os.path.join(current, part)
        mode = os.stat(current).st_mode
        if not mode & stat.S_IROTH or (stat.S_ISDIR(mode) and not mode & stat.S_IXOTH):
            return False
    return True


def unavailable() -> str | None:
    """Why a world-readable host cannot be run here, or ``None``."""
    if not os.path.exists(INTERPRETER):
        return f"no {INTERPRETER} here (a world-readable interpreter is needed)"
    if os.geteuid() != 0:
        return "the test process must be root to run hosts as other accounts"
    if not world_readable(INTERPRETER) or not world_readable(SRC):
        return f"{INTERPRETER} or {SRC} is not readable by every account"
    return None


class World:
    """A temporary world-readable folder: ``packages/`` (cloudpickle, psutil, ``modules``).

    ``path`` is the folder; ``remove()`` deletes it.
    """

    def __init__(self, modules: Iterable[str] = ()) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="zett-world-"))
        self.packages = self.path / "packages"
        self.packages.mkdir()
        for module in (cloudpickle, psutil):
            source = os.path.dirname(os.path.abspath(module.__file__ or ""))
            shutil.copytree(source, self.packages / os.path.basename(source))
        for module_path in modules:
            shutil.copy(module_path, self.packages)
        self.open_up()

    def open_up(self) -> None:
        """Make everything in the folder readable (and the folders enterable) by every account."""
        for root, dirs, files in os.walk(self.path):
            for name in (*dirs, *files, "."):
                os.chmod(os.path.join(root, name), 0o755)

    def remove(self) -> None:
        shutil.rmtree(self.path)


@contextlib.contextmanager
def host_world(script: str) -> Iterator[Path]:
    """A ``World`` whose ``host.py`` is ``script``, removed afterwards; skips where a
    world-readable host cannot run (``unavailable``)."""
    problem = unavailable()
    if problem is not None:
        pytest.skip(problem)
    made = World()
    try:
        (made.path / "host.py").write_text(script)
        made.open_up()
        yield made.path
    finally:
        made.remove()
