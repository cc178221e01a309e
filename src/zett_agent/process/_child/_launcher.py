"""The launcher: one small process per pool that forks workers and reaps every descendant.

Started by the pool with ``posix_spawn`` (never ``multiprocessing``; it never imports the host's
``__main__``). It imports the pool's preload modules once, so every worker it forks starts
warm. It is a child subreaper, so orphans of every worker land on it and are reaped here.
A pool may instead get it forked by a zygote (``_zygote``) that imported the same modules once
for the pools of many hosts on the machine (``serve_forked``).

It is started in a session of its own (``setsid``), the pool's: each worker makes a process
group of its own in it. No terminal's signals reach them, and the scheduler's autogroups weigh
the whole pool as one session at the pool's niceness against its host, not as one session per
worker (with 1,000 children, that was the host's event loop waiting behind 1,000 sessions).

It is not trusted with a job's fate: a job can stop or kill it (it is the worker's parent).
The host kills trees itself (through the cgroup, or a /proc freeze from its own thread),
watches each worker through a pidfd, expects an answer to every request within a deadline,
and replaces a launcher that died or stopped answering.

Control protocol (one ``SOCK_SEQPACKET`` socket, one JSON object per record):

host -> launcher
    ``{"op": "spawn", "n": N, "seq": S, "confine": B, "loop": L, "prepare": P}``  fork N
                                          workers (B: they prepare for confining while idle,
                                          from then on; L: they run an empty event loop while
                                          idle; P, when given: the shared part of the policy
                                          of the jobs they prepare for, from then on)
    ``{"op": "sweep", "seq": S}``          (scan containment) kill orphans now
    ``{"op": "ping", "seq": S}``           just answer
    ``{"op": "shutdown"}``                 kill everything, reap it, exit
launcher -> host
    ``{"op": "hello", "pid": ..., "landlock": {...}}`` or ``{"op": "hello", "error": ...}``;
    ``landlock`` says what every worker gets: ``kernel_abi``, ``abi`` (the one used: lower when
    the pool pretends an older kernel), ``scoped`` (each worker enters a Landlock domain of
    its own that scopes signals and abstract UNIX sockets) and ``reason`` when it does not
    ``{"op": "ok", "seq": S}``             request S was taken (sweep: done)
    ``{"op": "worker", "pid": P, "cg": NAME}`` with the host end of P's socket and a pidfd of
    P attached (SCM_RIGHTS)
    ``{"op": "spawn_failed", "error": ...}``
    ``{"op": "exit", "pid": P, "code": .., "signal": .., "cpu": .., "maxrss": ..}`` once P is
    reaped (scan containment: and the orphans it left are killed and dead)

When the host goes away (EOF on the control socket, or SIGTERM from ``PR_SET_PDEATHSIG``; a
launcher a zygote forked watches a pidfd of its host instead, see ``serve_forked``) the
launcher kills every worker tree, reaps everything it can and exits.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

from .. import _linux
from .._containment import _cgroup, _scan
from .._sandbox import _landlock
from .._wire._protocol import CONTROL_FD

__all__ = ["main"]

#: longest time the launcher spends killing and reaping at shutdown
_SHUTDOWN_LIMIT = 5.0

#: how often the launcher moves itself into its own cgroup again while it starts (``_Move``)
_KEEP_MOVING = 0.01


#: how soon to ask again when the kernel refused the session's niceness for now (it takes one
#: change a tenth of a second from an unprivileged account)
_SESSION_NICE_RETRY = 0.1


def _noop(signum: int, frame: object) -> None:
    pass


class _Launcher:
    def __init__(
        self,
        ctrl: socket.socket,
        max_frame_bytes: int,
        cgroups: dict[str, str],
        nice: int = 0,
        scoping: dict[str, Any] | None = None,
    ) -> None:
        self.ctrl = ctrl
        #: what the workers get (see the module docstring's ``hello``)
        self.scoping = scoping or {"kernel_abi": 0, "abi": 0, "scoped": False, "reason": None}
        #: the Landlock ABI each worker scopes itself with (0: none)
        self.scope = int(self.scoping["abi"]) if self.scoping["scoped"] else 0
        self.max_frame_bytes = max_frame_bytes
        #: added to each worker's niceness as it is forked, before it can get a job
        self.nice = nice
        #: the pool's cgroup paths under cgroup containment (``launcher``, ``workers``, ``pool``,
        #: ``home``: the host's own cgroup), empty under scan containment
        self.cgroups = cgroups
        self.workers_cg = cgroups.get("workers")
        self.pid = os.getpid()
        #: workers forked and not yet reaped -> their cgroup name
        self.workers: dict[int, str] = {}
        #: cgroups of workers that never reached the host, to remove once empty (the host
        #: removes the others: it watches them, and a removal would hide their last change)
        self.stale_cgroups: set[str] = set()
        self.stopping = False
        #: the host asked for the shutdown (it removes the cgroups), or went away (we do)
        self.host_gone = True
        #: workers the host asked for and not forked yet (one per loop turn)
        self.to_spawn = 0
        #: whether new workers prepare for confining while idle (the pool sandboxes jobs)
        self.confine = False
        #: the shared part of a sandboxed job's policy the spares prepare for ("": none yet)
        self.prepare = ""
        #: whether workers forked from now on run an empty event loop while they wait
        self.loop = False
        self.counter = 0
        #: when to ask again for the pool's niceness on its session (the kernel said: later),
        #: or ``None`` once it is done
        self.session_nice_at: float | None = None
        self._nice_session()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.selector = selectors.DefaultSelector()
        #: a pidfd of the host when it is not this process's parent (a zygote forked this
        #: launcher: ``serve_forked``), else -1 (its death is the parent-death signal)
        self.host_pidfd = -1

    # -- plumbing ---------------------------------------------------------------------------

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        data = json.dumps(message).encode()
        while True:
            try:
                if fds:
                    socket.send_fds(self.ctrl, [data], fds)
                else:
                    self.ctrl.send(data)
                return
            except BlockingIOError:
                select.select([], [self.ctrl], [], 1.0)
            except OSError:
                # the host is gone; shutting down is all that is left to do
                self.stopping = True
                return

    def _nice_session(self) -> None:
        """Give the pool's session its niceness, or say when to ask again."""
        done = _linux.nice_own_session(self.nice)
        self.session_nice_at = None if done else time.monotonic() + _SESSION_NICE_RETRY

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.stopping = True

    # -- main loop --------------------------------------------------------------------------

    def run(self) -> None:
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, _noop)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGHUP, self._on_sigterm)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.ctrl.setblocking(False)
        self.selector.register(self.ctrl, selectors.EVENT_READ, "ctrl")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        if self.host_pidfd >= 0:
            self.selector.register(self.host_pidfd, selectors.EVENT_READ, "host")
        self.send({"op": "hello", "pid": self.pid, "landlock": self.scoping})
        while not self.stopping:
            # forks wait behind everything else: a request must not queue behind a batch
            # of them; leftover cgroups are looked at again twice a second while any exist
            timeout = 0 if self.to_spawn else (0.5 if self.stale_cgroups else None)
            if self.session_nice_at is not None:
                wait = max(0.0, self.session_nice_at - time.monotonic())
                timeout = wait if timeout is None else min(timeout, wait)
            for key, _ in self.selector.select(timeout):
                if key.data == "ctrl":
                    self._read_control()
                elif key.data == "host":
                    self.stopping = True  # the host is gone (its pidfd is readable)
                else:
                    self._drain_wakeups()
            self._reap()
            if self.session_nice_at is not None and time.monotonic() >= self.session_nice_at:
                self._nice_session()
            if self.to_spawn and not self.stopping:
                self.to_spawn -= 1
                self._fork_worker()
        self.shutdown()

    def _drain_wakeups(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_r, 4096):
                pass

    def _read_control(self) -> None:
        while not self.stopping:
            try:
                data = self.ctrl.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.stopping = True
                return
            message = json.loads(data)
            op = message.get("op")
            if op == "spawn":
                self.to_spawn += int(message["n"])
                self.confine = self.confine or message.get("confine") is True
                prepare = message.get("prepare")
                if isinstance(prepare, str):
                    self.prepare = prepare
                self.loop = self.loop or message.get("loop") is True
            elif op == "sweep":
                self._reap()
                self._sweep()
            elif op == "shutdown":
                self.stopping = True
                self.host_gone = False
            if "seq" in message:  # a spawn is answered by its workers, the rest by "ok"
                self.send({"op": "ok", "seq": message["seq"]})

    # -- workers ----------------------------------------------------------------------------

    def _fork_worker(self) -> None:
        self.counter += 1
        name = f"w-{self.counter}"
        cgroup = f"{self.workers_cg}/{name}" if self.workers_cg else None
        try:
            if cgroup is not None:
                os.mkdir(cgroup)
                # before the worker exists: what its job may build below it is bounded
                _cgroup.bound(cgroup)
            host_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:
            if cgroup is not None:
                with contextlib.suppress(OSError):
                    os.rmdir(cgroup)
            self.send({"op": "spawn_failed", "error": f"could not prepare a worker: {exc}"})
            return
        try:
            pid = os.fork()
        except OSError as exc:
            host_end.close()
            worker_end.close()
            if cgroup is not None:
                _cgroup.remove_tree(cgroup)
            self.send({"op": "spawn_failed", "error": f"fork failed: {exc}"})
            return
        if pid == 0:
            code = 70
            try:
                host_end.close()
                self._forget_in_child()
                from . import _worker

                # under cgroup containment a worker whose launcher dies may die at once (its
                # cgroup holds its tree); otherwise it stops, and the host kills its tree whole
                pdeath = signal.SIGKILL if self.workers_cg else signal.SIGSTOP
                _worker.serve(
                    worker_end,
                    self.pid,
                    self.max_frame_bytes,
                    pdeath,
                    self.scope,
                    self.confine,
                    self.loop,
                    self.prepare,
                )
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        worker_end.close()
        self.workers[pid] = name
        try:
            if cgroup is not None:
                # before anyone can give it a job: from here on, all it starts stays inside
                _cgroup.write(f"{cgroup}/cgroup.procs", str(pid))
            self._schedule(pid)
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            host_end.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if cgroup is not None:
                self.stale_cgroups.add(cgroup)
            self.send({"op": "spawn_failed", "error": f"could not contain a worker: {exc}"})
            return
        try:
            self.send({"op": "worker", "pid": pid, "cg": name}, [host_end.fileno(), pidfd])
        finally:
            host_end.close()
            os.close(pidfd)

    def worker_nice(self) -> int:
        """A worker's niceness: the pool's ``nice`` on top of the launcher's."""
        own = os.getpriority(os.PRIO_PROCESS, 0)
        return min(19, own + self.nice) if self.nice else own

    def _schedule(self, pid: int) -> None:
        """The worker's niceness, set from here before the host can give it a job.

        Its slice it asks for itself, at its first job (``_worker.slice_request``): a spare
        asking for the shortest while idle would preempt the host when the host wakes it with
        a job. Setting the niceness in the worker would write to pages it shares with the
        launcher.
        """
        if self.nice:
            os.setpriority(os.PRIO_PROCESS, pid, self.worker_nice())

    def _forget_in_child(self) -> None:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # its descriptor only: the selector's own state is the launcher's, and clearing it
        # would copy the pages that hold it
        os.close(self.selector.fileno())
        os.close(self.wake_r)
        os.close(self.wake_w)
        if self.host_pidfd >= 0:
            os.close(self.host_pidfd)
        self.ctrl.close()

    def _reap(self) -> None:
        reports = []
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            name = self.workers.pop(pid, None)
            if name is None:
                continue  # an orphan of some worker's tree
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
            signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            reports.append(
                {
                    "op": "exit",
                    "pid": pid,
                    "code": code,
                    "signal": signum,
                    "cpu": usage.ru_utime + usage.ru_stime,
                    "maxrss": usage.ru_maxrss * 1024,
                }
            )
        if reports and self.workers_cg is None:
            # whatever its exit status says, a worker may have left processes behind
            self._sweep()
        for report in reports:
            self.send(report)
        self._remove_cgroups()

    def _sweep(self) -> None:
        """Scan containment: kill every child that is not a live worker, until none is left.

        Such a child is an orphan of a worker's tree (reparented here because the worker died,
        or because the job switched the worker's subreaper flag off).
        """
        if self.workers_cg is not None:
            return
        while True:
            # only children that are not workers are looked at (a sweep per worker exit must
            # not cost a /proc read per live worker)
            orphans = _scan.children(self.pid) - set(self.workers)
            alive = {p for p in orphans if (found := _scan.state(p)) and found[1] != "Z"}
            if not alive:
                break
            _scan.wait_dead(_scan.freeze_and_kill(alive, exclude=self.workers), timeout=1.0)
            self._reap_orphans()
        self._reap_orphans()

    def _reap_orphans(self) -> None:
        for pid in _scan.children(self.pid) - set(self.workers):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)

    def _remove_cgroups(self) -> None:
        for cgroup in list(self.stale_cgroups):
            if _cgroup.populated(cgroup):
                _cgroup.kill(cgroup)
            elif _cgroup.remove_tree(cgroup):
                self.stale_cgroups.discard(cgroup)

    def _live_children(self) -> set[int]:
        return {
            pid
            for pid in _scan.children(self.pid)
            if (found := _scan.state(pid)) is not None and found[1] != "Z"
        }

    def shutdown(self) -> None:
        """Kill everything, reap what can be reaped, give up after ``_SHUTDOWN_LIMIT``.

        Never waits on a process it did not kill: each round kills what is alive (through the
        workers' cgroup, and by freezing whatever child is still alive, an escapee included),
        then waits for SIGCHLD or a short while.
        """
        deadline = time.monotonic() + _SHUTDOWN_LIMIT
        while time.monotonic() < deadline:
            self._reap()
            contained = self.workers_cg is not None and _cgroup.populated(self.workers_cg)
            if contained:
                _cgroup.kill(self.workers_cg)  # type: ignore[arg-type]
            live = self._live_children()
            if live:
                _scan.wait_dead(_scan.freeze_and_kill(live), timeout=1.0)
                continue
            if not contained and not _scan.children(self.pid):
                break
            select.select([self.wake_r], [], [], 0.05)
            self._drain_wakeups()
        if self.host_gone and self.workers_cg is not None:
            self._remove_pool()
        self._remove_cgroups()

    def _remove_pool(self) -> None:
        """The host died: remove the pool's cgroups (nobody else would until the next pool starts).

        This process is in one of them, and a cgroup holding a process cannot be removed: it moves
        back to the cgroup the host ran in first (which held the host, so it can hold a process).
        What is still populated stays for the next pool's sweep.
        """
        pool, home = self.cgroups.get("pool"), self.cgroups.get("home")
        try:
            if pool is None or home is None:
                raise OSError("no pool cgroup given")
            _cgroup.write(f"{home}/cgroup.procs", "0")
        except OSError:
            assert self.workers_cg is not None
            _cgroup.remove_tree(self.workers_cg)
            return
        _cgroup.remove_tree(pool)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(pool))  # the shared cgroup, once no pool is left in it


