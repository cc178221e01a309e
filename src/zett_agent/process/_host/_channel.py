"""One worker's socket as the host sees it: reading, framing, assembling, writing, pausing.

The channel reads whenever it may, turns frames into messages (``_decode``) and hands each to
the pool. It never does more than a few milliseconds of work per event-loop callback: when
frames are left after ``_SLICE`` seconds it continues on the next iteration, so a worker
that floods the socket cannot stall the host. The pool pauses it (backpressure: the worker's
writes block once the socket buffer is full) and resumes it.

Writing: job frames and message frames for the running job (``ProcessJob.send``) share one
ordered outbox; what the socket does not take at once is written when it becomes writable.
The bytes of queued messages are counted (``message_bytes``) so their sender can wait while the
worker does not read, and messages of a job that ended are dropped unless already begun.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .._wire._decode import Assembler, Message
from .._wire._protocol import FrameDecoder, FrameError

__all__ = ["Channel"]

#: longest stretch of frame handling in one event-loop callback
_SLICE = 0.002
_RECV_SIZE = 1 << 18


class Channel:
    """The host end of one worker's socket.

    Callbacks: ``on_message(message)`` for each complete message, ``on_frame()`` after each
    frame (the pool checks budgets there and may ``pause``), ``on_eof()`` once the worker's end
    is closed and every frame before it was handled, ``on_error(reason)`` once for bytes that
    break the protocol (then the channel stops reading), ``bury(value)`` for a partly built
    value the channel gives up on, to free it without stalling the loop.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        max_message_bytes: int,
        on_message: Callable[[Message], None],
        on_frame: Callable[[], None],
        on_eof: Callable[[], None],
        on_error: Callable[[str], None],
        bury: Callable[[Any], None] = lambda value: None,
    ) -> None:
        self._loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        sock.setblocking(False)
        self.decoder = FrameDecoder()
        self.assembler = Assembler(max_message_bytes)
        self._on_message = on_message
        self._on_frame = on_frame
        self._on_eof = on_eof
        self._on_error = on_error
        self._bury = bury
        self._reading = False
        self.paused = False
        #: the worker's end is closed (no more bytes will come)
        self.eof = False
        self.closed = False
        #: the end of the stream was reached and every frame before it handled
        self.drained = False
        self._scheduled: asyncio.Handle | None = None
        #: frames not yet written, in order: ``[what is left of it, is a message]``; only the
        #: first may be partly written (``_head_started``)
        self._outbox: deque[list[Any]] = deque()
        self._head_started = False
        #: bytes of message frames queued and not yet taken by the socket
        self.message_bytes = 0
        #: called after some message bytes were written, and once at close (senders wait on it)
        self.on_drain: Callable[[], None] | None = None
        #: read descriptors sent along (``SCM_RIGHTS``) while this is set: an ``Egress`` job's
        #: worker sends its listener with the sandbox report (otherwise the kernel drops any)
        self.expect_fd = False
        #: the descriptor received, not yet taken (``take_fd``); at most one is kept
        self._fds: list[int] = []

    # -- writing ----------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Write ``data`` (a job frame).

        What the socket does not take now is written when it can, in order after what was queued
        before.
        """
        self._enqueue(data, False)

    def send_message(self, frame: bytes) -> None:
        """Write one message frame for the running job (see ``ProcessJob.send``), in order.

        Its bytes count in ``message_bytes`` until the socket took them; ``on_drain`` is called
        each time some of them were written. A no-op once the channel is closed.
        """
        self._enqueue(frame, True)

    def _enqueue(self, data: bytes, is_message: bool) -> None:
        if self.closed:
            return
        if not self._outbox:
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                return  # the worker is gone; its pidfd tells the pool
            if sent == len(data):
                return
            self._outbox.append([memoryview(data)[sent:], is_message])
            self._head_started = sent > 0
            self._loop.add_writer(self.fd, self._on_writable)
            if is_message:
                self.message_bytes += len(data) - sent
            return
        self._outbox.append([memoryview(data), is_message])
        if is_message:
            self.message_bytes += len(data)

    def _on_writable(self) -> None:
        outbox = self._outbox
        written = False
        while outbox:
            entry = outbox[0]
            view: memoryview = entry[0]
            try:
                sent = self.sock.send(view)
            except BlockingIOError:
                break
            except OSError:
                # the worker is gone (its pidfd tells the pool): nothing queued can arrive
                outbox.clear()
                self.message_bytes = 0
                written = True
                break
            if entry[1]:
                written = True
                self.message_bytes -= sent
            if sent < len(view):
                entry[0] = view[sent:]
                self._head_started = True
                break
            outbox.popleft()
            self._head_started = False
        if not outbox:
            self._loop.remove_writer(self.fd)
        if written and self.on_drain is not None:
            self.on_drain()

    def drop_messages(self) -> None:
        """Forget the queued message frames not yet begun (their job ended).

        A frame partly written already is finished, so the stream stays in frames.
        """
        outbox = self._outbox
        if not self.message_bytes or not outbox:
            return
        kept: deque[list[Any]] = deque()
        for index, entry in enumerate(outbox):
            if entry[1] and not (index == 0 and self._head_started):
                self.message_bytes -= len(entry[0])
            else:
                kept.append(entry)
        # a begun head is kept, so ``_head_started`` stays true of the head
        self._outbox = kept
        if not kept:
            self._loop.remove_writer(self.fd)

    # -- reading ----------------------------------------------------------------------------

    def start(self) -> None:
        """Read when bytes arrive (no-op while paused, closed or at end of stream)."""
        if not (self._reading or self.paused or self.eof or self.closed):
            self._loop.add_reader(self.fd, self._on_readable)
            self._reading = True

    def _stop(self) -> None:
        if self._reading:
            self._loop.remove_reader(self.fd)
            self._reading = False

    def pause(self) -> None:
        self.paused = True
        self._stop()

    def resume(self) -> None:
        if self.paused and not self.closed:
            self.paused = False
            self._schedule()

    def _schedule(self) -> None:
        if self._scheduled is None and not self.closed:
            self._scheduled = self._loop.call_soon(self._pump)

    def _on_readable(self) -> None:
        try:
            if self.expect_fd:
                received = self.decoder.recv_from(self.sock, _RECV_SIZE, self._fds)
                for extra in self._fds[1:]:  # one is all a worker may send: the rest is closed
                    os.close(extra)
                del self._fds[1:]
            else:
                received = self.decoder.recv_from(self.sock, _RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            received = 0
        if not received:
            self.eof = True
            self._stop()
        self._pump()

    def _pump(self) -> None:
        self._scheduled = None
        deadline = time.perf_counter() + _SLICE
        decoder, assembler = self.decoder, self.assembler
        while not (self.paused or self.closed):
            try:
                frame = decoder.next_frame()
                if frame is None:
                    if self.eof:
                        if not self.drained:
                            self.drained = True
                            self._on_eof()
                    elif not self._reading:
                        self.start()
                    return
                message = assembler.feed(frame)
                if assembler.dropped is not None:
                    self._bury(assembler.dropped)
                    assembler.dropped = None
            except FrameError as exc:
                self._fail(str(exc))
                return
            if message is not None:
                self._on_message(message)
            if not self.closed:
                self._on_frame()
            if time.perf_counter() > deadline:
                # more may be buffered: let the loop run other callbacks first
                self._stop()
                self._schedule()
                return
        self._stop()

    def _fail(self, reason: str) -> None:
        self._stop()
        self.paused = True
        self._on_error(reason)

    def protocol_error(self, reason: str) -> None:
        """Fail from outside (a budget was broken): stop reading and report ``reason``."""
        self._fail(reason)

    def take_fd(self) -> int | None:
        """The descriptor the worker sent (``expect_fd``), now the caller's; stops expecting one."""
        self.expect_fd = False
        return self._fds.pop() if self._fds else None

    def close(self) -> None:
        """Stop everything and close the socket (idempotent)."""
        if self.closed:
            return
        self.closed = True
        while self._fds:
            os.close(self._fds.pop())
        self._stop()
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        if self._outbox:
            self._loop.remove_writer(self.fd)
            self._outbox.clear()
        self.message_bytes = 0
        self._bury(self.assembler.reset())
        self.sock.close()
        if self.on_drain is not None:
            self.on_drain()
