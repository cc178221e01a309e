"""The pool's launcher, supervised: started, talked to, watched, replaced when it fails.

A job can stop or kill its own parent, the launcher; so the launcher is never trusted to
answer. Every request it gets (a worker for each one asked for), and the exit report of every
worker that died, is owed; 0.25 s after something became owed the launcher is looked at, and
replaced at once if it is seen stopped, or once it said nothing for ``DEADLINE`` seconds while
something was owed and used no CPU since the last look (a launcher busy with a long batch of
forks, or slowed by a loaded machine, keeps talking or at least working). A launcher
that exits is replaced too. Replacing is the pool's business (it kills what the lost launcher
started, through its containment, then calls ``replace``); this class keeps the policy: a pool
gives up after ``MAX_RESTARTS`` replacements within ``RESTART_WINDOW`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Container, Iterable
from typing import Any, Protocol

from .._containment import _scan
from .._errors import ProcessError
from ._control import LauncherHandle
from ._zygote_client import Zygote, ZygoteUnavailable

log = logging.getLogger("zett_agent.process")

__all__ = ["DEADLINE", "LauncherSupervisor", "Owner"]

START_TIMEOUT = 60.0
#: a launcher that owes an answer is looked at after this long: replaced at once if stopped
CHECK_AFTER = 0.25
#: while jobs run, the launcher is looked at this often even when it owes nothing: a job that
#: stopped it while nothing was owed would otherwise leave the host-death path (the launcher
#: kills every tree once the host is gone) to a process that cannot act (see ``watch``)
WATCH_EVERY = 1.0
#: ... and replaced anyway when it owes one for this long
DEADLINE = 5.0
#: launcher replacements allowed within RESTART_WINDOW seconds before the pool gives up
MAX_RESTARTS = 5
RESTART_WINDOW = 60.0
#: bytes of a launcher's children list read at a time (the pids of about 8,000 workers)
_CHILDREN_READ = 1 << 16


class Owner(Protocol):
    """What the supervisor tells the pool."""

    def on_worker(self, launcher: LauncherHandle, message: dict[str, Any], fds: list[int]) -> None:
        """A new worker: its socket and pidfd are in ``fds`` (the pool owns them now)."""

    def on_exit_report(self, launcher: LauncherHandle, message: dict[str, Any]) -> None:
        """The launcher reaped a worker: exit status and resource usage."""

    def on_spawn_failed(self, message: dict[str, Any]) -> None:
        """A worker could not be started."""

    def on_lost(self, launcher: LauncherHandle, why: str) -> None:
        """The current launcher failed: kill what it started, then call ``replace(why)``."""

    def on_gone(self, launcher: LauncherHandle) -> None:
        """A launcher exited and was reaped: no report will come from it any more."""

    def on_ready(self) -> None:
        """A (new) launcher said hello: ask it for workers."""

    def on_give_up(self, message: str) -> None:
        """The pool cannot get a working launcher: fail what waits, refuse new jobs."""


class LauncherSupervisor:
    """The current launcher and the ones still exiting; see the module docstring."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        owner: Owner,
        *,
        preload: tuple[str, ...],
        max_frame_bytes: int,
        cgroups: dict[str, str],
        nice: int = 0,
        warm_up: str = "",
        before_start: Callable[[], None] = lambda: None,
        zygote: Zygote | None = None,
    ) -> None:
        self._loop = loop
        self._zygote = zygote
        self._before_start = before_start
        self._owner = owner
        self._preload = preload
        self._max_frame_bytes = max_frame_bytes
        self._cgroups = cgroups
        self._nice = nice
        self._warm_up = warm_up
        #: the launcher jobs are given to; None while it is being replaced
        self.current: LauncherHandle | None = None
        #: every launcher not reaped yet
        self.handles: set[LauncherHandle] = set()
        #: set while no launcher process exists
        self.gone = asyncio.Event()
        self.gone.set()
        self.closing = False
        self._hello: asyncio.Future[None] | None = None
        self._health: asyncio.TimerHandle | None = None
        self._watching: asyncio.TimerHandle | None = None
        self._busy: Callable[[], bool] = lambda: False
        self._replacing: asyncio.Task[None] | None = None
        self._restarts: deque[float] = deque()
        #: worker pid -> since when its exit report is owed
        self._reports_owed: dict[int, float] = {}
        #: since when each worker asked for and not delivered yet is owed, oldest first
        self._spawns_owed: deque[float] = deque()
        #: when the current launcher last said anything (it makes progress while it does)
        self._heard = 0.0
        #: its CPU time at the last look (it is working while that grows)
        self._ticks = -1
        #: a launcher and its children list, kept open (``sweep_if_orphans``)
        self._probe: tuple[LauncherHandle, int] | None = None

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start a launcher and wait for its hello.

        Raises ``ProcessError`` (it failed to start, naming why, or did not answer within
        ``START_TIMEOUT``); on any error or cancellation the launcher is killed (and reaped when it
        exits).
        """
        self._before_start()
        make = functools.partial(
            LauncherHandle,
            preload=self._preload,
            max_frame_bytes=self._max_frame_bytes,
            cgroups=self._cgroups,
            nice=self._nice,
            warm_up=self._warm_up,
        )
        launcher = None
        if self._zygote is not None:
            # it blocks while the zygote forks (or imports, the first time): in a thread, as
            # no parent-death signal ties a zygote's launcher to the thread that asked for it
            launcher = await _from_zygote(make, self._zygote)
        if launcher is None:
            launcher = make()  # on this thread: the one its parent-death signal watches
        self.current = launcher
        self.handles.add(launcher)
        self.gone.clear()
        hello = self._hello = self._loop.create_future()
        self._loop.add_reader(launcher.sock.fileno(), self._on_control, launcher)
        self._loop.add_reader(launcher.pidfd, self._on_exit, launcher)
        try:
            async with asyncio.timeout(START_TIMEOUT):
                await hello
        except TimeoutError as exc:
            launcher.kill()
            raise ProcessError(
                f"the pool's launcher did not start within {START_TIMEOUT:g} s"
            ) from exc
        except BaseException:
            launcher.kill()
            raise

    async def close(self) -> None:
        """Stop replacing and looking.

        Ask every launcher to shut down (it kills what it started and exits). ``gone`` is set once
        all are reaped.
        """
        self.closing = True
        for timer in (self._health, self._watching):
            if timer is not None:
                timer.cancel()
        self._health = self._watching = None
        if self._replacing is not None:
            self._replacing.cancel()
            with contextlib.suppress(BaseException):
                await self._replacing
        for launcher in list(self.handles):
            launcher.send({"op": "shutdown"})

    def kill(self) -> None:
        """SIGKILL every launcher (the last resort of a close that timed out)."""
        for launcher in list(self.handles):
            launcher.kill()

    def abandon(self) -> None:
        """Only when the event loop is gone.

        Close the control sockets (EOF makes each launcher kill every tree and exit).
        """
        for launcher in self.handles:
            with contextlib.suppress(OSError):
                launcher.close()
        with contextlib.suppress(OSError):
            self._close_probe()

    # -- requests and what is owed ----------------------------------------------------------

    def request(self, message: dict[str, Any]) -> bool:
        """Send a request to the current launcher; False if there is none right now.

        A request is answered by an ``ok`` record, except ``spawn``, answered by the workers
        it asks for (one ``worker`` or ``spawn_failed`` record each): an ``ok`` per spawn would
        cost the launcher and this loop one more wake-up per job.
        """
        launcher = self.current
        if launcher is None:
            return False
        if message.get("op") == "spawn":
            now = time.monotonic()
            self._spawns_owed.extend([now] * int(message["n"]))
            queued = launcher.send(message)
        else:
            queued = launcher.request(message)
        if queued:
            self._loop.add_writer(launcher.sock.fileno(), self._flush, launcher)
        self._expect()
        return True

    def sweep_if_orphans(self, workers: Container[int]) -> None:
        """Ask the launcher for an orphan sweep when one may be needed.

        Ask the launcher for an orphan sweep if it has a child that is not one of
        ``workers`` (scan containment, after a reused worker's job: a job that switched its
        subreaper flag off and double-forked left such an orphan). Its children are read from
        /proc: the common case costs no message and no wake-up.
        """
        launcher = self.current
        if launcher is not None and any(pid not in workers for pid in self._children(launcher)):
            self.request({"op": "sweep"})

    def _children(self, launcher: LauncherHandle) -> Iterable[int]:
        """The launcher's children, from its one thread's ``children`` list kept open.

        One ``pread`` per look: the launcher never starts a thread, and a job cannot make it.
        """
        probe = self._probe
        if probe is None or probe[0] is not launcher:
            self._close_probe()
            if not _scan._HAVE_CHILDREN_FILE:
                return _scan.children(launcher.pid)
            path = f"/proc/{launcher.pid}/task/{launcher.pid}/children"
            try:
                probe = self._probe = (launcher, os.open(path, os.O_RDONLY | os.O_CLOEXEC))
                # opened while it is alive (not reaped: its pid is not someone else's), the
                # list is its own; from then on it fails once the launcher is gone
                signal.pidfd_send_signal(launcher.pidfd, 0)
            except OSError:
                self._close_probe()
                return ()  # it is gone: its exit is handled on its own
        try:
            data = os.pread(probe[1], _CHILDREN_READ, 0)
            while len(data) % _CHILDREN_READ == 0 and data:  # a long list: read all of it
                more = os.pread(probe[1], _CHILDREN_READ, len(data))
                if not more:
                    break
                data += more
        except OSError:
            return ()
        return map(int, data.split())

    def _close_probe(self) -> None:
        if self._probe is not None:
            os.close(self._probe[1])
            self._probe = None

    def owe_report(self, launcher: LauncherHandle, pid: int, since: float) -> None:
        """Worker ``pid`` of ``launcher`` died: its exit report is owed."""
        if launcher is self.current and not self.closing:
            self._reports_owed[pid] = since
            self._expect()

    def watch(self, busy: Callable[[], bool]) -> None:
        """Watch the launcher while jobs run.

        Look at the launcher every ``WATCH_EVERY`` seconds for as long as ``busy()`` is true
        (the pool calls this when a job starts while none ran), and replace it if it is seen
        stopped. Where the kernel cannot keep a job from signalling its launcher (no Landlock
        signal scoping), a job could stop it while nothing is owed: found within a second
        while the host lives.
        """
        self._busy = busy
        if self._watching is None and not self.closing:
            self._watching = self._loop.call_later(WATCH_EVERY, self._look)

    def _look(self) -> None:
        self._watching = None
        launcher = self.current
        if launcher is None or self.closing or not self._busy():
            return
        if launcher.stopped():
            self._lose(launcher, "it was stopped (SIGSTOP) while jobs ran")
            return
        self._watching = self._loop.call_later(WATCH_EVERY, self._look)

    def _flush(self, launcher: LauncherHandle) -> None:
        if not launcher.flush():
            self._loop.remove_writer(launcher.sock.fileno())

    def _expect(self) -> None:
        """Something is owed by the launcher: look at it soon."""
        if self._health is None and self.current is not None and not self.closing:
            self._health = self._loop.call_later(CHECK_AFTER, self._check)

    def _owed_since(self) -> float | None:
        launcher = self.current
        if launcher is None:
            return None
        times = list(self._reports_owed.values())
        if self._spawns_owed:
            times.append(self._spawns_owed[0])
        overdue = launcher.overdue()
        if overdue is not None:
            times.append(overdue)
        # a launcher busy with a long batch (a hundred forks on a loaded machine) still makes
        # progress: only silence while something is owed counts
        return max(min(times), self._heard) if times else None

    def _check(self) -> None:
        self._health = None
        launcher, since = self.current, self._owed_since()
        if launcher is None or since is None or self.closing:
            return
        waited = time.monotonic() - since
        ticks = launcher.cpu_ticks()
        working, self._ticks = ticks != self._ticks, ticks
        if launcher.stopped():
            self._lose(launcher, "it was stopped (SIGSTOP) and stopped answering")
        elif waited > DEADLINE and not working:
            self._lose(launcher, f"it did not answer for {waited:.1f} s")
        else:
            self._expect()

    # -- what the launcher says -------------------------------------------------------------

    def _on_control(self, launcher: LauncherHandle) -> None:
        if launcher is self.current:
            self._heard = time.monotonic()
        for _ in range(64):
            try:
                received = launcher.receive()
            except EOFError:
                self._loop.remove_reader(launcher.sock.fileno())
                return
            if received is None:
                return
            self._handle(launcher, *received)

    def _handle(self, launcher: LauncherHandle, message: dict[str, Any], fds: list[int]) -> None:
        op = message.get("op")
        if op in ("worker", "spawn_failed") and launcher is self.current and self._spawns_owed:
            self._spawns_owed.popleft()
        if op == "worker":
            self._owner.on_worker(launcher, message, fds)
            return
        for fd in fds:
            os.close(fd)
        if op == "ok":
            launcher.answered(message.get("seq"))
        elif op == "exit":
            self._reports_owed.pop(message.get("pid"), None)  # type: ignore[arg-type]
            self._owner.on_exit_report(launcher, message)
        elif op == "hello":
            launcher.hello = message  # what its workers get (the pool shows it)
            hello = self._hello
            if hello is not None and not hello.done() and launcher is self.current:
                if "error" in message:
                    hello.set_exception(
                        ProcessError(
                            f"the pool's launcher failed to start: {message['error']}; check "
                            "the ProcessPool(preload=...) module names"
                        )
                    )
                else:
                    hello.set_result(None)
        elif op == "spawn_failed":
            self._owner.on_spawn_failed(message)
        else:
            self._lose(launcher, "it sent a message that is not part of the protocol")

    def _on_exit(self, launcher: LauncherHandle) -> None:
        if not launcher.try_reap():
            return
        self._loop.remove_reader(launcher.pidfd)
        if launcher is self.current:
            self._on_control(launcher)  # its last exit reports may be in the socket still
            hello = self._hello
            if hello is not None and not hello.done():
                hello.set_exception(
                    ProcessError(
                        f"the pool's launcher process exited during startup "
                        f"({launcher.describe_exit()}); see its output on stderr"
                    )
                )
            elif not self.closing:
                self._lose(launcher, launcher.describe_exit())
        self._owner.on_gone(launcher)
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(launcher.sock.fileno())
            self._loop.remove_writer(launcher.sock.fileno())
        if launcher is self.current:
            self.current = None
        if self._probe is not None and self._probe[0] is launcher:
            self._close_probe()
        self.handles.discard(launcher)
        launcher.close()
        if not self.handles:
            self.gone.set()

    # -- replacing ----------------------------------------------------------------------------

    def _lose(self, launcher: LauncherHandle, why: str) -> None:
        if launcher is not self.current or self.closing:
            return
        self.current = None
        self._reports_owed.clear()
        self._spawns_owed.clear()
        now = time.monotonic()
        self._restarts.append(now)
        while self._restarts and now - self._restarts[0] > RESTART_WINDOW:
            self._restarts.popleft()
        self._owner.on_lost(launcher, why)

    def replace(self, why: str) -> None:
        """Start a new launcher, unless too many failed lately.

        Start a new launcher (the pool killed what the lost one started), unless too many
        failed lately: then the pool gives up.
        """
        if self.closing or self._replacing is not None:
            return
        if len(self._restarts) > MAX_RESTARTS:
            self._owner.on_give_up(
                f"the pool's launcher process failed {len(self._restarts)} times within "
                f"{RESTART_WINDOW:g} s (last: {why}); create a new ProcessPool"
            )
            return
        self._replacing = self._loop.create_task(self._restart())

    async def _restart(self) -> None:
        try:
            await self.start()
        except Exception as exc:
            self._owner.on_give_up(f"the pool's launcher could not be restarted: {exc}")
            return
        finally:
            self._replacing = None
        self._owner.on_ready()


async def _from_zygote(
    make: Callable[..., LauncherHandle], zygote: Zygote
) -> LauncherHandle | None:
    """A launcher from ``zygote`` (``make`` in a thread), or ``None`` when it gives none.

    A launcher that comes after a cancellation is killed.
    """
    work = functools.partial(make, zygote=zygote, timeout=START_TIMEOUT)
    future = asyncio.get_running_loop().run_in_executor(None, work)
    try:
        return await asyncio.shield(future)
    except ZygoteUnavailable as exc:
        log.warning("no launcher from the zygote (%s); the pool starts its own", exc)
        return None
    except asyncio.CancelledError:
        future.add_done_callback(_discard)
        raise


def _discard(future: asyncio.Future[LauncherHandle]) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    launcher = future.result()  # a zygote's (the zygote reaps it)
    launcher.kill()
    launcher.close()
