"""The parent's side of the wire: frames in, whole events and results out, within a budget.

``Assembler.feed`` takes one frame at a time (see ``_protocol`` for the messages) and returns a
``Message`` when one is complete. Every frame is small, so each call is short; and every call
adds to ``held`` an upper bound of the memory its decoded data takes, so the caller can stop
reading (backpressure) or fail the job before a worker makes the parent hold more than its
budget. The bound for JSON is the frame's size plus 64 bytes for each ``{``, ``[``, ``,`` and
``:`` in it (no decoded value costs more per byte: ``[{},{},...]`` costs about 24 bytes per
byte, counted as 43), and for text its length times its character width.

What it returns is valid Unicode: text frames are decoded as strict UTF-8, and a JSON frame
that escapes a lone surrogate is refused (``decode_json``), each with a ``FrameError`` that
names it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import _strbuild
from ._protocol import CHUNK, MAX_DEPTH, FrameError, decode_json

__all__ = ["Assembler", "Message", "json_cost"]

_KINDS = ("event", "result", "error", "sandbox")
_EMPTY = object()
_INF = math.inf


def json_cost(frame: bytes | bytearray) -> int:
    r"""Upper bound of the bytes the values decoded from a JSON frame take.

    A string takes as many bytes per character as its widest character needs: one character
    outside the Basic Multilingual Plane (four UTF-8 bytes, or a ``\\ud83d\\ude00`` escape pair)
    makes every character of its string four bytes wide, so a frame that may hold any non-ASCII
    character counts four bytes per byte of it.
    """
    structure = frame.count(b"{") + frame.count(b"[") + frame.count(b",") + frame.count(b":")
    width = 1 if frame.isascii() and b"\\u" not in frame else 4
    return width * len(frame) + 64 * structure + 256


@dataclass
class Message:
    """One complete event, result, error or sandbox report from a worker."""

    kind: str
    value: Any = None
    #: for a result or error: (CPU seconds, peak bytes, whether the worker exits after it)
    usage: tuple[float, int, bool] | None = None
    #: for an error: (type name, message, traceback text)
    error: tuple[str, str, str] | None = None
    #: upper bound of the memory the value takes (counted against the job's budget)
    cost: int = 0


def _usage(message: dict[str, Any]) -> tuple[float, int, bool]:
    usage = message.get("u")
    if type(usage) is dict:
        cpu, peak = usage.get("cpu"), usage.get("maxrss")
        if type(cpu) is float and type(peak) is int and -_INF < cpu < _INF:
            # what a worker sends, by exact types (no union to build)
            return cpu, peak, len(usage) > 2 and usage.get("exit") is True
    if not isinstance(usage, dict):
        raise FrameError(f"a {message['k']} without usage numbers")
    cpu, peak = usage.get("cpu"), usage.get("maxrss")
    if (
        isinstance(cpu, bool)
        or not isinstance(cpu, int | float)
        or not math.isfinite(cpu)
        or isinstance(peak, bool)
        or not isinstance(peak, int)
    ):
        raise FrameError(f"a {message['k']} with malformed usage numbers")
    return float(cpu), peak, usage.get("exit") is True


def _canonical_width(text: str) -> int:
    """Bytes per character of a non-ASCII ``str`` (without the C API: from its widest one)."""
    code = ord(max(text))
    return 1 if code < 0x100 else 2 if code < 0x10000 else 4


def _not_utf8(data: bytes | bytearray, exc: UnicodeDecodeError) -> str:
    """Why a text frame is refused; a lone surrogate (valid but for being one) named as such."""
    try:
        piece = str(data[exc.start : exc.start + 3], "utf-8", "surrogatepass")
    except UnicodeDecodeError:
        piece = ""
    if not piece or not 0xD800 <= ord(piece[0]) <= 0xDFFF:
        return f"a text frame is not valid UTF-8 ({exc})"
    return (
        f"a text frame holds a lone surrogate (U+{ord(piece[0]):04X} at byte {exc.start}), "
        "which is not valid Unicode text"
    )


class _Text:
    """A string arriving in text frames."""

    def __init__(self, size: int, length: int, kind: int, ascii: bool) -> None:
        self.left = size
        self.cost = length * kind + 64
        self.builder: _strbuild.StrBuilder | None = None
        self.pieces: list[str] = []
        if _strbuild.available:
            try:
                self.builder = _strbuild.StrBuilder(length, kind, ascii)
            except ValueError as exc:
                raise FrameError(f"a text announcement is malformed: {exc}") from None
        self.length = length
        self.kind = kind
        self.ascii = ascii

    def add(self, data: bytes | bytearray) -> None:
        self.left -= len(data)
        if self.left < 0:
            raise FrameError("a text frame runs past the announced size")
        try:
            if self.builder is not None:
                self.builder.add_utf8(data)
            elif self.ascii and not data.isascii():
                raise FrameError(
                    "a text frame is not valid UTF-8 (a non-ASCII byte in an ASCII text)"
                )
            else:
                self.pieces.append(str(data, "utf-8"))
        except UnicodeDecodeError as exc:
            raise FrameError(_not_utf8(data, exc)) from None
        except ValueError as exc:
            raise FrameError(f"a text frame does not match its announcement: {exc}") from None

    def finish(self) -> str:
        try:
            if self.builder is not None:
                return self.builder.finish()
        except ValueError as exc:
            raise FrameError(f"a text does not match its announcement: {exc}") from None
        text = "".join(self.pieces)
        if len(text) != self.length:
            raise FrameError(f"a text of {len(text)} characters, {self.length} announced")
        if self.kind != (1 if text.isascii() else _canonical_width(text)):
            raise FrameError("a text does not match its announcement: another character width")
        return text


class Assembler:
    """Turns one worker's frames into messages. ``max_bytes`` caps one message's wire size."""

    def __init__(self, max_bytes: int, *, chunk: int = CHUNK) -> None:
        self.max_bytes = max_bytes
        self._chunk = chunk
        #: upper bound of the memory held by the message being assembled
        self.held = 0
        #: what an aborted message had built, for the caller to free (then set to None)
        self.dropped: Any = None
        self._kind: str | None = None
        self._wire = 0
        self._stack: list[Any] = []
        self._key: str | None = None
        self._root: Any = _EMPTY
        self._text: _Text | None = None

    @property
    def busy(self) -> bool:
        """Whether a streamed message is partly received."""
        return self._kind is not None

    @property
    def expects_text(self) -> bool:
        """Whether the next frame is raw text."""
        return self._text is not None

    def reset(self) -> Any:
        """Forget the message being assembled.

        Return what was built of it (``None`` if nothing), for the caller to free (``Graveyard``).
        """
        partial = self._stack[0] if self._stack else self._root
        self.held = 0
        self._kind = None
        self._wire = 0
        self._stack.clear()
        self._key = None
        self._root = _EMPTY
        self._text = None
        return None if partial is _EMPTY else partial

    def feed(self, frame: bytes | bytearray) -> Message | None:
        """Take one frame; return the message it completes, if any.

        ``FrameError`` if it breaks the protocol.
        """
        if self._text is not None:
            text = self._text
            text.add(frame)
            if text.left == 0:
                self._text = None
                self._put(text.finish())
            return None
        message = decode_json(frame, self._chunk)
        kind = message["k"]
        if self._kind is None:
            return self._whole(kind, message, frame)
        self._count(frame)
        self.held += json_cost(frame)
        handler = _OPS.get(kind)
        if handler is None:
            raise FrameError(f"an unknown operation {kind!r:.40} inside a streamed message")
        done: Message | None = handler(self, message)
        return done

    # -- whole messages ---------------------------------------------------------------------

    def _whole(
        self, kind: str, message: dict[str, Any], frame: bytes | bytearray
    ) -> Message | None:
        if kind == "result" and "v" in message:  # the most common message, first
            return Message("result", message["v"], _usage(message), cost=json_cost(frame))
        if kind == "begin":
            mode = message.get("m")
            if mode not in ("event", "result"):
                raise FrameError(f"a streamed message of unknown kind {mode!r:.40}")
            self._kind = mode
            self._wire = len(frame)
            return None
        if kind not in _KINDS:
            raise FrameError(f"a frame has an unknown kind {kind!r:.40}")
        cost = json_cost(frame)
        if kind == "event":
            if "v" not in message:
                raise FrameError("an event frame without a value")
            return Message("event", message["v"], cost=cost)
        if kind == "sandbox":
            if not isinstance(message.get("v"), dict):
                raise FrameError("a sandbox report that is not an object")
            return Message("sandbox", message["v"], cost=cost)
        usage = _usage(message)
        if kind == "result":
            if "v" not in message:
                raise FrameError("a result frame without a value")
            return Message("result", message["v"], usage, cost=cost)
        fields = (message.get("type"), message.get("message"), message.get("traceback"))
        if not all(isinstance(field, str) for field in fields):
            raise FrameError("an error frame with malformed fields")
        return Message("error", None, usage, (fields[0], fields[1], fields[2]), cost=cost)  # type: ignore[arg-type]

    # -- streamed messages ------------------------------------------------------------------

    def _count(self, frame: bytes | bytearray) -> None:
        self._wire += len(frame)
        if self._wire > self.max_bytes:
            self._too_big()

    def _too_big(self) -> None:
        raise FrameError(
            f"a {self._kind} of more than {self.max_bytes} bytes, the pool's "
            "max_frame_bytes; send less per event or result, or raise "
            "ProcessPool(max_frame_bytes=...)"
        )

    def _top(self) -> Any:
        if not self._stack:
            raise FrameError("an operation that needs an open container, with none open")
        return self._stack[-1]

    def _put(self, value: Any) -> None:
        if not self._stack:
            if self._root is not _EMPTY:
                raise FrameError("a second value at the top of a streamed message")
            self._root = value
            return
        top = self._stack[-1]
        if type(top) is list:
            top.append(value)
            return
        if self._key is None:
            raise FrameError("a value inside a dict without its key")
        top[self._key] = value
        self._key = None

    def _op_val(self, message: dict[str, Any]) -> None:
        if "v" not in message:
            raise FrameError("a value operation without a value")
        self._put(message["v"])

    def _op_items(self, message: dict[str, Any]) -> None:
        top, items = self._top(), message.get("v")
        if type(top) is not list or type(items) is not list:
            raise FrameError("list items outside a list")
        top.extend(items)

    def _op_fields(self, message: dict[str, Any]) -> None:
        top, fields = self._top(), message.get("v")
        if type(top) is not dict or type(fields) is not dict or self._key is not None:
            raise FrameError("dict entries outside a dict")
        top.update(fields)

    def _op_open(self, message: dict[str, Any]) -> None:
        kind = message.get("t")
        if kind not in ("list", "dict"):
            raise FrameError(f"a container of unknown type {kind!r:.40}")
        if len(self._stack) >= MAX_DEPTH:
            raise FrameError(f"containers nested deeper than {MAX_DEPTH} levels")
        container: Any = [] if kind == "list" else {}
        self._put(container)
        self._stack.append(container)

    def _op_key(self, message: dict[str, Any]) -> None:
        key = message.get("v")
        if type(self._top()) is not dict or not isinstance(key, str) or self._key is not None:
            raise FrameError("a key outside a dict, or two keys in a row")
        self._key = key

    def _op_close(self, message: dict[str, Any]) -> None:
        if self._key is not None:
            raise FrameError("a dict closed after a key without its value")
        self._top()
        self._stack.pop()

    def _op_text(self, message: dict[str, Any]) -> None:
        size, length, kind = message.get("n"), message.get("c"), message.get("w")
        ascii = message.get("a")
        if not (
            type(size) is int
            and type(length) is int
            and type(kind) is int
            and type(ascii) is bool
            and 0 <= length <= size
        ):
            raise FrameError("a malformed text announcement")
        self._wire += size
        if self._wire > self.max_bytes:
            self._too_big()
        text = _Text(size, length, kind, ascii)
        self.held += text.cost
        if size == 0:
            self._put(text.finish())
        else:
            self._text = text

    def _op_abort(self, message: dict[str, Any]) -> None:
        self.dropped = self.reset()

    def _op_end(self, message: dict[str, Any]) -> Message:
        if self._stack or self._root is _EMPTY:
            raise FrameError("a streamed message ended before its value was complete")
        kind = self._kind
        assert kind is not None
        usage = _usage(message) if kind == "result" else None
        done = Message(kind, self._root, usage, cost=self.held)
        self.reset()
        return done


_OPS: dict[str, Any] = {
    "val": Assembler._op_val,
    "items": Assembler._op_items,
    "fields": Assembler._op_fields,
    "open": Assembler._op_open,
    "key": Assembler._op_key,
    "close": Assembler._op_close,
    "text": Assembler._op_text,
    "abort": Assembler._op_abort,
    "end": Assembler._op_end,
}
