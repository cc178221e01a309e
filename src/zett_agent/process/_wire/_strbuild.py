"""Build one large ``str`` piece by piece, with no final join.

A long text result arrives in slices of up to 1 MiB. Decoding the slices and joining them at
the end would copy the whole string once more in one step, which stalls the event loop for
tens of milliseconds on a large report. Instead the final ``str`` is allocated up front
(``PyUnicode_New``, with the length and character width the worker announced) and each slice
is copied into its place as it arrives. The string is nobody's but the builder's until it is
complete (no hash, no other reference), and it is only handed out after its content was
checked to be exactly what the announcement said, so it is a canonical ``str`` like any other.

Where the CPython C API is not reachable through ``ctypes`` (another interpreter), or the
self-check at import fails, ``available`` is False and callers decode and join instead.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

__all__ = ["StrBuilder", "available", "width"]

#: maximum code point of each width: 1 byte (ASCII when all < 128), 2 bytes, 4 bytes
_MAXCHAR = {1: 255, 2: 0xFFFF, 4: 0x10FFFF}
#: how each width is written into the string's buffer
_CODEC = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}

_new: Any
try:
    _new = ctypes.pythonapi.PyUnicode_New
    _new.argtypes = [ctypes.c_ssize_t, ctypes.c_uint32]
    _new.restype = ctypes.py_object
    #: offset of the character data in a compact ASCII str and in another compact str (of a
    #: fresh string: ``getsizeof`` also counts a cached UTF-8 copy, which literals may have)
    _ASCII_DATA = sys.getsizeof("") - 1
    _COMPACT_DATA = sys.getsizeof(chr(0xE9) * 2) - 3
except (AttributeError, ValueError):  # not CPython
    _new = None


def _address(text: str, ascii: bool) -> int:
    return id(text) + (_ASCII_DATA if ascii else _COMPACT_DATA)


class StrBuilder:
    """A ``str`` of ``length`` characters of width ``kind`` (1, 2, 4) being filled in order.

    ``ascii`` says the text is ASCII only (then ``kind`` is 1). ``add_utf8`` takes the next
    slice; ``finish`` returns the string. Both raise ``ValueError`` when the slices do not match
    the announcement (more characters, wider ones, or, at the end, fewer characters or none as
    wide as announced: a ``str`` must use the narrowest width that fits its characters).
    """

    def __init__(self, length: int, kind: int, ascii: bool) -> None:
        if kind not in _MAXCHAR or (ascii and kind != 1) or length < 0:
            raise ValueError(f"an impossible string shape (length {length}, width {kind})")
        assert _new is not None
        self._kind = kind
        self._ascii = ascii
        self._length = length
        self._text: str | None = _new(length, 127 if ascii else _MAXCHAR[kind])
        self._base = _address(self._text, ascii)
        self._filled = 0
        #: whether a character that needs the full width was seen (canonical form)
        self._wide_seen = ascii or length == 0

    def add_utf8(self, data: bytes | bytearray) -> None:
        """Append the characters of ``data``.

        Strict UTF-8 (``UnicodeDecodeError`` for anything else, a lone surrogate's three bytes
        included).
        """
        if self._ascii:
            if not data.isascii():
                # not valid UTF-8 of an ASCII text: reported like any other decoding error
                raise UnicodeDecodeError(
                    "utf-8", data, 0, len(data), "a non-ASCII byte in an ASCII text"
                )
            count, raw = len(data), data
        else:
            piece = str(data, "utf-8")
            count = len(piece)
            if not piece.isascii():
                piece_width = width(piece)
                if piece_width > self._kind:
                    raise ValueError("a slice holds characters wider than announced")
                if piece_width == self._kind:
                    self._wide_seen = True
            raw = piece.encode(_CODEC[self._kind])
        if self._filled + count > self._length:
            raise ValueError("the slices hold more characters than announced")
        if isinstance(raw, bytearray):
            source: Any = (ctypes.c_char * len(raw)).from_buffer(raw)
        else:
            source = raw
        ctypes.memmove(self._base + self._filled * self._kind, source, len(raw))
        self._filled += count

    def finish(self) -> str:
        """The complete string; the builder gives it up."""
        text = self._text
        if text is None:
            raise ValueError("the string was already handed out")
        if self._filled != self._length:
            raise ValueError(f"{self._filled} characters arrived, {self._length} announced")
        if not self._wide_seen:
            raise ValueError("no character needs the width the text was announced with")
        self._text = None
        return text


def width(text: str) -> int:
    """Bytes per character of a non-ASCII ``str`` (its storage width: 1, 2 or 4).

    Read from the string's size, in constant time. A one-character string may be one of the
    interpreter's shared singletons, whose size can include a cached UTF-8 copy (Python 3.12
    on), so its width comes from its code point instead.
    """
    if len(text) == 1:
        code = ord(text)
        return 1 if code < 0x100 else 2 if code < 0x10000 else 4
    return (sys.getsizeof(text) - _COMPACT_DATA) // (len(text) + 1)


def _self_check() -> bool:
    if _new is None:
        return False
    try:
        samples = ["plain ascii", "caf\xe9 \xff", "\u0100\u4e2d\u6587", "\U0001f600 x \U0010ffff"]
        for sample in samples:
            kind = 1 if sample.isascii() else width(sample)
            builder = StrBuilder(len(sample), kind, sample.isascii())
            data = sample.encode("utf-8")
            builder.add_utf8(b"")
            builder.add_utf8(data)
            built = builder.finish()
            if built != sample or hash(built) != hash(sample) or len(built) != len(sample):
                return False
    except Exception:
        return False
    return True


available = _self_check()
