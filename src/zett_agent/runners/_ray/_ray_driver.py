"""What a ``RayRunner`` does for its jobs: the narrow handle a ``RayJob`` holds of its runner.

A ``RayJob`` needs a few things only the driver side can do: cancel its Ray task, take the
note its task left in the cluster's store, know whether its node is this machine, have the
node's reaper ready, kill its tree from outside, ask whether its node still answers, know
whether the runner was closed, and leave the runner's set of running jobs once it ended.
``JobDriver`` is that handle: the runner owns it (its connection's calls and reapers, the jobs
it runs) and hands it to every job it makes; a job reaches nothing else of the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from zett_agent.runners._ray import _ray_cluster, _ray_kill, _ray_task, _ray_views

if TYPE_CHECKING:
    from collections.abc import Hashable

__all__ = ["JobDriver"]

log = logging.getLogger(__name__)


class RunnerOptions(Protocol):
    """What the jobs read of their runner's options (``RayRunner`` has them)."""

    @property
    def kill_timeout(self) -> float:
        """Seconds a kill may take before the job is given up."""
        ...

    @property
    def end_timeout(self) -> float:
        """Seconds the end of a killed job's stream may take."""
        ...

    @property
    def kill_from_host(self) -> bool:
        """Whether the host may kill a child's tree itself when its node is the host's."""
        ...

    @property
    def max_frame_bytes(self) -> int:
        """The largest frame a child may send."""
        ...

    @property
    def max_buffered_events(self) -> int:
        """Unread events kept per job."""
        ...

    @property
    def max_buffered_bytes(self) -> int:
        """What unread events of one job may hold."""
        ...


class JobDriver:
    """The runner's side of its jobs: what a ``RayJob`` may ask, and the jobs it runs.

    Attributes:
        runner: The runner whose options (``kill_timeout``, ``end_timeout``, the frame
            bounds, ``kill_from_host``) the jobs read.
        calls: Ray calls made off the event loop (``_ray_cluster.Calls``).
        reapers: The per-node reaper actors (``_ray_cluster.Reapers``).
        jobs: The running jobs, each with how to kill it (``close()`` of the runner).
        closed: Whether the runner was closed.
    """

    def __init__(self, runner: RunnerOptions) -> None:
        self.runner = runner
        self.calls = _ray_cluster.Calls()
        self.reapers = _ray_cluster.Reapers(self.calls)
        self.jobs: dict[Hashable, Callable[[BaseException], Awaitable[None]]] = {}
        self.closed = False
        self._views = _ray_views.views()

    def add(self, job: Hashable, kill: Callable[[BaseException], Awaitable[None]]) -> None:
        """Count ``job`` as running; ``kill(reason)`` ends it when the runner closes."""
        self.jobs[job] = kill

    def discard(self, job: Hashable) -> None:
        """``job`` ended: the runner no longer runs it."""
        self.jobs.pop(job, None)

    def cancel(self, generator: Any, *, force: bool) -> asyncio.Future[None]:
        """Ask Ray to cancel a job's task (``force``: end its Ray worker)."""
        return self.calls.cancel(generator, force=force)

    async def take_note(self, token: str) -> Any:
        """Take the note a task left in the cluster's store.

        The note, removed from the store; ``None`` if none (or the cluster does not answer).
        """
        try:
            return await self.calls.run(_take_note, token)
        except Exception:
            return None

    def is_local(self, tree: Mapping[str, Any]) -> bool:
        """Whether the tree's node is this machine, seen as this process sees it."""
        return self.runner.kill_from_host and list(tree.get("views") or []) == self._views

    def prepare(self, tree: Mapping[str, Any], node_id: str) -> None:
        """Have the node's reaper started now, ready before a kill needs it (never raises)."""
        if not self.is_local(tree):
            with contextlib.suppress(Exception):
                self.reapers.prepare(node_id)

    async def kill_tree(self, tree: dict[str, Any], node_id: str | None, deadline: float) -> bool:
        """Kill a child's Ray worker, pool and trees from outside; True once confirmed gone.

        From a thread of this process when the node is this machine, else through the node's
        reaper (replaced when it does not answer). Never raises.
        """
        left = max(0.1, deadline - time.monotonic())
        try:
            if self.is_local(tree):
                return await self.calls.run(_ray_kill.kill_tree, tree, left)
            if node_id is None or not await self.node_alive(node_id):
                return False
            budget = min(left, 10.0)
            result: bool = await self.reapers.call(
                node_id, "kill", tree, budget, budget=budget, deadline=deadline
            )
            return result
        except Exception:
            log.debug("killing a tree on node %s failed", node_id, exc_info=True)
            return False

    async def node_alive(self, node_id: str) -> bool:
        """Whether the node's raylet still answers.

        The cluster's view (when the head answers within 2 s), then a TCP connect to the
        raylet itself (a killed raylet refuses at once; the cluster notices only after its
        health checks).
        """
        try:
            nodes = await self.calls.run(_ray_cluster.node_table, 2.0)
        except Exception:
            return False  # the head does not answer: the cluster is gone
        entry = nodes.get(node_id)
        if entry is None or not entry[0]:
            return False
        try:
            _reader, writer = await asyncio.wait_for(asyncio.open_connection(*entry[1]), 2.0)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True


def _take_note(token: str) -> Any:
    from ray.experimental import internal_kv

    key = _ray_task.kv_key(token)
    note = internal_kv._internal_kv_get(key, namespace=_ray_task.KV_NAMESPACE)
    if note is not None:
        internal_kv._internal_kv_del(key, namespace=_ray_task.KV_NAMESPACE)
    return note
