"""``RayRunner``: children as Ray tasks, on one machine or a cluster (the ``ray`` extra).

::

    runner = RayRunner(address=None)          # None: start or join a local Ray
    job = await runner.submit_function(crunch, 10**8, limits=ProcessLimits(timeout=30))
    async for event in job.events():          # what crunch passed to emit()
        ...
    await job.wait()
    print(job.result())                       # or: await job.cancel()
    await runner.close()

Each child is one Ray generator task (``max_retries=0``: a child with side effects never runs
twice unless asked), by default on a fresh worker process (``max_calls=1``). The task streams
JSON text: progress events, then the result, which the parent parses with ``json.loads``
(the report's shape is checked as with processes). The job object offers what a
``zett_agent.process.ProcessJob`` offers the subagent extensions: ``events()``, ``done()``,
``wait()``, ``result()``, ``exception()``, ``cancel(grace=None)``, ``usage()``, ``pid`` (the Ray
worker's, while it runs), plus ``node_id``.

Kill and cleanup: while a task runs its worker is a child subreaper, so everything the child
starts stays in the worker's process tree, ``setsid`` double forks included. Cancel, timeout and
``close()`` have a per-node reaper (a small Ray actor, ``num_cpus=0``, created on the node the
first time a child runs there) freeze and SIGKILL the worker's whole tree and wait until it is
dead; then ``ray.cancel(ref, force=True)`` and the task's end as Ray reports it. ``cancel()``
returns once both happened. A child that ends normally or raises kills its own leftovers before
it reports. Ray alone kills only a worker's direct children, and only when the worker exits on
its own terms (measured on Ray 2.60: a force-cancelled worker's ``setsid`` grandchild lived on).

Typed outcomes, as with processes: ``JobFailed`` (the function raised), ``WorkerCrashed`` (the
worker died; the signal name when faulthandler saw it: SIGSEGV, SIGABRT, SIGBUS, SIGFPE,
SIGILL), ``JobTimeout`` (enforced from the host), ``LimitExceeded`` (``cpu_seconds``,
``memory_bytes``), ``JobCancelled``, ``PoolClosed`` (the runner was closed), and ``NodeLost``
(the node running the child died or left the cluster, or the cluster went away).

Limits: ``memory_bytes`` becomes Ray's ``memory=`` request (scheduling) and an ``RLIMIT_AS`` of
that many bytes *beyond what the worker already maps* (a Ray worker maps hundreds of MiB before
the child runs); ``cpu_seconds`` an ``RLIMIT_CPU`` beyond the CPU time the worker already used;
``max_open_files``, ``env`` and ``cwd`` as in the process engine. Any child-side limit forces a
fresh worker. CPUs are Ray's ``num_cpus`` (the runner's, or per submit).

Trust: Ray moves every value through its object store with pickle, so the guarantee that the
parent never unpickles bytes a child wrote does not hold on Ray: a Ray cluster is one trust
domain (no authentication by default; keep it on a private network).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import ray
import ray.exceptions as rex
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from zett_agent.extensions._child import ChildSpec, run_child
from zett_agent.process import (
    JobCancelled,
    JobFailed,
    JobTimeout,
    JobUsage,
    LimitExceeded,
    PoolClosed,
    ProcessError,
    ProcessLimits,
    WorkerCrashed,
)
from zett_agent.runners import _ray_task
from zett_agent.runners._ray_task import emit

__all__ = ["NodeLost", "RayJob", "RayRunner", "emit"]

log = logging.getLogger(__name__)

#: objects a running task may have in flight before its generator pauses (backpressure)
STREAM_BACKPRESSURE = 256

#: one reaper actor per node, shared by the runners of this process while Ray stays connected
_REAPERS: dict[str, Any] = {}


class NodeLost(ProcessError):
    """The Ray node running the child died or left the cluster (or the whole cluster went away).

    ``node_id`` is the node's hex id (``None`` when the child had not started yet); ``detail``
    is Ray's first line about it.
    """

    def __init__(self, node_id: str | None, detail: str = "") -> None:
        self.node_id = node_id
        self.detail = detail
        super().__init__(node_id, detail)

    def __str__(self) -> str:
        where = f"the Ray node {self.node_id[:12]}" if self.node_id else "its Ray node"
        detail = f" ({self.detail})" if self.detail else ""
        return (
            f"{where} died or left the cluster while the child ran{detail}; the child was not "
            "retried (max_retries=0): start it again"
        )[:500]

    def __reduce__(self) -> tuple[type[NodeLost], tuple[str | None, str]]:
        return (type(self), (self.node_id, self.detail))


class _Reaper:
    """One per node (a Ray actor): kills task trees there and reads crash notes."""

    def kill(self, pid: int, start: int, token: str, timeout: float) -> list[int]:
        try:
            same = _ray_task._start_time(pid) == start
        except OSError:
            same = False
        # a worker already gone left nothing but what carries the task's marker
        return _ray_task.kill_tree(
            pid if same else None, include_root=same, token=token, timeout=timeout
        )

    def crash(self, crash_file: str, token: str) -> str | None:
        """The fatal signal of a crashed worker (or ``None``); kills what its child left."""
        _ray_task.kill_tree(None, include_root=False, token=token)
        return _ray_task.crash_signal(crash_file)

    def ping(self) -> bool:
        return True


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


class RayJob:
    """One child running as a Ray generator task. Create it with ``RayRunner.submit...``.

    ``wait()`` waits without raising; ``result()``/``exception()`` read the outcome once
    ``done()``. ``cancel()`` kills the worker's process tree on its node and returns once it
    is dead and Ray reported the task ended. Every outcome is reached within a bound: a task
    whose node or cluster went away ends as ``NodeLost``.
    """

    def __init__(
        self,
        runner: RayRunner,
        generator: Any,
        limits: ProcessLimits,
        token: str,
        name: str,
    ) -> None:
        self._runner = runner
        self._gen = generator
        self.limits = limits
        self.name = name
        self._token = token
        #: the Ray worker's pid while the child runs, else None
        self.pid: int | None = None
        #: hex id of the Ray node the child runs (or ran) on, once it started
        self.node_id: str | None = None
        self._start: int | None = None
        self._crash_file: str | None = None
        self._loop = asyncio.get_running_loop()
        self._done: asyncio.Future[None] = self._loop.create_future()
        self._started = asyncio.Event()
        self._events: deque[Any] = deque()
        self._event_waiter: asyncio.Future[None] | None = None
        self._consumer = False
        self._result: Any = None
        self._exception: BaseException | None = None
        self._kill_reason: BaseException | None = None
        self._killing: asyncio.Task[None] | None = None
        self._submitted = time.monotonic()
        self._ended: float | None = None
        self._cpu = 0.0
        self._peak = 0
        #: armed when the child starts running (time queued in Ray does not count)
        self._timer: asyncio.TimerHandle | None = None
        self._pump = self._loop.create_task(self._run(), name=f"zett-ray-{name}")

    def __repr__(self) -> str:
        state = "done" if self.done() else "running" if self.pid else "pending"
        return f"<RayJob {self.name} {state} pid={self.pid} node={(self.node_id or '')[:12]}>"

    # -- outcome ----------------------------------------------------------------------------

    def done(self) -> bool:
        """Whether the job ended (completed, failed or cancelled)."""
        return self._done.done()

    def result(self) -> Any:
        """The child's result (parsed JSON); raises its error. ``RuntimeError`` if not done."""
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

    async def cancel(self, grace: float | None = None) -> None:
        """Kill the child and return once its worker's tree is dead and Ray reported the end.

        ``grace`` is accepted for the runner interface; Ray children are killed at once. The
        job ends with ``JobCancelled`` unless another outcome (a timeout) was already being
        enforced. No-op for a finished job. If the caller is cancelled, the kill goes on.
        """
        await asyncio.shield(self._kill(JobCancelled()))

    def usage(self) -> JobUsage:
        """CPU seconds and peak RSS of the worker while it ran the child (known at the end).

        Live numbers are not read from remote nodes: while running, only ``elapsed`` moves.
        """
        end = self._ended if self._ended is not None else time.monotonic()
        return JobUsage(self._cpu, 0, self._peak, end - self._submitted)

    # -- events -----------------------------------------------------------------------------

    def events(self) -> AsyncIterator[Any]:
        """What the child passed to ``emit()``, in order; ends when the job ends.

        One consumer per job (a second call raises ``RuntimeError``); the iterator does not
        raise the job's error.
        """
        if self._consumer:
            raise RuntimeError(f"events() of {self!r} already has a consumer")
        self._consumer = True
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        while True:
            if self._events:
                yield self._events.popleft()
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

    # -- supervision ------------------------------------------------------------------------

    async def _run(self) -> None:
        error: BaseException | None = None
        final: dict[str, Any] | None = None
        try:
            async for ref in self._gen:
                message = json.loads(await ref)
                kind = message.get("k")
                if kind == "start":
                    self.pid = int(message["pid"])
                    self._start = int(message["start"])
                    self.node_id = str(message["node"])
                    self._crash_file = str(message["crash_file"])
                    self._started.set()
                    if self.limits.timeout is not None:
                        self._timer = self._loop.call_later(self.limits.timeout, self._on_timeout)
                    self._runner._reaper(self.node_id)  # ready before a cancel needs it
                elif kind == "e":
                    self._events.append(message["v"])
                    self._wake()
                else:
                    final = message
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Ray's own errors: the worker, the node, the cluster
            if final is None:
                error = await self._ray_error(exc)
            else:
                # the child's outcome arrived; a fresh worker (max_calls=1) that exits right
                # after can make Ray report its lease failed (seen on Ray 2.60): not the child's
                log.debug("Ray error after the outcome of %s: %s", self.name, _first_line(exc))
        self._finish(final, error)

    async def _ray_error(self, error: BaseException) -> BaseException:
        if self._kill_reason is not None:
            return self._kill_reason
        if isinstance(error, rex.TaskCancelledError):
            return JobCancelled()
        if isinstance(error, rex.NodeDiedError | rex.LocalRayletDiedError):
            return NodeLost(self.node_id, _first_line(error))
        if isinstance(error, rex.WorkerCrashedError | rex.OutOfMemoryError):
            if self.node_id is None:
                self._start_from_kv()
            if self.node_id is not None and not await self._runner._node_alive(self.node_id):
                return NodeLost(self.node_id, _first_line(error))
            signal_name = await self._crash_signal()
            if signal_name == "SIGXCPU" and self.limits.cpu_seconds is not None:
                return LimitExceeded("cpu_seconds", self.limits.cpu_seconds, None)
            if self.limits.memory_bytes is not None and (
                signal_name is not None or isinstance(error, rex.OutOfMemoryError)
            ):
                return LimitExceeded("memory_bytes", self.limits.memory_bytes, None)
            return WorkerCrashed(None, signal_name)
        if self._runner._closed:
            return PoolClosed("the RayRunner was closed before the child finished")
        return NodeLost(self.node_id, f"{type(error).__name__}: {_first_line(error)}")

    def _start_from_kv(self) -> None:
        """Learn where the child ran from the note its task left in the cluster's store."""
        from ray.experimental import internal_kv

        key = f"zett-ray/{self._token}"
        try:
            note = internal_kv._internal_kv_get(key, namespace=_ray_task.KV_NAMESPACE)
            internal_kv._internal_kv_del(key, namespace=_ray_task.KV_NAMESPACE)
        except Exception:
            return
        if note:
            start = json.loads(note)
            self.node_id = str(start["node"])
            self._crash_file = str(start["crash_file"])

    async def _crash_signal(self) -> str | None:
        if self.node_id is None:
            self._start_from_kv()
        if self.node_id is None or self._crash_file is None:
            return None
        reaper = self._runner._reaper(self.node_id)
        try:
            ref = reaper.crash.remote(self._crash_file, self._token)
            return await asyncio.wait_for(_awaitable(ref), self._runner.reaper_timeout)
        except Exception:
            log.debug("could not read the crash note of %s", self.name, exc_info=True)
            return None

    def _finish(self, final: dict[str, Any] | None, error: BaseException | None) -> None:
        if self.done():
            return
        if self._timer is not None:
            self._timer.cancel()
        if error is None and self._kill_reason is not None:
            error = self._kill_reason  # a result that raced the kill does not count
        if error is None:
            error = self._outcome(final)
        self._exception = error
        self.pid = None
        self._ended = time.monotonic()
        self._done.set_result(None)
        self._wake()
        self._runner._jobs.discard(self)

    def _outcome(self, final: dict[str, Any] | None) -> BaseException | None:
        if final is None:
            return WorkerCrashed(None, None)
        self._cpu = float(final.get("cpu", 0.0))
        self._peak = int(final.get("peak", 0))
        kind = final.get("k")
        if kind == "r":
            self._result = final.get("v")
            return None
        if kind == "lim":
            return LimitExceeded(str(final["limit"]), float(final["value"]), None)
        if kind == "x":
            return JobFailed(str(final.get("t")), str(final.get("m")), str(final.get("tb", "")))
        return WorkerCrashed(None, None)

    def _on_timeout(self) -> None:
        if not self.done() and self.limits.timeout is not None:
            self._loop.create_task(self._kill(JobTimeout(self.limits.timeout)))

    async def _kill(self, reason: BaseException) -> None:
        if self.done():
            return
        if self._killing is None:
            self._kill_reason = reason
            self._killing = self._loop.create_task(self._do_kill())
        await asyncio.shield(self._killing)

    async def _do_kill(self) -> None:
        runner = self._runner
        if self.pid is not None and self.node_id is not None and self._start is not None:
            reaper = runner._reaper(self.node_id)
            try:
                ref = reaper.kill.remote(self.pid, self._start, self._token, runner.reaper_timeout)
                await asyncio.wait_for(_awaitable(ref), runner.reaper_timeout + 5)
            except Exception:
                # the node (or the reaper) is gone; Ray's own cancel below is all there is
                log.debug(
                    "reaper on %s did not answer for %s", self.node_id, self.name, exc_info=True
                )
        with contextlib.suppress(Exception):
            ray.cancel(self._gen, force=True)
        try:
            await asyncio.wait_for(asyncio.shield(self._done), runner.end_timeout)
        except TimeoutError:
            # Ray never reported the end (its control plane is gone): settle here, bounded
            self._pump.cancel()
            self._finish(None, self._kill_reason)


