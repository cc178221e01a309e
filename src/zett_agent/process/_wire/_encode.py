r"""The worker's side of the wire: turn an event or a result into frames (see ``_protocol``).

Values must be JSON data: ``dict`` with ``str`` keys, ``list``, ``tuple`` (arrives as a list),
``str``, ``int``, ``float``, ``bool``, ``None``. Anything that JSON would silently change is
refused with a ``TypeError`` that names where it is: a non-``str`` dict key (``{1: "a"}``
would arrive as ``{"1": "a"}``, and ``{1: "a", "1": "b"}`` would lose an entry), an object
of another type, a cycle, nesting deeper than ``MAX_DEPTH``; and a ``str`` (value or key)
holding a lone surrogate such as ``"\\ud800"``, which is not valid Unicode (the parent refuses
it, since it could never encode it to UTF-8 again).

A value that encodes into at most ``CHUNK`` bytes goes as one frame. A larger one is streamed:
containers are opened and filled with batches of small items, and long strings go as raw
UTF-8 text frames, so the parent decodes no frame bigger than ``CHUNK`` (or ``TEXT_SLICE`` of
text). The walk runs in the worker (in Python), never in the parent.

Imported by the worker, so it imports nothing heavy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from json.encoder import encode_basestring_ascii
from typing import Any

from ._protocol import CHUNK, MAX_DEPTH, SURROGATE, TEXT_SLICE, lone_surrogate, surrogate_in

__all__ = ["Encoder", "check_value", "without_surrogates"]

#: one compact encoder for every frame (``json.dumps`` with ``separators`` builds one per call)
_dumps = json.JSONEncoder(separators=(",", ":")).encode
#: strings at least this long inside a streamed value travel as text frames
TEXT_MIN = 1 << 14
#: a container with at most this many entries is tried whole before it is streamed
_SMALL_CONTAINER = 64
#: characters of an ASCII text encoded at a time (see ``Encoder._text``)
_ASCII_PIECE = 1 << 16

_SCALARS = (str, int, float, type(None))

#: what a message of each kind starts with, for the scalar fast path (``Encoder.message``)
_PREFIX = {"event": '{"k":"event","v":', "result": '{"k":"result","v":'}
#: ints and ASCII texts the scalar fast path takes (beyond them the general path decides)
_FAST_INT = 1 << 63
_FAST_TEXT = 1024
_INF = float("inf")


def _scalar_json(value: Any, text_min: int) -> str | None:
    """What ``_dumps(value)`` gives, for a plain scalar that needs no check at all.

    That is ``None``, a ``bool``, an ``int`` or ``float`` that is finite and not huge, an ASCII
    ``str`` shorter than ``text_min`` and ``_FAST_TEXT``. ``None`` for anything else (the
    general path takes it). Exact types only: a subclass may encode differently.
    """
    if value is None:
        return "null"
    cls = type(value)
    if cls is str:
        if len(value) < text_min and len(value) <= _FAST_TEXT and value.isascii():
            return encode_basestring_ascii(value)
        return None
    if cls is bool:
        return "true" if value else "false"
    if cls is int:
        return int.__repr__(value) if -_FAST_INT < value < _FAST_INT else None
    if cls is float and -_INF < value < _INF:  # NaN fails both
        return float.__repr__(value)
    return None


def _usage_json(usage: dict[str, Any]) -> str:
    """``_dumps(usage)``, without the general encoder for the worker's own numbers."""
    cpu, peak = usage.get("cpu"), usage.get("maxrss")
    if len(usage) == 2 and type(cpu) is float and -_INF < cpu < _INF and type(peak) is int:
        return '{"cpu":' + float.__repr__(cpu) + ',"maxrss":' + int.__repr__(peak) + "}"
    return _dumps(usage)


def _path(keys: list[Any]) -> str:
    return "".join(f"[{key!r}]" for key in keys) or "the value itself"


def _refuse(keys: list[Any], what: str) -> TypeError:
    return TypeError(f"at {_path(keys)}: {what}")


_SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})
_CONTAINER_TYPES = (dict, list, tuple)


