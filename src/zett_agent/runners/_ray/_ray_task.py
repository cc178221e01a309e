"""The Ray task of one child: what runs in a Ray worker's main thread, and what it streams.

Never imported by ``import zett_agent`` (by ``zett_agent.runners.ray`` and by Ray workers).

The task hands the child to this Ray worker's pool (``_ray_node``) and passes on what the pool
reports, as a Ray generator. Every item is ``str`` (one JSON object), ``bytes`` (the
engine's frames, see ``zett_agent.process._wire._protocol``) or a list of both (below), in
this order:

- ``{"k": "start", "node": NODE, "tree": TREE, "containment": INFO}``: where the child runs and
  what contains it (``TREE``: this Ray worker's pid and start time, its pool's launcher's, the
  pool's cgroup directory, the containment mode, the machine's ``views``), sent before the
  child starts;
- ``{"k": "inbox", "path": PATH, "key": KEY}``: the child's inbox on its node (``_ray_inbox``),
  before anything of the child; never noted in the key-value store;
- ``{"k": "pid", "pid": PID}`` once the child has its process; ``{"k": "sandbox", "v": ENTRY}``
  once its sandbox is in place, before its code runs; ``{"k": "usage", "cpu": S, "rss": B}``
  about once a second when the numbers changed;
- frames: each event, and the result (a ``result`` message with its usage numbers), encoded
  again from what the pool decoded (so they passed the pool's budgets and checks), at most
  ``RELAY_CHUNK`` bytes per item;
- last ``{"k": "end", "error": RECORD | None, "gone": BOOL, "cpu": S, "peak": B}``: the
  outcome (``None``: the result came before), and whether the child's tree was confirmed gone.

What the node's pool reported meanwhile travels as one item, a ``list`` of these in order (of
at most ``RELAY_CHUNK`` bytes, a larger one alone): each item a Ray generator yields costs the
task about half a millisecond and reaches the driver after the ones before it, so a child's
first event would otherwise wait behind its ``start``, ``inbox`` and ``pid`` records.

Cancel: ``ray.cancel(ref, force=False)`` raises ``KeyboardInterrupt`` in this thread (Ray trips
SIGINT; its wakeup descriptor makes the wait here return at once). The task then has the pool
kill the child's tree and returns without an item once that is confirmed: a stream that ends
cleanly without ``end`` means "cancelled, and nothing of the child is left". If the kill cannot
be confirmed in time, the ``KeyboardInterrupt`` goes on (Ray reports ``TaskCancelledError``)
and the driver kills the tree from outside, with the tree it learned from ``start`` or from
the note the task left in the cluster's key-value store before the child started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from zett_agent.process import ProcessLimits, Sandbox
from zett_agent.process._wire._encode import Encoder
from zett_agent.process._wire._protocol import HEADER
from zett_agent.runners._ray import _ray_node

__all__ = [
    "KV_NAMESPACE",
    "NESTED_ADDRESS",
    "kv_key",
    "prestart",
    "run_task",
    "run_task_fresh",
]

#: where a task notes its tree in the cluster's key-value store
KV_NAMESPACE = "zett_agent"
#: largest ``bytes`` item of the stream
RELAY_CHUNK = 1 << 20
#: seconds the task waits, after a cancel, for its child's tree to be confirmed gone
CANCEL_WAIT = 10.0
#: the environment variable that tells a child's own ``RayRunner`` which cluster it runs in
NESTED_ADDRESS = "ZETT_AGENT_RAY_ADDRESS"


def kv_key(token: str) -> str:
    return f"zett-ray/{token}"


def _dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _frames(kind: str, value: Any, usage: dict[str, Any] | None, max_bytes: int) -> Iterator[bytes]:
    """The engine's frames of one message, joined into items of at most ``RELAY_CHUNK``."""
    out: list[bytes] = []

    def send(payload: bytes) -> None:
        out.append(HEADER.pack(len(payload)) + payload)

    def send_parts(size: int, parts: Any) -> None:
        out.append(HEADER.pack(size) + b"".join(parts))

    Encoder(send, max_bytes, send_parts=send_parts).message(kind, value, usage)
    chunk: list[bytes] = []
    size = 0
    for frame in out:
        if chunk and size + len(frame) > RELAY_CHUNK:
            yield b"".join(chunk)
            chunk, size = [], 0
        chunk.append(frame)
        size += len(frame)
    if chunk:
        yield b"".join(chunk)


def _joined(out: Iterable[str | bytes]) -> Iterator[str | bytes | list[str | bytes]]:
    """``out`` as few stream items as ``RELAY_CHUNK`` allows, in order: a lone one as itself."""
    group: list[str | bytes] = []
    size = 0
    for part in out:
        if group and size + len(part) > RELAY_CHUNK:
            yield group if len(group) > 1 else group[0]
            group, size = [], 0
        group.append(part)
        size += len(part)
    if group:
        yield group if len(group) > 1 else group[0]


