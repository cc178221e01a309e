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
from typing import Any

__all__ = ["HEADER", "FrameDecoder", "FrameError", "decode_message", "encode_frame"]

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

#: frames at least this big are received straight into their own buffer (no extra copies)
LARGE_FRAME = 1 << 20


class FrameDecoder:
    """Incremental decoder of length-prefixed frames with a size cap.

    ``recv_from`` (or ``feed``) takes bytes in; ``next_frame`` returns the next complete
    payload or ``None``. A header announcing more than ``max_frame_bytes`` raises
    ``FrameError`` before the body is buffered, so a hostile writer cannot make the reader
    allocate more than the cap. A large frame is received directly into a buffer of its exact
    size, which is then returned as is.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self._max = max_frame_bytes
        self._buf = bytearray()
        self._need: int | None = None
        self._body: bytearray | None = None
        self._filled = 0

    def feed(self, data: bytes) -> None:
        if self._body is not None:
            take = min(len(data), len(self._body) - self._filled)
            self._body[self._filled : self._filled + take] = data[:take]
            self._filled += take
            data = data[take:]
        self._buf += data

    def recv_from(self, sock: socket.socket, size: int) -> int:
        """Receive once from ``sock``; return the byte count (0 at end of stream).

        Raises what ``sock.recv`` raises (``BlockingIOError`` when nothing is ready).
        """
        body = self._body
        if body is not None:
            with memoryview(body) as view:
                n = sock.recv_into(view[self._filled :])
            self._filled += n
            return n
        data = sock.recv(size)
        self._buf += data
        return len(data)

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) + self._filled

    def next_frame(self) -> bytes | bytearray | None:
        body = self._body
        if body is not None:
            if self._filled < len(body):
                return None
            self._body, self._filled, self._need = None, 0, None
            return body
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
                body = bytearray(self._need)
                self._filled = len(buf) - HEADER.size
                body[: self._filled] = buf[HEADER.size :]
                self._body = body
                buf.clear()
            return None
        with memoryview(buf) as view:
            frame = bytes(view[HEADER.size : end])
        del buf[:end]
        self._need = None
        return frame


def decode_message(frame: bytes | bytearray) -> dict[str, Any]:
    """Parse one worker frame; raise ``FrameError`` if it is not a known JSON message."""
    try:
        message = json.loads(frame.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise FrameError(f"a frame is not valid UTF-8 ({exc})") from None
    except ValueError as exc:
        raise FrameError(f"a frame is not valid JSON ({exc})") from None
    if not isinstance(message, dict) or message.get("k") not in KINDS:
        kind = message.get("k") if isinstance(message, dict) else type(message).__name__
        raise FrameError(f"a frame has an unknown kind {kind!r}")
    return message