def check_value(value: Any) -> None:
    """Raise ``TypeError`` naming the path of the first thing JSON would not carry faithfully.

    Iterative (no recursion limit); each container is visited once however often it appears
    (so a cycle passes here: ``Encoder`` refuses it when it encodes), the types of a
    container's members are gathered at C speed (``map``), and paths are only worked out for
    the error message.
    """
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            if not set(map(type, item)) <= {str} and not all(isinstance(k, str) for k in item):
                raise _find(value, _bad_key)
            members: Any = item.values()
        elif isinstance(item, list | tuple):
            members = item
        elif isinstance(item, _SCALARS):
            continue
        else:
            raise _find(value, _bad_object)
        if set(map(type, members)) <= _SCALAR_TYPES:
            continue  # the common case: nothing below to look at
        if depth >= MAX_DEPTH:
            raise _find(value, lambda node, depth: _container(node) if depth >= MAX_DEPTH else None)
        # each distinct member once (by identity, at C speed), scalars skipped
        for member in dict(zip(map(id, members), members, strict=True)).values():
            if type(member) not in _SCALAR_TYPES:
                stack.append((member, depth + 1))


def _container(node: Any) -> str | None:
    if isinstance(node, dict | list | tuple):
        return f"nesting deeper than {MAX_DEPTH} levels (or a cycle)"
    return None


def _bad_key(node: Any, depth: int) -> str | None:
    if isinstance(node, dict):
        for key in node:
            if not isinstance(key, str):
                return (
                    f"a dict key of type {type(key).__name__} ({key!r:.40}), which JSON "
                    "would turn into a string"
                )
    return None


def _bad_object(node: Any, depth: int) -> str | None:
    if isinstance(node, (*_SCALARS, dict, list, tuple)):
        return None
    return f"an object of type {type(node).__name__} ({node!r:.60}), not JSON data"


def _bad_text(node: Any, depth: int) -> str | None:
    texts: Any = node if isinstance(node, dict) else (node,) if isinstance(node, str) else ()
    for text in texts:
        found = _surrogate_in(text)
        if found is not None:
            what = "dict key" if isinstance(node, dict) else "str"
            return (
                f"a {what} holding a lone surrogate ({found.group()!r} at index "
                f"{found.start()}), which is not valid Unicode text; replace it, for example "
                "with text.encode('utf-8', 'replace').decode()"
            )
    return None


def _surrogate_in(text: Any) -> re.Match[str] | None:
    if not isinstance(text, str) or surrogate_in(text) is None:
        return None
    return SURROGATE.search(text)