class _Move:
    """The launcher's move into its cgroup, made by a thread while the main thread imports.

    Moving a process between cgroups takes a lock of the kernel's (``cgroup.procs``) that waits
    for an RCU grace period when no move happened in the last tens of milliseconds: 6 to 30 ms
    here, paid twice at the pool's start (the launcher's move, then its first worker's, after
    the imports). The thread moves the launcher beside the engine's own imports (``moved``
    waits for that first move before a preloaded module runs: a process one starts as it is
    imported is in the pool's cgroup, killed with it), then moves it again (to where it is)
    every ``_KEEP_MOVING`` seconds until ``join``: the first worker's move then finds the lock
    just used and takes a tenth of a millisecond. The thread has ended when ``join`` returns,
    before the launcher forks: it forks every worker and must be single-threaded then.
    """

    def __init__(self, procs: str) -> None:
        self.error: OSError | None = None
        self.tid = 0  # the thread's id, once it runs
        self.first = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._move, args=(procs,), name="zett-move")
        self.thread.start()

    def _move(self, procs: str) -> None:
        self.tid = threading.get_native_id()
        try:
            _cgroup.write(procs, "0")  # "0": the writer's process, every thread of it
        except OSError as exc:
            self.error = exc
            return
        finally:
            self.first.set()
        # only to keep the kernel's move path warm: a refusal now changes nothing
        with contextlib.suppress(OSError):
            while not self.done.wait(_KEEP_MOVING):
                _cgroup.write(procs, "0")

    def moved(self) -> None:
        """Wait for the first move; raise what it raised."""
        self.first.wait()
        if self.error is not None:
            raise self.error

    def join(self) -> None:
        """End the thread, and wait until the kernel has let it go.

        ``Thread.join`` returns once the thread's Python state is released, a moment before
        the thread itself exits (0.4% of joins here): Python 3.12 warns at a fork while the
        process has another thread (an error under ``-W error``).
        """
        self.done.set()
        self.thread.join()
        task = f"/proc/self/task/{self.tid}"
        deadline = time.monotonic() + 1.0
        while os.path.exists(task) and time.monotonic() < deadline:
            time.sleep(0.0001)


