"""What one provider response may make the parent hold: its bytes, lines and JSON, counted as read.

A model adapter makes its calls through an SDK, in the parent for every brokered child, so a
hostile or broken server must not make the parent hold much or spin: the SDK decodes SSE with no
limit on a line or an event, and parses every event's JSON whatever its shape. ``guard`` is the
HTTP client's response hook: it replaces the response's byte stream by a ``_Guarded`` one (of the
HTTP library the SDK uses), which counts what arrives before the SDK sees it:

- an answer (a 2xx response) may send at most ``MAX_RESPONSE_BYTES`` of body as received (every
  byte counts: comments, keep-alives, blank lines), in lines of at most ``MAX_LINE_BYTES``, at
  most ``MAX_LINES`` line ends; a line longer than ``CHECKED_BYTES`` may hold at most
  ``MAX_JSON_ITEMS`` commas and colons outside its strings (each costs the JSON parser 100 to
  250 ns and about 70 bytes, thirty times a character of a string), so no event's JSON costs the
  parent more than a few tens of milliseconds;
- an error response's body is read up to ``MAX_ERROR_BYTES`` and cut there (its status still
  decides what the error is);
- a compressed body is refused (the request asks for none: what a small compressed body
  expands to is not what arrived), and so is a body the budget cannot count (none is).

Crossing a bound raises ``ResponseRefused`` (a ``ModelError`` naming the bound) from inside the
SDK's read, which passes it through unwrapped; the adapter counts the events the SDK makes
(``MAX_EVENTS``) and bounds the whole call by its deadline.

Each piece of a body, and the head before it, waits for its turn (``_pacing``) before anything
is done with it: when a thousand responses arrive together, the parent takes them a few per
loop iteration instead of all in one.

An answer with a JSON content type (a server that ignored ``stream: true``) is read whole, at
most ``MAX_JSON_BYTES``, and handed to the SDK as one server-sent event followed by ``[DONE]``,
when the adapter asks for it (``json_as_event``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from zett_agent._model import ModelError
from zett_agent.models._pacing import pace

__all__ = [
    "CHECKED_BYTES",
    "MAX_ERROR_BYTES",
    "MAX_EVENTS",
    "MAX_JSON_BYTES",
    "MAX_JSON_ITEMS",
    "MAX_LINES",
    "MAX_LINE_BYTES",
    "MAX_RESPONSE_BYTES",
    "ResponseRefused",
    "guard",
    "paced",
    "separators_outside_strings",
]

#: body bytes of one answer, as received, at most
MAX_RESPONSE_BYTES = 64 * 2**20
#: one line of an answer (one SSE line: one event's data, in practice), at most
MAX_LINE_BYTES = 8 * 2**20
#: a whole answer the server did not stream (one JSON document), at most
MAX_JSON_BYTES = MAX_LINE_BYTES
#: line ends of one answer, at most: a flood of blank lines or keep-alives ends here
MAX_LINES = 2**21
#: events the SDK makes of one answer, at most (counted by the adapter): a million is more than
#: the longest answer streams, with its reasoning
MAX_EVENTS = 2**20
#: an error body, at most (only its first few hundred characters are quoted)
MAX_ERROR_BYTES = 2**20
#: lines longer than this are checked for their JSON's structure
CHECKED_BYTES = 2**16
#: commas and colons outside the strings of one line longer than ``CHECKED_BYTES``, at most
MAX_JSON_ITEMS = 2**17
#: events handed out between two yields to the event loop (an SDK hands out the events of one
#: read without waiting, however many it holds)
_PACE = 64


class ResponseRefused(ModelError):
    """A response crossed one of the budget's bounds, or is of a kind it cannot count."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


def separators_outside_strings(data: bytes | bytearray | str) -> int:
    """The commas and colons outside the strings of the JSON text ``data``.

    Counted at C speed: first all of them; only if that is too many, those outside strings
    (prose and code in a long string hold plenty).
    """
    if isinstance(data, str):
        items = data.count(",") + data.count(":")
    else:
        items = data.count(b",") + data.count(b":")
    if items <= MAX_JSON_ITEMS:
        return items
    text = data.decode("utf-8", "replace") if isinstance(data, bytes | bytearray) else data
    # Without escaped backslashes and quotes, every quote left opens or closes a string.
    if "\\" in text:
        text = text.replace("\\\\", "").replace('\\"', "")
    quotes = text.count('"')
    if quotes > 4 * MAX_JSON_ITEMS:
        # That many strings are that many keys and values, with a comma or colon between each
        # two: no need to split them to know.
        return quotes // 2
    outside = "".join(text.split('"')[::2])
    return outside.count(",") + outside.count(":")


def _check_structure(line: bytes | bytearray) -> None:
    items = separators_outside_strings(line)
    if items > MAX_JSON_ITEMS:
        raise ResponseRefused(
            f"the model endpoint sent a line of {len(line)} bytes holding {items} commas and "
            f"colons outside strings, more than the {MAX_JSON_ITEMS} one event may hold (JSON "
            "built to be expensive to parse?)"
        )


