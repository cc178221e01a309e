"""The node side of a Ray child: the process pools of one Ray worker, and one child's run there.

A Ray worker that runs a child of ``RayRunner`` keeps, for the rest of its life, an asyncio
event loop in a thread of its own (``NodeHost``) and on it one ``ProcessPool`` per
configuration (containment, budgets, preload). Each child runs as a job of that pool, in a
fresh worker process of it: its code never runs in the Ray worker, and it has everything the
engine gives a job (its containment, its Landlock domain, its limits, its sandbox, bounded
decoding of what it sends). The Ray task's own thread (``_ray_task``) only passes what the job
does on to the driver: a ``NodeRun`` is the meeting point of the two threads.

A pool's launcher is forked by the node's zygote for the runner's secret and the pool's
preload (``NodeConfig.zygote``, ``process._child._zygote``), which imports the pool's modules
once for every Ray worker of the node; a pool whose zygote gives none starts its own. The
pools are started from the loop's thread, which lives as long as the Ray worker process,
because a spawned launcher's parent-death signal fires when the thread that started it ends.
When the Ray worker dies (a force cancel, its driver's death, Ray ending an idle worker),
every launcher sees its host go and kills every tree it started, as with any dead host (the
runner asks Ray not to kill a worker's children itself, see ``RayRunner``).

Imported by Ray workers (never by the pools' launchers and workers); it imports no Ray.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from zett_agent.process import PoolClosed, ProcessError, ProcessPool
from zett_agent.process._host._job import set_event_filter
from zett_agent.process._host._pool import use_zygote
from zett_agent.process._host._zygote_client import Zygote
from zett_agent.runners._preload import excluded
from zett_agent.runners._ray._ray_errors import encode_error
from zett_agent.runners._ray._ray_inbox import NodeInbox
from zett_agent.runners._ray._ray_payload import run_payload
from zett_agent.runners._ray._ray_views import process_start, views

if TYPE_CHECKING:
    from zett_agent.process import ProcessJob, ProcessLimits, Sandbox

__all__ = ["NodeConfig", "NodeHost", "NodeRun", "host"]

log = logging.getLogger(__name__)

#: seconds between two usage reports of a running child
USAGE_PERIOD = 1.0
#: items a run holds for the Ray task's thread before its job's events wait (backpressure)
MAX_QUEUED = 8
#: seconds a run waits for its tree to be confirmed gone after the outcome
GONE_TIMEOUT = 30.0
#: seconds a run waits for the model calls it brokered to close after the outcome
BROKER_CLOSE_TIMEOUT = 10.0
#: seconds a node's zygote lives on once no pool of it is left (a Ray worker keeps its pool
#: while Ray keeps the worker)
ZYGOTE_IDLE = 60.0
#: what every pool of a node preloads beyond a configuration's modules (light: not this one)
NODE_MODULES = ("zett_agent.runners._ray._ray_payload",)


@dataclass(frozen=True)
class NodeConfig:
    """What shapes a node's pool; a Ray worker keeps one pool per distinct configuration."""

    containment: str = "auto"
    max_frame_bytes: int = 64 * 1024 * 1024
    max_buffered_events: int = 1024
    max_buffered_bytes: int = 256 * 1024 * 1024
    preload: tuple[str, ...] = ()
    spare_workers: int = 1
    #: the runner's secret (hex) for the node's zygote, which imports once for the pools of
    #: every Ray worker of the node (``process._child._zygote``); "" for none
    zygote: str = ""

    def pool(self, preload: tuple[str, ...]) -> ProcessPool:
        pool = ProcessPool(
            # one child at a time per Ray worker; a second slot for the next one while the
            # last one's tree is being confirmed dead
            max_workers=2,
            spare_workers=self.spare_workers,
            max_frame_bytes=self.max_frame_bytes,
            max_buffered_events=self.max_buffered_events,
            max_buffered_bytes=self.max_buffered_bytes,
            preload=preload,
            containment=self.containment,
        )
        if self.zygote:
            # the raylet's end (the node's) ends the zygote; Ray starts every worker from it
            raylet = os.getppid()
            start = process_start(raylet)
            watch = None if start is None else (raylet, start)
            use_zygote(pool, Zygote(bytes.fromhex(self.zygote), watch, ZYGOTE_IDLE))
        return pool