def _resolve(name: str) -> Any:
    """The function ``"module:function"`` names (the pool's ``warm_up``)."""
    module, _, attribute = name.partition(":")
    function = getattr(importlib.import_module(module), attribute)
    if not callable(function):
        raise TypeError(f"warm_up {name!r} is not a function")
    return function


def _rehearse(function: Any) -> None:
    """Run the pool's ``warm_up`` once, here, before the first fork.

    What a code path's first run writes (the interpreter's specialised bytecode, lazily built
    caches, interned names) is then written in the launcher's pages, which every worker
    shares, instead of in a copy each worker makes when its first job runs that path: a
    running child agent on the runner's rehearsal held 3.8 MiB of its own instead of 5.6 (the
    spares rehearsing each), and started as fast. What it raises only means the jobs pay for
    their first run themselves. It must leave no thread behind: the launcher forks, and a fork
    copies no thread but every lock one held, so a warm-up that does fails the start, naming
    the threads (those a preloaded module started are not its doing, and are left to that
    module, as before).
    """
    import threading

    from . import _worker

    # threads a preloaded module started are its own business (as without a warm-up)
    before = set(os.listdir("/proc/self/task"))
    named = set(threading.enumerate())
    _worker.warm_up(confine=False, loop=True)  # the engine's own path: a job, an event loop
    with contextlib.suppress(Exception):
        function()
    _worker.fresh_asyncio()
    _worker.rehearsed = True
    left = set(os.listdir("/proc/self/task")) - before
    if left:
        names = [t.name for t in set(threading.enumerate()) - named]
        raise RuntimeError(
            f"warm_up left {len(left)} thread(s) running ({', '.join(names) or 'not Python'}); "
            "the launcher forks every worker and must stay single-threaded: join them first"
        )


