r"""Framing between the parent and a worker, and the kinds of messages a worker sends.

A frame is a 4-byte big-endian length followed by that many payload bytes. Parent to worker,
the payload is one flag byte plus either a cloudpickle'd job or, with ``FLAG_MESSAGE``, a
message for the running job: UTF-8 JSON ``{"t": TOPIC, "v": VALUE}`` (see ``ProcessJob.send``
and ``_inbox``; a worker discards a message frame that arrives while it has no job). With
``FLAG_SANDBOX`` a job's pickle is preceded by its sandbox policy (a 4-byte length and that much
UTF-8 JSON), which the worker enforces before it unpickles anything (see ``_confine``). Worker
to parent, a frame is either a *JSON frame* (UTF-8 JSON, at most ``CHUNK`` bytes) or a *text
frame* (raw UTF-8, at most ``TEXT_SLICE`` bytes) that a JSON frame announced. The parent only
ever ``json`` -decodes or UTF-8-decodes what a worker wrote; anything else is a protocol
violation. What it decodes is valid Unicode: a lone surrogate (``"\\ud800"`` in JSON, or its three
bytes in a text frame), which the parent could hold but never encode to UTF-8 again (a model
request holding it would fail), is a protocol violation too.

Every frame is small on purpose: decoding one costs the parent's event loop about a
millisecond at most, whatever it holds, and the parent counts what each decodes into against a
budget before it takes the next (see ``_decode``). A value too big for one frame is streamed
as a sequence of small ones:

Whole messages (one JSON frame each)
    ``{"k": "sandbox", "v": REPORT}`` (first, and only, from a sandboxed job's worker, before
    the job runs: what was enforced), ``{"k": "event", "v": V}``,
    ``{"k": "result", "v": V, "u": USAGE}``,
    ``{"k": "error", "type": .., "message": .., "traceback": .., "u": USAGE}``
Streamed messages
    ``{"k": "begin", "m": "event" | "result"}``, then the operations that build one value,
    then ``{"k": "end"}`` (with ``"u": USAGE`` for a result). Operations:
    ``{"k": "val", "v": V}`` a complete value; ``{"k": "open", "t": "list" | "dict"}`` a
    container, filled by ``{"k": "items", "v": [..]}`` (list items) or ``{"k": "fields", "v":
    {..}}`` (dict entries) and by nested values, each value inside a dict preceded by ``{"k":
    "key", "v": NAME}``; ``{"k": "close"}`` ends the innermost container; ``{"k": "text", "n":
    BYTES}`` a string whose UTF-8 follows in text frames.

This module is imported by the worker, so it imports nothing heavy.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "CHUNK",
    "CONTROL_FD",
    "FLAG_LAST",
    "FLAG_MESSAGE",
    "FLAG_SANDBOX",
    "HEADER",
    "MAX_DEPTH",
    "SURROGATE",
    "SURROGATE_ESCAPE",
    "TEXT_SLICE",
    "FrameDecoder",
    "FrameError",
    "decode_json",
    "lone_surrogate",
    "surrogate_in",
]

#: the descriptor a launcher finds its control socket at (the host puts it there)
CONTROL_FD = 3
HEADER = struct.Struct(">I")
#: room for one descriptor's ancillary data (``recv_from`` with ``fds``)
_ONE_FD = socket.CMSG_SPACE(4)

#: largest JSON frame a worker may send: decoding one costs at most about a millisecond
CHUNK = 1 << 15
#: largest text frame (raw UTF-8 of part of a string)
TEXT_SLICE = 1 << 20
#: deepest nesting of containers in a value
MAX_DEPTH = 200

#: flag bit in a job frame: the worker runs no job after this one
FLAG_LAST = 1
#: flag bit of a host-to-worker frame that carries a message for the running job, not a job
FLAG_MESSAGE = 2
#: flag bit in a job frame: a sandbox policy comes before the pickled job
FLAG_SANDBOX = 4


class FrameError(Exception):
    """Bytes from a worker that are not a valid frame or message; the message is the reason."""


#: frames at least this big are received straight into a buffer of their own (no extra copy)
LARGE_FRAME = 1 << 16
#: frames below this size are cut out of the buffer by a plain slice (two small copies cost
#: less than the view that saves one)
_SMALL_FRAME = 4096


#: one receive buffer per thread, shared by the decoders of its event loop (a read is
#: copied out of it at once)
_scratch = threading.local()


class FrameDecoder:
    """Incremental decoder of length-prefixed frames, none larger than ``TEXT_SLICE``.

    ``recv_from`` takes bytes in; ``next_frame`` returns the next complete payload or
    ``None``. A header announcing more than the cap raises ``FrameError`` before anything of the
    body is kept, so a writer cannot make the reader hold more than one frame. A large frame is
    received directly into a buffer of its size, and returned as that ``bytearray``, which is
    only valid until the next call (the next large frame of the same size reuses it).
    """

    def __init__(self, max_frame: int = TEXT_SLICE) -> None:
        self._max = max_frame
        self._buf = bytearray()
        self._need: int | None = None
        #: the large frame being received, and how much of it arrived
        self._body: bytearray | None = None
        self._filled = 0
        #: the last large frame's buffer, reused for the next one of the same size
        self._spare: bytearray | None = None

    def feed(self, data: bytes) -> None:
        body = self._body
        if body is not None:
            take = min(len(data), len(body) - self._filled)
            body[self._filled : self._filled + take] = data[:take]
            self._filled += take
            data = data[take:]
        self._buf += data

    def recv_from(self, sock: socket.socket, size: int, fds: list[int] | None = None) -> int:
        """Receive up to ``size`` bytes once from ``sock``; return the count (0 at end of stream).

        With ``fds``, a descriptor sent along (``SCM_RIGHTS``, at most one per read: the kernel
        drops what does not fit) is appended to it; without, the kernel drops every descriptor
        sent, so none ever enters this process unasked. Raises what ``sock.recv`` raises
        (``BlockingIOError`` when nothing is ready).
        """
        body = self._body
        if body is not None:
            with memoryview(body)[self._filled : self._filled + size] as window:
                n = self._recv(sock, window, len(window), fds)
            self._filled += n
            return n
        # into a scratch buffer, not ``sock.recv(size)``: that allocates ``size`` bytes per
        # call, which glibc maps and unmaps each time (three system calls per read; measured
        # as a third of the host's CPU per reused job)
        view: memoryview | None = getattr(_scratch, "view", None)
        if view is None or len(view) < size:
            view = _scratch.view = memoryview(bytearray(size))  # kept: made once per thread
        n = self._recv(sock, view, size, fds)
        self._buf += view[:n]
        return n

    @staticmethod
    def _recv(sock: socket.socket, view: memoryview, size: int, fds: list[int] | None) -> int:
        if fds is None:
            return sock.recv_into(view, size)
        n, ancillary, _flags, _address = sock.recvmsg_into([view[:size]], _ONE_FD)
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(
                    int.from_bytes(data[i : i + 4], sys.byteorder)
                    for i in range(0, len(data) - 3, 4)
                )
        return n

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
            self._spare = body
            return body
        buf = self._buf
        need = self._need
        if need is None:
            if len(buf) < HEADER.size:
                return None
            (need,) = HEADER.unpack_from(buf)
            if need > self._max:
                raise FrameError(
                    f"a frame of {need} bytes, larger than any frame of the protocol "
                    f"({self._max} bytes)"
                )
            self._need = need
        end = HEADER.size + need
        if len(buf) < end:
            if need >= LARGE_FRAME:
                # everything buffered belongs to this frame: the rest is received in place,
                # into the previous large frame's buffer when it has the same size (its pages
                # are touched already; the consumer copied what it needed out of it)
                spare, self._spare = self._spare, None
                body = spare if spare is not None and len(spare) == need else bytearray(need)
                have = len(buf) - HEADER.size
                body[:have] = buf[HEADER.size :]
                buf.clear()
                self._body, self._filled = body, have
            return None
        if end == len(buf) and need < _SMALL_FRAME:  # the common case: one small frame
            frame = bytes(buf[HEADER.size :])
            buf.clear()
        else:
            with memoryview(buf) as whole:
                frame = bytes(whole[HEADER.size : end])
            del buf[:end]
        self._need = None
        return frame


#: the C scanner behind ``json.loads``, called directly: ``loads`` adds three Python-level
#: calls per frame. A worker never writes whitespace around a message, so none is accepted.
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def decode_json(frame: bytes | bytearray, limit: int = CHUNK) -> dict[str, Any]:
    """Parse one JSON frame into a message object.

    ``FrameError`` if it is not one (or is longer than ``limit`` bytes).
    """
    if len(frame) > limit:
        raise FrameError(f"a JSON frame of {len(frame)} bytes (at most {limit} are allowed)")
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
    if not isinstance(message, dict) or not isinstance(message.get("k"), str):
        raise FrameError(f"a frame is not a message object ({type(message).__name__})")
    found = lone_surrogate(frame, message) if b"\\" in frame else None  # the common case: none
    if found is not None:
        raise FrameError(
            f"a frame holds a lone surrogate (U+{ord(found):04X}), which is not valid Unicode text"
        )
    return message


# -- valid Unicode ------------------------------------------------------------------------
#
# Strict UTF-8 lets no surrogate through as bytes, but JSON can still write one as an escape
# (``\ud800``). Looking at every decoded string would cost a walk in Python per frame, and
# searching every frame's bytes for such an escape about a third of what decoding costs, so
# the check goes from cheapest to most precise and stops as soon as it can say:
#
# 1. a frame without a backslash holds no escape at all (one ``memchr``): most small frames;
# 2. a frame of few values (a message and its value: an event, a report) has its decoded
#    strings looked at; each costs nothing when it is ASCII or one byte wide (a surrogate
#    needs two: read from its size), and a UTF-32 encoding, about a copy, otherwise;
# 3. a frame of many values (a batch of a streamed result) has its bytes searched for a
#    surrogate escape (escaped emoji pairs match too), and only then
# 4. the decoded value is encoded again at C speed, and that text looked at.

#: a JSON escape of a surrogate code point (a valid pair's escapes match too)
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
#: a surrogate code point in a ``str``: never part of a pair there (a decoded pair is one
#: character above U+FFFF), so always one that UTF-8 cannot encode
SURROGATE = re.compile("[\ud800-\udfff]")
#: values looked at one by one (step 2) before the bytes are searched instead (step 3)
_LOOK_AT = 64
_TOO_MANY = object()
#: size of a compact one-byte-wide ``str`` of no characters (the header of ``getsizeof``)
_NARROW_HEADER = sys.getsizeof(chr(0xE9) * 2) - 3
_dumps_unicode = json.JSONEncoder(
    ensure_ascii=False, check_circular=False, separators=(",", ":")
).encode


def lone_surrogate(frame: bytes | bytearray, value: Any) -> str | None:
    """Find the first lone surrogate in JSON data.

    The first lone surrogate in the strings (and dict keys) of ``value``, JSON data whose
    encoding is ``frame``, or ``None``. Tuples and subclasses count as what they derive from
    (the worker checks what it is about to send the same way).
    """
    if b"\\" not in frame:
        return None
    found = _look_at(value, _LOOK_AT)
    if found is not _TOO_MANY:
        return found  # type: ignore[no-any-return]
    if SURROGATE_ESCAPE.search(frame) is None:
        return None
    return surrogate_in(_dumps_unicode(value))


def surrogate_in(text: str) -> str | None:
    """The first surrogate in ``text``, or ``None``.

    Constant time for an ASCII or one-byte wide ``str``, about the time of a copy otherwise.
    """
    if text.isascii() or _narrow(text):
        return None
    try:
        text.encode("utf-32-le")  # refuses a surrogate
    except UnicodeEncodeError as exc:
        return str(text[exc.start])
    return None


def _narrow(text: str) -> bool:
    """Whether ``text`` is stored one byte per character (nothing above U+00FF), from its size.

    A cached UTF-8 copy makes a string look wider: it is then looked at, never skipped.
    """
    if len(text) == 1:
        return ord(text) < 0x100
    return sys.getsizeof(text) - _NARROW_HEADER <= len(text) + 1


def _look_at(value: Any, budget: int) -> Any:
    """Look for lone surrogates within a budget.

    ``surrogate_in`` for every string of ``value``, or ``_TOO_MANY`` once more than
    ``budget`` values were to be looked at one by one. A container of strings only is looked
    at joined, at C speed. Iterative (no recursion limit).
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found = surrogate_in(item)
            if found is not None:
                return found
            continue
        if isinstance(item, dict):
            members: Any = item.values()
            stack.append("".join(item))  # keys are strings: decoded JSON, or checked ones
        elif isinstance(item, list | tuple):
            members = item
        else:
            continue
        if len(members) > 8:
            try:
                stack.append("".join(members))
                continue
            except TypeError:  # not only strings
                pass
        budget -= len(members)
        if budget < 0:
            return _TOO_MANY
        stack.extend(members)
    return None
