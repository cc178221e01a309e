"""Finding and killing a process tree without cgroups: freeze, enumerate, kill, confirm.

A tree can change while it is being looked at, so it is frozen first: every member found gets
``SIGSTOP``. A stopped process can neither fork nor reap, so its children stay listed under it
(alive or as zombies) and their pids cannot be reused. Each round lists the children of *every*
stopped member again (an orphan that was reparented to a stopped subreaper of the tree shows up
there) and stops the new ones; the rounds go on, however long the tree keeps forking, until
*two rounds in a row* find nothing new. Then everything gets ``SIGKILL``.

Why two: a round's lists are read one after the other, not at one instant. A member caught
while it exits (a pid-hopping process: fork a successor, exit) has ``SIGSTOP`` pending but dies
anyway, and its live child is reparented to the subreaper after the subreaper's list was read
and before the dying member's was: that round sees it nowhere. Every such move happens before
the round ends, so a second round over the same stopped set, every list read after it, finds
the child under the subreaper. A round that found something, even a pid gone before it could be
stopped, counts as finding something.

And a round counts as quiet only if, before its first list was read, every thread of every
member was seen stopped (or traced, or dead). ``SIGSTOP`` stops no fork already under way: a
member still running when its list is read (one slow to get a CPU on a loaded machine, one
inside ``fork``, one that another member resumed with ``SIGCONT``) can add a child after it.
Such a member gets ``SIGSTOP`` again in the next round, and the rounds go on. A member that
cannot act on it (a thread in uninterruptible sleep: a ``vfork`` parent, a dead file server)
cannot fork either while it sleeps; the rounds wait for it at most ``_SETTLE_WAIT`` after the
last round that found a new member (a large tree on a loaded machine may take longer than that
to find), so no tree can keep the kill from ending.

Children are read from ``/proc/PID/task/TID/children`` (every thread's list); on kernels built
without it, from one scan of all of ``/proc`` per round.

Imported by the launcher (its orphan sweep and shutdown) and by the host's kill thread; it
imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Iterable

__all__ = [
    "children",
    "freeze_and_kill",
    "scan",
    "signal_tree",
    "start_time",
    "state",
    "wait_dead",
]

#: process states in which a process can no longer fork: stopped, traced, zombie, dead
_FROZEN = frozenset("TtZXx")
#: how long to wait for one process to act on SIGSTOP before looking at its children anyway (a
#: process in uninterruptible sleep stops when it wakes; it cannot fork before that)
_STOP_WAIT = 0.05
#: how long the rounds wait, after the last one that found a new member, for every member to
#: be seen stopped (see the docstring)
_SETTLE_WAIT = 2.0
#: how long to wait for killed processes to exit before giving up on confirming it (a process
#: stuck in the kernel, e.g. on a dead NFS server, dies when the kernel lets it)
_DEATH_WAIT = 5.0

_HAVE_CHILDREN_FILE = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 20)
    except OSError:
        return None
    finally:
        os.close(fd)


def state(pid: int) -> tuple[int, str] | None:
    """``(ppid, state letter)`` of ``pid``, or ``None`` if there is no such process."""
    data = _read(f"/proc/{pid}/stat")
    if not data:
        return None
    # the command name is in parentheses and may contain spaces or parentheses
    rest = data[data.rfind(b")") + 2 :].split(b" ", 2)
    if len(rest) < 2:
        return None
    return int(rest[1]), rest[0].decode("ascii", "replace")


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or ``None`` if there is no such process.

    Field 22 of ``/proc/PID/stat``: with the pid, an identity that survives pid reuse.
    """
    data = _read(f"/proc/{pid}/stat")
    if not data:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


def scan() -> dict[int, tuple[int, str]]:
    """Return ``{pid: (ppid, state)}`` for every process visible in ``/proc``."""
    out: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (found := state(int(name))) is not None:
            out[int(name)] = found
    return out


def children(pid: int, procs: dict[int, tuple[int, str]] | None = None) -> set[int]:
    """The children of ``pid`` (from every thread's ``children`` list, or from ``procs``)."""
    if procs is None and _HAVE_CHILDREN_FILE:
        out: set[int] = set()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return out
        for tid in tids:
            data = _read(f"/proc/{pid}/task/{tid}/children")
            if data:
                out.update(int(child) for child in data.split())
        return out
    if procs is None:
        procs = scan()
    return {child for child, (ppid, _state) in procs.items() if ppid == pid}


