"""A task store's lock: one live host per store file, whatever path names the file.

``take_lock`` resolves the path (symlinks followed), opens the file itself (creating it if
missing) and takes an exclusive ``flock`` on it. The lock is the file's: the kernel keys it on
the file's identity (device and inode), so a symlink, a hard link or a bind mount of the
file meets the same lock, and drops it when its holder dies (even by SIGKILL). sqlite's own
locks on the file are POSIX record locks, which a ``flock`` does not touch (on a local file
system: a store needs one, as sqlite's WAL mode does).

A refused opener is told the holder's pid: the kernel's list of locks (``/proc/locks``)
names it, and a ``TaskStore`` of this very process is found in this process's own list of
held stores, without opening the file again (closing a second descriptor of the file would
drop sqlite's record locks). A file of more than one name (hard links) is refused too:
sqlite keeps its WAL beside the name it opened, so two names would split a store's journal.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading

from zett_agent.extensions._tasks._store_schema import TaskStoreError

__all__ = ["StoreLock", "take_lock"]

#: the stores this process holds: the file's (device, inode) -> (pid, the path it was opened by)
_HELD: dict[tuple[int, int], tuple[int, str]] = {}
_HELD_LOCK = threading.Lock()
#: sqlite's files beside a database
SIDE_FILES = ("-wal", "-shm", "-journal")


class StoreLock:
    """The held lock of one store file.

    Attributes:
        fd: The descriptor of the store file the ``flock`` is on.
        path: The path the store was opened by.
        real: The file's resolved path (what sqlite opens).
        identity: The file's (device, inode).
        created: Whether opening created the file.
    """

    def __init__(self, fd: int, path: str, real: str, identity: tuple[int, int], created: bool):
        self.fd = fd
        self.path = path
        self.real = real
        self.identity = identity
        self.created = created
        #: how messages name the store: its path, and the file it resolves to if another
        self.shown = _shown(path, real)
        self._released = False

    def same_file(self) -> bool:
        """Whether the resolved path still names the locked file (not one put in its place)."""
        try:
            st = os.stat(self.real)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.identity

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if self._released:
            return
        self._released = True
        with _HELD_LOCK:
            _HELD.pop(self.identity, None)
        os.close(self.fd)

    def abandon(self) -> None:
        """Release the lock of a store that failed to open; remove the file if opening made it.

        A file this opening created holds nothing of anyone's: it goes, with sqlite's files
        beside it, so a refused open leaves the directory as it found it.
        """
        if self._released:
            return
        if self.created and self.same_file():
            for name in (self.real, *(self.real + side for side in SIDE_FILES)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)
        self.release()


def take_lock(path: str) -> StoreLock:
    """Lock the store file ``path`` names (creating an empty one if it is missing).

    Raises:
        TaskStoreError: The path cannot be resolved (a symlink loop), names something that is
            not a regular file (a FIFO, a directory), cannot be opened, has more than one
            name, or the file is held: by another process (its pid named) or by another
            ``TaskStore`` of this one. Nothing is left open or created then.
    """
    real = _resolve(path)
    shown = _shown(path, real)
    with _HELD_LOCK:
        fd, created = _open(real, shown)
        try:
            st = os.fstat(fd)
            identity = (st.st_dev, st.st_ino)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise TaskStoreError(
                    f"task store {shown} is held by {_holder(identity)}: one store serves one "
                    "live host at a time. Stop that host (the lock goes with it), or give this "
                    "one a store file of its own"
                ) from None
            except OSError as exc:
                raise TaskStoreError(f"cannot lock task store {shown}: {exc.strerror}") from exc
            st = os.fstat(fd)
            if st.st_nlink != 1:
                raise TaskStoreError(_names_error(shown, st.st_nlink))
        except BaseException:
            os.close(fd)
            if created:
                with contextlib.suppress(OSError):
                    os.unlink(real)
            raise
        _HELD[identity] = (os.getpid(), path)
    return StoreLock(fd, path, real, identity, created)


def _shown(path: str, real: str) -> str:
    return path if real == path else f"{path} (the file {real})"


def _resolve(path: str) -> str:
    try:
        return os.path.realpath(path, strict=True)
    except FileNotFoundError:
        return os.path.realpath(path)  # a new store: created where a dangling symlink points
    except OSError as exc:
        raise TaskStoreError(
            f"cannot resolve task store {path}: {exc.strerror}; check its path (a symlink loop?)"
        ) from exc


def _open(real: str, shown: str) -> tuple[int, bool]:
    """A descriptor of the store file, and whether it was created; never of a non-file.

    A store held by this process is refused here, before a second descriptor of it exists.
    Called with ``_HELD_LOCK`` held.
    """
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    st = _lstat(real, shown)
    if st is None:
        try:
            return os.open(real, flags | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            st = _lstat(real, shown)  # another opener made it meanwhile: open it as theirs
        except OSError as exc:
            raise TaskStoreError(
                f"cannot create task store {shown}: {exc.strerror}; check that its directory "
                "exists and is writable"
            ) from exc
        if st is None:
            raise TaskStoreError(
                f"task store {shown} was made and removed while it was being opened; open it again"
            )
    if not stat.S_ISREG(st.st_mode):
        raise TaskStoreError(
            f"task store {shown} is not a regular file (it is {_kind(st.st_mode)}); it was "
            "left as it is. Choose another store path"
        )
    pid, opened_as = _HELD.get((st.st_dev, st.st_ino), (None, ""))
    if pid == os.getpid():
        raise TaskStoreError(
            f"task store {shown} is held by another TaskStore of this process (pid {pid}, "
            f"opened as {opened_as}; close it first): one store serves one live host at a time"
        )
    try:
        fd = os.open(real, flags)
    except OSError as exc:
        hint = "; check that it is writable" if exc.errno in (errno.EACCES, errno.EROFS) else ""
        raise TaskStoreError(f"cannot open task store {shown}: {exc.strerror}{hint}") from exc
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise TaskStoreError(
            f"task store {shown} was replaced while it was being opened; open it again"
        )
    return fd, False


def _lstat(real: str, shown: str) -> os.stat_result | None:
    try:
        return os.lstat(real)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TaskStoreError(f"cannot open task store {shown}: {exc.strerror}") from exc


def _holder(identity: tuple[int, int]) -> str:
    """Who holds the ``flock`` of the file ``identity``, as the kernel's list of locks says."""
    pid = _holder_pid(identity)
    if pid is None:
        return "another live host (its pid is not visible from here)"
    if pid == os.getpid():
        return f"another TaskStore of this process (pid {pid}; close it first)"
    return f"another live host (pid {pid})"


def _holder_pid(identity: tuple[int, int]) -> int | None:
    """The pid holding a ``flock`` on the file ``identity``, or ``None`` if none is seen.

    ``/proc/locks`` names each lock's file as ``MAJOR:MINOR:INODE`` (hex, hex, decimal) and
    its holder's pid as this process's pid namespace sees it (0 or -1 when it does not).
    """
    device, inode = identity
    name = f"{os.major(device):02x}:{os.minor(device):02x}:{inode}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            for line in locks:
                fields = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"; a waiter's line has "->"
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == name:
                    pid = int(fields[4])
                    return pid if pid > 0 else None
    except (OSError, ValueError):
        pass
    return None


def _names_error(shown: str, links: int) -> str:
    if links == 0:
        return f"task store {shown} was removed while it was being opened; open it again"
    return (
        f"task store {shown} has {links} names (hard links): sqlite keeps a store's journal "
        "beside the name it was opened by, so a store opened by two names can lose what one of "
        "them wrote. It was left as it is; remove its other names (`find / -samefile PATH` "
        "lists them), or copy it to a file of its own"
    )


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return kind
    return f"of mode {mode:o}"
