"""Framing between the parent and a worker.

A frame is a 4-byte big-endian length followed by that many payload bytes. Parent to worker, the
payload is one flag byte plus a cloudpickle'd job. Worker to parent, the payload is UTF-8 JSON: an
object whose ``"k"`` is ``"event"``, ``"result"`` or ``"error"``. The parent only ever
``json.loads`` what a worker wrote; anything else is a protocol violation.

This module is imported by the worker, so it imports nothing heavy.
"""

from __future__ import annotations

import json
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


class FrameDecoder:
    """Incremental decoder of length-prefixed frames with a size cap.

    ``feed`` appends bytes; ``next_frame`` returns the next complete payload or ``None``. A
    header announcing more than ``max_frame_bytes`` raises ``FrameError`` immediately, before the
    body is buffered, so a hostile writer cannot make the reader allocate more than the cap.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self._max = max_frame_bytes
        self._buf = bytearray()
        self._need: int | None = None

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf)

    @property
    def wanted(self) -> int:
        """How many more bytes would complete the frame being read (at least 1)."""
        if self._need is None:
            return max(1, HEADER.size - len(self._buf))
        return max(1, HEADER.size + self._need - len(self._buf))

    def next_frame(self) -> bytes | None:
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
            return None
        frame = bytes(buf[HEADER.size : end])
        del buf[:end]
        self._need = None
        return frame


def decode_message(frame: bytes) -> dict[str, Any]:
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