class _Counter:
    """The bounds of one answer's body, fed each piece as it arrives."""

    __slots__ = ("lines", "received", "tail")

    def __init__(self) -> None:
        self.received = 0
        self.lines = 0
        #: the bytes after the last line end (the line still arriving)
        self.tail = bytearray()

    def feed(self, piece: bytes) -> None:
        self.received += len(piece)
        if self.received > MAX_RESPONSE_BYTES:
            raise ResponseRefused(
                f"the model endpoint's answer exceeds {MAX_RESPONSE_BYTES} bytes (the most one "
                "response may send, keep-alives and blank lines included)"
            )
        cut = max(piece.rfind(b"\n"), piece.rfind(b"\r"))
        if cut < 0:
            self.tail += piece
            if len(self.tail) > MAX_LINE_BYTES:
                raise ResponseRefused(
                    f"the model endpoint sent a line longer than {MAX_LINE_BYTES} bytes"
                )
            return
        self.lines += piece.count(b"\n") + piece.count(b"\r")
        if self.lines > MAX_LINES:
            raise ResponseRefused(
                f"the model endpoint sent more than {MAX_LINES} lines in one response (a flood "
                "of blank lines or comments?)"
            )
        if len(self.tail) + cut + 1 > CHECKED_BYTES:  # a line of it may be long: look at each
            region = self.tail + piece[: cut + 1]
            for line in region.splitlines():
                if len(line) > MAX_LINE_BYTES:
                    raise ResponseRefused(
                        f"the model endpoint sent a line longer than {MAX_LINE_BYTES} bytes"
                    )
                if len(line) > CHECKED_BYTES:
                    _check_structure(line)
        self.tail = bytearray(piece[cut + 1 :])


async def _answer(inner: Any) -> AsyncIterator[bytes]:
    counter = _Counter()
    async for piece in inner:
        await pace()
        counter.feed(piece)
        yield piece


async def _error_body(inner: Any) -> AsyncIterator[bytes]:
    left = MAX_ERROR_BYTES
    async for piece in inner:
        await pace()
        if len(piece) >= left:
            yield piece[:left]
            return  # the rest is not read: the status decides
        left -= len(piece)
        yield piece


async def _json_as_event(inner: Any) -> AsyncIterator[bytes]:
    body = bytearray()
    async for piece in inner:
        await pace()
        body += piece
        if len(body) > MAX_JSON_BYTES:
            raise ResponseRefused(
                f"the model endpoint's answer (one JSON document) exceeds {MAX_JSON_BYTES} bytes"
            )
    if len(body) > CHECKED_BYTES:
        _check_structure(body)
    lines = bytes(body).splitlines() or [b""]
    yield b"".join(b"data: " + line + b"\n" for line in lines) + b"\ndata: [DONE]\n\n"


def _stream_class(response: Any) -> type:
    """The ``AsyncByteStream`` of the HTTP library ``response`` comes from, subclassed once."""
    library = sys.modules[type(response).__module__.partition(".")[0]]
    base: type = library.AsyncByteStream
    made = _classes.get(base)
    if made is None:

        class _Guarded(base):  # type: ignore[misc]
            """The response's body, through the budget; closing it closes the original."""

            def __init__(self, inner: Any, pieces: AsyncIterator[bytes]) -> None:
                self._inner = inner
                self._pieces = pieces

            def __aiter__(self) -> AsyncIterator[bytes]:
                return self._pieces

            async def aclose(self) -> None:
                try:
                    await self._pieces.aclose()  # type: ignore[attr-defined]
                finally:
                    await self._inner.aclose()

        made = _classes[base] = _Guarded
    return made


_classes: dict[type, type] = {}


def guard(*, json_as_event: bool) -> Callable[[Any], Awaitable[None]]:
    """The response hook that puts every response of a client through the budget.

    ``json_as_event``: an answer with a JSON content type is handed on as one SSE event (for
    an API whose servers may ignore ``stream: true``); else it is counted like any answer.
    """

    async def hook(response: Any) -> None:
        await pace()  # many heads arrive at once: what follows (the SDK's part too) takes turns
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise ResponseRefused(
                f"the model endpoint sent a compressed body (Content-Encoding: "
                f"{encoding[:40]}), though the request asked for none"
            )
        inner = response.stream
        if response.status_code >= 300:
            pieces = _error_body(inner)
        elif json_as_event and _is_json(response):
            pieces = _json_as_event(inner)
        else:
            pieces = _answer(inner)
        response.stream = _stream_class(response)(inner, pieces)

    return hook


def _is_json(response: Any) -> bool:
    content_type: str = response.headers.get("content-type", "")
    return content_type.split(";")[0].strip().lower() == "application/json"


async def paced(events: Any, deadline: float) -> AsyncIterator[Any]:
    """The events of an SDK stream, each awaited before the loop time ``deadline``.

    After every ``_PACE`` events the event loop runs what is ready, so a flood that arrived at
    once is handed out in slices. Raises ``TimeoutError`` at the deadline and ``ResponseRefused``
    past ``MAX_EVENTS`` events.
    """
    iterator = aiter(events)
    count = 0
    while True:
        async with asyncio.timeout_at(deadline):
            try:
                event = await anext(iterator)
            except StopAsyncIteration:
                return
        count += 1
        if count % _PACE == 0:
            if count > MAX_EVENTS:
                raise ResponseRefused(
                    f"the model endpoint sent more than {MAX_EVENTS} events in one response"
                )
            await asyncio.sleep(0)
        yield event
