"""One Ray child's processes, kept together on their node and killed together (node side).

Stdlib only, and no import from this package: this file also runs as a script, the task's
*sentinel* (``python -I -S _ray_contain.py sentinel TREE``), and is imported by Ray workers, by
the runner's per-node reaper actor and by the host.

A task's *tree* is the Ray worker process running the child plus every process the child
starts. Two modes, chosen on each node when the task starts (``enter``):

``cgroup`` (where a writable cgroup v2 hierarchy exists, Linux 5.14+): the worker moves itself
into a cgroup of its own, ``<worker's cgroup>/zett-agent-ray/task-<pid>-<start>-<token>``,
before the child runs. Every process forked from then on lands in it, however it forks,
double-forks or calls ``setsid``, and only a process allowed to write another cgroup's
``cgroup.procs`` (root, or the owner of a delegated subtree) can leave it. One write to
``cgroup.kill`` SIGKILLs all of it, atomically against forks; ``cgroup.events`` reads
``populated 0`` once all exited. The cgroup is a kernel object: anyone on the node can kill it
by its path, whoever else died, so no bookkeeping can go stale.

``scan`` (elsewhere): the worker is a child subreaper while the task runs, so orphans of the
child's processes are re-parented to it and stay in its tree. A kill stops (SIGSTOP) every
process of the tree found by walking ``/proc``, rescans until nothing new appears, then
SIGKILLs them all. Processes whose environment carries ``ZETT_RAY_TASK=<token>`` are killed
too: what a dead worker left behind (its orphans went to PID 1). A child that clears its
subreaper flag or its environment can escape this mode.

Killers, any of which suffices: the task itself when the child returns (``leave``); the host,
when it runs on the same machine (``kill``); the node's reaper actor (``kill``); and the
task's sentinel, a small process started outside the tree before the child runs, which waits
on the worker with a pidfd and kills the tree when the worker dies for any reason (a cancel, a
crash, the Ray driver's death, Ray's memory monitor). ``sweep`` removes the cgroups of dead
workers that nobody cleaned up (every killer was itself killed).
"""

from __future__ import annotations

import errno
import os
import select
import sys
import time

try:  # the C module: the same constants and functions, without signal.py's enum import
    import _signal as signal  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    import signal

# The sentinel imports this module, and its start delays the child's: only cheap stdlib
# modules at the top (not typing, contextlib, json, re, subprocess or ctypes; the worker's
# side imports what it needs where it needs it).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import Any

__all__ = [
    "DIR_NAME",
    "MARKER",
    "boot_id",
    "cgroup_problem",
    "crash_signal",
    "enter",
    "kill",
    "leave",
    "start_time",
    "sweep",
    "views",
    "wait_sentinels",
]

#: the directory, under the worker's own cgroup, that holds one cgroup per running task
DIR_NAME = "zett-agent-ray"
#: names the processes of one task in scan mode, inherited unless a process drops it
MARKER = "ZETT_RAY_TASK"
PR_SET_CHILD_SUBREAPER = 36
#: seconds ``enter`` waits for the sentinel to be armed (a Python start, on a loaded node)
SENTINEL_READY_TIMEOUT = 60.0


# -- small Linux helpers -----------------------------------------------------------------------


class _suppress:
    """``contextlib.suppress`` without importing contextlib (see the imports)."""

    def __init__(self, *errors: type[BaseException]) -> None:
        self.errors = errors

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, self.errors)


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot: with the pid, one process's identity
    that survives pid reuse. ``None`` if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


def boot_id() -> str:
    """This kernel's boot id: the same on every process of one machine, different elsewhere."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def views() -> list[str]:
    """What makes one process's paths and pids valid in another: the same kernel (boot id),
    the same pid namespace and the same mount namespace. Equal lists: equal views."""
    out = [boot_id()]
    for name in ("pid", "mnt"):
        try:
            out.append(os.readlink(f"/proc/self/ns/{name}"))
        except OSError:
            out.append("")
    return out


def _set_subreaper(on: bool) -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


def _pidfd(pid: int, start: int | None) -> int | None:
    """A pidfd of ``pid`` if it is still the process that started at ``start``."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    if start is not None and start_time(pid) != start:
        os.close(fd)
        return None
    return fd


def _readable(fd: int, timeout: float | None) -> bool:
    """Wait until ``fd`` is readable (a pidfd: its process exited), at most ``timeout`` s.

    ``poll``, not ``select``: a Ray driver may hold more than FD_SETSIZE descriptors.
    """
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    try:
        return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))
    except OSError:
        return False


