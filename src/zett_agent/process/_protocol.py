"""Framing between the parent and a worker.

A frame is a 4-byte big-endian length followed by that many payload bytes. Parent to worker, the
payload is one flag byte plus a cloudpickle'd job. Worker to parent, the payload is UTF-8 JSON: an
object whose ``"k"`` is ``"event"``, ``"result"`` or ``"error"``; a result frame with a
``"text"`` byte count is followed by one frame of raw UTF-8 text (the result string). The
parent only ever ``json.loads`` or UTF-8-decodes what a worker wrote; anything else is a
protocol violation.

This module is imported by the worker, so it imports nothing heavy.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["HEADER", "BufferCache", "FrameDecoder", "FrameError", "decode_message", "encode_frame"]

HEADER = struct.Struct(">I")
MAX_FRAME_LIMIT = 2**32 - 1

#: flag bit in a job frame: the worker exits after this job
FLAG_LAST = 1

#: exit code of a worker that ended on its own after killing and reaping everything its jobs
#: left behind; any other exit makes the launcher sweep for orphans. Never shown to users: a
#: worker only exits this way after its last result was sent.
CLEAN_EXIT = 90

KINDS = frozenset({"event", "result", "error"})


class FrameError(Exception):
    """Bytes from a worker that are not a valid frame; the message is the reason."""


def encode_frame(payload: bytes) -> bytes:
    """Return ``payload`` with its length header."""
    return HEADER.pack(len(payload)) + payload


#: a ``str`` result at least this long travels as a ``{"k": "result", "text": N}`` frame
#: followed by one frame of N bytes of raw UTF-8 (JSON escaping and parsing are slow)
RAW_TEXT_MIN = 1 << 16

#: frames at least this big are received straight into a buffer of their size (no extra copies)
LARGE_FRAME = 1 << 20


class BufferCache:
    """Keeps the receive buffer of the last large frame for the next one.

    Writing to a page for the first time costs a page fault, which costs more than copying a
    page (about 3 times more on a VM), so a large frame lands much faster in memory that was
    touched before. Holds at most one buffer (the largest seen); ``clear`` frees it.
    """

    def __init__(self) -> None:
        self._buffer: bytearray | None = None

    def take(self, size: int) -> bytearray:
        """A buffer of at least ``size`` bytes, the kept one if it is big enough."""
        buffer = self._buffer
        if buffer is not None and len(buffer) >= size:
            self._buffer = None
            return buffer
        return bytearray(size)

    def give(self, buffer: bytearray) -> None:
        """Keep ``buffer`` for a later ``take`` (unless a bigger one is kept already)."""
        if self._buffer is None or len(buffer) > len(self._buffer):
            self._buffer = buffer

    def clear(self) -> None:
        self._buffer = None

    @property
    def kept(self) -> int:
        """Bytes held for reuse."""
        return 0 if self._buffer is None else len(self._buffer)


class FrameDecoder:
    """Incremental decoder of length-prefixed frames with a size cap.

    ``recv_from`` (or ``feed``) takes bytes in; ``next_frame`` returns the next complete
    payload or ``None``. A header announcing more than ``max_frame_bytes`` raises
    ``FrameError`` before the body is buffered, so a hostile writer cannot make the reader
    allocate more than the cap. A large frame is received directly into a buffer of its size
    (from ``buffers`` when given) and returned as a ``memoryview`` of it, valid until the next
    ``next_frame`` or ``close`` call, which hand the buffer back to ``buffers``.
    """

    def __init__(self, max_frame_bytes: int, buffers: BufferCache | None = None) -> None:
        self._max = max_frame_bytes
        self._buffers = buffers
        self._buf = bytearray()
        self._need: int | None = None
        #: the large frame being received: its buffer and a view of its exact size
        self._body: bytearray | None = None
        self._view: memoryview | None = None
        self._filled = 0
        #: the large frame last returned, and its buffer
        self._lent: tuple[bytearray, memoryview] | None = None

    def feed(self, data: bytes) -> None:
        view = self._view
        if view is not None:
            take = min(len(data), len(view) - self._filled)
            view[self._filled : self._filled + take] = data[:take]
            self._filled += take
            data = data[take:]
        self._buf += data

    def recv_from(self, sock: socket.socket, size: int) -> int:
        """Receive up to ``size`` bytes once from ``sock``; return the count (0 at end of
        stream).

        Raises what ``sock.recv`` raises (``BlockingIOError`` when nothing is ready).
        """
        view = self._view
        if view is not None:
            filled = self._filled
            with view[filled : filled + size] as window:
                n = sock.recv_into(window)
            self._filled += n
            return n
        data = sock.recv(size)
        self._buf += data
        return len(data)

    @property
    def receiving_large(self) -> bool:
        """Whether a large frame is partly received (its remaining bytes are wanted)."""
        return self._view is not None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) + self._filled

    def close(self) -> None:
        """Hand back the buffer of the last large frame returned (its view dies)."""
        lent = self._lent
        if lent is None:
            return
        self._lent = None
        buffer, view = lent
        try:
            view.release()
        except BufferError:
            return  # something still reads it: never overwrite it, let it go with its user
        if self._buffers is not None:
            self._buffers.give(buffer)

    def next_frame(self) -> bytes | bytearray | memoryview | None:
        self.close()
        view = self._view
        if view is not None:
            if self._filled < len(view):
                return None
            assert self._body is not None
            self._lent = (self._body, view)
            self._body, self._view, self._filled, self._need = None, None, 0, None
            return view
        buf = self._buf
        if self._need is None:
            if len(buf) < HEADER.size:
                return None
            (need,) = HEADER.unpack_from(buf)
            if need > self._max:
                raise FrameError(
                    f"a frame of {need} bytes exceeds max_frame_bytes={self._max}; return or "
                    "emit less data per frame, or raise the pool's max_frame_bytes"
                )
            self._need = need
        end = HEADER.size + self._need
        if len(buf) < end:
            if self._need >= LARGE_FRAME:
                # everything buffered belongs to this frame: move it into the frame's own buffer
                need = self._need
                body = self._buffers.take(need) if self._buffers is not None else bytearray(need)
                view = memoryview(body)[:need]
                self._filled = len(buf) - HEADER.size
                view[: self._filled] = buf[HEADER.size :]
                self._body, self._view = body, view
                buf.clear()
            return None
        with memoryview(buf) as whole:
            frame = bytes(whole[HEADER.size : end])
        del buf[:end]
        self._need = None
        return frame


#: the C scanner behind ``json.loads``, called directly: ``loads`` adds three Python-level
#: calls per frame. A worker never writes whitespace around a message, so none is accepted.
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def decode_message(frame: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Parse one worker frame; raise ``FrameError`` if it is not a known JSON message."""
    try:
        text = str(frame, "utf-8")
        message, end = _scan_json(text, 0)
    except UnicodeDecodeError as exc:
        raise FrameError(f"a frame is not valid UTF-8 ({exc})") from None
    except StopIteration:
        raise FrameError("a frame is not valid JSON (no value at its start)") from None
    except (ValueError, RecursionError) as exc:
        raise FrameError(f"a frame is not valid JSON ({exc})") from None
    if end != len(text):
        raise FrameError(f"a frame is not valid JSON (extra data at character {end})")
    if not isinstance(message, dict) or message.get("k") not in KINDS:
        kind = message.get("k") if isinstance(message, dict) else type(message).__name__
        raise FrameError(f"a frame has an unknown kind {kind!r}")
    return message
