"""The child side: what runs inside a worker process, and ``emit``.

A worker is forked by the launcher, already inside its own cgroup (cgroup containment), and
makes a process group of its own in the pool's session. It reads cloudpickle'd jobs from its
socket, runs each one and answers with frames (see ``_protocol`` and ``_encode``). It imports
almost nothing itself; everything it uses was imported by the launcher before the fork, so a
worker starts warm.

Nothing a job does here is trusted by the parent: the job runs in this very process and can
write anything to the socket, change any flag, or exit with any status. The parent decides
from what it observes (its own kill, the cgroup, pidfds), never from what the worker says.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from .. import _linux
from .._containment import _scan
from .._sandbox import _confine, _landlock, _ruleset
from .._wire._encode import Encoder, _dumps, without_surrogates
from .._wire._protocol import CHUNK, FLAG_LAST, FLAG_MESSAGE, FLAG_SANDBOX, HEADER
from . import _inbox
from ._inbox import Inbox

__all__ = ["emit", "serve"]

_JSON_HINT = "JSON data (dicts with str keys, lists, tuples, str, int, float, bool, None)"


class _Channel:
    """The worker's end of its socket.

    One message at a time (a lock), blocking writes (backpressure: the parent stops reading while
    its buffer for the job is full). What the host sends is read by the job loop (jobs) and the
    ``inbox`` (messages to the running job, see ``_inbox``), from one shared buffer.
    """

    def __init__(self, sock: socket.socket, max_frame_bytes: int) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self.encoder = Encoder(self._send_frame, max_frame_bytes, send_parts=self._send_parts)
        self.inbox = Inbox(sock)

    def _send_frame(self, payload: bytes) -> None:
        header = HEADER.pack(len(payload))
        if len(payload) < 65536:
            self.sock.sendall(header + payload)
        else:  # no copy of a large payload just to prepend four bytes
            self.sock.sendall(header)
            self.sock.sendall(payload)

    def _send_parts(self, size: int, parts: Iterable[bytes]) -> None:
        """One frame of ``size`` bytes, written part by part as the parts are made."""
        self.sock.sendall(HEADER.pack(size))
        for part in parts:
            self.sock.sendall(part)

    def message(
        self,
        kind: str,
        value: Any,
        usage: dict[str, float] | None = None,
        *,
        as_json: bool = False,
    ) -> None:
        with self.lock:
            self.encoder.message(kind, value, usage, as_json=as_json)

    def error(self, exc: BaseException, usage: dict[str, float]) -> None:
        """Report the job's exception.

        Long texts are cut so it fits one frame, and a lone surrogate in them is written as its
        escape (the parent refuses invalid Unicode).
        """
        import traceback

        text = without_surrogates(str(exc))
        trace = without_surrogates("".join(traceback.format_exception(exc)))
        if len(text) > CHUNK // 8:
            text = text[: CHUNK // 8] + "... (cut)"
        if len(trace) > CHUNK // 4:
            trace = "... (cut)\n" + trace[-(CHUNK // 4) :]
        message = {
            "k": "error",
            "type": without_surrogates(_type_name(exc)),
            "message": text,
            "traceback": trace,
            "u": usage,
        }
        with self.lock:
            self._send_frame(_dumps(message).encode())

    def sandbox_report(self, report: dict[str, Any], listener: int | None = None) -> None:
        """What was enforced, sent before the job runs (so the job cannot forge it).

        With ``listener`` (an ``Egress`` job's listening socket in its network namespace) the
        descriptor goes along (``SCM_RIGHTS``) and this process's copy is closed: the host's
        proxy accepts on it, the job cannot.
        """
        payload = _dumps({"k": "sandbox", "v": report}).encode()
        with self.lock:
            if listener is None:
                self._send_frame(payload)
                return
            try:
                data = HEADER.pack(len(payload)) + payload
                sent = socket.send_fds(self.sock, [data], [listener])
                if sent < len(data):
                    self.sock.sendall(data[sent:])
            finally:
                os.close(listener)


_channel: _Channel | None = None


def current_channel() -> _Channel | None:
    """This worker's channel to the host (None outside a worker)."""
    return _channel


def emit(obj: Any) -> None:
    """Send ``obj`` as an event to the parent; it appears in ``ProcessJob.events()``.

    Call it only from code running inside a pool job. ``obj`` must be JSON data (tuples arrive
    as lists). The write blocks while the parent's buffer for this job is full, so a flood of
    events slows the job down instead of growing the parent's memory.

    Raises ``TypeError`` naming where ``obj`` is not JSON data (a non-str dict key, an object),
    ``ValueError`` if it is larger than the pool's ``max_frame_bytes``, and ``RuntimeError``
    outside a worker.
    """
    channel = _channel
    if channel is None:
        raise RuntimeError(
            "emit() only works inside a job running in a ProcessPool worker; call it from the "
            "function you passed to ProcessPool.submit()"
        )
    try:
        channel.message("event", obj)
    except TypeError as exc:
        raise TypeError(f"emit() takes {_JSON_HINT}: {exc}") from None


def emit_json(obj: Any) -> None:
    """``emit(obj)`` for a value that becomes JSON anyway: sent as ``json.dumps`` takes it.

    For the engine's own users in a worker (a brokered model's request, which its parent sends
    on as JSON): a non-``str`` dict key arrives as the string JSON makes of it instead of being
    refused, and a value whose JSON fits one frame is not walked first (``Encoder.message``'s
    ``as_json``). Raises as ``emit``.
    """
    channel = _channel
    if channel is None:
        raise RuntimeError("emit_json() only works inside a job running in a ProcessPool worker")
    try:
        channel.message("event", obj, as_json=True)
    except TypeError as exc:
        raise TypeError(f"emit_json() takes {_JSON_HINT}: {exc}") from None


def _channel_fd() -> int:
    """The worker socket's fd (tests use it to write garbage on purpose)."""
    if _channel is None:
        raise RuntimeError("not inside a worker")
    return _channel.sock.fileno()


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv_frame(sock: socket.socket, buffer: bytearray) -> bytes | None:
    """The next frame's payload (None at end of stream).

    One ``recv`` usually brings the header and a small job together; ``buffer`` keeps what arrived
    beyond the frame.
    """
    while len(buffer) < HEADER.size:
        chunk = sock.recv(_RECV_SIZE)
        if not chunk:
            return None
        buffer += chunk
    (size,) = HEADER.unpack_from(buffer)
    end = HEADER.size + size
    if len(buffer) >= end:
        body = bytes(buffer[HEADER.size : end])
        del buffer[:end]
        return body
    rest = _recv_exactly(sock, end - len(buffer))
    if rest is None:
        return None
    body = b"".join((buffer[HEADER.size :], rest))
    buffer.clear()
    return body


#: bytes asked for by one ``recv`` of the job loop
_RECV_SIZE = 1 << 16


def _usage(leaving: bool = False) -> dict[str, float]:
    """The job's CPU seconds and peak memory, and whether this worker exits after its answer.

    ``leaving`` (sent as ``"exit": true``) is for a worker told it may run another job that
    will not (``_clean_up`` found what the job left): the host must not hand it a next job,
    whatever its own check of the worker reads while the worker is exiting.
    """
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    usage = {
        "cpu": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
        "maxrss": max(me.ru_maxrss, kids.ru_maxrss) * 1024,
    }
    if leaving:
        usage["exit"] = True
    return usage


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _apply_limits(spec: dict[str, Any]) -> None:
    if spec["memory_bytes"] is not None:
        resource.setrlimit(resource.RLIMIT_AS, (spec["memory_bytes"], spec["memory_bytes"]))
    if spec["cpu_seconds"] is not None:
        soft = max(1, -(-spec["cpu_seconds"] // 1))
        resource.setrlimit(resource.RLIMIT_CPU, (int(soft), int(soft) + 1))
    if spec["max_open_files"] is not None:
        n = spec["max_open_files"]
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    if spec["env"] is not None:
        os.environ.clear()
        os.environ.update(spec["env"])
    if spec["cwd"] is not None:
        os.chdir(spec["cwd"])


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _sandboxed(body: memoryview) -> int:
    """Enforce the sandbox policy at the start of ``body`` and report it.

    Return where the pickled job starts. Exits the process when the job must not run (the report
    says why).
    """
    import json

    assert _channel is not None
    size: int = HEADER.unpack_from(body, 1)[0]
    try:
        parts = json.loads(bytes(body[1 + HEADER.size : 1 + HEADER.size + size]))
        report = _confine.confine({**parts["shared"], **parts["job"]}, _channel.sock.fileno())
    except Exception as exc:  # a bug here must not let the job run unconfined
        report = {"refused": f"confining the worker failed: {type(exc).__name__}: {exc}"}
    listener = report.pop("egress_fd", None)
    _channel.sandbox_report(report, listener)
    if "refused" in report:
        _flush_std_streams()
        os._exit(0)
    return 1 + HEADER.size + size


#: ``cloudpickle.loads``, bound at the first job (importing it is not for the launcher)
_loads: Callable[[bytes | memoryview], Any] | None = None


def _run(payload: bytes | memoryview) -> Any:
    global _loads
    if _loads is None:
        import cloudpickle

        _loads = cloudpickle.loads
    fn, args, kwargs, spec = _loads(payload)
    if spec is not None:
        _apply_limits(spec)
    result = fn(*args, **kwargs)
    if hasattr(result, "__await__"):
        import asyncio

        result = asyncio.run(_await(result))
    return result


def _clean_up() -> bool:
    """Kill and reap what a job left behind; return whether this worker may run another job.

    Best effort, in the job's own process: the parent checks independently (a job can lie).
    Never blocks in a wait on a process it did not kill.
    """
    if threading.active_count() > 1:
        return False  # a thread of the job still runs here: it would run into the next job
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True  # the common case, in one system call: no child at all
    kids = _scan.children(os.getpid())
    if kids:
        _scan.wait_dead(_scan.freeze_and_kill(kids), timeout=1.0)
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False  # a child still lives (forked by what we killed, or unkillable)


def _flush_std_streams() -> None:
    # os._exit() skips Python's own flushing; what the job printed must not be lost
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - contextlib.suppress costs three Python calls, twice per job
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


#: seconds a new worker waits for a first job before it warms up as a spare
_WARM_UP_AFTER = 0.002

#: whether the launcher ran the job path and the pool's ``warm_up`` before it forked this
#: worker (``_launcher._rehearse``): set in the launcher, inherited by every worker
rehearsed = False
#: the launcher's request for the shortest scheduler slice (``_linux.short_slice_request``),
#: which a worker makes at its first job, before any of the job runs: asked for while it
#: idled, a spare would preempt the host the moment the host hands it the job
slice_request: Any = None


def warm_up(confine: bool, loop: bool = False, prepare: str = "", engine: bool = True) -> None:
    """Run the job path once on a dummy job before the first real one arrives.

    A freshly forked worker shares its memory with the launcher copy-on-write; the first run
    of any code path pays page faults for every object it touches. Paying them here, while the
    worker waits as a spare, takes them off the dispatch latency of the first job. With
    ``confine``, the same for what confining a sandboxed job touches; with ``loop``, for
    running an event loop; with ``prepare`` (the shared part of a policy), it builds ahead
    what confining a job of that kind takes (``_ruleset.prepare``). Without ``engine`` (the
    launcher ran the job path before it forked: ``rehearsed``), only the confining part: a
    spare's own run of that path was no faster to dispatch then, and left about 0.4 MiB more
    of its memory its own.
    """
    if engine:
        _warm_up_job(loop)
    if confine:
        _confine.warm_up()  # the sandbox's path too: a spare of a sandboxing pool may get one
        if prepare:
            _ruleset.prepare(prepare)


def _warm_up_job(loop: bool) -> None:
    """A dummy job's way through the engine: unpickled, run, its result encoded."""
    import cloudpickle

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    fn, args, kwargs, _spec = cloudpickle.loads(cloudpickle.dumps((nothing, (1,), {"k": 2}, None)))
    sink: list[bytes] = []
    Encoder(sink.append, 1 << 20).message("result", fn(*args, **kwargs), _usage())
    if loop:
        _warm_up_event_loop()  # the pool has run coroutine jobs: the next one will be too


def _warm_up_event_loop() -> None:
    """Run one empty ``asyncio.run``, then leave asyncio as a fresh process has it.

    The first event loop a forked worker runs costs 1.5 to 2 ms of copy-on-write page faults
    (measured on 3.11 to 3.13; the next one costs 0.3 ms), which a coroutine job would pay on
    its dispatch path; a sandboxed job, which always gets a fresh worker, paid it every time.
    ``asyncio.run`` marks its policy as having had a loop set, after which
    ``asyncio.get_event_loop()`` raises instead of creating one: dropping the policy gives the
    job the same asyncio it would find in a process that never ran a loop.
    """
    import asyncio

    async def nothing() -> None:
        return None

    asyncio.run(nothing())
    fresh_asyncio()


def fresh_asyncio() -> None:
    """Drop asyncio's policy if a warm-up ran a loop (see ``_warm_up_event_loop``)."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # policies are deprecated in 3.14
        asyncio.set_event_loop_policy(None)


def serve(
    sock: socket.socket,
    launcher_pid: int,
    max_frame_bytes: int,
    pdeath: int = signal.SIGKILL,
    scope: int = 0,
    confine: bool = False,
    loop: bool = False,
    prepare: str = "",
) -> NoReturn:
    """Run jobs from ``sock`` until told the job is the last one or the socket closes; exit.

    Never returns: the process ends with ``os._exit`` so nothing of the launcher's state (atexit
    handlers, buffered files) runs twice. The parent kills the worker's tree once its last
    result arrived; exiting first is just faster. ``pdeath`` is the signal this process gets
    when the launcher dies. ``scope`` (a Landlock ABI, 0 for none) puts the worker in a Landlock
    domain of its own before any job: nothing its jobs start can signal, ``ptrace`` or reach an
    abstract UNIX socket of a process outside its tree (the launcher, the host, other pools).
    ``confine``: an idle spare also prepares for confining a job (the pool sandboxes jobs);
    ``loop``: it runs an empty event loop (the pool's jobs are coroutine functions);
    ``prepare``: the shared part of the latest sandboxed job's policy, which an idle spare
    prepares for (a job that is not sandboxed closes what it prepared first).

    A sandboxed job (``FLAG_SANDBOX``) is confined before it is unpickled, and its worker runs
    no other job.
    """
    global _channel, slice_request
    _linux.set_parent_death_signal(pdeath)
    if os.getppid() != launcher_pid:
        os._exit(1)
    os.setpgid(0, 0)  # a group of its own, in its launcher's session (the pool's)
    if scope:
        try:
            _landlock.scope_self(scope)
        except OSError as exc:
            # the launcher saw this work when it started: never run a job unscoped when the
            # host was told its jobs are
            print(f"zett-agent worker: cannot enter its Landlock domain: {exc}", file=sys.stderr)
            os._exit(71)
    sock.setblocking(True)
    _channel = _Channel(sock, max_frame_bytes)
    _inbox.bind(_channel.inbox)
    # warm up only as a spare: when a job is already on its way (the pool is busy), the
    # warm-up would just be extra work before it
    if not select.select([sock], [], [], _WARM_UP_AFTER)[0]:
        warm_up(confine, loop, prepare, engine=not rehearsed)
    me = os.getpid()
    received = _channel.inbox.buffer
    # orphans of a job (its grandchildren whose parent died) land here, where the clean-up
    # after the job finds them (never inherited through a fork: set once here). A job may
    # switch it off: under scan containment it is set again after every job, before the next
    # one can start; under cgroup containment (``pdeath`` SIGKILL: the worker's cgroup holds
    # its whole tree) an orphan that went past the worker is still in its cgroup, which the
    # host reads before reusing the worker, and the worker is retired instead
    _linux.set_child_subreaper()
    each_job = pdeath != signal.SIGKILL
    while True:
        body = _recv_frame(sock, received)
        if body is None:
            break
        flags = body[0]
        if flags & FLAG_MESSAGE:
            continue  # for a job that ended (sent as it finished): never read as a job
        _channel.inbox.start_job()
        if slice_request is not None:
            _linux.take_slice(slice_request)  # before a sandbox could refuse the call
            slice_request = None
        last = flags & FLAG_LAST or flags & FLAG_SANDBOX
        try:
            try:
                view = memoryview(body)
                if flags & FLAG_SANDBOX:
                    start = _sandboxed(view)
                else:
                    _ruleset.discard()  # nothing of a sandbox's preparation for this job
                    start = 1
                result = _run(view[start:])  # no copy of large arguments
            finally:
                if os.getpid() != me:
                    # a process the job forked returned from the job: the answer is ours
                    os._exit(0)
            _flush_std_streams()
            # a worker that runs another job cleans up before it answers, so the parent finds
            # it clean when the answer arrives (the parent checks; a last job's whole tree is
            # killed by the parent when its answer arrives)
            reusable = not last and _clean_up()
            try:
                _channel.message("result", result, _usage(not last and not reusable))
            except TypeError as exc:
                raise TypeError(f"results must be {_JSON_HINT}: {exc}") from None
        except BaseException as exc:
            _flush_std_streams()
            reusable = not last and _clean_up()
            _channel.error(exc, _usage(not last and not reusable))
        if not reusable:
            break
        if each_job:
            # after the answer, off its path: the next job cannot start before this
            _linux.set_child_subreaper()
    _flush_std_streams()
    os._exit(0)
