"""``RayRunner``: child agents as Ray tasks, on one machine or a cluster (the ``ray`` extra).

::

    from zett_agent.runners.ray import RayRunner

    runner = RayRunner(address=None)     # None: start a local Ray; "auto", "ray://host:port"
    runner.connect()                     # optional: connect now rather than at the first child
    extension = AsyncSubAgentExtension(definitions, runner=runner)

Each child is one Ray generator task (``max_retries=0``: a child with side effects never runs
twice unless asked). The task streams JSON text (where it runs, progress events, usage, then
the outcome), which the parent parses with ``json.loads``, so the report's shape is checked as
with processes. Jobs offer the runner interface (``events()``, ``done()``, ``wait()``,
``result()``, ``exception()``, ``cancel()``, ``usage()``, ``pid``, ``info()``) plus
``node_id``. ``submit_function`` runs any function the same way (``emit`` streams its events).

Kill: the child's processes are contained on their node from before it runs (a cgroup v2 of
the task's own, else a subreaper and an environment marker: see ``_ray_contain``), and a job
reaches its outcome only once that tree is gone. Cancel, timeout and ``close()`` kill the tree
(from the host when the child runs on this machine, else through the node's reaper actor,
recreated if it died), then ``ray.cancel(ref, force=True)``; a sentinel process on the node
kills the tree whenever the worker dies, whoever killed it.

Typed outcomes, as with processes: ``JobFailed`` (the function raised), ``WorkerCrashed`` (the
worker died; the signal name when faulthandler saw it: SIGSEGV, SIGABRT, SIGBUS, SIGFPE,
SIGILL), ``JobTimeout`` (enforced from the host), ``LimitExceeded`` (``cpu_seconds``,
``memory_bytes``), ``JobCancelled``, ``PoolClosed`` (the runner was closed), and ``NodeLost``
(the node running the child died or left the cluster, or the cluster went away).

Trust: Ray moves every value through its object store with pickle, so the guarantee that the
parent never unpickles bytes a child wrote does not hold on Ray: a Ray cluster is one trust
domain (keep it on a private network).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

import ray
import ray.exceptions as rex
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from zett_agent.process import (
    JobCancelled,
    JobFailed,
    JobTimeout,
    JobUsage,
    LimitExceeded,
    PoolClosed,
    ProcessError,
    ProcessLimits,
    Sandbox,
    SandboxUnavailable,
    WorkerCrashed,
)
from zett_agent.process._limits import check_limits
from zett_agent.runners import _ray_contain, _ray_task
from zett_agent.runners._child import ChildSpec, run_child, unpicklable_part
from zett_agent.runners._ray_task import emit
from zett_agent.runners._refused import RefusedJob, unenforced

__all__ = ["NodeLost", "RayJob", "RayRunner", "emit"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: objects a running task may have in flight before its generator pauses (backpressure)
STREAM_BACKPRESSURE = 256
#: seconds a cancelled child's worker gets to exit as Ray ends it, before its cgroup is killed
WORKER_GRACE = 1.0
#: seconds a job may wait for Ray before ``info()`` says it is waiting
WAITING_AFTER = 2.0
_CONTAINMENTS = ("auto", "cgroup", "scan")
#: the per-node reaper actors by (Ray job id of this driver, node id)
_REAPERS: dict[tuple[str, str], Any] = {}
_PLACEMENT_KEYS = frozenset({"num_cpus", "resources"})


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
    """One per node and runner (a Ray actor, ``num_cpus=0``): kills task trees there, reads
    crash notes. Removes what dead workers left when it starts."""

    def __init__(self) -> None:
        _ray_contain.sweep()

    def kill(
        self,
        tree: dict[str, Any],
        timeout: float,
        worker_grace: float = 0.0,
        worker_ends: bool = False,
    ) -> bool:
        return _ray_contain.kill(tree, timeout, worker_grace=worker_grace, worker_ends=worker_ends)

    def crash(self, crash_file: str) -> str | None:
        return _ray_contain.crash_signal(crash_file)

    def wait_sentinels(self, token: str, timeout: float) -> bool:
        return _ray_contain.wait_sentinels(token, timeout)

    def ping(self) -> bool:
        return True


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run a bounded blocking call in a thread of its own; the thread has ended when this
    returns, even when the caller is cancelled (then after the call ends)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as exc:
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    thread = threading.Thread(target=run, name="zett-ray-call", daemon=True)
    thread.start()
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        # Every call made here is bounded: let it end, so no thread outlives its caller.
        await asyncio.wait([future])
        raise
    finally:
        if future.done():
            thread.join()  # it has nothing left to do but return


async def _get(ref: Any) -> Any:
    return await ref


class RayJob:
    """One child running as a Ray generator task. Created by ``RayRunner.submit...``.

    ``wait()`` waits without raising; ``result()``/``exception()`` read the outcome once
    ``done()``. The outcome is reached only once the child's process tree is gone (or its node
    is). ``cancel()`` kills that tree and returns once it is dead and Ray reported the task's
    end. Every outcome is reached within a bound: a task whose node or cluster went away ends as
    ``NodeLost``.
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
        #: hex id of the Ray node the child runs (or ran) on, once it started
        self.node_id: str | None = None
        self._tree: dict[str, Any] | None = None
        #: where the task started, known before its tree (from the note it leaves first)
        self._views: list[str] | None = None
        self._crash: tuple[str, list[int]] | None = None
        self._running = False
        self._loop = asyncio.get_running_loop()
        self._done: asyncio.Future[None] = self._loop.create_future()
        self._events: deque[Any] = deque()
        self._event_waiter: asyncio.Future[None] | None = None
        self._consumer = False
        self._result: Any = None
        self._exception: BaseException | None = None
        self._kill_reason: BaseException | None = None
        self._killing: asyncio.Task[None] | None = None
        #: whether the child's tree was confirmed gone (``None`` while it runs)
        self.tree_gone: bool | None = None
        self._submitted = time.monotonic()
        #: the task info's ``sandbox`` entry when a sandbox was asked for and not enforced
        self.sandbox_note: dict[str, Any] | None = None
        self._ended: float | None = None
        self._cpu = 0.0
        self._rss = 0
        self._peak = 0
        #: armed when the child starts running (time queued in Ray does not count)
        self._timer: asyncio.TimerHandle | None = None
        self._pump = self._loop.create_task(self._run(), name=f"zett-ray-{name}")

    def __repr__(self) -> str:
        state = "done" if self.done() else "running" if self._running else "pending"
        return f"<RayJob {self.name} {state} pid={self.pid} node={(self.node_id or '')[:12]}>"

    @property
    def pid(self) -> int | None:
        """The Ray worker's pid on its node while the child runs, else ``None``."""
        if self._running and self._tree is not None:
            return int(self._tree["pid"])
        return None

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
        """Kill the child's whole tree; return once it is dead and Ray reported the task's end.

        ``grace`` is accepted for symmetry with processes; Ray children are killed at once. The
        job ends with ``JobCancelled`` unless another outcome (a timeout) was being enforced.
        No-op for a finished job. If the caller is cancelled, the kill goes on. Bounded by the
        runner's ``kill_timeout`` plus ``end_timeout`` even when the node or cluster is gone.
        """
        await asyncio.shield(self._kill(JobCancelled()))

    def usage(self) -> JobUsage:
        """CPU seconds (the child's cgroup's, or its worker's), the worker's resident memory
        and its peak, and elapsed time. Updated about once a second while the child runs."""
        end = self._ended if self._ended is not None else time.monotonic()
        return JobUsage(self._cpu, self._rss, self._peak, end - self._submitted)

    def info(self) -> Mapping[str, Any]:
        """``{"node_id": ...}`` once the child runs; while Ray has not started it for more
        than ``WAITING_AFTER`` seconds, ``{"waiting": ...}`` says so."""
        info: dict[str, Any] = {}
        if self.sandbox_note is not None:
            info["sandbox"] = self.sandbox_note
        if self.node_id is not None:
            info["node_id"] = self.node_id
        elif not self.done() and time.monotonic() - self._submitted > WAITING_AFTER:
            info["waiting"] = "waiting for Ray to schedule it (a worker and its resources)"
        return info

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
        final: dict[str, Any] | None = None
        error: BaseException | None = None
        try:
            async for ref in self._gen:
                message = json.loads(await ref)
                kind = message.get("k")
                if kind == "e":
                    self._events.append(message["v"])
                    self._wake()
                elif kind == "u":
                    self._usage(message)
                elif kind == "start":
                    self._on_start(message)
                else:
                    final = message
        except Exception as exc:  # Ray's own errors: the worker, the node, the cluster
            if final is None:
                error = exc
            else:
                # the outcome arrived; a worker that exits right after (max_calls=1) can make
                # Ray report its lease failed (seen on Ray 2.60): that is not the child's
                log.debug("Ray error after the outcome of %s: %s", self.name, _first_line(exc))
        self._running = False
        if final is not None and final.get("k") in ("r", "x", "lim"):
            # the task killed what the child left before it reported (``_ray_contain.leave``)
            self.tree_gone = True
            self._finish(self._outcome(final))
            return
        if final is not None:  # the task failed before the child ran (containment, limits)
            self._finish(self._outcome(final))
            return
        self._finish(await self._failed(error))

    def _on_start(self, message: dict[str, Any]) -> None:
        self._tree = message["tree"]
        self.node_id = str(message["node"])
        self._crash = (str(message["crash"]), list(message["crash_ident"]))
        self._running = True
        if self.limits.timeout is not None and self._timer is None:
            self._timer = self._loop.call_later(self.limits.timeout, self._on_timeout)
        if not self._runner._is_local(self._tree):
            self._runner._reaper(self.node_id)  # ready before a cancel needs it

    def _usage(self, message: dict[str, Any]) -> None:
        self._cpu = float(message.get("cpu", self._cpu))
        self._rss = int(message.get("rss", self._rss))
        self._peak = max(self._peak, self._rss, int(message.get("peak", 0)))

    async def _failed(self, error: BaseException | None) -> BaseException:
        """The outcome of a task Ray ended without the child's report; kills what is left."""
        runner = self._runner
        if self._tree is None:
            self._start_from_kv()
        node_lost = False
        if self._kill_reason is None and not isinstance(error, rex.TaskCancelledError):
            node_lost = isinstance(error, rex.NodeDiedError | rex.LocalRayletDiedError) or (
                self.node_id is not None and await runner._node_lost(self.node_id)
            )
        if self._tree is None and self._views is not None:
            # killed as it started, before its tree was known here: its sentinel (if it got
            # one) kills the tree once the worker is dead; the outcome waits for that
            deadline = time.monotonic() + runner.kill_timeout
            self.tree_gone = await runner._wait_sentinels(
                self._token, self._views, self.node_id, deadline
            )
        if self._tree is not None:
            # Whatever killed the worker, nothing of its tree may outlive the outcome.
            deadline = time.monotonic() + runner.kill_timeout
            # a worker Ray ended (cancelled, crashed, killed) may still be exiting: it is part
            # of the tree, so the outcome waits for it too (a worker whose task failed in Ray
            # before the child ran lives on, reused)
            ends = self._kill_reason is not None or isinstance(
                error, rex.TaskCancelledError | rex.WorkerCrashedError | rex.OutOfMemoryError
            )
            self.tree_gone = await runner._kill_tree(
                self._tree, self.node_id, deadline, node_dead=node_lost, worker_ends=ends
            )
        if self._kill_reason is not None:
            return self._kill_reason
        if isinstance(error, rex.TaskCancelledError):
            return JobCancelled("the Ray task was cancelled outside zett_agent")
        if node_lost:
            return NodeLost(self.node_id, _first_line(error) if error is not None else "")
        if isinstance(error, rex.WorkerCrashedError | rex.OutOfMemoryError):
            signal_name = await self._crash_signal()
            if signal_name == "SIGXCPU" and self.limits.cpu_seconds is not None:
                return LimitExceeded("cpu_seconds", self.limits.cpu_seconds, self._cpu or None)
            if self.limits.memory_bytes is not None and (
                signal_name is not None or isinstance(error, rex.OutOfMemoryError)
            ):
                return LimitExceeded("memory_bytes", self.limits.memory_bytes, self._peak or None)
            if isinstance(error, rex.OutOfMemoryError):
                return WorkerCrashed(None, None, f"Ray's memory monitor: {_first_line(error)}")
            return WorkerCrashed(None, signal_name)
        if isinstance(error, rex.RayTaskError):
            # the task itself failed in Ray, before the child ran: its function or arguments
            # could not be loaded in the worker (a module missing there), or Ray's own error
            cause = error.cause if isinstance(error.cause, BaseException) else error
            return JobFailed(type(cause).__name__, _first_line(cause), str(error)[-20000:])
        if runner._closed:
            return PoolClosed("the RayRunner was closed before the child finished")
        detail = f"{type(error).__name__}: {_first_line(error)}" if error is not None else ""
        return NodeLost(self.node_id, detail)

    def _start_from_kv(self) -> None:
        """Learn where the child ran from the note its task left in the cluster's store (for a
        worker that died before its first message arrived)."""
        from ray.experimental import internal_kv

        key = _ray_task.kv_key(self._token)
        try:
            note = internal_kv._internal_kv_get(key, namespace=_ray_task.KV_NAMESPACE)
            internal_kv._internal_kv_del(key, namespace=_ray_task.KV_NAMESPACE)
        except Exception:
            return
        if note:
            start = json.loads(note)
            self.node_id = str(start["node"])
            if start.get("k") == "node":  # the task had not started the child's tree yet
                self._views = list(start["views"])
                return
            self._tree = start["tree"]
            self.node_id = str(start["node"])
            self._crash = (str(start["crash"]), list(start["crash_ident"]))

    async def _crash_signal(self) -> str | None:
        if self._crash is None or self._tree is None:
            return None
        path, _ident = self._crash
        runner = self._runner
        if runner._is_local(self._tree):
            return _ray_contain.crash_signal(path)
        if self.node_id is None:
            return None
        try:
            result: str | None = await runner._call_reaper(
                self.node_id, "crash", path, deadline=time.monotonic() + runner.kill_timeout
            )
            return result
        except Exception:
            log.debug("could not read the crash note of %s", self.name, exc_info=True)
            return None

    def _finish(self, error: BaseException | None) -> None:
        if self.done():
            return
        if self._timer is not None:
            self._timer.cancel()
        if error is None and self._kill_reason is not None:
            error = self._kill_reason  # a result that raced the kill does not count
        self._exception = error
        self._running = False
        self._ended = time.monotonic()
        self._done.set_result(None)
        self._wake()
        self._runner._jobs.discard(self)

    def _outcome(self, final: dict[str, Any]) -> BaseException | None:
        self._usage({"cpu": final.get("cpu", self._cpu), "rss": final.get("rss", self._rss)})
        self._peak = max(self._peak, int(final.get("peak", 0)))
        kind = final.get("k")
        if kind == "r":
            self._result = final.get("v")
            return None
        if kind == "lim":
            value = float(final["value"])
            return LimitExceeded(str(final["limit"]), value, self._peak or None)
        if kind == "x":
            return JobFailed(str(final.get("t")), str(final.get("m")), str(final.get("tb", "")))
        return WorkerCrashed(None, None, f"unexpected message from the Ray task: {kind!r:.40}")

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
        deadline = time.monotonic() + runner.kill_timeout
        tree = self._tree
        if tree is not None and tree["mode"] == "scan":
            # Scan mode finds the tree by walking down from the live worker: kill it first.
            self.tree_gone = await runner._kill_tree(tree, self.node_id, deadline)
        with contextlib.suppress(Exception):
            ray.cancel(self._gen, force=True)  # Ray ends the worker itself (and quietly)
        if tree is not None and tree["mode"] == "cgroup":
            # Then the cgroup, whatever the worker left in it (the worker too, if it did not
            # exit within the grace: a worker stuck where Ray cannot end it).
            self.tree_gone = await runner._kill_tree(
                tree, self.node_id, deadline, worker_grace=WORKER_GRACE
            )
        # The pump ends once Ray reports the task's end; it kills (or confirms dead) the tree
        # the task had, whatever killed it, before the job settles.
        bound = max(0.0, deadline - time.monotonic()) + runner.end_timeout
        try:
            await asyncio.wait_for(asyncio.shield(self._done), bound)
        except TimeoutError:
            # Ray never reported the end (its control plane is gone): settle here, bounded
            self._pump.cancel()
            self._finish(self._kill_reason)
        if self._tree is not None and not self.tree_gone:
            log.warning(
                "%s: could not confirm that the child's processes on node %s are gone; its "
                "sentinel kills them when the Ray worker dies",
                self.name,
                self.node_id,
            )