def main() -> None:
    """Entry point of the launcher process (see the module docstring)."""
    host_pid, max_frame_bytes = int(sys.argv[2]), int(sys.argv[3])
    preload = json.loads(sys.argv[4])
    cgroups: dict[str, str] = json.loads(sys.argv[5])
    nice = int(sys.argv[6])
    warm_up = sys.argv[7] if len(sys.argv) > 7 else ""
    ctrl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=CONTROL_FD)
    _linux.set_child_subreaper()
    _linux.set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != host_pid:
        return  # the host died before we could watch it
    launcher = _new_launcher(ctrl, max_frame_bytes, cgroups, nice)
    moving = _Move(f"{cgroups['launcher']}/cgroup.procs") if "launcher" in cgroups else None
    try:
        import_engine()
        if moving is not None:
            moving.moved()  # before any preloaded module runs (see ``_Move``)
        for name in preload:
            importlib.import_module(name)
        if moving is not None:
            moving.join()  # before the warm-up (it counts threads) and any fork
        if warm_up:
            _rehearse(_resolve(warm_up))
    except BaseException as exc:
        launcher.send({"op": "hello", "error": f"{type(exc).__name__}: {exc}"})
        return
    finally:
        if moving is not None:
            moving.join()  # (again, at once, when it was joined above)
    _serve(launcher)


