"""cgroup v2 plumbing: find a writable hierarchy, lay out a pool's cgroups, kill, clean up.

Layout, under the cgroup the host process runs in (so a pool started inside a worker, by a
nested child agent, nests inside that worker's cgroup)::

    <host's cgroup>/zett-agent/
        pool-<host pid>-<host start time>-<n>/
            launcher/          the pool's launcher process
            workers/
                w-<n>/         one worker and every process its job starts

A process cannot leave its cgroup without write access to another cgroup's ``cgroup.procs``
(root has it: see the README's threat model), and a fork lands in its parent's cgroup, so a
worker's cgroup holds its whole tree however it forks, double-forks or calls ``setsid``.
Writing ``1`` to ``cgroup.kill`` SIGKILLs every process in it, atomically against forks (Linux
5.14); ``cgroup.events`` reads ``populated 0`` once they all exited, and the kernel reports that
change to inotify watchers.

Imported by the launcher, so it imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import time
from collections.abc import Callable

from ._scan import start_time

__all__ = [
    "DIR_NAME",
    "JOB_MAX_DEPTH",
    "JOB_MAX_DESCENDANTS",
    "TREE_CONTROLLERS",
    "PoolCgroup",
    "bound",
    "cgroup_problem",
    "kill",
    "populated",
    "remove_tree",
    "write",
]

DIR_NAME = "zett-agent"
#: ProcessLimits fields that need a controller -> (controller, file written)
TREE_CONTROLLERS = {
    "max_processes": ("pids", "pids.max"),
    "tree_memory_bytes": ("memory", "memory.max"),
}
_WANTED = ("pids", "memory", "cpu")
#: what a job may build below its worker's cgroup (``cgroup.max.depth`` and
#: ``cgroup.max.descendants``, set before the worker runs anything): room for the pools of child
#: agents nested four levels deep (a nested pool takes four levels: ``zett-agent/pool/workers/w``)
#: and a few hundred of their workers, while a job that builds structure for the host to walk is
#: bounded (a ``mkdir`` beyond either limit fails with ``EAGAIN``)
JOB_MAX_DEPTH = 16
JOB_MAX_DESCENDANTS = 1024
_counter = itertools.count(1)


def write(path: str, data: str) -> None:
    """Write ``data`` to a cgroup file in one ``write`` (cgroupfs takes one value per write)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def read(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536).decode()
    finally:
        os.close(fd)


def bound(cgroup: str) -> None:
    """Bound the cgroups that may be created below ``cgroup`` (see ``JOB_MAX_DEPTH``)."""
    write(f"{cgroup}/cgroup.max.depth", str(JOB_MAX_DEPTH))
    write(f"{cgroup}/cgroup.max.descendants", str(JOB_MAX_DESCENDANTS))


def kill(cgroup: str) -> bool:
    """SIGKILL every process in ``cgroup`` and its descendant cgroups; False if it is gone.

    Gone: no such file, or (``ENODEV``) removed between the file's opening and the write.
    """
    try:
        write(f"{cgroup}/cgroup.kill", "1")
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENODEV):
            return False
        raise
    return True


def populated(cgroup: str) -> bool:
    """Whether any process is still in ``cgroup`` or below (False once it is gone)."""
    try:
        text = read(f"{cgroup}/cgroup.events")
    except FileNotFoundError:
        return False
    for line in text.splitlines():
        if line.startswith("populated "):
            return line != "populated 0"
    return False