class NodeHost:
    """The pools of this Ray worker process, on an event loop in a daemon thread of their own.

    Created once per process (``host()``) and never closed: the process's end ends it, and
    every launcher then kills what it started.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._pools: dict[NodeConfig, ProcessPool] = {}
        self._starting: dict[NodeConfig, asyncio.Future[ProcessPool]] = {}
        self._thread = threading.Thread(target=self._serve, name="zett-ray-node", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def pool(self, config: NodeConfig) -> ProcessPool:
        """The started pool for ``config``.

        The started pool for ``config`` (started on first use; ``ProcessError`` if it cannot start
        even without the configuration's own modules).
        """
        pool = self._pools.get(config)
        if pool is not None:
            return pool
        starting = self._starting.get(config)
        if starting is None:
            starting = self._starting[config] = self.loop.create_task(self._start(config))
            starting.add_done_callback(lambda _: self._starting.pop(config, None))
        return await asyncio.shield(starting)

    async def _start(self, config: NodeConfig) -> ProcessPool:
        """Start a pool for ``config``: its modules preloaded, else only the engine's.

        The agent runtime only when the configuration asks for it (a child agent's does; a
        function of ``submit_function`` never runs it): it is most of a launcher's start.
        """
        engine = tuple(name for name in config.preload if excluded(name, ("zett_agent",)))
        base = tuple(dict.fromkeys((*NODE_MODULES, *engine)))
        wanted = tuple(dict.fromkeys((*base, *config.preload)))
        for preload in dict.fromkeys((wanted, base)):
            pool = config.pool(preload)
            try:
                await pool.start()
            except ProcessError as exc:
                if preload == base:
                    raise
                log.warning("a node pool could not preload %s (%s); without them", wanted, exc)
                continue
            self._pools[config] = pool
            return pool
        raise AssertionError("unreachable")

    def forget(self, config: NodeConfig, pool: ProcessPool) -> None:
        """Drop a pool that gave up on its launcher (the next run starts a new one)."""
        if self._pools.get(config) is pool:
            del self._pools[config]
            self.loop.create_task(pool.close())


_host: NodeHost | None = None
_host_lock = threading.Lock()


def host() -> NodeHost:
    """This process's ``NodeHost``, started on first use."""
    global _host
    with _host_lock:
        if _host is None:
            _host = NodeHost()
        return _host


class NodeRun:
    """One child on this node, between the Ray task's thread and the node's event loop.

    The loop side gets the pool ready and reports ``("ready", tree)``, then opens the child's
    inbox (``("inbox", path, key)``: where the driver sends the child messages, ``_ray_inbox``)
    while the task's thread notes where the child runs; once that thread said ``go()`` it
    submits the job and passes on, in order: ``("pid", pid)``, ``("sandbox", entry)``,
    ``("event", value)`` for each event, ``("usage", numbers)`` about once a second when they
    changed, ``("result", value, usage)`` if the job completed, and last ``("end", record)``:
    the outcome's error record (``None`` for a result), whether the job's tree was confirmed
    gone, its CPU seconds and peak memory. The task's thread reads them with ``batches()``;
    while it holds ``MAX_QUEUED`` of them the job's events wait (the pool then stops reading
    the child, whose ``emit`` blocks).

    Cancellation: ``cancel()`` (from the task's thread) kills the job's tree through the pool;
    the ``end`` item then follows once the tree is gone, and ``wait_end`` returns whether it is.
    """

    def __init__(
        self,
        host: NodeHost,
        config: NodeConfig,
        payload: bytes,
        limits: ProcessLimits,
        sandbox: Sandbox | None,
        models: list[Any] | None,
        brokered: bool,
    ) -> None:
        self._host = host
        self._loop = host.loop
        self._config = config
        self._payload = payload
        self._limits = limits
        self._sandbox = sandbox
        self._models = models
        self._brokered = brokered
        self._lock = threading.Lock()
        self._items: deque[tuple[Any, ...]] = deque()
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._ended: concurrent.futures.Future[bool] = concurrent.futures.Future()
        #: the task's thread is done with the run (``close``)
        self._left = False
        # loop side only
        self._go: asyncio.Event | None = None
        self._room: asyncio.Event | None = None
        self._cancelled = False
        self._job: ProcessJob | None = None
        self._pid_sent = False
        self._sandbox_sent = False
        self._usage_timer: asyncio.TimerHandle | None = None
        self._reported: dict[str, Any] = {}
        self._inbox: NodeInbox | None = None

    # -- the Ray task's thread ------------------------------------------------------------------

    def start(self) -> None:
        """Begin the run on its host's loop; the loop side then reports through ``batches()``."""
        self._loop.call_soon_threadsafe(self.begin)

    def batches(self, interrupt_fd: int) -> Iterator[list[tuple[Any, ...]]]:
        """What the loop side passed on since the last batch, in order; blocks in between.

        The last batch ends with ``("end", ...)``.

        ``interrupt_fd`` is the main thread's signal wakeup descriptor (or -1): a Ray cancel
        trips SIGINT, which writes to it, so the wait wakes and Python raises
        ``KeyboardInterrupt`` at once; without one the wait wakes ten times a second to let
        Python look for it.
        """
        import select

        poller = select.poll()
        poller.register(self._wake_read, select.POLLIN)
        if interrupt_fd >= 0:
            poller.register(interrupt_fd, select.POLLIN)
        while True:
            with self._lock:
                batch = list(self._items)
                self._items.clear()
            if batch:
                self._loop.call_soon_threadsafe(self._freed)
                for n, item in enumerate(batch):
                    if item[0] == "end":
                        yield batch[: n + 1]
                        return
                yield batch
                continue
            poller.poll(-1 if interrupt_fd >= 0 else 100)
            for fd in (self._wake_read, interrupt_fd):
                if fd >= 0:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(fd, 4096):
                            pass

    def go(self) -> None:
        """Submit the job (after ``ready``: the task has noted where it runs)."""
        self._loop.call_soon_threadsafe(self._start_job)

    def cancel(self) -> None:
        """Kill the job's whole tree (or drop it before it starts); thread-safe, idempotent."""
        self._loop.call_soon_threadsafe(self._cancel)

    def wait_end(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the end; whether the job's tree is confirmed gone."""
        try:
            return self._ended.result(timeout)
        except concurrent.futures.TimeoutError:
            return False

    def close(self) -> None:
        """Tell the run that the task's thread is done with it.

        The task's thread is done with the run: its descriptors are released once the run ended too
        (the loop side may still write to them until then).
        """
        with self._lock:
            self._left = True
            ended = self._ended.done()
        if ended:
            self._release()

    def _release(self) -> None:
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- the loop's side ------------------------------------------------------------------------

    def begin(self) -> None:
        self._go = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._loop.create_task(self._run(), name="zett-ray-run")

    def _push(self, item: tuple[Any, ...]) -> None:
        with self._lock:
            if self._left:
                return  # nobody reads any more (and the descriptors may be gone)
            self._items.append(item)
            full = len(self._items) >= MAX_QUEUED
            with contextlib.suppress(OSError):
                os.write(self._wake_write, b"\0")
        if full and self._room is not None:
            self._room.clear()

    def _freed(self) -> None:
        with self._lock:
            room = len(self._items) < MAX_QUEUED
        if room and self._room is not None:
            self._room.set()

    async def _send(self, item: tuple[Any, ...]) -> None:
        """Pass ``item`` on once there is room; dropped once cancelled (nobody reads then)."""
        assert self._room is not None
        while not self._cancelled:
            if self._room.is_set():
                self._push(item)
                return
            await self._room.wait()

    def _start_job(self) -> None:
        assert self._go is not None
        self._go.set()

    def _cancel(self) -> None:
        self._cancelled = True
        for event in (self._go, self._room):
            if event is not None:
                event.set()
        job = self._job
        if job is not None and not job.done():
            self._loop.create_task(job.cancel())

    def _end(self, error: BaseException | None, gone: bool, cpu: float, peak: int) -> None:
        if self._usage_timer is not None:
            self._usage_timer.cancel()
        if self._inbox is not None:
            self._inbox.close()
        record = {
            "k": "end",
            "error": None if error is None else encode_error(error),
            "gone": gone,
            "cpu": round(cpu, 6),
            "peak": peak,
        }
        self._push(("end", record))
        with self._lock:
            if not self._ended.done():
                self._ended.set_result(gone)
            left = self._left
        if left:
            self._release()

    async def _run(self) -> None:
        try:
            await self._serve()
        except Exception as exc:  # a bug of ours must still end the run, and say why
            log.exception("a Ray child's run failed on its node")
            if not self._ended.done():
                self._end(ProcessError(f"the node failed to run the child: {exc}"), False, 0.0, 0)

    async def _serve(self) -> None:
        config = self._config
        try:
            pool = await self._host.pool(config)
        except ProcessError as exc:
            self._end(exc, True, 0.0, 0)
            return
        info = pool.containment_info
        launcher = int(info["launcher_pid"])
        me = os.getpid()
        tree = {
            "views": views(),
            "worker": [me, process_start(me)],
            "launcher": [launcher, process_start(launcher)],
            "cgroup": info.get("cgroup"),
            "mode": info["mode"],
        }
        self._push(("ready", tree, {k: v for k, v in info.items() if k not in ("cgroup",)}))
        await self._open_inbox()  # while the task notes where the child runs
        assert self._go is not None
        await self._go.wait()
        if self._cancelled:
            self._end(_cancelled(), True, 0.0, 0)
            return
        job = await self._submit(pool)
        if job is not None:
            await self._follow(job)

    async def _open_inbox(self) -> None:
        """Open the child's inbox and tell the driver, before anything of the job."""
        inbox = NodeInbox(lambda: self._job, self._cancel)
        try:
            await inbox.start()
        except OSError:
            log.warning("a Ray child's inbox could not be opened; it takes no messages")
            return  # the driver refuses messages to it (no inbox record)
        self._inbox = inbox
        self._push(("inbox", inbox.path, inbox.key))

    async def _submit(self, pool: ProcessPool) -> ProcessJob | None:
        """Submit the job; ``None`` once it ended without running (the end is sent)."""
        if self._brokered:
            from zett_agent.runners._child import run_pickled_child

            target: Any = run_pickled_child
        else:
            target = run_payload
        limits = replace(self._limits, timeout=None)  # the driver enforces the timeout
        for attempt in (1, 2):
            try:
                return pool.submit(target, self._payload, limits=limits, sandbox=self._sandbox)
            except PoolClosed as exc:
                # the pool gave up on its launcher (killed from outside): a new pool, once
                self._host.forget(self._config, pool)
                if attempt == 2:
                    self._end(exc, True, 0.0, 0)
                    return None
                try:
                    pool = await self._host.pool(self._config)
                except ProcessError as error:
                    self._end(error, True, 0.0, 0)
                    return None
            except (TypeError, ValueError, ProcessError) as exc:
                self._end(exc, True, 0.0, 0)
                return None
        return None

    async def _follow(self, job: ProcessJob) -> None:
        self._job = job
        broker = None
        if self._models:
            from zett_agent.runners._broker._parent import Broker

            broker = Broker(job, self._models)
            set_event_filter(job, broker.accept)
            job.add_done_callback(broker.close)
        if self._cancelled:
            self._loop.create_task(job.cancel())
        self._report_progress(job)
        self._usage_timer = self._loop.call_later(USAGE_PERIOD, self._usage, job)
        async for event in job.events():
            self._report_progress(job)
            await self._send(("event", event))
        await job.wait()
        self._report_progress(job)
        usage = job.usage()
        error = job.exception()
        if error is None:
            numbers = {"cpu": usage.cpu_seconds, "maxrss": usage.peak_rss_bytes}
            await self._send(("result", job.result(), numbers))
        gone = True
        try:
            async with asyncio.timeout(GONE_TIMEOUT):
                await job.wait_gone()
        except TimeoutError:
            gone = False
        if broker is not None:
            broker.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(BROKER_CLOSE_TIMEOUT):
                    await broker.wait_closed()
        self._end(error, gone, usage.cpu_seconds, usage.peak_rss_bytes)

    def _report_progress(self, job: ProcessJob) -> None:
        if not self._pid_sent and job.pid is not None:
            self._pid_sent = True
            self._push(("pid", job.pid))
        report = job.sandbox_report
        if not self._sandbox_sent and report is not None:
            from zett_agent.runners._process import sandbox_entry

            self._sandbox_sent = True
            self._push(("sandbox", sandbox_entry(report)))

    def _usage(self, job: ProcessJob) -> None:
        if job.done():
            return
        self._report_progress(job)
        usage = job.usage()
        numbers = {"cpu": round(usage.cpu_seconds, 6), "rss": usage.rss_bytes}
        with self._lock:
            crowded = len(self._items) >= MAX_QUEUED
        # a report is only a refresh: none while the task's thread lags, and none when nothing
        # changed (a child waiting on its model): each is a Ray item for the task to yield and
        # the driver to read, about 5 ms of CPU a second for each waiting child
        if not crowded and numbers != self._reported:
            self._reported = numbers
            self._push(("usage", numbers))
        self._usage_timer = self._loop.call_later(USAGE_PERIOD, self._usage, job)


def _cancelled() -> BaseException:
    from zett_agent.process import JobCancelled

    return JobCancelled("the Ray task was cancelled before the child started")