class RayRunner:
    """Runs each child agent as a Ray task, on this machine or a Ray cluster.

    Select it with ``AsyncSubAgentExtension(definitions, runner=RayRunner(...))`` (or
    ``SubAgentExtension``): the tools, the registry, the notices, the limits and
    ``_create_child`` behave as with processes. ``task_info`` adds ``node_id``.

    Args:
        address: ``None`` starts a local Ray (or uses the Ray this process already
            initialized); ``"auto"`` joins the cluster this machine belongs to;
            ``"ray://host:port"`` or ``"host:port"`` joins that cluster.
        num_cpus: Ray CPUs each child requests (default 1: Ray runs as many children at once
            on a node as it has CPUs; lower it for children that mostly wait on a model).
        resources: Ray custom resources each child requests (placement), e.g. ``{"big": 1}``.
        placement: Per-definition overrides of ``num_cpus`` and ``resources``, by definition
            name: ``{"coder": {"num_cpus": 4, "resources": {"big": 1}}}``.
        limits: Default ``ProcessLimits`` where neither the extension nor the definition sets
            any. ``timeout`` is enforced from the host; ``memory_bytes`` becomes Ray's
            ``memory=`` request and an ``RLIMIT_AS`` that many bytes beyond what the worker
            already maps; ``cpu_seconds``, ``max_open_files``, ``env`` and ``cwd`` apply as in
            the process engine. ``max_processes`` and ``tree_memory_bytes`` are refused.
        max_retries: Ray retries of a child whose worker died (default 0: never run twice).
        fresh_workers: A new worker process per child (Ray's ``max_calls=1``). Default off:
            like the process engine, a worker is reused unless the child set a limit other
            than ``timeout`` (a reused worker keeps module state a child left behind).
        containment: ``"auto"`` (a cgroup per child where the node has a writable cgroup v2
            hierarchy, else a subreaper and marker scan), ``"cgroup"`` (a child fails on a node
            without it) or ``"scan"``.
        kill_from_host: Kill the trees of children that run on this machine directly (the
            default) rather than through the node's reaper actor.
        init_kwargs: Extra ``ray.init`` arguments when this runner connects. By default the
            workers' output is not forwarded (``log_to_driver=False``), and a local Ray
            started here listens on 127.0.0.1 only, without its dashboard.
        kill_timeout: Seconds a kill may take to confirm a tree dead.
        end_timeout: Seconds to wait for Ray to report a killed task's end before the job
            settles anyway (its node or the cluster is gone).

    Raises:
        TypeError, ValueError: a bad option (the message names it).
    """

    #: Ray children are killed at once (no SIGTERM first)
    kill_grace = 0.0

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: float = 1.0,
        resources: Mapping[str, float] | None = None,
        placement: Mapping[str, Mapping[str, Any]] | None = None,
        limits: ProcessLimits | None = None,
        max_retries: int = 0,
        fresh_workers: bool = False,
        containment: str = "auto",
        kill_from_host: bool = True,
        init_kwargs: Mapping[str, Any] | None = None,
        kill_timeout: float = 20.0,
        end_timeout: float = 15.0,
    ) -> None:
        if address is not None and not isinstance(address, str):
            raise TypeError(f"address must be None or a str such as 'auto', got {address!r}")
        if isinstance(num_cpus, bool) or not isinstance(num_cpus, int | float) or num_cpus < 0:
            raise ValueError(f"num_cpus must be a number >= 0, got {num_cpus!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if containment not in _CONTAINMENTS:
            raise ValueError(
                f"containment must be one of {', '.join(_CONTAINMENTS)}, got {containment!r:.40}"
            )
        for name, value in (("kill_timeout", kill_timeout), ("end_timeout", end_timeout)):
            if not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        self.address = address
        self.num_cpus = float(num_cpus)
        self.resources = _check_resources("resources", resources or {})
        self.placement = {
            str(name): _check_placement(name, options)
            for name, options in (placement or {}).items()
        }
        self.limits = check_limits(limits, "RayRunner(limits=...)")
        self.max_retries = max_retries
        self.fresh_workers = bool(fresh_workers)
        self.containment = containment
        self.kill_from_host = bool(kill_from_host)
        self.init_kwargs = dict(init_kwargs or {})
        self.kill_timeout = float(kill_timeout)
        self.end_timeout = float(end_timeout)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._remote: dict[bool, Any] | None = None
        self._reaper_class: Any = None
        self._jobs: set[RayJob] = set()
        self._initialized_here = False
        self._closed = False
        self._views = _ray_contain.views()
        #: a Ray node's raylet address by node id (for the liveness probe)
        self._raylets: dict[str, tuple[str, int]] = {}

    def __repr__(self) -> str:
        state = "closed" if self._closed else "connected" if self._remote else "new"
        return f"<RayRunner {state} address={self.address!r} containment={self.containment}>"

    # A runner travels inside a definition when a child starts children of its own: only its
    # configuration goes (inside a Ray worker, it uses the worker's connection).
    def __getstate__(self) -> dict[str, Any]:
        keep = (
            "address", "num_cpus", "resources", "placement", "limits", "max_retries",
            "fresh_workers", "containment", "kill_from_host", "init_kwargs", "kill_timeout",
            "end_timeout",
        )  # fmt: skip
        return {name: getattr(self, name) for name in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # -- connection -------------------------------------------------------------------------

    def connect(self) -> None:
        """Connect to Ray (start a local one for ``address=None``) unless already connected.

        Blocks the calling thread while Ray starts (seconds for a local Ray): call it at
        startup, before serving, from the thread that lives as long as the program (Ray ties
        the processes it starts to that thread). Otherwise the first child connects, on the
        event loop. Raises ``RuntimeError`` once closed, and Ray's own errors (a cluster that
        cannot be reached).
        """
        if self._closed:
            raise RuntimeError("this RayRunner is closed; create a new one")
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"log_to_driver": False}
            if self.address is None:
                kwargs["_node_ip_address"] = "127.0.0.1"
                kwargs["include_dashboard"] = False
            kwargs.update(self.init_kwargs)
            with _local_workers_share_this_environment(self.address is None):
                ray.init(address=self.address, **kwargs)
            self._initialized_here = True
        if self._remote is None:
            self._remote = {
                True: ray.remote(max_calls=1)(_ray_task.run_task_fresh),
                False: ray.remote(_ray_task.run_task_reused),
            }
            self._reaper_class = ray.remote(_Reaper)

    def warm_up(self, modules: Iterable[str] = ()) -> None:
        """Nothing to do ahead (Ray keeps its own idle workers); never blocks, never connects.

        Call ``connect()`` at startup to have Ray ready before the first child.
        """

    # -- submitting -------------------------------------------------------------------------

    async def submit(
        self,
        spec: ChildSpec,
        *,
        limits: ProcessLimits | None = None,
        sandbox: Sandbox | None = None,
    ) -> RayJob | RefusedJob:
        """Start one subagent child (``run_child(spec)``) as a Ray task and return its job.

        ``limits`` (the extension's or the definition's) or the runner's own apply; the
        definition's ``placement`` entry, if any, chooses CPUs and resources.

        Ray nodes do not enforce sandboxes yet: a child with a required ``sandbox`` fails at
        once with ``SandboxUnavailable`` (nothing is sent to the cluster); one with
        ``Sandbox(required=False)`` runs unconfined, and its task info says so.

        Raises:
            TypeError: the spec cannot be shipped to Ray (the message names the part).
            ValueError: a limit Ray children cannot have (``max_processes``,
                ``tree_memory_bytes``), or a brokered spec (``spec.broker``): Ray children
                cannot have their model calls made by the parent yet.
            RuntimeError: the runner is closed.
        """
        if spec.broker:
            raise ValueError(
                f"cannot start a child of {spec.definition.name!r} on Ray with brokered model "
                "calls: RayRunner does not broker model calls yet (the child would need the "
                "model's key on its node). Run this child on ProcessRunner, or give it a "
                "model it may hold"
            )
        note = None
        if sandbox is not None:
            reason = (
                "the Ray runner does not enforce sandboxes yet; run sandboxed children with "
                "ProcessRunner (the default)"
            )
            if sandbox.required:
                error = SandboxUnavailable(
                    reason + ", or pass Sandbox(required=False)", ("runner",)
                )
                return RefusedJob(error, {"sandbox": unenforced(reason, refused=True)})
            note = unenforced(reason, refused=False)
        options = self.placement.get(spec.definition.name, {})
        try:
            job = await self._submit(
                run_child,
                (spec,),
                {},
                limits or self.limits,
                options.get("num_cpus"),
                options.get("resources"),
                pass_emit=True,
            )
        except TypeError as exc:
            part = unpicklable_part(spec) or str(exc)
            raise TypeError(
                f"cannot start a child of {spec.definition.name!r} on Ray: {part}. Everything "
                "a child needs is pickled to its Ray worker: keep locks, clients, connections "
                "and event loops out of what the definition holds, or define the class in an "
                "importable module"
            ) from exc
        job.sandbox_note = note
        return job

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
            ValueError: For ``max_processes`` or ``tree_memory_bytes`` in ``limits``.
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
        limits = check_limits(limits, "RayRunner.submit(limits=...)") or ProcessLimits()
        if limits.tree_wide:
            raise ValueError(
                f"RayRunner cannot enforce {', '.join(limits.tree_wide)} (they need the engine's "
                "cgroup controllers); use memory_bytes (Ray's memory request and RLIMIT_AS) "
                "or run these children with ProcessRunner"
            )
        self.connect()
        assert self._remote is not None
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
                .remote(fn, args, kwargs, limits.child_spec(), token, pass_emit, self.containment)
            )
        except Exception as error:
            if "pickl" in str(error).lower() or isinstance(error, TypeError):
                raise TypeError(f"cannot ship {fn!r} to Ray: {error}") from error
            raise
        name = getattr(fn, "__qualname__", "job")
        job = RayJob(self, generator, limits, token, f"{name}-{token[:8]}")
        self._jobs.add(job)
        return job

    # -- killing, per node ------------------------------------------------------------------

    async def _wait_sentinels(
        self, token: str, views: list[str], node_id: str | None, deadline: float
    ) -> bool:
        """Wait until no sentinel of task ``token`` runs on its node; True once confirmed.
        Never raises."""
        left = deadline - time.monotonic()
        try:
            if self._is_local({"views": views}):
                return await _in_thread(_ray_contain.wait_sentinels, token, max(0.1, left))
            if node_id is None:
                return False
            result: bool = await self._call_reaper(
                node_id, "wait_sentinels", token, max(0.1, left - 1), deadline=deadline
            )
            return result
        except Exception:
            log.debug("waiting for a sentinel on node %s failed", node_id, exc_info=True)
            return False

    def _is_local(self, tree: Mapping[str, Any]) -> bool:
        """Whether the tree's node is this machine, seen as this process sees it."""
        return self.kill_from_host and list(tree.get("views") or []) == self._views

    async def _kill_tree(
        self,
        tree: dict[str, Any],
        node_id: str | None,
        deadline: float,
        *,
        node_dead: bool = False,
        worker_grace: float = 0.0,
        worker_ends: bool = False,
    ) -> bool:
        """Kill a child's tree and wait until it is gone; True once confirmed. Never raises.

        From here when the node is this machine; else through the node's reaper (recreated
        if it died), unless the node is dead (its processes died with it).
        """
        left = deadline - time.monotonic()
        try:
            if self._is_local(tree):
                kill = functools.partial(
                    _ray_contain.kill, worker_grace=worker_grace, worker_ends=worker_ends
                )
                return await _in_thread(kill, tree, max(0.1, left))
            if node_dead or node_id is None:
                return False
            result: bool = await self._call_reaper(
                node_id,
                "kill",
                tree,
                max(0.1, left - 1),
                worker_grace,
                worker_ends,
                deadline=deadline,
            )
            return result
        except Exception:
            log.debug("killing a tree on node %s failed", node_id, exc_info=True)
            return False

    def _reaper(self, node_id: str) -> Any:
        """The node's reaper actor, shared by the runners of this process while it stays
        connected to the same cluster (the actors end with this driver's connection)."""
        key = (ray.get_runtime_context().get_job_id(), node_id)
        reaper = _REAPERS.get(key)
        if reaper is None:
            reaper = self._reaper_class.options(
                num_cpus=0,
                max_restarts=0,
                max_concurrency=16,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote()
            _REAPERS[key] = reaper
        return reaper

    async def _call_reaper(self, node_id: str, method: str, *args: Any, deadline: float) -> Any:
        """Call a method of the node's reaper; a dead reaper (a child may kill it) is replaced
        and the call repeated, until ``deadline``."""
        while True:
            reaper = self._reaper(node_id)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the reaper on node {node_id[:12]} did not answer in time")
            try:
                return await asyncio.wait_for(_get(getattr(reaper, method).remote(*args)), left)
            except (rex.RayActorError, rex.ActorUnavailableError) as error:
                log.info("the reaper on node %s is gone (%s); a new one", node_id[:12], error)
                for key, known in list(_REAPERS.items()):
                    if known is reaper:
                        del _REAPERS[key]
                with contextlib.suppress(Exception):
                    ray.kill(reaper)
                if not await self._node_alive(node_id):
                    raise

    # -- node liveness ----------------------------------------------------------------------

    async def _node_lost(self, node_id: str) -> bool:
        return not await self._node_alive(node_id)

    async def _node_alive(self, node_id: str) -> bool:
        """Whether the node's raylet still answers: the cluster's view (when the head answers
        within 2 s), then a TCP connect to the raylet itself (a killed raylet refuses at once;
        the cluster notices only after its health checks)."""
        try:
            nodes = await _in_thread(_node_table, 2.0)
        except Exception:
            return False  # the head does not answer: the cluster is gone
        entry = nodes.get(node_id)
        if entry is None or not entry[0]:
            return False
        address = entry[1]
        try:
            _reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), 2.0)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    # -- closing ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Kill every running child (``PoolClosed``), and disconnect if this runner connected
        (which ends the per-node reapers too). Bounded even when the cluster is gone.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        jobs = list(self._jobs)
        await asyncio.gather(
            *(job._kill(PoolClosed("the RayRunner was closed")) for job in jobs),
            return_exceptions=True,
        )
        if self._initialized_here:
            _REAPERS.clear()
            if _gcs_reachable():
                await _in_thread(ray.shutdown)
            else:
                # ray.shutdown() waits for the lost cluster; Ray ends this driver process
                # after gcs_rpc_server_reconnect_timeout_s (60 s by default)
                log.warning("the Ray cluster is gone; not disconnecting from it")

    async def __aenter__(self) -> RayRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@contextlib.contextmanager