def remove_tree(cgroup: str, stop: Callable[[], bool] | None = None) -> bool:
    """Remove ``cgroup`` and every cgroup below it, deepest first; True if it is gone.

    Only empty cgroups can be removed: kill first and wait for ``populated 0``. Iterative and
    relative to directory descriptors, so no structure a job built below its cgroup (of any
    depth, with names of any length) exhausts the stack or the path length; its cost grows with
    what the job made (call it off the event loop, see ``_janitor``), and ``stop``, looked at
    before every step, ends it early (False then). Interface files are left alone.
    """
    try:
        root = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    ok = True
    #: the directories open on the way down: (fd, names of its subdirectories not done yet)
    stack: list[tuple[int, list[str]]] = []
    try:
        stack.append((root, _subdirs(root)))
        while stack:
            if stop is not None and stop():
                return False
            fd, names = stack[-1]
            if not names:
                stack.pop()
                os.close(fd)
                if stack:  # its parent removes it
                    ok = _rmdir(stack[-1][0], stack[-1][1].pop()) and ok
                continue
            try:
                child = os.open(names[-1], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                names.pop()
                continue
            except OSError:  # out of descriptors on a structure deeper than allowed: leave it
                names.pop()
                ok = False
                continue
            stack.append((child, _subdirs(child)))
    finally:
        for fd, _names in stack:
            os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        try:
            os.rmdir(cgroup)
        except OSError:
            return False
    return ok


def _subdirs(fd: int) -> list[str]:
    try:
        with os.scandir(fd) as entries:
            return [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _rmdir(parent: int, name: str) -> bool:
    try:
        os.rmdir(name, dir_fd=parent)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def _v2_mount() -> str | None:
    """Where the cgroup v2 hierarchy is mounted (pure v2 or the hybrid ``unified`` mount)."""
    found: list[str] = []
    try:
        with open("/proc/self/mountinfo") as handle:
            for line in handle:
                before, _, after = line.partition(" - ")
                if after.split(" ", 1)[0] == "cgroup2":
                    found.append(before.split(" ")[4])
    except OSError:
        return None
    for preferred in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if preferred in found:
            return preferred
    return found[0] if found else None


def _own_cgroup() -> str | None:
    try:
        with open("/proc/self/cgroup") as handle:
            for line in handle:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        return None
    return None


def _start_time(pid: int) -> str | None:
    """``start_time(pid)`` as it stands in a pool's cgroup name (``None`` if it is gone)."""
    ticks = start_time(pid)
    return None if ticks is None else str(ticks)


def _base() -> tuple[str | None, str]:
    mount = _v2_mount()
    if mount is None:
        return (
            None,
            "no cgroup v2 hierarchy is mounted (pure at /sys/fs/cgroup or hybrid at "
            "/sys/fs/cgroup/unified)",
        )
    own = _own_cgroup()
    if own is None:
        return None, "this process is not in a cgroup v2 cgroup (/proc/self/cgroup has no 0:: line)"
    path = os.path.normpath(f"{mount}/{own.lstrip('/')}")
    if not os.path.isdir(path):
        return None, f"this process's cgroup {path} is not visible (another cgroup namespace?)"
    return path, ""


def cgroup_problem(*, keep: bool = False) -> str | None:
    """Why cgroup containment is not available here, in one line, or ``None`` if it is.

    The pools' shared cgroup is created to find out; unless ``keep``, it is removed again if
    this call created it (a look leaves nothing behind).

    Available means: a cgroup v2 hierarchy is mounted, the cgroup this process runs in lets it
    create cgroups (root, or a delegated subtree such as a systemd ``Delegate=yes`` scope), and
    the kernel has ``cgroup.kill`` (Linux 5.14).
    """
    host, reason = _base()
    if host is None:
        return reason
    base = f"{host}/{DIR_NAME}"
    created = not os.path.isdir(base)
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as exc:
        return (
            f"cannot create cgroups in {host} ({exc.strerror}); run as root or in a delegated "
            "cgroup"
        )
    try:
        if not os.path.exists(f"{base}/cgroup.kill"):
            return "this kernel has no cgroup.kill (Linux 5.14 or newer is needed)"
        if not os.access(f"{base}/cgroup.procs", os.W_OK):
            return f"cannot move processes into {base} (no write access to cgroup.procs)"
        return None
    finally:
        if created and not keep:
            # a pool starting meanwhile keeps it: a cgroup with cgroups inside stays
            with contextlib.suppress(OSError):
                os.rmdir(base)


class PoolCgroup:
    """The cgroups of one pool: created by ``create``, removed by ``remove``.

    Also removes, at creation, what pools whose host died left behind (``stale``): everything in
    those cgroups is killed first; the removal of the emptied cgroups happens later, off the
    event loop.
    """

    def __init__(
        self, path: str, controllers: frozenset[str], stale: list[str] | None = None
    ) -> None:
        self.path = path
        #: cgroups of dead hosts' pools, killed but not empty yet: ``remove_stale`` later
        self.stale = stale or []
        self.launcher = f"{path}/launcher"
        self.workers = f"{path}/workers"
        #: controllers enabled for the worker cgroups (``pids``, ``memory``, ``cpu``)
        self.controllers = controllers

    @classmethod
    def create(cls) -> PoolCgroup:
        """Detect, clean up stale pools, create this pool's cgroups.

        Raises ``OSError`` with the reason (``cgroup_problem``) when cgroups cannot be used.
        """
        problem = cgroup_problem(keep=True)
        host, _ = _base()
        if problem is not None or host is None:
            raise OSError(errno.EPERM, problem or "no cgroup v2")
        base = f"{host}/{DIR_NAME}"
        leftovers = remove_stale(base)
        controllers = _enable(base)
        me = os.getpid()
        path = f"{base}/pool-{me}-{_start_time(me)}-{next(_counter)}"
        # (the shared cgroup too, if another host's pool just removed it, empty, on closing)
        os.makedirs(path)
        try:
            os.mkdir(f"{path}/launcher")
            os.mkdir(f"{path}/workers")
            controllers = _enable(path, controllers)
            controllers = _enable(f"{path}/workers", controllers)
        except BaseException:
            remove_tree(path)
            raise
        return cls(path, controllers, leftovers)

    def touch(self) -> None:
        """Mark the pool alive: its host is about to (re)start a launcher (see ``stale``)."""
        with contextlib.suppress(OSError):
            os.utime(self.path)

    def remove(self, stop: Callable[[], bool] | None = None) -> bool:
        """Kill whatever is left in the pool's cgroups and remove them; True if all are gone.

        Processes killed here may take a moment to exit; a cgroup still populated is left for
        the next pool to remove (``remove_stale``). ``stop`` as for ``remove_tree``.
        """
        kill(self.path)
        gone = remove_tree(self.path, stop)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(self.path))  # the shared zett-agent cgroup, if now empty
        return gone


def _enable(cgroup: str, wanted: frozenset[str] | None = None) -> frozenset[str]:
    """Enable controllers for a cgroup's children.

    Enable for ``cgroup``'s children what it has of the wanted controllers (its
    ``cgroup.controllers`` says what its parent passes down); return what they will have.
    """
    child = cgroup
    try:
        available = set(read(f"{child}/cgroup.controllers").split())
    except OSError:
        return frozenset()
    names = [c for c in (_WANTED if wanted is None else wanted) if c in available]
    enabled = set()
    for name in names:
        try:
            write(f"{child}/cgroup.subtree_control", f"+{name}")
        except OSError:
            continue  # e.g. EBUSY: the cgroup holds processes of its own
        enabled.add(name)
    return frozenset(enabled)


#: a pool cgroup whose launcher cgroup is empty is left alone for this long after its host last
#: (re)started a launcher (``PoolCgroup.touch``): a pool between creating its cgroups and its
#: launcher moving in, or replacing a lost launcher, looks empty for a moment
STALE_AFTER = 30.0


def stale(path: str, now: float | None = None) -> bool:
    """Whether the pool cgroup ``path`` belongs to a pool whose host is gone.

    Judged by what holds whichever pid namespace that host runs in (a container sharing this
    cgroup hierarchy has pids we cannot see): its launcher's cgroup is empty (a launcher lives
    as long as its host, and exits once it killed everything after the host died) and its host
    has not touched it for ``STALE_AFTER`` seconds. A host pid that is visible and alive with
    the recorded start time also means alive; a pid lookup alone never means dead.
    """
    parts = os.path.basename(path).split("-")
    if len(parts) == 4 and parts[1].isdigit() and _start_time(int(parts[1])) == parts[2]:
        return False  # its host lives (in our pid namespace)
    try:
        touched = os.stat(path).st_mtime
    except OSError:
        return False  # gone meanwhile: nothing to do
    if (time.time() if now is None else now) - touched < STALE_AFTER:
        return False
    try:
        text = read(f"{path}/launcher/cgroup.events")
    except FileNotFoundError:
        text = "populated 0"  # never got its launcher cgroup, or it was removed already
    except OSError:
        return False
    return "populated 0" in text.splitlines()


def remove_stale(base: str) -> list[str]:
    """Kill what is left in the pool cgroups in ``base`` whose host is gone (``stale``).

    Return them, to be removed once their killed processes exited (off the event loop).
    """
    found: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return found
    now = time.time()
    for name in names:
        path = f"{base}/{name}"
        if name.startswith("pool-") and stale(path, now):
            kill(path)
            found.append(path)
    return found