def import_engine() -> None:
    """Import what every worker runs, once, before the first fork."""
    import cloudpickle  # noqa: F401 - imported once here so every worker starts warm

    from .. import _pickled_call  # noqa: F401 - the executor's jobs run it
    from . import _worker  # noqa: F401 - every worker runs it: imported once, here


def rehearse(warm_up: str) -> None:
    """The pool's ``warm_up`` (``"module:function"``), run once before the first fork."""
    _rehearse(_resolve(warm_up))


def serve_forked(
    host_pidfd: int,
    max_frame_bytes: int,
    cgroups: dict[str, str],
    nice: int,
    error: str = "",
) -> None:
    """The launcher's life in a process a zygote forked (``_zygote``), which imported for it.

    The control socket is at ``CONTROL_FD`` already. The host is not this process's parent:
    ``host_pidfd`` (a pidfd of the host, opened while the host waited for this fork) says when
    it is gone, in place of the parent-death signal. ``error``: what the zygote's imports or
    warm-up raised, which the hello reports as this launcher's own start would have.
    """
    ctrl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=CONTROL_FD)
    _linux.set_child_subreaper()
    launcher = _new_launcher(ctrl, max_frame_bytes, cgroups, nice)
    launcher.host_pidfd = host_pidfd
    try:
        if error:
            raise RuntimeError(error)
        if "launcher" in cgroups:
            _cgroup.write(f"{cgroups['launcher']}/cgroup.procs", "0")
    except BaseException as exc:
        launcher.send({"op": "hello", "error": f"{type(exc).__name__}: {exc}"})
        return
    _serve(launcher)


