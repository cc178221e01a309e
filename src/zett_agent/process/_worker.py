"""The child side: what runs inside a worker process, and ``emit``.

A worker is forked by the launcher. It reads cloudpickle'd jobs from its socket, runs each one
and answers with JSON frames (see ``_protocol``). It imports almost nothing itself; everything it
uses was already imported by the launcher before the fork, so a worker starts warm.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import socket
import sys
import threading
from typing import Any, NoReturn

from . import _linux, _tree
from ._protocol import CLEAN_EXIT, FLAG_LAST, HEADER, RAW_TEXT_MIN

__all__ = ["emit", "serve"]

#: compact JSON; one encoder for every frame (``json.dumps`` with ``separators`` builds a new
#: encoder for each call)
_dumps = json.JSONEncoder(separators=(",", ":")).encode

_JSON_HINT = "JSON-compatible data (dict with str keys, list, str, int, float, bool, None)"


class _Channel:
    """The worker's end of its socket; ``send`` is thread-safe and blocks (backpressure)."""

    def __init__(self, sock: socket.socket, max_frame_bytes: int) -> None:
        self.sock = sock
        self.max_frame_bytes = max_frame_bytes
        self.lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        payload = _dumps(message).encode("utf-8")
        if len(payload) > self.max_frame_bytes:
            raise ValueError(
                f"a {message['k']} of {len(payload)} bytes does not fit the pool's "
                f"max_frame_bytes={self.max_frame_bytes}; send less data per frame or raise "
                "ProcessPool(max_frame_bytes=...)"
            )
        with self.lock:
            self._send_frame(payload)

    def send_text_result(self, text: str, usage: dict[str, float]) -> None:
        """A result that is one large string: a JSON frame announcing it, then its UTF-8.

        An ASCII string (the common case, and known in O(1)) is encoded and sent in slices:
        a whole-string ``encode`` would write a second copy of the result into fresh memory,
        and first writes to fresh pages cost more than the copy itself. Sending slice by slice
        also lets the parent read the start while the rest is encoded.

        Raises ``UnicodeEncodeError`` for lone surrogates (the caller sends JSON instead).
        """
        data = None if text.isascii() else text.encode("utf-8")
        size = len(text) if data is None else len(data)
        if size > self.max_frame_bytes:
            raise ValueError(
                f"a result of {size} bytes does not fit the pool's max_frame_bytes="
                f"{self.max_frame_bytes}; return less data or raise "
                "ProcessPool(max_frame_bytes=...)"
            )
        announce = json.dumps({"k": "result", "text": size, "u": usage}).encode()
        with self.lock:
            self._send_frame(announce)
            if data is not None:
                self._send_frame(data)
                return
            self.sock.sendall(HEADER.pack(size))
            for start in range(0, size, _TEXT_SLICE):
                self.sock.sendall(text[start : start + _TEXT_SLICE].encode("ascii"))

    def _send_frame(self, payload: bytes) -> None:
        header = HEADER.pack(len(payload))
        if len(payload) < 65536:
            self.sock.sendall(header + payload)
        else:  # no copy of a large payload just to prepend four bytes
            self.sock.sendall(header)
            self.sock.sendall(payload)


#: characters of an ASCII text result encoded and sent at a time: below malloc's mmap
#: threshold (128 KiB), so the slice and its bytes reuse the same, already touched, heap memory
#: each time (256 KiB slices were mmapped afresh each time and sending took 2.5x longer)
_TEXT_SLICE = 1 << 16


_channel: _Channel | None = None


def _raw_text(result: Any) -> bool:
    """Whether ``result`` is a large ``str`` that skips JSON (escaping and parsing are slow)."""
    return type(result) is str and len(result) >= RAW_TEXT_MIN


