"""Scratch directories of sandboxed jobs: where they live, and removing them safely.

Each pool that runs a sandboxed job makes one base directory in the system's temporary
directory, ``zett-agent-sandbox-XXXXXXXX`` (mode 0711: an account can reach its own job's
directory inside, not list the others), holding a ``.lock`` file the pool keeps locked
(``flock``) for as long as it lives. Each job gets ``job-N`` inside, made by its worker (mode
0700, owned by the job's account) and removed by the host once the job's whole tree is dead.

A base whose lock anyone can take belongs to a pool that is gone (its host died without closing
it): the next pool to make a base removes it. The lock is on the file, not on a pid, so this
holds across pid namespaces that share the directory.

Removal runs in the pool's janitor thread (its cost is what the job wrote), never follows a
symlink the job planted (everything is opened relative to directory descriptors with
``O_NOFOLLOW``), does not recurse (any depth), and stops between steps when asked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Callable

__all__ = ["Base", "remove_tree", "stale_bases"]

PREFIX = "zett-agent-sandbox-"
_LOCK = ".lock"


class Base:
    """One pool's base directory (or, with another ``prefix``, any directory of one process's).

    ``close`` releases its lock (the directory is removed by the janitor with ``remove_tree``).
    ``mode`` is the directory's: 0711 lets each job's account reach its own directory inside.
    """

    def __init__(self, prefix: str = PREFIX, mode: int = 0o711) -> None:
        self.path = tempfile.mkdtemp(prefix=prefix)
        os.chmod(self.path, mode)
        # locked under another name, then renamed: a sweeping pool never finds a lock file
        # that exists but is not held yet
        staging = os.path.join(self.path, ".lock-new")
        self._fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        os.rename(staging, os.path.join(self.path, _LOCK))
        self._counter = 0

    def job_path(self) -> str:
        """A fresh path for a job's scratch directory (the worker makes it)."""
        self._counter += 1
        return os.path.join(self.path, f"job-{self._counter}")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def stale_bases(directory: str | None = None, prefix: str = PREFIX) -> list[str]:
    """Base directories in ``directory`` (default: the temporary directory) whose pool is gone.

    Their lock is not held. Only those owned by this process's user, named ``prefix...``.
    """
    directory = directory or tempfile.gettempdir()
    found = []
    try:
        names = [name for name in os.listdir(directory) if name.startswith(prefix)]
    except OSError:
        return []
    for name in names:
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            # O_NONBLOCK: a FIFO planted as the lock file must not hold the sweep in open()
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(os.path.join(path, _LOCK), flags)
        except OSError:
            continue  # no lock file (yet, or any more): not ours to judge
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue  # not a lock a pool made: not ours to judge
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: its pool lives
        finally:
            os.close(fd)
        found.append(path)
    return found


def _open_dir(name: str, parent: int | None) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)


def _entries(fd: int) -> list[tuple[str, bool]]:
    """``(name, is a directory)`` of everything in directory ``fd`` (symlinks are not)."""
    out = []
    with os.scandir(fd) as listing:
        for entry in listing:
            try:
                out.append((entry.name, entry.is_dir(follow_symlinks=False)))
            except OSError:
                out.append((entry.name, False))
    return out


def remove_tree(path: str, stop: Callable[[], bool] | None = None) -> bool:
    """Remove directory ``path`` and everything in it; True once it is gone.

    Never follows a symlink (one is removed as the link it is), never recurses, and keeps one
    directory open at a time whatever the depth (it climbs back with ``..``, checked against
    the device and inode it came from). A directory the job made unreadable (mode 000) is made
    readable first. ``stop``, looked at before each directory, ends it early (False).
    """
    parent_path, name = os.path.split(path.rstrip("/"))
    try:
        top = os.open(parent_path or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return _remove_below(top, name, stop)
    finally:
        os.close(top)


def _remove_below(top: int, name: str, stop: Callable[[], bool] | None) -> bool:
    # the way down: (device, inode) of each directory entered, its name in its parent, and the
    # names of its subdirectories still to remove (None until it was listed)
    trail: list[tuple[int, int, str, list[str] | None]] = []
    try:
        fd = _enter(top, name)
    except FileNotFoundError:
        return True
    except NotADirectoryError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=top)
        return True
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        trail.append((st.st_dev, st.st_ino, name, None))
        while True:
            if stop is not None and stop():
                return False
            dev, ino, current, pending = trail[-1]
            if pending is None:
                pending = []
                for entry, is_dir in _entries(fd):
                    if is_dir:
                        pending.append(entry)
                    else:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry, dir_fd=fd)
                trail[-1] = (dev, ino, current, pending)
            if pending:
                entry = pending.pop()
                try:
                    child = _enter(fd, entry)
                except FileNotFoundError:
                    continue
                except NotADirectoryError:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry, dir_fd=fd)
                    continue
                st = os.fstat(child)
                trail.append((st.st_dev, st.st_ino, entry, None))
                os.close(fd)
                fd = child
                continue
            # empty now: climb to its parent and remove it there
            trail.pop()
            if not trail:
                os.close(fd)
                fd = -1
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(current, dir_fd=top)
                return True
            up = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            st = os.fstat(up)
            if (st.st_dev, st.st_ino) != trail[-1][:2]:
                os.close(up)
                return False  # moved meanwhile: stop rather than remove anything elsewhere
            os.close(fd)
            fd = up
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(current, dir_fd=fd)
    except OSError:
        return False
    finally:
        if fd >= 0:
            os.close(fd)


def _enter(parent: int, name: str) -> int:
    """Open subdirectory ``name`` (never through a symlink), writable and listable for its owner.

    A job may have taken those bits away.
    """
    try:
        fd = _open_dir(name, parent)
    except PermissionError:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, name) from None
        os.chmod(name, 0o700, dir_fd=parent)  # a directory, checked just above
        fd = _open_dir(name, parent)
    try:
        if os.fstat(fd).st_mode & 0o700 != 0o700:
            os.fchmod(fd, 0o700)
    except OSError:
        pass  # not its owner: root removes it anyway
    return fd
