"""What the driver asks of the Ray cluster, without stalling its event loop.

Every blocking Ray call of the runner goes through ``Calls``: one thread of its own, fed
from the loop, that runs the calls in order and reports each back in one loop callback.
Cancels are batched: all the cancels asked for in one loop iteration (a hundred children
cancelled at once) are one call, and their waiters are woken in one callback.

``Reapers`` are the per-node reaper actors (``_ray_kill.Reaper``), judged by whether they
answer: a call that gets no answer within its bound (a stopped or overloaded reaper) has that
reaper killed and replaced, and is made again on the new one, until the caller's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

import ray
import ray.exceptions as rex
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from zett_agent.runners._ray._ray_kill import Reaper

__all__ = ["Calls", "Reapers", "node_table"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: seconds a reaper may take to answer on top of the work asked of it, before it counts as
#: not answering (and is replaced)
REAPER_ANSWER = 3.0
#: seconds a new reaper gets on top of that, once, to start (a Ray worker process)
REAPER_START = 20.0
_STOP = object()


class Calls:
    """Blocking Ray calls, run in order in one thread of their own (started on first use).

    Cancellation: a caller cancelled while its call runs gets ``CancelledError`` at once; the
    call itself finishes in the thread (every call made here is bounded).
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._cancels: list[tuple[Any, bool, asyncio.Future[None]]] = []
        self._flush: asyncio.Handle | None = None

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` in the thread; a future of its result (or its exception)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._start()
        self._queue.put((loop, fn, args, [future]))
        return future

    def cancel(self, generator: Any, *, force: bool) -> asyncio.Future[None]:
        """Ask Ray to cancel ``generator``, batched with the others of this iteration.

        ``ray.cancel(generator, force=force)``, batched with the others of this iteration; never
        raises.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._cancels.append((generator, force, future))
        if self._flush is None:
            self._flush = loop.call_soon(self._send_cancels, loop)
        return future

    def _send_cancels(self, loop: asyncio.AbstractEventLoop) -> None:
        self._flush = None
        batch, self._cancels = self._cancels, []
        self._start()
        self._queue.put(
            (loop, _cancel_all, ([(g, f) for g, f, _ in batch],), [f for *_, f in batch])
        )

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="zett-ray-calls", daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        while True:
            work = self._queue.get()
            if work is _STOP:
                return
            loop, fn, args, futures = work
            try:
                result, error = fn(*args), None
            except BaseException as exc:
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
                loop.call_soon_threadsafe(_settle, futures, result, error)

    async def close(self) -> None:
        """Let the queued calls finish, then end the thread (bounded: every call is)."""
        thread = self._thread
        if thread is None:
            return
        self._thread = None
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        self._queue.put((loop, lambda: None, (), [ended]))
        self._queue.put(_STOP)
        await asyncio.shield(ended)
        thread.join()


def _settle(futures: list[asyncio.Future[Any]], result: Any, error: BaseException | None) -> None:
    for future in futures:
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def _cancel_all(batch: list[tuple[Any, bool]]) -> None:
    for generator, force in batch:
        with contextlib.suppress(Exception):  # it ended, or the cluster is gone
            ray.cancel(generator, force=force)


def node_table(timeout: float) -> dict[str, tuple[bool, tuple[str, int]]]:
    """The cluster's nodes, from its head.

    ``{node id: (alive, (raylet address, port))}`` from the cluster's head, within ``timeout``
    seconds (raises if the head does not answer).
    """
    client: Any = cast(Any, ray._private.worker.global_worker).gcs_client
    table = client.get_all_node_info(timeout=timeout)
    out = {}
    for node_id, info in table.items():
        alive = info.state == 0  # GcsNodeInfo.ALIVE
        out[node_id.hex()] = (alive, (info.node_manager_address, int(info.node_manager_port)))
    return out


def gcs_reachable() -> bool:
    try:
        client: Any = cast(Any, ray._private.worker.global_worker).gcs_client
        client.internal_kv_exists(b"zett-agent-ping", None, timeout=2)
    except Exception:
        return False
    return True


class Reapers:
    """The reaper actors of this driver, one per node, created on demand."""

    def __init__(self, calls: Calls) -> None:
        self._calls = calls
        self._actors: dict[tuple[str, str], Any] = {}
        #: when each reaper that has not answered yet was made: it is given time to start
        #: (``REAPER_START``), and its start allowance runs from then
        self._born: dict[int, float] = {}
        self._remote: Any = None
        self._warming: dict[str, asyncio.Task[None]] = {}

    def get(self, node_id: str) -> Any:
        """The node's reaper (created if there is none: it starts in the background)."""
        key = (ray.get_runtime_context().get_job_id(), node_id)
        actor = self._actors.get(key)
        if actor is None:
            if self._remote is None:
                self._remote = ray.remote(Reaper)
            actor = self._remote.options(
                num_cpus=0,
                max_restarts=0,
                max_concurrency=16,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote()
            self._actors[key] = actor
            self._born[id(actor)] = time.monotonic()
        return actor

    async def call(
        self, node_id: str, method: str, *args: Any, budget: float, deadline: float
    ) -> Any:
        """Call ``reaper.method(*args)`` on the node's reaper, replaced while it does not answer.

        The reaper is pinged first, and must answer within ``REAPER_ANSWER`` seconds (plus
        ``REAPER_START`` once, while a new one starts); the call then gets ``budget`` seconds of
        work plus ``REAPER_ANSWER``. A reaper that does not answer in time (stopped, overloaded)
        or died is killed and replaced, and the call made again, until ``deadline`` (then
        ``TimeoutError``). So a stopped reaper costs a kill ``REAPER_ANSWER`` seconds, not the
        kill's whole budget.
        """
        while True:
            if deadline - time.monotonic() <= 0:
                raise TimeoutError(f"no reaper on node {node_id[:12]} answered in time")
            actor = self.get(node_id)
            start = REAPER_START if id(actor) in self._born else 0.0
            steps: list[tuple[str, tuple[Any, ...], float]] = []
            if method != "ping":
                steps.append(("ping", (), REAPER_ANSWER + start))
                start = 0.0
            steps.append((method, args, budget + REAPER_ANSWER + start))
            try:
                for name, arguments, allowed in steps:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    ref = getattr(actor, name).remote(*arguments)
                    try:
                        result = await asyncio.wait_for(_await(ref), min(left, allowed))
                    except TimeoutError:
                        if left < allowed and self._starting(actor):
                            # the caller's deadline came first while a new reaper is within its
                            # start allowance (counted from when it was made): kept for the
                            # next call; one that never answers is judged once that is used
                            raise _DeadlinePassed(node_id) from None
                        raise
                    self._born.pop(id(actor), None)  # answered: started
            except _DeadlinePassed:
                raise TimeoutError(
                    f"the reaper on node {node_id[:12]} did not answer before the deadline"
                ) from None
            except (TimeoutError, rex.RayActorError, rex.ActorUnavailableError) as error:
                log.info(
                    "the reaper on node %s did not answer (%r); a new one", node_id[:12], error
                )
                self._drop(actor)
                await self._calls.run(_kill_actor, actor)
                continue
            return result

    def prepare(self, node_id: str) -> asyncio.Task[None]:
        """Start the node's reaper now and have it answer once in the background.

        A reaper that answered once gets no start-up allowance any more, so one that stops
        answering later (a child stopped it, where the kernel lets it) is replaced within
        ``REAPER_ANSWER`` of a kill's work. Returns the background task (one per node).
        """
        task = self._warming.get(node_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._ping(node_id))
            self._warming[node_id] = task
        return task

    async def _ping(self, node_id: str) -> None:
        deadline = time.monotonic() + REAPER_START + REAPER_ANSWER
        with contextlib.suppress(Exception):
            await self.call(node_id, "ping", budget=0.0, deadline=deadline)

    def _starting(self, actor: Any) -> bool:
        """Whether ``actor`` never answered yet and is still within its start allowance."""
        born = self._born.get(id(actor))
        return born is not None and time.monotonic() - born < REAPER_START + REAPER_ANSWER

    def _drop(self, actor: Any) -> None:
        self._born.pop(id(actor), None)
        for key, known in list(self._actors.items()):
            if known is actor:
                del self._actors[key]

    async def close(self) -> None:
        """End this runner's reapers (bounded: ``ray.kill`` is) and forget them."""
        actors = list(self._actors.values())
        self.clear()
        for actor in actors:
            with contextlib.suppress(Exception):
                await self._calls.run(_kill_actor, actor)

    def clear(self) -> None:
        """Forget every reaper (they end with this driver's connection); stop the pings."""
        for task in self._warming.values():
            task.cancel()
        self._warming.clear()
        self._actors.clear()
        self._born.clear()


class _DeadlinePassed(Exception):
    """A reaper call ran out of its caller's time before its reaper's own allowance."""


async def _await(ref: Any) -> Any:
    return await ref


def _kill_actor(actor: Any) -> None:
    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)
