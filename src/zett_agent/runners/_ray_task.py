"""The worker side of ``RayRunner``: what runs inside a Ray worker process for one child.

Never imported by the host's ``zett_agent`` import (only by ``zett_agent.runners.ray`` and by
Ray workers). Stdlib only at import time; Ray itself is already loaded in a worker.

One child is one Ray generator task, ``run_task``. Everything it yields is JSON text:

- ``{"k": "start", "pid": ..., "start": ..., "node": ..., "crash_file": ...}`` first;
- ``{"k": "e", "v": event}`` for each ``emit(event)``;
- then exactly one of ``{"k": "r", "v": result}``, ``{"k": "x", "t": type, "m": message,
  "tb": traceback}`` (the function raised) or ``{"k": "lim", "limit": name, "value": limit}``.

While the task runs its worker is a child subreaper, so every process the child starts stays in
the worker's tree (a ``setsid`` double fork included); when the function returns or raises, the
task freezes and kills that tree before it reports. Each process it starts carries the variable
``ZETT_RAY_TASK`` in its environment, so a node's reaper can also find what a crashed worker left.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import faulthandler
import inspect
import json
import os
import queue
import resource
import select
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["emit", "kill_tree", "run_task", "run_task_fresh", "run_task_reused"]

PR_SET_CHILD_SUBREAPER = 36
#: names the processes of one task, inherited through ``fork``/``exec`` unless a child drops it
MARKER = "ZETT_RAY_TASK"
#: where a task notes its start in the cluster's key-value store
KV_NAMESPACE = "zett_agent"
#: events buffered in the worker before ``emit`` blocks (backpressure)
MAX_BUFFERED_EVENTS = 1000

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


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _start_time(pid: int) -> int:
    """The process's start time in clock ticks since boot (pid plus this names one process)."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        data = handle.read()
    return int(data[data.rindex(b")") + 2 :].split()[19])


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(k) for k in f.read().split())
    except OSError:
        pass
    return kids


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for kid in _children(todo.pop()):
            out.append(kid)
            todo.append(kid)
    return out


def _marked(token: str) -> list[int]:
    """Every live process of this machine whose environment carries ``MARKER=token``."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{name}/environ", "rb") as handle:
            if needle in handle.read().split(b"\0"):
                found.append(int(name))
    return found


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def kill_tree(
    root: int | None, *, include_root: bool, token: str | None = None, timeout: float = 5.0
) -> list[int]:
    """Freeze and SIGKILL ``root``'s descendants (and ``root`` if asked); wait until all died.

    Every process found is stopped (SIGSTOP) first, and the tree scanned again, until a scan
    finds nothing new: a stopped process cannot fork, and the children of a killed one are
    re-parented to ``root`` when it is a subreaper, so nothing escapes between scans. With
    ``token``, processes carrying ``MARKER=token`` in their environment are killed too (what
    a crashed worker left behind). Returns the pids killed; waits at most ``timeout`` seconds
    for them to die (a dead process awaiting its parent's ``wait`` counts as dead).
    """
    me = os.getpid()
    seen: dict[int, int | None] = {}

    def take(pids: list[int]) -> bool:
        new = False
        for pid in pids:
            if pid == me or pid in seen:
                continue
            seen[pid] = _pidfd(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            new = True
        return new

    def below() -> list[int]:
        return [] if root is None else _descendants(root)

    if include_root and root is not None:
        take([root])
    while take(below() + (_marked(token) if token else [])):
        pass
    for pid in seen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    while take(below()):  # orphans of the killed re-parented to the subreaper root
        for pid in seen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    for fd in seen.values():
        if fd is None:
            continue
        try:
            left = max(0.0, deadline - time.monotonic())
            select.select([fd], [], [], left)  # readable once the process has exited
        finally:
            os.close(fd)
    return sorted(seen)


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


def run_task(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    limits: dict[str, Any],
    token: str,
    pass_emit: bool,
) -> Iterator[str]:
    """The body of one Ray generator task: run ``fn`` and stream JSON text to the parent.

    ``fn`` runs in a thread of the worker (a coroutine function under ``asyncio.run``), so the
    task can yield events while it works. With ``pass_emit`` it is called with ``emit=`` (the
    subagent child's ``run_child(spec, emit)``); otherwise it may call ``emit()`` itself.
    """
    import ray

    me = os.getpid()
    node = ray.get_runtime_context().get_node_id()
    crash_file = os.path.join(tempfile.gettempdir(), f"zett-ray-{token}.crash")
    crash = open(crash_file, "w")  # noqa: SIM115 (closed in finally)
    start = _dumps("start", pid=me, start=_start_time(me), node=node, crash_file=crash_file)
    # Also in the cluster's key-value store: a worker that dies at once may never deliver the
    # first message, and the parent still needs to know where to look for the crash note.
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(f"zett-ray/{token}", start, namespace=KV_NAMESPACE)
    yield start
    faulthandler.enable(file=crash, all_threads=True)
    _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    os.environ[MARKER] = token
    outbox: queue.Queue[Any] = queue.Queue(MAX_BUFFERED_EVENTS)
    outcome: list[dict[str, Any]] = []
    memory_limited = limits.get("memory_bytes") is not None

    def sink(event: Any) -> None:
        outbox.put(_dumps("e", v=event))

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

    # SIGXCPU (the CPU rlimit) kills the worker; faulthandler notes it in a file of its own
    xcpu = open(crash_file + ".xcpu", "w")  # noqa: SIM115 (closed in finally)
    faulthandler.register(signal.SIGXCPU, file=xcpu, chain=True)
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    try:
        _apply_limits(limits)
        worker = threading.Thread(target=body, name="zett-ray-child", daemon=True)
        worker.start()
        while (item := outbox.get()) is not _DONE:
            yield item
        kill_tree(me, include_root=False, token=token)
        used = resource.getrusage(resource.RUSAGE_SELF)
        cpu = used.ru_utime + used.ru_stime - (cpu_before.ru_utime + cpu_before.ru_stime)
        yield json.dumps(
            {**outcome[0], "cpu": round(cpu, 6), "peak": used.ru_maxrss * 1024},
            ensure_ascii=False,
        )
    finally:
        faulthandler.unregister(signal.SIGXCPU)
        _libc().prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        os.environ.pop(MARKER, None)
        faulthandler.enable()  # back to stderr
        with contextlib.suppress(Exception):
            internal_kv._internal_kv_del(f"zett-ray/{token}", namespace=KV_NAMESPACE)
        for handle in (crash, xcpu):
            handle.close()
            with contextlib.suppress(OSError):
                os.unlink(handle.name)


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


#: signal names by the line Python's faulthandler writes for them
FATAL_LINES = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}


def crash_signal(crash_file: str) -> str | None:
    """The fatal signal a crashed worker's faulthandler recorded for ``crash_file``.

    Removes the files. ``None`` when nothing was recorded (SIGKILL, ``os._exit``).
    """
    found = None
    for path in (crash_file + ".xcpu", crash_file):
        try:
            with open(path, errors="replace") as handle:
                text = handle.read(4096)
        except OSError:
            continue
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        if found is not None:
            continue
        if path.endswith(".xcpu"):
            found = "SIGXCPU" if text else None
            continue
        for line, name in FATAL_LINES.items():
            if f"Fatal Python error: {line}" in text:
                found = name
    return found