def _wait_fds(fds: list[int], deadline: float) -> None:
    """Wait until every pidfd is readable (its process exited) or ``deadline`` passes."""
    for fd in fds:
        _readable(fd, max(0.0, deadline - time.monotonic()))


# -- cgroups -----------------------------------------------------------------------------------


def _write(path: str, data: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def _own_cgroup() -> str | None:
    """This process's cgroup v2 directory, or ``None``."""
    mount: str | None = None
    try:
        with open("/proc/self/mountinfo") as handle:
            mounts = []
            for line in handle:
                before, _, after = line.partition(" - ")
                if after.split(" ", 1)[0] == "cgroup2":
                    mounts.append(before.split(" ")[4])
        for preferred in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
            if preferred in mounts:
                mount = preferred
                break
        else:
            mount = mounts[0] if mounts else None
        with open("/proc/self/cgroup") as handle:
            own = next((line[3:].strip() for line in handle if line.startswith("0::")), None)
    except OSError:
        return None
    if mount is None or own is None:
        return None
    path = os.path.normpath(f"{mount}/{own.lstrip('/')}")
    return path if os.path.isdir(path) else None


def cgroup_problem() -> str | None:
    """Why this node cannot contain a task in a cgroup, in one line; ``None`` if it can."""
    own = _own_cgroup()
    if own is None:
        return "no cgroup v2 hierarchy is visible to this Ray worker"
    base = f"{own}/{DIR_NAME}"
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as exc:
        return f"cannot create cgroups in {own} ({exc.strerror})"
    if not os.path.exists(f"{base}/cgroup.kill"):  # (the root cgroup has none of its own)
        return "this kernel has no cgroup.kill (Linux 5.14 or newer is needed)"
    if not os.access(f"{base}/cgroup.procs", os.W_OK):
        return f"cannot move processes into {base}"
    return None


def _populated(cgroup: str) -> bool:
    try:
        with open(f"{cgroup}/cgroup.events") as handle:
            text = handle.read()
    except FileNotFoundError:
        return False
    return "populated 1" in text


def _wait_empty(cgroup: str, deadline: float) -> bool:
    """Wait until no process is left in ``cgroup``: the kernel flags ``cgroup.events`` to
    ``poll`` (POLLPRI) whenever its ``populated`` line changes."""
    try:
        fd = os.open(f"{cgroup}/cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLPRI | select.POLLERR)
        while True:
            os.lseek(fd, 0, os.SEEK_SET)
            if b"populated 1" not in os.read(fd, 4096):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller.poll(int(min(left, 0.5) * 1000) + 1)  # 0.5: should a change be missed
    except OSError:
        return not _populated(cgroup)
    finally:
        os.close(fd)


def _remove(cgroup: str, deadline: float) -> bool:
    """Remove an emptied cgroup (the kernel may take a moment after ``populated 0``)."""
    while True:
        try:
            os.rmdir(cgroup)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                return False
            time.sleep(0.005)


def _kill_cgroup(cgroup: str, deadline: float) -> bool:
    try:
        _write(f"{cgroup}/cgroup.kill", "1")
    except FileNotFoundError:
        return True  # removed: everything in it already died
    return _wait_empty(cgroup, deadline) and _remove(cgroup, deadline)


def sweep(base: str | None = None) -> list[str]:
    """Kill and remove the task cgroups whose worker is dead (nobody cleaned them up).

    A cgroup's name carries its worker's pid and start time; a live worker's cgroup is never
    touched. Returns the cgroups removed.
    """
    if base is None:
        own = _own_cgroup()
        if own is None:
            return []
        base = f"{own}/{DIR_NAME}"
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        parts = name.split("-")
        if len(parts) != 4 or parts[0] != "task" or not parts[1].isdigit():
            continue
        if str(start_time(int(parts[1]))) == parts[2]:
            continue
        if _kill_cgroup(f"{base}/{name}", time.monotonic() + 5):
            removed.append(name)
    return removed


# -- scan mode ---------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with _suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(k) for k in f.read().split())
    except OSError:
        pass
    return kids


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for kid in _children(todo.pop()):
            out.append(kid)
            todo.append(kid)
    return out


def _marked(token: str) -> list[int]:
    """Every process of this machine whose environment carries ``MARKER=token``."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with _suppress(OSError), open(f"/proc/{name}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.append(int(name))
    return found


def _kill_scan(
    root: int | None, *, include_root: bool, token: str, spare: set[int], deadline: float
) -> bool:
    """Freeze and SIGKILL ``root``'s descendants (and ``root`` if asked) and the processes
    marked with ``token``; wait until they all died. ``spare``: pids never touched.

    Every process found is stopped first and the tree scanned again until a scan finds
    nothing new: a stopped process cannot fork, and the children of a killed one go to
    ``root`` when it is a subreaper, so nothing escapes between scans.
    """
    me = os.getpid()
    seen: dict[int, int | None] = {}

    def take(pids: list[int]) -> bool:
        new = False
        for pid in pids:
            if pid == me or pid in seen or pid in spare:
                continue
            seen[pid] = _pidfd(pid, None)
            with _suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            new = True
        return new

    def below() -> list[int]:
        return [] if root is None else _descendants(root)

    if include_root and root is not None:
        take([root])
    while take(below() + _marked(token)):
        pass
    for pid in seen:
        with _suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    while take(below()):  # orphans of the killed, re-parented to the subreaper root
        for pid in seen:
            with _suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    fds = [fd for fd in seen.values() if fd is not None]
    try:
        _wait_fds(fds, deadline)
    finally:
        for fd in fds:
            os.close(fd)
    return all(start_time(pid) is None or _zombie(pid) for pid in seen)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return True
    return data[data.rindex(b")") + 2 : data.rindex(b")") + 3] in (b"Z", b"X")


# -- the task's side ---------------------------------------------------------------------------


def enter(token: str, mode: str = "auto") -> dict[str, Any]:
    """Contain the calling worker process before its child runs; return the tree's description.

    ``mode``: ``"auto"`` (cgroup where possible, else scan), ``"cgroup"`` (``OSError`` with
    the reason where not possible) or ``"scan"``. Starts the sentinel first, outside the tree.
    The description is JSON-compatible: it travels to the host and to the node's reaper.
    """
    me = os.getpid()
    me_start = start_time(me)
    tree: dict[str, Any] = {
        "pid": me,
        "start": me_start,
        "token": token,
        "mode": "scan",
        "cgroup": None,
        "home": None,
        "sentinel": None,
        "views": views(),
    }
    if mode != "scan":
        problem = cgroup_problem()
        if problem is None:
            home = _own_cgroup()
            assert home is not None
            base = f"{home}/{DIR_NAME}"
            sweep(base)
            cgroup = f"{base}/task-{me}-{me_start}-{token}"
            os.mkdir(cgroup)
            tree.update(mode="cgroup", cgroup=cgroup, home=home)
        elif mode == "cgroup":
            raise OSError(errno.EPERM, f"containment='cgroup' is not possible here: {problem}")
    # The sentinel starts before the worker enters the cgroup (it must stay outside), and
    # the child runs only once it is armed.
    try:
        tree["sentinel"] = _start_sentinel(tree)
    except BaseException:
        if tree["cgroup"] is not None:
            os.rmdir(tree["cgroup"])
        raise
    if tree["mode"] == "cgroup":
        try:
            _write(f"{tree['cgroup']}/cgroup.procs", str(me))
        except BaseException:
            _stop_sentinel(token)
            os.rmdir(tree["cgroup"])
            raise
    else:
        with open(_running_file(token), "w"):
            pass
        _set_subreaper(True)
        os.environ[MARKER] = token
    return tree


def _running_file(token: str) -> str:
    """Exists while a scan-mode task runs: a killer that froze the worker checks it, so a
    late kill never hits the next task of a reused worker."""
    folder = os.environ.get("TMPDIR") or "/tmp"
    return os.path.join(folder, f"zett-ray-{token}.running")


_SENTINELS: dict[str, subprocess.Popen[bytes]] = {}


def leave(tree: dict[str, Any], timeout: float = 10.0) -> bool:
    """After the child returned or raised: kill what it left, undo ``enter``; True if all died.

    The worker itself lives on (Ray may reuse it): in cgroup mode it moves back to its own
    cgroup first. The sentinel is told to stop first, then the leftovers are killed and the
    worker's dead children reaped.
    """
    deadline = time.monotonic() + timeout
    token = tree["token"]
    _stop_sentinel(token)
    if tree["mode"] == "cgroup":
        _write(f"{tree['home']}/cgroup.procs", str(os.getpid()))
        gone = _kill_cgroup(tree["cgroup"], deadline)
    else:
        gone = _kill_scan(
            os.getpid(), include_root=False, token=token, spare=set(), deadline=deadline
        )
        _set_subreaper(False)
        os.environ.pop(MARKER, None)
        with _suppress(OSError):
            os.unlink(_running_file(token))
    _reap()
    return gone


def _reap() -> None:
    """Collect the exit statuses of this worker's dead children."""
    for pid in _children(os.getpid()):
        if _zombie(pid):
            with _suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _start_sentinel(tree: dict[str, Any]) -> list[int | None]:
    """Start the task's sentinel and wait until its watcher holds a pidfd of this worker;
    return ``[pid, start time]`` of its first process. ``OSError`` if it does not arm."""
    import subprocess

    args = [tree["mode"], str(tree["pid"]), str(tree["start"]), tree["token"], tree["cgroup"] or ""]
    sentinel = subprocess.Popen(
        [sys.executable, "-I", "-S", os.path.abspath(__file__), "sentinel", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    _SENTINELS[tree["token"]] = sentinel
    assert sentinel.stdout is not None
    poller = select.poll()
    poller.register(sentinel.stdout.fileno(), select.POLLIN)
    ready = poller.poll(int(SENTINEL_READY_TIMEOUT * 1000)) and sentinel.stdout.readline()
    sentinel.stdout.close()
    if ready != b"ready\n":
        _stop_sentinel(tree["token"])
        raise OSError(
            errno.ETIMEDOUT,
            f"the task's sentinel did not start within {SENTINEL_READY_TIMEOUT:g} s "
            f"(answered {ready!r:.40}); the child was not run",
        )
    return [sentinel.pid, start_time(sentinel.pid)]


def _stop_sentinel(token: str) -> None:
    sentinel = _SENTINELS.pop(token, None)
    if sentinel is None:
        return
    try:
        assert sentinel.stdin is not None
        sentinel.stdin.write(b"done\n")
        sentinel.stdin.close()
    except (OSError, ValueError):
        sentinel.kill()  # the child closed our pipe: the sentinel cannot be told
    import subprocess

    try:
        sentinel.wait(timeout=5)
    except subprocess.TimeoutExpired:
        sentinel.kill()
        sentinel.wait()


# -- everyone's side ---------------------------------------------------------------------------


def kill(
    tree: dict[str, Any],
    timeout: float = 10.0,
    *,
    wait_sentinel: bool = True,
    worker_grace: float = 0.0,
    worker_ends: bool = False,
) -> bool:
    """Kill the whole tree (the worker included) and wait until it is gone; True if it is.

    Idempotent, and correct from any process of the tree's node that is not in the tree: the
    host (when on the same machine), the node's reaper, the sentinel. With ``wait_sentinel``,
    also waits for the task's sentinel to finish (it exits once the worker is dead), so that
    nothing of the task is left when this returns. ``worker_grace`` (cgroup mode): seconds to
    let the worker exit on its own first (Ray ends a force-cancelled worker itself, quietly;
    a worker we kill makes Ray log an unexpected death). ``worker_ends``: Ray ended the task
    without its report (a force cancel, a crash), so the worker process is dying whether or
    not it still counts as running the task: wait until it is gone too (scan mode lets a
    worker that no longer runs the task go, and Ray may report the end before it exited).
    """
    deadline = time.monotonic() + timeout
    if tree["mode"] == "cgroup":
        if worker_grace > 0:
            worker = _pidfd(tree["pid"], tree["start"])
            if worker is not None:
                try:
                    _readable(worker, min(worker_grace, max(0.0, deadline - time.monotonic())))
                finally:
                    os.close(worker)
        gone = _kill_cgroup(tree["cgroup"], deadline)
    else:
        alive = _stop_if_running(tree)
        spare = {tree["sentinel"][0]} if tree.get("sentinel") else set()
        gone = _kill_scan(
            tree["pid"] if alive else None,
            include_root=alive,
            token=tree["token"],
            spare=spare,
            deadline=deadline,
        )
    if worker_ends:
        worker = _pidfd(tree["pid"], tree["start"])
        if worker is not None:
            try:
                gone = _readable(worker, max(0.0, deadline - time.monotonic())) and gone
            finally:
                os.close(worker)
    if wait_sentinel and tree.get("sentinel"):
        pid, start = tree["sentinel"]
        fd = _pidfd(pid, start)
        if fd is not None:
            try:
                _wait_fds([fd], deadline)
            finally:
                os.close(fd)
    return gone


def _stop_if_running(tree: dict[str, Any]) -> bool:
    """Scan mode: stop the worker if it still runs this task (then the kill includes it).

    Stopped first, checked second: a stopped worker cannot finish the task meanwhile. A
    worker that finished the task (and may run another one now) is let go again.
    """
    pid, token = tree["pid"], tree["token"]
    fd = _pidfd(pid, tree["start"])
    if fd is None:
        return False
    try:
        os.kill(pid, signal.SIGSTOP)
        if os.path.exists(_running_file(token)):
            return True
        os.kill(pid, signal.SIGCONT)
        return False
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


def crash_signal(crash_file: str) -> str | None:
    """The fatal signal a crashed worker's faulthandler recorded in ``crash_file`` (and its
    ``.xcpu`` companion); removes both. ``None`` when nothing was recorded (SIGKILL,
    ``os._exit``)."""
    found = None
    for path in (crash_file + ".xcpu", crash_file):
        try:
            with open(path, errors="replace") as handle:
                text = handle.read(4096)
        except OSError:
            continue
        finally:
            with _suppress(OSError):
                os.unlink(path)
        if found is not None:
            continue
        if path.endswith(".xcpu"):
            found = "SIGXCPU" if text else None
            continue
        for line, name in FATAL_LINES.items():
            if f"Fatal Python error: {line}" in text:
                found = name
    return found


#: signal names by the line Python's faulthandler writes for them
FATAL_LINES = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}


def wait_sentinels(token: str, timeout: float = 10.0) -> bool:
    """Wait until no sentinel process of the task ``token`` runs on this node; True if none.

    For a task killed before its host learned its tree (a cancel right as it started): its
    sentinel, if ``enter`` got to start one, kills the tree once the worker is dead, then
    exits. Found by its command line, which names the token.
    """
    deadline = time.monotonic() + timeout
    needle = token.encode()
    fds: list[int] = []
    try:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    argv = handle.read().split(b"\0")
            except OSError:
                continue
            if len(argv) > 8 and argv[4] == b"sentinel" and argv[8] == needle:
                fd = _pidfd(int(entry), None)
                if fd is not None:
                    fds.append(fd)
        _wait_fds(fds, deadline)
        return all(_readable(fd, 0) for fd in fds)
    finally:
        for fd in fds:
            os.close(fd)


# -- the sentinel ------------------------------------------------------------------------------


def sentinel(tree: dict[str, Any]) -> None:
    """The sentinel: two processes, started by ``enter`` before the child runs, outside its tree.

    The first (the worker's direct child, which the worker reaps) forks the *watcher* and
    relays ``done`` from its stdin to it. Two, because Ray kills a worker's direct children
    when the worker exits on its own terms (its owner died, for example): the watcher, a
    grandchild, survives that. The watcher takes a pidfd of the worker, says ``ready`` on
    stdout, and waits: when the worker dies for any reason, it kills the tree. ``done`` means
    the task cleaned up itself. End of input alone proves nothing (the child may close
    descriptors; the first process may be killed): only the worker's pidfd decides.
    """
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    read, write = os.pipe()
    watcher = os.fork()
    if watcher == 0:
        os.close(write)
        try:
            _watch(tree, read)
        finally:
            os._exit(0)
    os.close(read)
    os.close(1)  # the watcher says ready
    watcher_fd = _pidfd(watcher, None)
    if watcher_fd is not None and _until_done(0, watcher_fd):
        with _suppress(OSError):
            os.write(write, b"done\n")
    os.close(write)
    os.waitpid(watcher, 0)


def _until_done(control: int, other: int) -> bool:
    """Wait for ``done`` on ``control`` (True) or for the pidfd ``other`` (False); end of
    ``control`` leaves only ``other`` to wait for."""
    poller = select.poll()
    poller.register(other, select.POLLIN)
    poller.register(control, select.POLLIN)
    buffered = b""
    while True:
        ready = {fd for fd, _ in poller.poll()}
        if other in ready:
            return False
        if control in ready:
            data = os.read(control, 64)
            buffered += data
            if b"done\n" in buffered:
                return True
            if not data:
                poller.unregister(control)


def _watch(tree: dict[str, Any], control: int) -> None:
    worker = _pidfd(tree["pid"], tree["start"])
    with _suppress(OSError):
        os.write(1, b"ready\n")
        os.close(1)
    if worker is not None and _until_done(control, worker):
        return
    kill(tree, timeout=30.0, wait_sentinel=False)


if __name__ == "__main__":
    if sys.argv[1:2] == ["sentinel"]:
        _mode, _pid, _start, _token, _cgroup = sys.argv[2:7]
        sentinel(
            {
                "mode": _mode,
                "pid": int(_pid),
                "start": int(_start),
                "token": _token,
                "cgroup": _cgroup or None,
                "sentinel": None,
            }
        )