def _local_workers_share_this_environment(local: bool) -> Iterator[None]:
    """Under ``uv run``, Ray packages the working directory and starts every worker through
    ``uv run`` (``RAY_ENABLE_UV_RUN_RUNTIME_ENV``, read when Ray is imported). A local Ray's
    workers already run in this very environment, and the working directory may be any folder:
    off for a local Ray, unless the variable was set explicitly."""
    from ray._private import ray_constants

    if not local or "RAY_ENABLE_UV_RUN_RUNTIME_ENV" in os.environ:
        yield
        return
    before = getattr(ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", None)
    ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False
    try:
        yield
    finally:
        ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = before


def _node_table(timeout: float) -> dict[str, tuple[bool, tuple[str, int]]]:
    """``{node id: (alive, (raylet address, port))}`` from the cluster's head, within
    ``timeout`` seconds (raises if the head does not answer)."""
    client: Any = cast(Any, ray._private.worker.global_worker).gcs_client
    table = client.get_all_node_info(timeout=timeout)
    out = {}
    for node_id, info in table.items():
        alive = info.state == 0  # GcsNodeInfo.ALIVE
        out[node_id.hex()] = (alive, (info.node_manager_address, int(info.node_manager_port)))
    return out


def _gcs_reachable() -> bool:
    try:
        client: Any = cast(Any, ray._private.worker.global_worker).gcs_client
        client.internal_kv_exists(b"zett-agent-ping", None, timeout=2)
    except Exception:
        return False
    return True


def _check_resources(where: str, resources: Mapping[str, float]) -> dict[str, float]:
    if not isinstance(resources, Mapping):
        raise TypeError(f"{where} must map resource names to amounts, got {resources!r:.60}")
    out = {}
    for name, amount in resources.items():
        if not isinstance(name, str) or isinstance(amount, bool):
            raise TypeError(f"{where}: {name!r:.40}: {amount!r:.40} is not a name and an amount")
        if not isinstance(amount, int | float) or not amount >= 0:
            raise ValueError(f"{where}[{name!r}] must be a number >= 0, got {amount!r:.40}")
        out[name] = float(amount)
    return out


def _check_placement(name: object, options: Mapping[str, Any]) -> dict[str, Any]:
    where = f"placement[{name!r:.40}]"
    if not isinstance(name, str) or not isinstance(options, Mapping):
        raise TypeError(f"placement maps definition names to option dicts; {where} is not one")
    unknown = set(options) - _PLACEMENT_KEYS
    if unknown:
        raise ValueError(
            f"{where} has unknown options {sorted(unknown)}; it takes num_cpus and resources"
        )
    out: dict[str, Any] = {}
    if "num_cpus" in options:
        value = options["num_cpus"]
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"{where}['num_cpus'] must be a number >= 0, got {value!r:.40}")
        out["num_cpus"] = float(value)
    if "resources" in options:
        out["resources"] = _check_resources(f"{where}['resources']", options["resources"])
    return out


if TYPE_CHECKING:  # both satisfy the runner interface
    from zett_agent.runners._base import ChildJob, ChildRunner

    def _check(runner: RayRunner, job: RayJob) -> tuple[ChildRunner, ChildJob]:
        return runner, job