def _awaitable(ref: Any) -> Any:
    async def get() -> Any:
        return await ref

    return get()


class RayRunner:
    """Runs children as Ray tasks; the Ray counterpart of the process runner.

    Args:
        address: ``None`` starts or joins a local Ray (an already initialized Ray in this
            process is used as is); ``"auto"`` or ``"ray://host:port"`` or ``"host:port"``
            joins an existing cluster.
        num_cpus: Ray CPUs each child requests (default 1).
        resources: Ray custom resources each child requests (placement), e.g. ``{"gpu_box": 1}``.
        limits: Default ``ProcessLimits`` for definitions and calls that set none.
        max_retries: Ray retries of a child whose worker died (default 0: never run twice).
        fresh_workers: A new worker process per child (Ray's ``max_calls=1``; default). Off,
            children without child-side limits reuse idle workers (faster start, but a child
            can leave module state behind for the next).
        init_kwargs: Extra ``ray.init`` arguments when this runner connects. By default the
            workers' output is not forwarded to this process (``log_to_driver=False``) and a
            local Ray started here listens on 127.0.0.1 only.
        reaper_timeout: Seconds a node's reaper may take to kill a tree.
        end_timeout: Seconds to wait for Ray to report a killed task's end before the job
            settles anyway (its node or the cluster is gone).
    """

    #: the interface the extension reads; Ray children are killed at once (no SIGTERM first)
    kill_grace = 0.0

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: float = 1.0,
        resources: Mapping[str, float] | None = None,
        limits: ProcessLimits | None = None,
        max_retries: int = 0,
        fresh_workers: bool = True,
        init_kwargs: Mapping[str, Any] | None = None,
        reaper_timeout: float = 20.0,
        end_timeout: float = 15.0,
    ) -> None:
        if num_cpus < 0:
            raise ValueError(f"num_cpus must be >= 0, got {num_cpus}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.address = address
        self.num_cpus = num_cpus
        self.resources = dict(resources or {})
        self.limits = limits
        self.max_retries = max_retries
        self.fresh_workers = fresh_workers
        self.init_kwargs = dict(init_kwargs or {})
        self.reaper_timeout = reaper_timeout
        self.end_timeout = end_timeout
        self._remote: Any = None
        self._jobs: set[RayJob] = set()
        self._initialized_here = False
        self._closed = False

    # -- connection -------------------------------------------------------------------------

    def connect(self) -> None:
        """Connect to Ray (start a local one for ``address=None``) unless already connected.

        Blocks the calling thread while Ray starts (seconds for a local Ray): call it before
        serving requests. Submitting connects on first use.
        """
        if self._closed:
            raise RuntimeError("this RayRunner is closed; create a new one")
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"log_to_driver": False}
            if self.address is None:
                kwargs["_node_ip_address"] = "127.0.0.1"
            kwargs.update(self.init_kwargs)
            ray.init(address=self.address, **kwargs)
            self._initialized_here = True
        if self._remote is None:
            self._remote = {
                True: ray.remote(max_calls=1)(_ray_task.run_task_fresh),
                False: ray.remote(_ray_task.run_task_reused),
            }
            self._reaper_class = ray.remote(_Reaper)

    def warm_up(self) -> None:
        """Nothing to boot ahead: Ray keeps its own idle workers (connecting blocks, see
        ``connect``)."""

    # -- submitting -------------------------------------------------------------------------

    async def submit(self, spec: ChildSpec) -> RayJob:
        """Start one subagent child (``run_child``) as a Ray task; the extensions call this."""
        limits = spec.definition.limits or self.limits
        return await self._submit(run_child, (spec,), {}, limits, None, None, pass_emit=True)

    async def submit_function(
        self,
        fn: Callable[..., Any],
        *args: Any,
        limits: ProcessLimits | None = None,
        num_cpus: float | None = None,
        resources: Mapping[str, float] | None = None,
        **kwargs: Any,
    ) -> RayJob:
        """Run ``fn(*args, **kwargs)`` (sync or async) as a Ray task and return its job.

        Inside, ``zett_agent.runners.ray.emit(obj)`` streams a JSON-compatible event to the
        parent; ``fn`` returns JSON-compatible data. ``num_cpus``/``resources`` override the
        runner's for this call.

        Raises:
            RuntimeError: If the runner is closed.
            TypeError: If ``fn`` or its arguments cannot be pickled for Ray.
        """
        return await self._submit(fn, args, kwargs, limits or self.limits, num_cpus, resources)

    async def _submit(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        limits: ProcessLimits | None,
        num_cpus: float | None,
        resources: Mapping[str, float] | None,
        *,
        pass_emit: bool = False,
    ) -> RayJob:
        if self._closed:
            raise RuntimeError("this RayRunner is closed; create a new one to start children")
        self.connect()
        limits = limits or ProcessLimits()
        options: dict[str, Any] = {
            "num_cpus": self.num_cpus if num_cpus is None else num_cpus,
            "resources": dict(self.resources if resources is None else resources),
            "max_retries": self.max_retries,
            "retry_exceptions": False,
            "_generator_backpressure_num_objects": STREAM_BACKPRESSURE,
        }
        fresh = self.fresh_workers or limits.applies_in_child
        if limits.memory_bytes is not None:
            options["memory"] = limits.memory_bytes
        token = uuid.uuid4().hex
        try:
            generator = (
                self._remote[fresh]
                .options(**options)
                .remote(fn, args, kwargs, limits.child_spec(), token, pass_emit)
            )
        except Exception as error:
            if "pickle" in str(error).lower() or isinstance(error, TypeError):
                raise TypeError(f"cannot ship {fn!r} to Ray: {error}") from error
            raise
        name = getattr(fn, "__qualname__", "job")
        job = RayJob(self, generator, limits, token, f"{name}-{token[:8]}")
        self._jobs.add(job)
        return job

    # -- per-node helpers -------------------------------------------------------------------

    def _reaper(self, node_id: str) -> Any:
        reaper = _REAPERS.get(node_id)
        if reaper is None:
            reaper = self._reaper_class.options(
                num_cpus=0,
                max_restarts=0,
                max_concurrency=16,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote()
            _REAPERS[node_id] = reaper
        return reaper

    async def _node_alive(self, node_id: str) -> bool:
        """Whether the node answers (through its reaper), within ``reaper_timeout``."""
        try:
            ref = self._reaper(node_id).ping.remote()
            await asyncio.wait_for(_awaitable(ref), self.reaper_timeout)
        except Exception:
            return False
        return True

    # -- closing ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Kill every running child (``PoolClosed``) and disconnect if this runner connected.

        The per-node reapers are shared by the runners of this process and end when Ray is
        disconnected. Bounded even when the cluster is gone. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        jobs = list(self._jobs)
        await asyncio.gather(
            *(job._kill(PoolClosed("the RayRunner was closed")) for job in jobs),
            return_exceptions=True,
        )
        if self._initialized_here:
            # the reapers are actors of this driver: they end with it
            _REAPERS.clear()
            if self._gcs_reachable():
                ray.shutdown()
            else:
                # ray.shutdown() waits for the lost cluster; Ray ends this driver process
                # after gcs_rpc_server_reconnect_timeout_s (60 s by default)
                log.warning("the Ray cluster is gone; not disconnecting from it")

    def _gcs_reachable(self) -> bool:
        try:
            client: Any = getattr(ray._private.worker.global_worker, "gcs_client", None)
            client.internal_kv_exists(b"zett-agent-ping", None, timeout=2)
        except Exception:
            return False
        return True