def _send(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def signal_tree(roots: Iterable[int], signum: int) -> set[int]:
    """Send ``signum`` to ``roots`` and the descendants found then; return who got it.

    Not atomic against forks (use ``freeze_and_kill`` for that): meant for the courtesy SIGTERM
    before a kill.
    """
    done: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in done or not _send(pid, signum):
            continue
        done.add(pid)
        todo.extend(children(pid))
    return done


def _running(pids: Iterable[int]) -> set[int]:
    """The ``pids`` some thread of which is neither stopped, traced nor dead (it may fork).

    Every thread is looked at, not the leader alone: a group stop shows in the leader's state
    before its last thread has stopped, and a leader that exited leaves its threads running.
    """
    out: set[int] = set()
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone: it forks no more
        for tid in tids:
            data = _read(f"/proc/{pid}/task/{tid}/stat")
            if not data:
                continue  # that thread is gone
            at = data.rfind(b")") + 2  # the state letter follows the command name
            if data[at : at + 1].decode("ascii", "replace") not in _FROZEN:
                out.add(pid)
                break
    return out


def _await_stopped(pids: Iterable[int]) -> None:
    """Wait until ``pids`` acted on their ``SIGSTOP``, at most ``_STOP_WAIT`` for all together.

    One wait for the round, not one per process: a round of thousands of new members, each
    waiting for a CPU, would otherwise take minutes (a tree growing on a loaded machine).
    """
    deadline = time.monotonic() + _STOP_WAIT
    pending = list(pids)
    while pending:
        pending = [
            pid for pid in pending if (found := state(pid)) is not None and found[1] not in _FROZEN
        ]
        if not pending or time.monotonic() > deadline:
            return
        # the targets need a CPU to act on SIGSTOP and may be queued behind us: sleep
        # (sched_yield does not reliably hand the CPU over)
        time.sleep(0.0001)


def freeze_and_kill(
    roots: Iterable[int], *, exclude: Iterable[int] = (), pidfds: dict[int, int] | None = None
) -> set[int]:
    """Stop ``roots`` and all their descendants until no new one appears, then SIGKILL them.

    ``exclude`` are pids never touched (a launcher sweeping its orphans excludes its live
    workers). ``pidfds`` maps roots to pidfds the caller holds: those roots are signalled
    through them, so a root that exited and whose pid was reused is never hit (descendants
    need none: they are found under a stopped parent, which cannot reap them, so their pids
    cannot be reused meanwhile). Returns every pid that was killed; their parents or
    subreapers reap them, and ``wait_dead`` waits until they exited. Each round lists the
    children of every stopped process (so orphans reparented inside the tree are found); the
    rounds end when two in a row find nothing new (see the module's docstring), however fast
    the tree forks, and only once every member was seen stopped before the lists were read
    (at most ``_SETTLE_WAIT`` after the last new member is spent waiting for that). Blocks
    the calling thread for about one round per level the tree grows while it is being frozen,
    plus one.
    """
    skip = set(exclude)
    stopped: set[int] = set()
    frontier = {pid for pid in roots if pid not in skip}
    procs: dict[int, tuple[int, str]] | None = None
    through = pidfds or {}
    running: set[int] = set()  # members seen running in the last round
    settle_by = time.monotonic() + _SETTLE_WAIT
    quiet = 0  # rounds in a row that found nothing new, every member seen stopped first
    while quiet < 2:
        newly = {pid for pid in frontier if _signal(pid, signal.SIGSTOP, through)}
        for pid in running:
            _signal(pid, signal.SIGSTOP, through)  # resumed by a member, or slow to stop
        stopped |= newly
        _await_stopped(newly | running)
        # seen stopped before any list is read: from then on none of them adds a child
        running = _running(stopped)
        if not _HAVE_CHILDREN_FILE:
            procs = scan()
        found: set[int] = set()
        for pid in stopped:
            found |= children(pid, procs)
        frontier = found - stopped - skip
        if frontier:  # the tree is still being found: the wait for the last ones starts later
            settle_by = time.monotonic() + _SETTLE_WAIT
        settled = not running or time.monotonic() > settle_by
        quiet = quiet + 1 if settled and not frontier else 0
    for pid in stopped:
        _signal(pid, signal.SIGKILL, through)
    return stopped


def _signal(pid: int, signum: int, pidfds: dict[int, int]) -> bool:
    fd = pidfds.get(pid)
    if fd is None:
        return _send(pid, signum)
    try:
        signal.pidfd_send_signal(fd, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def wait_dead(pids: Iterable[int], timeout: float = _DEATH_WAIT) -> bool:
    """Block until every pid in ``pids`` has exited (is a zombie or gone); True if all did.

    Waits on pidfds (readable once the process exited); a pid whose pidfd cannot be opened has
    already been reaped.
    """
    fds: list[int] = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                continue
            except OSError:  # out of descriptors: fall back to looking at /proc
                return _wait_dead_slowly(pids, timeout)
        deadline = time.monotonic() + timeout
        pending = set(fds)
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for fd, _events in poller.poll(left * 1000):
                pending.discard(fd)
                poller.unregister(fd)
        return True
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _wait_dead_slowly(pids: Iterable[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    for pid in pids:
        while (found := state(pid)) is not None and found[1] not in "ZXx":
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
    return True
