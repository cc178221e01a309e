"""``RayJob``: one child running as a Ray generator task, as the driver sees and stops it."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import ray.exceptions as rex

from zett_agent.process import (
    JobCancelled,
    JobTimeout,
    JobUsage,
    ProcessError,
    ProcessLimits,
    ProtocolError,
)
from zett_agent.process._wire._protocol import FrameError
from zett_agent.runners._ray import _ray_outcome
from zett_agent.runners._ray._ray_errors import decode_error, first_line
from zett_agent.runners._ray._ray_mail import JobMail
from zett_agent.runners._ray._ray_stream import Relay

if TYPE_CHECKING:
    from zett_agent.runners._ray._ray_driver import JobDriver

__all__ = ["GRACEFUL_CANCEL", "RayJob"]

log = logging.getLogger(__name__)

#: seconds a cancel waits for the task to confirm its child gone before killing from outside
GRACEFUL_CANCEL = 5.0
#: seconds a job may wait for Ray before ``info()`` says it is waiting
WAITING_AFTER = 2.0
#: longest control record of a stream (JSON text from the Ray task)
MAX_RECORD = 1 << 16
#: most records and frames in one stream item (the task sends what its node queued at once)
MAX_PARTS = 4096
_TREE_KEYS = frozenset({"views", "worker", "launcher", "cgroup", "mode"})


class RayJob:
    """One child running as a Ray generator task. Created by ``RayRunner.submit...``.

    ``wait()`` waits without raising; ``result()``/``exception()`` read the outcome once
    ``done()``; ``send()`` delivers ``task_message``. The child runs in a process of its node's
    pool (not in the Ray worker), and the outcome is reached once the task reported it with the
    child's tree confirmed gone, or once the driver confirmed it itself (``tree_gone``). Every
    outcome is reached within a bound: a task whose node or cluster went away ends as
    ``NodeLost``.

    Attributes:
        node_id: Hex id of the Ray node the child runs (or ran) on, once it started.
        tree_gone: Whether the child's tree was confirmed gone (``None`` while it runs).
        containment: How its node's pool contains it (``ProcessPool.containment_info``: the
            mode, the Landlock scoping of its process), once it started.
        dropped_events: Events dropped because nobody read them and a bound was reached.

    Cancellation: see ``cancel()``; cancelling a task that awaits ``wait()`` leaves the job.
    """

    def __init__(
        self, driver: JobDriver, generator: Any, limits: ProcessLimits, token: str, name: str
    ) -> None:
        #: what this job may ask of its runner (and how the runner closing reaches it)
        self._driver = driver
        runner = driver.runner
        self._gen = generator
        self.limits = limits
        self.name = name
        self._token = token
        self.node_id: str | None = None
        self.tree_gone: bool | None = None
        self.containment: dict[str, Any] | None = None
        #: the task info's ``sandbox`` entry (what the node enforced, or why not)
        self.sandbox_note: dict[str, Any] | None = None
        self._tree: dict[str, Any] | None = None
        self._pid: int | None = None
        self._loop = asyncio.get_running_loop()
        #: the child's inbox on its node, as the task says where
        self._mail = JobMail(driver, self, self._mail_target)
        self._done: asyncio.Future[None] = self._loop.create_future()
        #: set once the stream ended, with the error Ray raised (``None``: it ended cleanly)
        self._stream_end: asyncio.Future[BaseException | None] = self._loop.create_future()
        self._end: dict[str, Any] | None = None
        self._relay = Relay(
            runner.max_frame_bytes, runner.max_buffered_events, runner.max_buffered_bytes
        )
        self._event_waiter: asyncio.Future[None] | None = None
        self._room: asyncio.Future[None] | None = None
        self._result: Any = None
        self._exception: BaseException | None = None
        self._kill_reason: BaseException | None = None
        self._killing: asyncio.Task[None] | None = None
        self._submitted = time.monotonic()
        self._ended: float | None = None
        self._cpu = 0.0
        self._rss = 0
        self._peak = 0
        #: armed when the child starts running (time queued in Ray does not count)
        self._timer: asyncio.TimerHandle | None = None
        self._pump = self._loop.create_task(self._read(), name=f"zett-ray-{name}")
        driver.add(self, self._kill)

    def __repr__(self) -> str:
        state = "done" if self.done() else "running" if self._pid is not None else "pending"
        return f"<RayJob {self.name} {state} pid={self.pid} node={(self.node_id or '')[:12]}>"

    @property
    def pid(self) -> int | None:
        """The child's process id on its node while it runs, else ``None``."""
        return None if self.done() else self._pid

    @property
    def dropped_events(self) -> int:
        return self._relay.dropped

    # -- outcome ----------------------------------------------------------------------------

    def done(self) -> bool:
        """Whether the job ended (completed, failed or cancelled)."""
        return self._done.done()

    def result(self) -> Any:
        """The child's result (JSON data); raises its error. ``RuntimeError`` if not done."""
        if not self.done():
            raise RuntimeError(f"{self!r} has not finished yet; wait for it first")
        if self._exception is not None:
            raise self._exception
        return self._result

    def exception(self) -> BaseException | None:
        """The job's error, ``None`` if it completed. ``RuntimeError`` if not done."""
        if not self.done():
            raise RuntimeError(f"{self!r} has not finished yet; wait for it first")
        return self._exception

    async def wait(self) -> None:
        """Wait until the job ended, without raising its error.

        Cancellation: cancelling the waiter does not cancel the job.
        """
        await asyncio.shield(self._done)

    async def cancel(self) -> None:
        """Kill the child's whole tree; return once it is confirmed gone (or cannot be).

        The child's run on its node is asked to stop, through the child's inbox (directly,
        or through the node's reaper); a task that has no inbox yet is cancelled through Ray
        (``ray.cancel(force=False)``). Either way the task has its node's pool kill the
        child's tree and confirms it. Without that confirmation within ``GRACEFUL_CANCEL``
        seconds (a Ray worker stopped or stuck), the driver kills the Ray worker, its pool and
        every tree in it from outside: from here when the node is this machine, else through
        the node's reaper, which is replaced when it does not answer in time. The job ends
        with ``JobCancelled`` unless another outcome (a timeout) was being enforced. No-op
        for a finished job. Bounded by the runner's ``kill_timeout`` plus ``end_timeout``,
        even when the node or cluster is gone.

        Cancellation: if the caller is cancelled, the kill goes on.
        """
        await asyncio.shield(self._kill(JobCancelled()))

    def usage(self) -> JobUsage:
        """What the child used so far.

        CPU seconds and resident memory of the child's process (and its peak), and elapsed time.
        Updated about once a second while the child runs (when they changed).
        """
        end = self._ended if self._ended is not None else time.monotonic()
        return JobUsage(self._cpu, self._rss, self._peak, end - self._submitted)

    def info(self) -> Mapping[str, Any]:
        """Where the child runs, and what it waits for.

        ``{"node_id": ...}`` once the child runs; while Ray has not started it for more than
        ``WAITING_AFTER`` seconds, ``{"waiting": ...}`` says so; ``{"sandbox": ...}`` for a
        sandboxed child: what its node enforced.
        """
        info: dict[str, Any] = {}
        if self.sandbox_note is not None:
            info["sandbox"] = self.sandbox_note
        if self.node_id is not None:
            info["node_id"] = self.node_id
        elif not self.done() and time.monotonic() - self._submitted > WAITING_AFTER:
            info["waiting"] = "waiting for Ray to schedule it (a worker and its resources)"
        return info

    # -- messages ---------------------------------------------------------------------------

    async def send(self, message: Mapping[str, Any]) -> None:
        """Hand ``message`` (``task_message``'s ``{"id", "text", "interrupt"}``) to the child.

        It goes to the child's inbox on its node (``_ray_inbox``): directly when the node is
        this machine (and ``kill_from_host``), else through the node's reaper actor, and from
        there to the child's ``ProcessJob.send``. Returns once the node queued it for the child,
        not once the child read it (its ``message_delivered`` event says that). Messages go in
        the order sent. Called before the child started, it waits until it runs (or ends).
        Never blocks the event loop; one message takes at most about ``CONNECTION_TIMEOUT``
        seconds (through a reaper, also its replacement, bounded the same way).

        Raises:
            RuntimeError: the child is not running (it ended, or is being stopped), its node
                opened no inbox, or the node did not take the message (it ended meanwhile, or
                did not answer in time: then it may or may not have been taken).
            ValueError: the message does not encode to JSON within ``_ray_inbox.MAX_LINE``.

        Cancellation: the message may or may not have been sent.
        """
        await self._mail.send(message)

    def _mail_target(self) -> tuple[dict[str, Any] | None, str | None] | None:
        if self.done() or self._killing is not None:
            return None
        return self._tree, self.node_id

    # -- events -----------------------------------------------------------------------------

    def events(self) -> AsyncIterator[Any]:
        """What the child passed to ``emit()``, in order; ends when the job ends.

        One consumer per job (a second call raises ``RuntimeError``). While it lags by
        ``max_buffered_events`` (or ``max_buffered_bytes``) the job stops reading the stream,
        so the child's ``emit`` waits; before anyone calls ``events()`` the oldest are dropped
        beyond those bounds (``dropped_events``). The iterator does not raise the job's error.
        """
        if self._relay.consumer:
            raise RuntimeError(f"events() of {self!r} already has a consumer")
        self._relay.consumer = True
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        relay = self._relay
        while True:
            if relay.events:
                value = relay.pop()
                self._wake_room()
                yield value
                continue
            if self.done():
                return
            self._event_waiter = self._loop.create_future()
            try:
                await self._event_waiter
            finally:
                self._event_waiter = None

    def _wake(self) -> None:
        if self._event_waiter is not None and not self._event_waiter.done():
            self._event_waiter.set_result(None)

    def _wake_room(self) -> None:
        relay, room = self._relay, self._room
        if (
            room is not None
            and not room.done()
            and len(relay.events) <= relay.max_buffered_events // 2
            and relay.held <= relay.max_buffered_bytes // 2
        ):
            room.set_result(None)

    # -- reading the stream -----------------------------------------------------------------

    async def _read(self) -> None:
        error: BaseException | None = None
        try:
            async for ref in self._gen:
                await self._take(await ref)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Ray's own errors: the worker, the node, the cluster
            error = exc
        if not self._stream_end.done():
            self._stream_end.set_result(error)
        if self._killing is None and not self.done():
            try:
                await self._settle(error)
            except Exception as exc:  # a bug of ours must still settle the job, and say why
                log.exception("%s: settling the job failed", self.name)
                self._finish(ProcessError(f"the Ray runner failed to settle the child: {exc}"))

    async def _take(self, item: object) -> None:
        """Handle one stream item: a record, frames, or a list of both (``_ray_task``).

        Once the job is being killed only records count: the stream is read to its end, whose form
        is the task's confirmation.
        """
        if isinstance(item, list) and len(item) <= MAX_PARTS:
            for part in item:
                await self._take_part(part)  # never nested: one level, as the task sends them
        else:
            await self._take_part(item)

    async def _take_part(self, item: object) -> None:
        """Handle one record or one run of frames."""
        try:
            if isinstance(item, bytes):
                if self._killing is not None:
                    return
                self._relay.feed(item)
                await self._decode()
                if self._relay.events:
                    self._wake()
                while self._relay.consumer and self._relay.full and self._killing is None:
                    self._room = self._loop.create_future()
                    await self._room
            elif isinstance(item, str) and len(item) <= MAX_RECORD:
                self._control(json.loads(item))
            else:
                raise FrameError(f"a stream item of {type(item).__name__} (or too long)")
        except (FrameError, ValueError, TypeError, KeyError) as exc:
            self._relay.clear()
            if self._killing is None:
                self._loop.create_task(self._kill(ProtocolError(str(exc)[:500])))

    async def _decode(self) -> None:
        """Decode what was fed, a slice per event-loop iteration (others run in between)."""
        while not self._relay.step():  # noqa: ASYNC110 - yielding between slices is the point
            await asyncio.sleep(0)

    def _control(self, record: dict[str, Any]) -> None:
        kind = record["k"]
        if kind == "start":
            self._on_start(record)
        elif kind == "inbox":
            self._mail.learn(record["path"], record["key"])
        elif kind == "pid":
            self._mail.settle()  # after the inbox, if the node opened one
            pid = record["pid"]
            self._pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
        elif kind == "usage":
            self._usage(record)
        elif kind == "sandbox":
            entry = record["v"]
            self.sandbox_note = entry if isinstance(entry, dict) else None
        elif kind == "end":
            self._end = record
            self._usage({"cpu": record.get("cpu"), "rss": 0})
            peak = record.get("peak")
            if isinstance(peak, int) and not isinstance(peak, bool):
                self._peak = max(self._peak, peak)
        else:
            raise ValueError(f"an unknown record {kind!r:.40} from the Ray task")

    def _on_start(self, record: dict[str, Any]) -> None:
        tree, node = record["tree"], record["node"]
        if not isinstance(tree, dict) or set(tree) != _TREE_KEYS or not isinstance(node, str):
            raise ValueError("a malformed start record from the Ray task")
        self._tree, self.node_id = tree, node
        containment = record.get("containment")
        self.containment = containment if isinstance(containment, dict) else None
        if self.limits.timeout is not None and self._timer is None:
            self._timer = self._loop.call_later(self.limits.timeout, self._on_timeout)
        self._driver.prepare(tree, node)  # a reaper, ready before a kill needs it

    def _usage(self, record: Mapping[str, Any]) -> None:
        cpu, rss = record.get("cpu"), record.get("rss")
        if isinstance(cpu, int | float) and not isinstance(cpu, bool):
            self._cpu = float(cpu)
        if isinstance(rss, int) and not isinstance(rss, bool):
            self._rss = rss
            self._peak = max(self._peak, rss)

    # -- the end ----------------------------------------------------------------------------

    def _record_outcome(self) -> BaseException | None:
        """The outcome the ``end`` record says (the result came before it, if any)."""
        assert self._end is not None
        self.tree_gone = self._end.get("gone") is True
        if self._end.get("error") is not None:
            return decode_error(self._end["error"])
        result = self._relay.result
        if result is None:
            return ProtocolError("the Ray task ended without the child's result")
        self._result = result[0]
        return None

    async def _settle(self, error: BaseException | None) -> None:
        """The stream ended and no kill of ours is under way: settle with what it said."""
        if self._end is not None:
            self._finish(self._record_outcome())
            return
        driver, runner = self._driver, self._driver.runner
        if error is None:
            self.tree_gone = True  # the task confirmed a cancel from outside zett_agent
        else:
            if self._tree is None:
                await self._read_note()
            alive = True
            if _ray_outcome.needs_liveness(error, killed=False) and self.node_id is not None:
                alive = await driver.node_alive(self.node_id)
            if self._tree is not None and alive:
                # whatever ended the Ray worker, nothing of the child may outlive the outcome
                deadline = time.monotonic() + runner.kill_timeout
                self.tree_gone = await driver.kill_tree(self._tree, self.node_id, deadline)
            elif self._tree is None:
                self.tree_gone = True  # the task never got to start the child
        self._finish(
            _ray_outcome.outcome(
                error,
                killed=None,
                node_alive=alive if error is not None else True,
                closed=driver.closed,
                node_id=self.node_id,
                limits=self.limits,
                peak=self._peak,
            )
        )

    async def _read_note(self) -> dict[str, Any] | None:
        """Take the note the task left in the cluster's store.

        What the task left in the cluster's store (its tree, or whether a cancel it handled left its
        child gone), taken out of it; ``None`` if nothing.
        """
        note = await self._driver.take_note(self._token)
        if note is None:
            return None
        try:
            record = json.loads(note) if isinstance(note, str | bytes) else None
            if isinstance(record, dict) and record.get("k") == "start" and self._tree is None:
                self._on_start(record)
            return record if isinstance(record, dict) else None
        except (ValueError, TypeError, KeyError):
            return None

    def _finish(self, error: BaseException | None) -> None:
        if self.done():
            return
        if self._timer is not None:
            self._timer.cancel()
        if error is None and self._kill_reason is not None:
            error = self._kill_reason  # a result that raced the kill does not count
        if error is not None:
            self._result = None
        self._exception = error
        self._ended = time.monotonic()
        self._done.set_result(None)
        self._mail.settle()
        self._wake()
        if self._room is not None and not self._room.done():
            self._room.set_result(None)
        self._driver.discard(self)

    # -- killing ----------------------------------------------------------------------------

    def _on_timeout(self) -> None:
        if not self.done() and self.limits.timeout is not None:
            self._loop.create_task(self._kill(JobTimeout(self.limits.timeout)))

    async def _kill(self, reason: BaseException) -> None:
        if self.done():
            return
        if self._killing is None:
            self._kill_reason = reason
            self._relay.clear()
            if self._room is not None and not self._room.done():
                self._room.set_result(None)  # the stream is read to its end from here on
            self._killing = self._loop.create_task(self._do_kill())
        await asyncio.shield(self._killing)

    async def _do_kill(self) -> None:
        driver, runner = self._driver, self._driver.runner
        now = time.monotonic()
        deadline = now + runner.kill_timeout
        graceful = min(GRACEFUL_CANCEL, runner.kill_timeout / 2)
        graceful_end = now + graceful
        # the run on the node stops the child and ends its task on its own; one that ended is
        # left to end; only a task that has no inbox yet (not started, or starting) or does not
        # answer is cancelled through Ray (see _ray_inbox)
        if await self._mail.stop(self._tree, self.node_id, graceful / 2) == "unanswered":
            await driver.cancel(self._gen, force=False)
        left = max(0.0, graceful_end - time.monotonic())
        if await self._stream_ended(left) and await self._confirmed():
            self._finish(self._kill_reason)
            return
        # not confirmed: the Ray worker is stopped, stuck or gone; kill it from outside
        if self._tree is None:
            await self._read_note()
        await driver.cancel(self._gen, force=True)
        if self._tree is not None:
            self.tree_gone = await driver.kill_tree(self._tree, self.node_id, deadline)
        bound = max(0.0, deadline - time.monotonic()) + runner.end_timeout
        if not await self._stream_ended(bound):
            self._pump.cancel()  # Ray never reported the end (its control plane is gone)
        if self._tree is None and self.tree_gone is None:
            self.tree_gone = self.node_id is None  # never started anything anywhere
        if not self.tree_gone:
            log.warning(
                "%s: could not confirm that the child's processes on node %s are gone",
                self.name,
                self.node_id,
            )
        self._finish(self._kill_reason)

    async def _stream_ended(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(asyncio.shield(self._stream_end), seconds)
        except TimeoutError:
            return False
        return True

    async def _confirmed(self) -> bool:
        """Whether the child is known to be gone, after the stream ended during a kill.

        After the stream ended during a kill: whether the child is known to be gone (the task
        confirmed it, or it never started); reads the task's note when it must.
        """
        error = self._stream_end.result()
        if self._end is not None and self._end.get("gone") is True:
            self.tree_gone = True
            return True
        if error is None and self._end is None:
            self.tree_gone = True  # a clean end without an end record: confirmed
            return True
        note = await self._read_note() if self._tree is None or error is not None else None
        if note is not None and note.get("k") == "cancelled" and note.get("gone") is True:
            self.tree_gone = True
            return True
        if self._tree is None and isinstance(error, rex.TaskCancelledError):
            self.tree_gone = True  # cancelled before it ran: nothing was started
            return True
        if error is not None and not isinstance(error, rex.TaskCancelledError):
            log.debug("%s ended with %s while being killed", self.name, first_line(error))
        return False