def emit(obj: Any) -> None:
    """Send ``obj`` as an event to the parent; it appears in ``ProcessJob.events()``.

    Call it only from code running inside a pool job. ``obj`` must be JSON-compatible (tuples
    arrive as lists). The write blocks while the parent's buffer for this job is full, so a
    flood of events slows the job down instead of growing the parent's memory.

    Raises ``TypeError`` naming the offending value if ``obj`` is not JSON-compatible,
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
        channel.send({"k": "event", "v": obj})
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValueError) and "max_frame_bytes" in str(exc):
            raise
        raise TypeError(f"emit() takes {_JSON_HINT}; {exc}") from None


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
    """The next frame's payload (None at end of stream). One ``recv`` usually brings the
    header and a small job together; ``buffer`` keeps what arrived beyond the frame."""
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


def _usage() -> dict[str, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "cpu": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
        "maxrss": max(me.ru_maxrss, kids.ru_maxrss) * 1024,
    }


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _error(exc: BaseException) -> dict[str, Any]:
    import traceback

    return {
        "k": "error",
        "type": _type_name(exc),
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }


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


def _run(payload: bytes | memoryview) -> Any:
    import cloudpickle

    fn, args, kwargs, spec = cloudpickle.loads(payload)
    if spec is not None:
        _apply_limits(spec)
    result = fn(*args, **kwargs)
    if hasattr(result, "__await__"):
        import asyncio

        result = asyncio.run(_await(result))
    return result


def _reap_leftovers() -> None:
    """Kill and reap every descendant a finished job left behind (this process is a subreaper)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return  # the common case: the job started no process
    _tree.freeze_and_kill(_tree.children_of(_tree.scan(), os.getpid()))
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _flush_std_streams() -> None:
    # os._exit() skips Python's own flushing; what the job printed must not be lost
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()


#: seconds a new worker waits for a first job before it warms up as a spare
_WARM_UP_AFTER = 0.002


def _warm_up() -> None:
    """Run the job path once on a dummy job before the first real one arrives.

    A freshly forked worker shares its memory with the launcher copy-on-write; the first run
    of any code path pays page faults for every object it touches. Paying them here, while the
    worker waits as a spare, takes them off the dispatch latency of the first job.
    """
    import cloudpickle

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    fn, args, kwargs, _spec = cloudpickle.loads(cloudpickle.dumps((nothing, (1,), {"k": 2}, None)))
    _dumps({"k": "result", "v": fn(*args, **kwargs), "u": _usage()})
    HEADER.pack(0)


def serve(sock: socket.socket, launcher_pid: int, max_frame_bytes: int) -> NoReturn:
    """Run jobs from ``sock`` until told the job is the last one or the socket closes; exit.

    Never returns: the process ends with ``os._exit`` so nothing of the launcher's state (atexit
    handlers, buffered files) runs twice.
    """
    global _channel
    _linux.set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != launcher_pid:
        os._exit(1)
    os.setsid()
    _linux.set_child_subreaper()
    sock.setblocking(True)
    _channel = _Channel(sock, max_frame_bytes)
    # warm up only as a spare: when a job is already on its way (the pool is busy), the
    # warm-up would just be extra work before it
    if not select.select([sock], [], [], _WARM_UP_AFTER)[0]:
        _warm_up()
    me = os.getpid()
    received = bytearray()
    while True:
        body = _recv_frame(sock, received)
        if body is None:
            break
        last = body[0] & FLAG_LAST
        try:
            try:
                result = _run(memoryview(body)[1:])  # no copy of large arguments
            finally:
                if os.getpid() != me:
                    # a process the job forked returned from the job: the answer is ours
                    os._exit(0)
            try:
                sent = False
                if _raw_text(result):
                    # lone surrogates cannot be UTF-8; JSON still carries them as escapes
                    with contextlib.suppress(UnicodeEncodeError):
                        _channel.send_text_result(result, _usage())
                        sent = True
                if not sent:
                    _channel.send({"k": "result", "v": result, "u": _usage()})
            except (TypeError, ValueError) as exc:
                if isinstance(exc, ValueError) and "max_frame_bytes" in str(exc):
                    raise
                raise TypeError(
                    f"results must be JSON-compatible (dict/list/str/int/float/bool/None); {exc}"
                ) from None
        except BaseException as exc:
            message = _error(exc)
            message["u"] = _usage()
            try:
                _channel.send(message)
            except (TypeError, ValueError):
                message["message"] = repr(message["message"])[:1000]
                message["traceback"] = ""
                _channel.send(message)
        _flush_std_streams()
        _reap_leftovers()
        if last:
            break
    os._exit(CLEAN_EXIT)
