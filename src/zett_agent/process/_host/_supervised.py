"""The host's record of one worker process, and the worker's lifecycle."""

from __future__ import annotations

import asyncio
import enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._containment._strategy import Tree
    from ._channel import Channel
    from ._control import LauncherHandle
    from ._job_core import JobCore

__all__ = ["Worker", "WorkerState"]


class WorkerState(enum.Enum):
    """``IDLE <-> BUSY -> ENDING -> DEAD``, and ``IDLE -> ENDING``.

    Any other transition is a bug and raises ``RuntimeError``.
    """

    IDLE = "idle"  # alive, no job: may get one
    BUSY = "busy"  # running a job
    ENDING = "ending"  # runs no more jobs: its tree is being killed, or its process exited
    DEAD = "dead"  # its tree is dead and what was awaited from it arrived: buried


_LEGAL = {
    WorkerState.IDLE: frozenset({WorkerState.BUSY, WorkerState.ENDING}),
    WorkerState.BUSY: frozenset({WorkerState.IDLE, WorkerState.ENDING}),
    WorkerState.ENDING: frozenset({WorkerState.DEAD}),
    WorkerState.DEAD: frozenset(),
}
_IDLE, _BUSY = WorkerState.IDLE, WorkerState.BUSY


class Worker:
    """One worker process: its tree, its channel, its job, what is known about its end."""

    def __init__(self, pid: int, tree: Tree, launcher: LauncherHandle) -> None:
        self.pid = pid
        self.tree = tree
        #: the launcher that forked it (its parent, which reaps it and reports its exit)
        self.launcher = launcher
        self.channel: Channel | None = None
        self.state = WorkerState.IDLE
        self.job: JobCore | None = None
        #: the job whose answer retired it: that job's tree is gone once this worker is buried
        self.answered: JobCore | None = None
        self.jobs_done = 0
        #: whether the job it runs is its last one
        self.last = False
        #: when its process was seen to exit (its pidfd became readable)
        self.exited_at: float | None = None
        #: the launcher's exit report (exit status and resource usage)
        self.report: dict[str, Any] | None = None
        #: its launcher is gone: no exit report will ever come
        self.orphaned = False
        #: the scratch directory of its sandboxed job, removed once its tree is dead
        self.scratch: str | None = None
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def __repr__(self) -> str:
        job = f" {self.job.name}" if self.job is not None else ""
        return f"<worker {self.pid} {self.state.name}{job}>"

    def to(self, state: WorkerState) -> None:
        # the two transitions of every reused job by identity: hashing an enum member for the
        # table runs Python code
        current = self.state
        if (current is _IDLE and state is _BUSY) or (current is _BUSY and state is _IDLE):
            self.state = state
            return
        if state not in _LEGAL[current]:
            raise RuntimeError(f"illegal worker transition {current.name} -> {state.name}")
        self.state = state

    def set_timer(self, name: str, handle: asyncio.TimerHandle) -> None:
        self.cancel_timer(name)
        self._timers[name] = handle

    def cancel_timer(self, name: str) -> None:
        handle = self._timers.pop(name, None)
        if handle is not None:
            handle.cancel()

    def cancel_timers(self) -> None:
        if not self._timers:
            return
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