def _new_launcher(
    ctrl: socket.socket, max_frame_bytes: int, cgroups: dict[str, str], nice: int
) -> _Launcher:
    # the pool's Landlock settings travel with the cgroup paths (the launcher's arguments)
    landlock_cap = int(cgroups.pop("landlock_abi", "-1"))
    scope_workers = cgroups.pop("scope_workers", "1") == "1"
    try:
        scoping = _landlock.worker_scoping(landlock_cap, scope_workers)
    except OSError as exc:
        scoping = {"kernel_abi": 0, "abi": 0, "scoped": False, "reason": f"not looked at: {exc}"}
    return _Launcher(ctrl, max_frame_bytes, cgroups, nice, scoping)


def _serve(launcher: _Launcher) -> None:
    from . import _worker

    # made once here, taken by each worker at its first job (made there, the ``ctypes`` calls
    # would write to pages it shares with the launcher)
    _worker.slice_request = _linux.short_slice_request(launcher.worker_nice())
    # objects created so far are shared with every worker; keep the GC from touching them.
    # No collection first: it took 4 to 8 ms of the pool's start, and the holes it left in
    # pages every worker shares were filled by each worker's first allocations, copied (an
    # idle worker held 0.03 MiB more of its own with it)
    gc.freeze()
    try:
        launcher.run()
    except Exception as exc:
        # never a traceback on the host's terminal: one line, then kill what is left
        sys.stderr.write(f"zett-agent launcher {os.getpid()}: {type(exc).__name__}: {exc}\n")
        with contextlib.suppress(Exception):
            launcher.stopping = True
            launcher.shutdown()
