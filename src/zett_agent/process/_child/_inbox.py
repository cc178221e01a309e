"""The child side of messages from the host to a running job: ``receive`` and ``receive_blocking``.

The host sends with ``ProcessJob.send(value, topic=...)``; inside the job::

    from zett_agent.process._child._inbox import receive, receive_blocking

    value = await receive("steer")                  # an async job: waits in its event loop
    value = receive_blocking("steer", timeout=5.0)  # a sync job (or a thread of one)

Each topic is a queue of its own, in the order the host sent; a message nobody asked for stays
queued until the job ends, then it is discarded (the next job on the worker never sees it).
Reading never stalls the job: the async form watches the worker's socket through the job's
running event loop (``add_reader``) only while someone waits, with non-blocking reads, and the
blocking form waits in ``select`` with the caller's timeout. Both read only message frames; a
job frame is left in the buffer for the worker's job loop (none can arrive while a job runs).

This module is imported by the worker before the fork (by ``_worker``), so it imports nothing
beyond what the worker already has; ``asyncio`` is imported on the first async ``receive``,
inside an async job, which has it already.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from .._wire._protocol import FLAG_MESSAGE, HEADER

if TYPE_CHECKING:
    import asyncio

__all__ = ["Inbox", "receive", "receive_blocking"]

#: bytes asked for by one read of the inbox
_READ_SIZE = 1 << 16


class Inbox:
    """The messages of the running job, and the bytes read from the socket for the job loop.

    ``buffer`` is shared with the worker's job loop (``_worker.serve``): what one read brings
    beyond a job frame (messages sent right after the job) is kept for the inbox, and what the
    inbox reads beyond its messages (never, while a job runs) is kept for the job loop.

    One reader at a time reads the socket for everyone: the job's event loop while async
    receivers wait, else one blocking receiver (the others wait on ``cond`` and take over when
    it leaves). Whoever reads puts each message in its topic's box and wakes the receivers.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.buffer = bytearray()
        #: held while reading the socket or touching the boxes (never while waiting)
        self.lock = threading.Lock()
        #: blocking receivers wait on it for a message another reader took, or their turn to read
        self.cond = threading.Condition(self.lock)
        self.boxes: dict[str, deque[Any]] = {}
        self.eof = False
        #: futures of async receivers, by topic, and the loop whose reader serves them
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        #: a blocking receiver is in ``select`` on the socket, and its thread
        self._sync_reading = False
        self._sync_thread: int | None = None
        #: a pipe the blocking reader also waits on: another reader that took the messages it
        #: waited for (between its release of ``lock`` and its ``select``) writes a byte to it
        self._bell: tuple[int, int] | None = None

    def start_job(self) -> None:
        """A new job starts: forget the messages and waiters of the one before."""
        if not (self.boxes or self._waiters or self._loop is not None):
            # the common case: the job before sent nothing and left no thread (a worker whose
            # job left a thread is not reused), so nothing else can be touching them now
            return
        with self.lock:
            self.boxes.clear()
            self._waiters.clear()
            self._loop = None  # its loop is closed; its reader went with it

    # -- taking frames (under ``lock``) -----------------------------------------------------

    def _take(self) -> bool:
        """Move the complete message frames at the start of ``buffer`` into their boxes.

        Return whether there were any.
        """
        buffer = self.buffer
        offset, end_of_data, took = 0, len(buffer), False
        while end_of_data - offset > HEADER.size:
            (size,) = HEADER.unpack_from(buffer, offset)
            if not buffer[offset + HEADER.size] & FLAG_MESSAGE:
                break  # a job frame: the job loop's
            end = offset + HEADER.size + size
            if end > end_of_data:
                break
            message = json.loads(buffer[offset + HEADER.size + 1 : end])
            self.boxes.setdefault(message["t"], deque()).append(message["v"])
            offset, took = end, True
        if offset:
            del buffer[:offset]
        return took

    def _read(self) -> None:
        """One non-blocking read into ``buffer``.

        The messages it completes go to their boxes and their receivers are woken (all of them at
        the end of the stream).
        """
        try:
            chunk = self.sock.recv(_READ_SIZE, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if chunk:
            self.buffer += chunk
            if not self._take():
                return
        else:
            self.eof = True
        self.cond.notify_all()
        if (
            self._sync_reading
            and self._bell is not None
            and self._sync_thread != threading.get_ident()
        ):
            with contextlib.suppress(BlockingIOError):
                os.write(self._bell[1], b"\0")  # the blocking reader looks at the boxes again
        if self._loop is not None:
            if self._thread == threading.get_ident():
                self._wake()
            else:
                with contextlib.suppress(RuntimeError):  # that loop was closed meanwhile
                    self._loop.call_soon_threadsafe(self._wake)

    def _pop(self, topic: str) -> tuple[bool, Any]:
        box = self.boxes.get(topic)
        if box:
            return True, box.popleft()
        if self.eof:
            raise EOFError("the host closed the job's channel; no more messages will come")
        return False, None

    # -- async receivers (on the loop's thread) ---------------------------------------------

    def _watch(
        self, loop: asyncio.AbstractEventLoop, topic: str, waiter: asyncio.Future[None]
    ) -> None:
        if self._loop is not None and self._loop is not loop:
            if not self._loop.is_closed():
                raise RuntimeError(
                    "receive() is already waiting in another event loop of this job; use one "
                    "loop (and receive_blocking in other threads)"
                )
            self._waiters.clear()
            self._loop = None
        self._waiters.setdefault(topic, []).append(waiter)
        if self._loop is None:
            self._loop = loop
            self._thread = threading.get_ident()
            loop.add_reader(self.fd, self._on_readable)

    def _unwatch(self, topic: str, waiter: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(topic)
        if waiters is not None and waiter in waiters:
            waiters.remove(waiter)
            if not waiters:
                del self._waiters[topic]
        if not self._waiters and self._loop is not None:
            # nobody waits: stop reading, so the socket's backpressure reaches the host again
            if not self._loop.is_closed():
                self._loop.remove_reader(self.fd)
            self._loop = None
            self.cond.notify_all()  # a blocking receiver takes over the reading

    def _on_readable(self) -> None:
        with self.lock:
            self._read()

    def _wake(self) -> None:
        """Wake every async receiver whose topic has a message now (all of them at EOF)."""
        for topic, waiters in list(self._waiters.items()):
            if self.eof or self.boxes.get(topic):
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)

    # -- receiving --------------------------------------------------------------------------

    async def receive(self, topic: str) -> Any:
        """The next message on ``topic``, waiting in the running loop (see ``receive``)."""
        import asyncio

        loop = asyncio.get_running_loop()
        while True:
            waiter: asyncio.Future[None] = loop.create_future()
            with self.lock:
                self._take()
                found, value = self._pop(topic)
                if found:
                    return value
                # registered before the lock is released: a thread that takes a message for
                # this topic meanwhile finds the waiter to wake
                self._watch(loop, topic, waiter)
            try:
                await waiter
            finally:
                with self.lock:
                    self._unwatch(topic, waiter)

    def receive_blocking(self, topic: str, timeout: float | None) -> Any:
        """The next message on ``topic``, blocking this thread (see ``receive_blocking``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while True:
                self._take()
                found, value = self._pop(topic)
                if found:
                    return value
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no message on topic {topic!r} within {timeout} s")
                if self._sync_reading or self._loop is not None:
                    self.cond.wait(left)  # another reader reads for us, and wakes us
                    continue
                if self._bell is None:
                    self._bell = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
                bell = self._bell[0]
                self._sync_reading = True
                self._sync_thread = threading.get_ident()
                try:
                    self.lock.release()
                    try:
                        ready = select.select([self.fd, bell], [], [], left)[0]
                    finally:
                        self.lock.acquire()
                    if bell in ready:
                        with contextlib.suppress(BlockingIOError):
                            os.read(bell, 4096)
                    if self.fd in ready:
                        self._read()
                finally:
                    self._sync_reading = False
                    self._sync_thread = None
                    self.cond.notify_all()  # a receiver that waited may read next


#: this worker's inbox, bound by ``_worker.serve`` as the worker starts (None elsewhere)
_bound: Inbox | None = None


def bind(inbox: Inbox | None) -> None:
    """Make ``inbox`` the one ``receive`` and ``receive_blocking`` read (the worker's)."""
    global _bound
    _bound = inbox


def _inbox() -> Inbox:
    inbox = _bound
    if inbox is None:
        raise RuntimeError(
            "receive() only works inside a job running in a ProcessPool worker; call it from "
            "the function you passed to ProcessPool.submit()"
        )
    return inbox


async def receive(topic: str = "") -> Any:
    """The next message the host sent to this job on ``topic`` (``ProcessJob.send``).

    Waits in the running event loop without blocking it. Messages of other topics that arrive
    meanwhile are kept for their own receivers.

    Raises ``RuntimeError`` outside a pool job (or while another event loop of the job waits),
    ``EOFError`` once the host closed the channel (the job is being killed).

    Cancellation: a cancelled ``receive`` takes no message; what arrived stays queued.
    """
    return await _inbox().receive(topic)


def receive_blocking(topic: str = "", timeout: float | None = None) -> Any:
    """Wait for the next message on a topic, blocking the calling thread.

    The next message on ``topic``, blocking the calling thread up to ``timeout`` seconds
    (``None``: without a bound). For sync jobs and threads of a job.

    Raises ``TimeoutError`` when nothing came in time, ``RuntimeError`` outside a pool job,
    ``EOFError`` once the host closed the channel.
    """
    return _inbox().receive_blocking(topic, timeout)
