"""The worker side of ``RayRunner``: what runs inside a Ray worker process for one child.

Never imported by ``import zett_agent`` (only by ``zett_agent.runners.ray`` and by Ray
workers). Stdlib only at import time; Ray itself is already loaded in a worker.

One child is one Ray generator task, ``run_task``. Everything it yields is JSON text:

- ``{"k": "start", "tree": ..., "node": ..., "crash": ..., "crash_ident": ...}`` first: where
  the child runs and how its process tree is contained (``_ray_contain.enter``);
- ``{"k": "e", "v": event}`` for each ``emit(event)``;
- ``{"k": "u", "cpu": seconds, "rss": bytes}`` about once a second (usage while it runs);
- then exactly one of ``{"k": "r", "v": result}``, ``{"k": "x", "t": type, "m": message,
  "tb": traceback}`` (the function raised) or ``{"k": "lim", "limit": name, "value": limit}``,
  with the final ``cpu`` and ``peak`` numbers.

The child's processes are contained from before it runs (a cgroup of the task's own, or a
subreaper and a marker: see ``_ray_contain``); when the function returns or raises, whatever it
left is killed before the outcome is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import inspect
import json
import os
import queue
import resource
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any, cast

from zett_agent.runners import _ray_contain

__all__ = ["emit", "run_task", "run_task_fresh", "run_task_reused"]

#: where a task notes its start in the cluster's key-value store
KV_NAMESPACE = "zett_agent"
#: events buffered in the worker before ``emit`` blocks (backpressure)
MAX_BUFFERED_EVENTS = 1000
#: seconds between two usage reports of a running child
USAGE_PERIOD = 1.0

_local = threading.local()
_DONE = object()


def emit(event: Any) -> None:
    """Send a JSON-compatible progress event to the parent, from inside a ``RayRunner`` task.

    Blocks while the worker holds ``MAX_BUFFERED_EVENTS`` unsent events. Raises ``TypeError``
    for data that is not JSON-compatible and ``RuntimeError`` outside a ``RayRunner`` task.
    """
    sink = getattr(_local, "sink", None)
    if sink is None:
        raise RuntimeError("emit() works only inside a function run by RayRunner")
    sink(event)


class _ProcessEmitBridge:
    """Stands in for the process engine's worker channel while a Ray task runs, so a child's
    tool that calls ``zett_agent.process.emit`` (as the process runner documents) reaches the
    parent on Ray too. Only ``message("event", ...)`` is ever called by ``emit``."""

    def __init__(self, sink: Callable[[Any], None]) -> None:
        self._sink = sink

    def message(self, kind: str, value: Any, usage: Any = None) -> None:
        self._sink(value)


@contextlib.contextmanager
def _process_emit(sink: Callable[[Any], None]) -> Iterator[None]:
    from zett_agent.process import _worker

    previous = _worker._channel
    _worker._channel = cast(Any, _ProcessEmitBridge(sink))
    try:
        yield
    finally:
        _worker._channel = previous


def kv_key(token: str) -> str:
    return f"zett-ray/{token}"


def _apply_limits(limits: dict[str, Any]) -> None:
    """The same rlimits as the process engine, on top of what the Ray worker already uses.

    A Ray worker maps hundreds of MiB (its runtime and the object store) and spent CPU seconds
    starting up before the child runs: the limits count from that point.
    """
    if limits.get("memory_bytes") is not None:
        with open("/proc/self/statm") as handle:
            mapped = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        cap = mapped + int(limits["memory_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    if limits.get("cpu_seconds") is not None:
        used = resource.getrusage(resource.RUSAGE_SELF)
        spent = used.ru_utime + used.ru_stime
        soft = int(spent + max(1, -(-float(limits["cpu_seconds"]) // 1))) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))
    if limits.get("max_open_files") is not None:
        n = int(limits["max_open_files"])
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    if limits.get("env") is not None:
        os.environ.clear()
        os.environ.update(limits["env"])
    if limits.get("cwd") is not None:
        os.chdir(limits["cwd"])


def _dumps(kind: str, **fields: Any) -> str:
    return json.dumps({"k": kind, **fields}, ensure_ascii=False, allow_nan=False)


class _Usage:
    """CPU of the child (its cgroup's, or the worker's and its reaped children's) and RSS."""

    def __init__(self, cgroup: str | None) -> None:
        self._cgroup = cgroup
        self._before = self._cpu_self()
        self.peak = 0

    def _cpu_self(self) -> float:
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    def cpu(self) -> float:
        if self._cgroup is not None:
            with contextlib.suppress(OSError, ValueError), open(f"{self._cgroup}/cpu.stat") as f:
                for line in f:
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6
        return self._cpu_self() - self._before

    def rss(self) -> int:
        try:
            with open("/proc/self/statm") as handle:
                rss = int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            return 0
        self.peak = max(self.peak, rss)
        return rss


def run_task(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    limits: dict[str, Any],
    token: str,
    pass_emit: bool,
    containment: str = "auto",
) -> Iterator[str]:
    """The body of one Ray generator task: run ``fn`` and stream JSON text to the parent.

    ``fn`` runs in a thread of the worker (a coroutine function under ``asyncio.run``), so the
    task can yield events while it works. With ``pass_emit`` it is called with ``emit=`` (the
    subagent child's ``run_child(spec, emit)``); otherwise it may call ``emit()`` itself.
    """
    import ray
    from ray.experimental import internal_kv

    node = ray.get_runtime_context().get_node_id()
    crash_file = os.path.join(tempfile.gettempdir(), f"zett-ray-{token}.crash")
    crash = open(crash_file, "w")  # noqa: SIM115 (closed in finally)
    xcpu = open(crash_file + ".xcpu", "w")  # noqa: SIM115 (closed in finally)
    stat = os.fstat(crash.fileno())
    tree: dict[str, Any] | None = None
    # Where the task runs, in the cluster's key-value store before anything starts: a worker
    # killed from here on (a cancel as it starts) may never deliver a message, and the parent
    # must still find what it left (the sentinel, which then kills the tree) on this node.
    internal_kv._internal_kv_put(
        kv_key(token),
        _dumps("node", node=node, views=_ray_contain.views()),
        namespace=KV_NAMESPACE,
    )
    try:
        try:
            _apply_limits(limits)  # first: the sentinel enter() starts needs little
            tree = _ray_contain.enter(token, containment)
        except Exception as error:
            yield json.dumps(_failure(error))
            return
        start = _dumps(
            "start", tree=tree, node=node, crash=crash_file, crash_ident=[stat.st_dev, stat.st_ino]
        )
        # Also in the cluster's key-value store: a worker that dies at once may never deliver
        # this message, and the parent still needs to know where the child ran.
        internal_kv._internal_kv_put(kv_key(token), start, namespace=KV_NAMESPACE)
        yield start
        faulthandler.enable(file=crash, all_threads=True)
        # SIGXCPU (the CPU rlimit) kills the worker; faulthandler notes it in a file of its own
        faulthandler.register(signal.SIGXCPU, file=xcpu, chain=True)
        yield from _supervise(fn, args, kwargs, limits, pass_emit, tree)
    finally:
        if tree is not None:
            faulthandler.unregister(signal.SIGXCPU)
            faulthandler.enable()  # back to stderr
        with contextlib.suppress(Exception):
            internal_kv._internal_kv_del(kv_key(token), namespace=KV_NAMESPACE)
        for handle in (crash, xcpu):
            handle.close()
            with contextlib.suppress(OSError):
                os.unlink(handle.name)


def _supervise(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    limits: dict[str, Any],
    pass_emit: bool,
    tree: dict[str, Any],
) -> Iterator[str]:
    outbox: queue.Queue[Any] = queue.Queue(MAX_BUFFERED_EVENTS)
    outcome: list[dict[str, Any]] = []
    memory_limited = limits.get("memory_bytes") is not None
    usage = _Usage(tree["cgroup"])

    def sink(event: Any) -> None:
        try:
            line = _dumps("e", v=event)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"emit() takes JSON data (dicts with str keys, lists, str, ...): {error}"
            ) from None
        outbox.put(line)

    def body() -> None:
        _local.sink = sink
        try:
            call_kwargs = {**kwargs, "emit": sink} if pass_emit else kwargs
            if inspect.iscoroutinefunction(fn):
                value = asyncio.run(fn(*args, **call_kwargs))
            else:
                value = fn(*args, **call_kwargs)
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError) as error:
                message = f"the result is not JSON-compatible: {error}"
                outcome.append({"k": "x", "t": "TypeError", "m": message, "tb": ""})
            else:
                outcome.append({"k": "r", "v": value})
        except MemoryError as error:
            if memory_limited:
                cap = limits["memory_bytes"]
                outcome.append({"k": "lim", "limit": "memory_bytes", "value": cap})
            else:
                outcome.append(_failure(error))
        except BaseException as error:
            outcome.append(_failure(error))
        finally:
            _local.sink = None
            outbox.put(_DONE)

    worker = threading.Thread(target=body, name="zett-ray-child", daemon=True)
    with _process_emit(sink):
        worker.start()
        next_usage = time.monotonic() + USAGE_PERIOD
        while True:
            try:
                item = outbox.get(timeout=max(0.0, next_usage - time.monotonic()))
            except queue.Empty:
                next_usage = time.monotonic() + USAGE_PERIOD
                yield json.dumps({"k": "u", "cpu": round(usage.cpu(), 6), "rss": usage.rss()})
                continue
            if item is _DONE:
                break
            yield item
    cpu, rss = usage.cpu(), usage.rss()
    _ray_contain.leave(tree)
    yield json.dumps(
        {**outcome[0], "cpu": round(cpu, 6), "rss": rss, "peak": usage.peak},
        ensure_ascii=False,
    )


def run_task_fresh(*args: Any) -> Iterator[str]:
    """``run_task`` registered with ``max_calls=1``: the worker exits after this child."""
    yield from run_task(*args)


def run_task_reused(*args: Any) -> Iterator[str]:
    """``run_task`` registered for reusable workers (Ray's ``max_calls`` is per function)."""
    yield from run_task(*args)


def _failure(error: BaseException) -> dict[str, Any]:
    kind = type(error)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    text = "".join(traceback.format_exception(error))
    return {"k": "x", "t": name, "m": str(error), "tb": text[-20000:]}