class _Interrupts:
    """This thread's signal wakeup descriptor while the task runs (the main thread only)."""

    def __init__(self) -> None:
        self.fd = -1
        self._write = -1
        self._previous = -1
        if threading.current_thread() is not threading.main_thread():
            return
        self.fd, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)

    def close(self) -> None:
        if self.fd < 0:
            return
        signal.set_wakeup_fd(self._previous)
        os.close(self.fd)
        os.close(self._write)
        self.fd = -1


def run_task(
    payload: bytes,
    brokered: bool,
    limits: ProcessLimits,
    sandbox: Sandbox | None,
    models: list[Any] | None,
    config: dict[str, Any],
    token: str,
) -> Iterator[str | bytes | list[str | bytes]]:
    """The body of one child's Ray generator task (see the module docstring).

    ``payload`` is what the pool's worker runs: ``run_pickled_child``'s pickled spec when
    ``brokered`` (its brokerable models replaced by stand-ins; ``models`` are the real ones,
    which this task uses to serve the child's calls), else the cloudpickled function, arguments
    and keywords. Nothing of it is unpickled in this process.
    """
    import ray
    from ray.experimental import internal_kv

    context = ray.get_runtime_context()
    node = context.get_node_id()
    # a child that starts children of its own on Ray joins this cluster (see RayRunner)
    os.environ.setdefault(NESTED_ADDRESS, context.gcs_address)
    node_config = _ray_node.NodeConfig(**config)
    run = _ray_node.NodeRun(
        _ray_node.host(), node_config, payload, limits, sandbox, models, brokered
    )
    run.start()
    interrupts = _Interrupts()
    noted = keep_note = False

    def parts(batch: list[tuple[Any, ...]]) -> Iterator[str | bytes]:
        nonlocal noted
        for item in batch:
            kind = item[0]
            if kind == "ready":
                start = _dumps(
                    {"k": "start", "node": node, "tree": item[1], "containment": item[2]}
                )
                # before the child starts: a worker that cannot report any more (stopped,
                # killed) still left where its child ran
                internal_kv._internal_kv_put(kv_key(token), start, namespace=KV_NAMESPACE)
                noted = True
                run.go()  # the start record still comes first: all else is queued after it
                yield start
            elif kind == "event":
                yield from _frames("event", item[1], None, node_config.max_frame_bytes)
            elif kind == "result":
                yield from _frames("result", item[1], item[2], node_config.max_frame_bytes)
            elif kind == "inbox":
                yield _dumps({"k": "inbox", "path": item[1], "key": item[2]})
            elif kind == "pid":
                yield _dumps({"k": "pid", "pid": item[1]})
            elif kind == "sandbox":
                yield _dumps({"k": "sandbox", "v": item[1]})
            elif kind == "usage":
                yield _dumps({"k": "usage", **item[1]})
            elif kind == "end":
                yield _dumps(item[1])

    try:
        for batch in run.batches(interrupts.fd):
            # encoded as they are sent: one event's frames at a time, never a whole batch's
            yield from _joined(parts(batch))
    except KeyboardInterrupt:
        # ray.cancel(force=False): kill the child; a clean end says its tree is gone
        run.cancel()
        if run.wait_end(CANCEL_WAIT):
            return
        keep_note = noted  # the driver needs the tree to kill it from outside
        raise
    except GeneratorExit:
        # Ray closed the stream (the interrupt came while Ray's own code ran): nothing can be
        # sent any more, so the note says whether the tree is gone
        run.cancel()
        if noted:
            gone = run.wait_end(CANCEL_WAIT)
            with contextlib.suppress(Exception):
                note = _dumps({"k": "cancelled", "gone": gone})
                internal_kv._internal_kv_put(kv_key(token), note, namespace=KV_NAMESPACE)
            keep_note = True
        raise
    finally:
        interrupts.close()
        run.close()
        if noted and not keep_note:
            with contextlib.suppress(Exception):
                internal_kv._internal_kv_del(kv_key(token), namespace=KV_NAMESPACE)


def run_task_fresh(*args: Any) -> Iterator[str | bytes | list[str | bytes]]:
    """``run_task`` registered with ``max_calls=1``: the Ray worker exits after this child."""
    yield from run_task(*args)


def prestart(token: str, count: int, timeout: float) -> int:
    """Hold this Ray worker until ``count`` tasks of ``token`` run, then return its pid.

    ``RayRunner(prestart_workers=N)`` runs N of these at once, so Ray starts N workers (each
    task holds its own until all run), which later children reuse. Bounded by ``timeout``
    seconds (then it returns anyway).
    """
    import time

    from ray.experimental import internal_kv

    prefix = f"zett-prestart/{token}/"
    internal_kv._internal_kv_put(f"{prefix}{os.getpid()}", b"1", namespace=KV_NAMESPACE)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(internal_kv._internal_kv_list(prefix, namespace=KV_NAMESPACE)) >= count:
            break
        time.sleep(0.05)  # a bounded wait for the others: no event to wait on across workers
    return os.getpid()
