"""The driver's side of ``task_message`` into a Ray child: where its inbox is, how to reach it.

The Ray task tells the driver its child's inbox (``_ray_inbox.NodeInbox``: a socket path and
a key) in the stream, or that there is none once the child runs without one. ``JobMail``
keeps what the task said for one ``RayJob`` and delivers that job's messages, one at a time
in the order sent: directly when the node is this machine (``JobDriver.is_local``), else
through the node's reaper actor.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from zett_agent.runners._ray import _ray_inbox
from zett_agent.runners._ray._ray_errors import first_line

if TYPE_CHECKING:
    from zett_agent.runners._ray._ray_driver import JobDriver

__all__ = ["JobMail"]

#: the job's node as a message needs it: its tree and node id, or ``None`` once it is not
#: running (ended, or being stopped)
Target = Callable[[], "tuple[dict[str, Any] | None, str | None] | None"]


class JobMail:
    """One Ray job's way to its child's inbox.

    ``job`` only names the job in errors; ``target`` says where it runs when a message goes.
    """

    def __init__(self, driver: JobDriver, job: object, target: Target) -> None:
        self._driver = driver
        self._job = job
        self._target = target
        #: the inbox on the node (path, key), once the task said where
        self._address: tuple[str, str] | None = None
        #: set once the inbox is known, or known never to come (no inbox, or the job ended)
        self._known: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lock = asyncio.Lock()

    def learn(self, path: Any, key: Any) -> None:
        """The task's ``inbox`` record. Raises ``ValueError`` for a malformed one."""
        if not (isinstance(path, str) and isinstance(key, str)) or len(path + key) > 4096:
            raise ValueError("a malformed inbox record from the Ray task")
        self._address = (path, key)
        self.settle()

    def settle(self) -> None:
        """Nothing more will be said about the inbox (the child runs, or the job ended)."""
        if not self._known.done():
            self._known.set_result(None)

    async def stop(self, tree: dict[str, Any] | None, node_id: str | None, seconds: float) -> str:
        """Ask the child's run to stop the child; one of ``_ray_inbox.STOP_ANSWERS``.

        ``"taken"``: its run kills the child's tree and ends the Ray task on its own;
        ``"ended"``: the run ended already (its task is ending on its own) or its Ray worker is
        gone; ``"unanswered"``, within ``seconds``: there is no inbox to ask (the task has not
        opened one yet, or opened none), or no answer came (the Ray worker is stopped or
        stuck, or its node's reaper did not answer), and the caller cancels the task through
        Ray. Not behind the messages under way (a message may wait on the child's
        backpressure).
        """
        if self._address is None or tree is None:
            return "unanswered"
        path, key = self._address
        if self._driver.is_local(tree):
            return await _ray_inbox.stop_run(path, key, seconds)
        if node_id is None:
            return "unanswered"
        try:
            answer = await self._driver.reapers.call(
                node_id,
                "stop",
                path,
                key,
                seconds,
                budget=seconds,
                deadline=time.monotonic() + seconds,
            )
        except Exception:  # the reaper did not answer in time, or died: Ray's cancel, then
            return "unanswered"
        return answer if answer in _ray_inbox.STOP_ANSWERS else "unanswered"

    async def send(self, message: Mapping[str, Any]) -> None:
        """Deliver ``message`` to the child's inbox; raises as ``RayJob.send`` says."""
        await asyncio.shield(self._known)
        async with self._lock:
            target = self._target()
            if target is None:
                raise RuntimeError(f"{self._job!r} is not running; the message was not sent")
            tree, node_id = target
            if self._address is None or tree is None:
                raise RuntimeError(f"{self._job!r}: its node opened no inbox; it takes no messages")
            path, key = self._address
            line = _ray_inbox.request_line(key, dict(message))
            timeout = _ray_inbox.CONNECTION_TIMEOUT + 2.0
            if self._driver.is_local(tree):
                await _ray_inbox.deliver(path, line, timeout)
                return
            if node_id is None:
                raise RuntimeError(f"{self._job!r} has no node; the message was not sent")
            try:
                await self._driver.reapers.call(
                    node_id,
                    "send",
                    path,
                    line,
                    timeout,
                    budget=timeout,
                    deadline=time.monotonic() + 2 * timeout,
                )
            except Exception as error:  # Ray's errors wrap the reaper's RuntimeError
                raise RuntimeError(
                    f"the message did not reach node {node_id[:12]}: {first_line(error)}"
                ) from None
