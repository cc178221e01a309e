"""One worker's socket as the host sees it: reading, framing, assembling, writing, pausing.

The channel reads whenever it may, turns frames into messages (``_decode``) and hands each to
the pool. It never does more than a few milliseconds of work per event-loop callback: when
frames are left after ``_SLICE`` seconds it continues on the next iteration, so a worker
that floods the socket cannot stall the host. The pool pauses it (backpressure: the worker's
writes block once the socket buffer is full) and resumes it.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

from ._decode import Assembler, Message
from ._protocol import FrameDecoder, FrameError

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
        self._outbox: memoryview | None = None

    # -- writing ----------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Write ``data`` (a job); what the socket does not take now is written when it can."""
        if self.closed:
            return
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            return  # the worker is gone; its pidfd tells the pool
        if sent < len(data):
            self._outbox = memoryview(data)[sent:]
            self._loop.add_writer(self.fd, self._on_writable)

    def _on_writable(self) -> None:
        outbox = self._outbox
        if outbox is not None:
            try:
                sent = self.sock.send(outbox)
            except BlockingIOError:
                return
            except OSError:
                sent = len(outbox)
            self._outbox = outbox[sent:] if sent < len(outbox) else None
        if self._outbox is None:
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
        while not (self.paused or self.closed):
            try:
                frame = self.decoder.next_frame()
                if frame is None:
                    if self.eof:
                        if not self.drained:
                            self.drained = True
                            self._on_eof()
                    else:
                        self.start()
                    return
                message = self.assembler.feed(frame)
                if self.assembler.dropped is not None:
                    self._bury(self.assembler.dropped)
                    self.assembler.dropped = None
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

    def close(self) -> None:
        """Stop everything and close the socket (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self._stop()
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        if self._outbox is not None:
            self._loop.remove_writer(self.fd)
            self._outbox = None
        self._bury(self.assembler.reset())
        self.sock.close()