def without_surrogates(text: str) -> str:
    r"""Escape lone surrogates.

    ``text`` with each lone surrogate written as its escape (``"\\ud800"``), for texts
    that must reach the parent whatever they hold (an exception's message).
    """
    if surrogate_in(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _find(root: Any, problem: Callable[[Any, int], str | None]) -> TypeError:
    """Find where a value is wrong, with its path.

    The error for the first node of ``root`` where ``problem`` says what is wrong (a
    second, slower walk that keeps paths: only taken when there is an error to report).
    """
    stack: list[tuple[Any, list[Any]]] = [(root, [])]
    seen: set[int] = set()
    while stack:
        node, keys = stack.pop()
        what = problem(node, len(keys))
        if what is not None:
            path = list(keys)
            if isinstance(node, dict) and problem is _bad_key:
                path.append(next(key for key in node if not isinstance(key, str)))
            elif isinstance(node, dict) and problem is _bad_text:
                path.append(next(key for key in node if _surrogate_in(key) is not None))
            return _refuse(path, what)
        if isinstance(node, dict | list | tuple) and id(node) not in seen:
            seen.add(id(node))
            pairs = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend((child, [*keys, key]) for key, child in reversed(list(pairs)))
    return TypeError("the value is not JSON data")


class Encoder:
    """Writes messages through ``send`` (one frame payload per call).

    ``max_bytes`` caps one message's total size (the pool's ``max_frame_bytes``); a bigger one
    raises ``ValueError``. ``chunk``, ``text_slice`` and ``text_min`` are the protocol's sizes
    (tests shrink them to exercise streaming with small values).
    """

    def __init__(
        self,
        send: Callable[[bytes], None],
        max_bytes: int,
        *,
        chunk: int = CHUNK,
        text_slice: int = TEXT_SLICE,
        text_min: int = TEXT_MIN,
        send_parts: Callable[[int, Iterable[bytes]], None] | None = None,
    ) -> None:
        self._send = send
        #: sends one frame of the given size made of the given parts (default: joined)
        self._send_parts = send_parts or (lambda size, parts: send(b"".join(parts)))
        self._max = max_bytes
        self._chunk = chunk
        self._text_slice = text_slice
        self._text_min = text_min
        #: a value whose encoding is at most this long goes in one frame of its own
        self._whole_item = chunk - 32
        self._sent = 0
        #: kind of each open container: True for dict
        self._open: list[bool] = []
        #: the value being sent (to name the path of a bad text in it)
        self._root: Any = None

    def message(
        self,
        kind: str,
        value: Any,
        usage: dict[str, float] | None = None,
        *,
        as_json: bool = False,
    ) -> None:
        """Send one event or result.

        Raises ``TypeError`` (not JSON data, or a text that is not valid Unicode, with its
        path) or ``ValueError`` (over the size cap) before anything is sent when the value goes
        in one frame; a streamed value is checked first (a bad text as its frames are made),
        then sent, and the parent told to drop what it got of it when it fails.

        ``as_json``: the value is sent as ``json.dumps`` takes it (a non-``str`` key it turns
        into a string arrives as that string), for a value that becomes JSON anyway: when its
        JSON fits one frame, the walk of ``check_value`` (most of the cost of a large value) is
        skipped; what JSON refuses, and a lone surrogate, are refused all the same, with their
        path.
        """
        prefix = _PREFIX.get(kind)
        if prefix is not None:
            scalar = _scalar_json(value, self._text_min)
            if scalar is not None:
                # the common answer (None, a number, a short text) in a few string operations;
                # it needs no check: JSON data by its type, ASCII holds no surrogate
                if usage is None:
                    payload = (prefix + scalar + "}").encode()
                else:
                    payload = (prefix + scalar + ',"u":' + _usage_json(usage) + "}").encode()
                if len(payload) <= self._chunk:
                    self._send(payload)
                    return
        message: dict[str, Any] = {"k": kind, "v": value}
        if usage is not None:
            message["u"] = usage
        self._root = value
        try:
            if as_json and self._one_frame(message, value):
                return
            check_value(value)
            self._message(kind, value, usage, message)
        finally:
            self._root = None

    def _one_frame(self, message: dict[str, Any], value: Any) -> bool:
        """Send ``message`` as one frame if JSON takes it and it fits; whether it was sent."""
        try:
            text = _dumps(message)
        except (TypeError, ValueError, RecursionError):
            return False  # the checked way names what is wrong, or streams a deep value
        if len(text) > self._chunk:  # ASCII: as many bytes as characters
            return False
        payload = text.encode()
        self._check_text(payload, value)
        self._send(payload)
        return True

    def _message(
        self, kind: str, value: Any, usage: dict[str, float] | None, message: dict[str, Any]
    ) -> None:
        # a long string would only be encoded to find out that it must be streamed
        long_text = isinstance(value, str) and len(value) >= self._text_min
        text = None if long_text else self._whole(message)
        if text is not None:
            payload = text.encode()
            if len(payload) <= self._chunk:
                self._check_text(payload, value)
                self._send(payload)
                return
        self._sent = 0
        self._open = []
        self._frame({"k": "begin", "m": kind})
        try:
            self._value(value)
        except BaseException:
            # the parent drops what it assembled of this message; the error follows
            self._send(b'{"k":"abort"}')
            raise
        end: dict[str, Any] = {"k": "end"}
        if usage is not None:
            end["u"] = usage
        self._frame(end)

    def _whole(self, message: dict[str, Any]) -> str | None:
        try:
            return _dumps(message)
        except RecursionError:
            return None  # deep but legal (check_value passed): stream it
        except ValueError as exc:  # circular reference
            raise TypeError(f"the value is not JSON data: {exc}") from None

    # -- frames -----------------------------------------------------------------------------

    def _count(self, size: int) -> None:
        self._sent += size
        if self._sent > self._max:
            raise ValueError(
                f"the value takes more than the pool's max_frame_bytes={self._max} bytes; send "
                "less data per event or result, or raise ProcessPool(max_frame_bytes=...)"
            )

    def _frame(self, message: dict[str, Any]) -> None:
        payload = _dumps(message).encode()
        self._check_text(payload, message)
        self._count(len(payload))
        self._send(payload)

    def _check_text(self, payload: bytes, data: Any) -> None:
        r"""Refuse a payload that holds a lone surrogate.

        Refuse ``payload``, the JSON of ``data``, if ``data`` holds a lone surrogate (JSON
        escapes it as ``\\ud800``; the parent refuses it): the parent's own check, then,
        only to report one, the walk that finds its path in the whole value.
        """
        if lone_surrogate(payload, data) is not None:
            raise _find(self._root, _bad_text)

    # -- values -----------------------------------------------------------------------------

    def _small(self, value: Any) -> str | None:
        """``value`` encoded, if it is small enough to travel in one frame."""
        if isinstance(value, str) and len(value) >= self._text_min:
            return None
        if isinstance(value, dict | list | tuple) and len(value) > _SMALL_CONTAINER:
            return None
        try:
            text = _dumps(value)
        except RecursionError:
            return None
        return text if len(text) <= self._whole_item else None

    def _value(self, value: Any) -> None:
        """Stream ``value`` as the next value (top level, list item, or after a key)."""
        small = self._small(value)
        if isinstance(value, str) and small is None:
            self._text(value)  # long, or escaped into more than a frame holds
            return
        if small is not None or not isinstance(value, dict | list | tuple):
            if small is None:
                small = _dumps(value)  # a number of thousands of digits: under a real CHUNK
            payload = ('{"k":"val","v":' + small + "}").encode()
            self._check_text(payload, value)
            self._count(len(payload))
            self._send(payload)
            return
        is_dict = isinstance(value, dict)
        self._frame({"k": "open", "t": "dict" if is_dict else "list"})
        self._open.append(is_dict)
        entries: Any = list(value.items()) if isinstance(value, dict) else value
        # entries go in slices encoded at C speed; the slice grows while it fits a frame and
        # shrinks when it does not, down to one entry, which is then streamed on its own
        start, step, count = 0, 16, len(entries)
        while start < count:
            part = entries[start : start + step]
            body = self._slice(part, is_dict)
            if body is not None:
                kind = "fields" if is_dict else "items"
                payload = ('{"k":"' + kind + '","v":' + body + "}").encode()
                self._check_text(payload, part)
                self._count(len(payload))
                self._send(payload)
                start += len(part)
                if len(body) < self._chunk // 2:
                    step = min(step * 2, 1 << 16)
            elif step > 1:
                step = max(1, step // 4)
            else:
                if is_dict:
                    key, child = part[0]
                    self._frame({"k": "key", "v": key})
                    self._value(child)
                else:
                    self._value(part[0])
                start += 1
        self._open.pop()
        self._frame({"k": "close"})

    def _slice(self, part: Any, is_dict: bool) -> str | None:
        """Encode a slice of a container as one frame, if it can be.

        ``part`` (list items, or dict entries) encoded as a list or dict, if it fits one
        frame and holds no string that must travel as text; else None.
        """
        if len(part) == 1:
            single = part[0][1] if is_dict else part[0]
            if isinstance(single, str) and len(single) >= self._text_min:
                return None
        try:
            body = _dumps(dict(part) if is_dict else part)
        except RecursionError:
            return None
        return body if len(body) <= self._chunk - 32 else None

    def _text(self, text: str) -> None:
        ascii = text.isascii()
        # characters per text frame: a slice of any string encodes into at most text_slice bytes
        per_slice = self._text_slice // 4
        try:
            slices = (
                None
                if ascii
                else [
                    text[start : start + per_slice].encode("utf-8")
                    for start in range(0, len(text), per_slice)
                ]
            )
        except UnicodeEncodeError:  # a lone surrogate: refused before its announcement
            raise _find(self._root, _bad_text) from None
        size = len(text) if slices is None else sum(map(len, slices))
        # counted whole before the announcement: once text frames flow, nothing can be aborted
        self._count(size)
        kind = 1 if ascii else _width(text)
        self._frame({"k": "text", "n": size, "c": len(text), "w": kind, "a": ascii})
        if slices is None:
            # ASCII: each frame encoded in pieces below malloc's mmap threshold (128 KiB), so
            # the pieces reuse the same, already touched, heap memory each time: encoding a
            # whole frame at once writes to fresh pages, which costs more than the copy itself
            step = self._text_slice
            for start in range(0, len(text), step):
                end = min(start + step, len(text))
                pieces = (
                    text[at : min(at + _ASCII_PIECE, end)].encode("ascii")
                    for at in range(start, end, _ASCII_PIECE)
                )
                self._send_parts(end - start, pieces)
        else:
            for piece in slices:
                self._send(piece)


def _width(text: str) -> int:
    """Bytes per character CPython stores a non-ASCII ``text`` with: 1, 2 or 4."""
    try:
        text.encode("latin-1")
        return 1
    except UnicodeEncodeError:
        pass
    wide = len(text.encode("utf-16-le")) != 2 * len(text)
    return 4 if wide else 2
