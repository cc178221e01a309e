"""How ``zett_agent.models._http`` reads a response off the wire, over byte strings: no I/O here.

The socket code appends what it receives to one ``bytearray`` and calls a reader on it; a reader
takes (deletes) from the front of that buffer what it consumed and returns what it made of it,
or ``None`` when it needs more bytes. When the connection ends, ``read_eof()`` says what the
end means: the end of the body, or a response cut short (``TransportError``). So every framing
rule, bound and defect is tested with byte strings, without a server.

- ``HeadReader``: the status line and headers of the final response, skipping interim (1xx)
  responses. One budget for all of them: ``MAX_HEAD_BYTES`` over every interim head and the
  final one together, at most ``MAX_INTERIM`` interim responses.
- ``body_reader(head)``: the reader the head's framing calls for: ``ContentLengthReader``,
  ``ChunkedReader`` (chunk-size lines at most ``MAX_CHUNK_LINE`` bytes with their extensions,
  trailers at most ``MAX_HEAD_BYTES``), ``UntilEOFReader`` (a body that ends with the
  connection), or ``NoBodyReader``. A body reader returns body data (``bytes``, never empty),
  ``b""`` once the body is complete (and again at every later call), or ``None``.

Protocol numbers (status codes, ``Content-Length``, chunk sizes) are read with ASCII-only
grammars over bytes: ``²`` is not a digit here. Everything the server sends is looked at once:
each reader remembers how far it searched for a line end, so a head or a chunk-size line
trickling in one byte at a time costs linear time.

The errors of the client live here too, since the readers raise them (``_http`` re-exports
them): each has one meaning, and the messages say what the server did wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "MAX_CHUNKS",
    "MAX_CHUNK_LINE",
    "MAX_HEAD_BYTES",
    "MAX_INTERIM",
    "BodyReader",
    "ChunkedReader",
    "ConnectTimeout",
    "ContentLengthReader",
    "DecodingError",
    "HTTPError",
    "HTTPTimeout",
    "Head",
    "HeadReader",
    "NoBodyReader",
    "ReadTimeout",
    "RequestError",
    "TransportError",
    "UntilEOFReader",
    "WriteTimeout",
    "body_reader",
]

#: the status lines and headers of a response, interim responses included, at most
MAX_HEAD_BYTES = 64 * 1024
#: interim (1xx) responses before the final one, at most (servers send one ``100 Continue``
#: or a few ``103 Early Hints``; a stream of them would otherwise never end)
MAX_INTERIM = 16
#: one chunk-size line of a chunked body, its extensions included, at most
MAX_CHUNK_LINE = 4096
#: chunks of one chunked body, at most: servers send one per event or flush, and a million is
#: more than any answer streams; each costs a microsecond or two, whatever its size
MAX_CHUNKS = 2**20


class HTTPError(Exception):
    """Base of the errors of the HTTP client."""


class HTTPTimeout(HTTPError):
    """One step (connecting, sending, the response head, or one read of the body) took too long."""


class ConnectTimeout(HTTPTimeout):
    """Connecting (TCP, proxy tunnel, TLS handshake) took longer than ``io_timeout``."""


class WriteTimeout(HTTPTimeout):
    """Sending the request took longer than ``io_timeout``."""


class ReadTimeout(HTTPTimeout):
    """The server was too slow.

    The response head was not complete within ``io_timeout`` seconds of the request being
    sent, or nothing of the body arrived for ``io_timeout`` seconds.
    """


class TransportError(HTTPError):
    """The connection could not be made, broke, or ended before the response was complete."""


class DecodingError(HTTPError):
    """The response is not HTTP/1.x as this client reads it, or crossed one of its bounds."""


class RequestError(HTTPError):
    """The request cannot be sent as configured (the message says what to change)."""


# RFC 9112 status-line; the reason phrase may be empty or missing with its space.
_STATUS_LINE = re.compile(rb"HTTP/1\.[0-9] ([0-9]{3})(?: ([\t\x20-\x7e\x80-\xff]*))?")
# RFC 9110 field-name ":" field-value (OWS are stripped apart: a lazy match backtracks).
_FIELD = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):([\t\x20-\x7e\x80-\xff]*)")
_FOLD = re.compile(rb"[ \t]+([\t\x20-\x7e\x80-\xff]*)")
# RFC 9112 chunk-size [ chunk-ext ]: extensions are ignored, but may not hold control bytes.
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]+)[ \t]*(?:;[\t\x20-\x7e\x80-\xff]*)?")
_DIGITS = re.compile(rb"[0-9]{1,19}")
_OWS = b" \t"
_HEX = b"0123456789abcdefABCDEF"


@dataclass(frozen=True, slots=True)
class Head:
    """The head of a final response.

    ``fields`` maps lower-case names to their values, the values of a repeated field joined with
    ``b", "``.
    """

    status: int
    reason: bytes
    fields: dict[bytes, bytes]


class _Lines:
    r"""Takes lines (ended by ``\\n`` or ``\\r\\n``) from the front of a buffer.

    ``budget`` bytes in all (line ends included), and each search starts where the last one stopped.
    """

    __slots__ = ("_budget", "_searched", "used")

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._searched = 0
        self.used = 0

    def take(self, buf: bytearray) -> bytes | None:
        """The next line without its end, or ``None`` if ``buf`` holds no complete line.

        Raises ``OverflowError`` when the lines would cross the budget.
        """
        end = buf.find(b"\n", self._searched, self._budget - self.used)
        if end < 0:
            if self.used + len(buf) >= self._budget:
                raise OverflowError
            self._searched = len(buf)
            return None
        self._searched = 0
        self.used += end + 1
        line = bytes(buf[: end - 1 if end and buf[end - 1] == 13 else end])
        del buf[: end + 1]
        return line


class HeadReader:
    """Reads the head of the final response, skipping interim (1xx) responses.

    ``reader(buf)`` returns the ``Head`` once complete, else ``None``. Raises
    ``DecodingError`` for a head that is not HTTP/1.x (a status line or field this client does
    not read), more than ``max_bytes`` over all heads, or more than ``max_interim`` interim
    responses. Empty lines before a status line are tolerated (RFC 9112 2.2), within the budget.
    """

    def __init__(
        self,
        *,
        max_bytes: int = MAX_HEAD_BYTES,
        max_interim: int = MAX_INTERIM,
    ) -> None:
        self._lines = _Lines(max_bytes)
        self._max_bytes = max_bytes
        self._max_interim = max_interim
        self.interim = 0  # interim responses skipped so far
        self._status: tuple[int, bytes] | None = None
        self._fields: dict[bytes, list[bytes]] = {}
        self._name = b""  # the field being read, whose value may go on in folded lines
        self._value: list[bytes] = []
        self._pending = 0  # bytes of a line not complete yet, at the last call

    @property
    def received(self) -> int:
        """Bytes of heads consumed so far (those of interim responses included)."""
        return self._lines.used

    def __call__(self, buf: bytearray) -> Head | None:
        while True:
            try:
                line = self._lines.take(buf)
            except OverflowError:
                raise DecodingError(self._too_long()) from None
            if line is None:
                self._pending = len(buf)
                return None
            if self._status is None:
                if line:
                    self._status = _status(line)
                continue  # empty lines before a status line are ignored
            if line:
                self._field(line)
                continue
            head = self._end()
            if head is not None:
                return head

    def read_eof(self) -> None:
        """The connection ended before the head did: raises ``TransportError``."""
        if not self.received and not self._pending:
            raise TransportError("the server closed the connection without answering")
        raise TransportError("the server closed the connection in the middle of the response head")

    def _too_long(self) -> str:
        interim = f" ({self.interim} interim responses included)" if self.interim else ""
        return f"the response head exceeds {self._max_bytes} bytes{interim}"

    def _field(self, line: bytes) -> None:
        if line[0] in b" \t":  # obsolete line folding: more of the last value (RFC 9112 5.2)
            match = _FOLD.fullmatch(line)
            if match is None or not self._name:
                raise DecodingError(f"a response header is malformed: {line[:200]!r}")
            self._value.append(match[1].rstrip(_OWS))
            return
        match = _FIELD.fullmatch(line)
        if match is None:
            raise DecodingError(f"a response header is malformed: {line[:200]!r}")
        self._flush()
        self._name = match[1].lower()
        self._value = [match[2].strip(_OWS)]

    def _flush(self) -> None:
        if self._name:
            value = b" ".join(part for part in self._value if part)
            self._fields.setdefault(self._name, []).append(value)
            self._name = b""

    def _end(self) -> Head | None:
        """The head just ended: the final one, or ``None`` after an interim response."""
        assert self._status is not None
        self._flush()
        status, reason = self._status
        fields = {name: b", ".join(values) for name, values in self._fields.items()}
        self._status, self._fields = None, {}
        if 100 <= status < 200 and status != 101:
            self.interim += 1
            if self.interim > self._max_interim:
                raise DecodingError(
                    f"the server sent more than {self._max_interim} interim (1xx) responses "
                    f"before its answer (the last was {status} {reason[:80]!r})"
                )
            return None
        return Head(status, reason, fields)


def _status(line: bytes) -> tuple[int, bytes]:
    match = _STATUS_LINE.fullmatch(line)
    if match is None:
        raise DecodingError(f"the status line is not HTTP/1.x: {line[:200]!r}")
    return int(match[1]), (match[2] or b"").strip(_OWS)


class BodyReader(Protocol):
    """One body framing: body data from the buffer, ``b""`` at its end, ``None`` for more."""

    def __call__(self, buf: bytearray) -> bytes | None: ...

    def read_eof(self) -> None:
        """The connection ended: return if that ends the body, else raise ``TransportError``."""


def _take(buf: bytearray, most: int) -> bytes:
    if len(buf) <= most:
        data = bytes(buf)
        buf.clear()
    else:
        data = bytes(buf[:most])
        del buf[:most]
    return data


class ContentLengthReader:
    """A body of ``length`` bytes; bytes after it are ignored (the connection closes)."""

    def __init__(self, length: int) -> None:
        self._length = self._left = length

    def __call__(self, buf: bytearray) -> bytes | None:
        if not self._left:
            return b""
        if not buf:
            return None
        data = _take(buf, self._left)
        self._left -= len(data)
        return data

    def read_eof(self) -> None:
        if self._left:
            raise TransportError(
                "the server closed the connection in the middle of the body (after "
                f"{self._length - self._left} of the {self._length} bytes its Content-Length "
                "announced)"
            )


_SIZE, _DATA, _CRLF, _TRAILERS, _END = range(5)


class ChunkedReader:
    """A body in chunked transfer coding (RFC 9112 7.1).

    Extensions and trailers are read and ignored. Raises ``DecodingError`` for a chunk-size line
    that is malformed or longer than ``MAX_CHUNK_LINE``, a chunk longer than its size says, more
    than ``max_chunks`` chunks, or trailers over ``MAX_HEAD_BYTES``.
    """

    def __init__(self, max_chunks: int = MAX_CHUNKS) -> None:
        self._max_chunks = self._chunks = max_chunks  # allowed, still allowed
        self._state = _SIZE
        self._left = 0  # bytes of the current chunk still to come
        self._searched = 0  # how far the buffer holds no \n (in _SIZE)
        self._trailers = _Lines(MAX_HEAD_BYTES)

    def __call__(self, buf: bytearray) -> bytes | None:
        while True:
            state = self._state
            if state == _DATA:
                if not buf:
                    return None
                data = _take(buf, self._left)
                self._left -= len(data)
                if not self._left:
                    self._state = _CRLF
                return data
            if state == _SIZE:
                end = buf.find(b"\n", self._searched, MAX_CHUNK_LINE)
                if end < 0:
                    if len(buf) >= MAX_CHUNK_LINE:
                        raise DecodingError(
                            f"a chunk-size line of the response exceeds {MAX_CHUNK_LINE} bytes: "
                            f"{bytes(buf[:80])!r}..."
                        )
                    self._searched = len(buf)
                    return None
                self._searched = 0
                self._left = _chunk_size(buf, end - 1 if end and buf[end - 1] == 13 else end)
                del buf[: end + 1]
                self._state = _DATA if self._left else _TRAILERS
                self._chunks -= 1
                if self._chunks < 0:
                    raise DecodingError(
                        f"the response body comes in more than {self._max_chunks} chunks "
                        "(a flood of tiny chunks?)"
                    )
            elif state == _CRLF:
                if buf.startswith(b"\r\n"):
                    del buf[:2]
                elif buf.startswith(b"\n"):
                    del buf[:1]
                elif not buf or buf == b"\r":
                    return None
                else:
                    raise DecodingError("a chunk of the response is longer than its size says")
                self._state = _SIZE
            elif state == _TRAILERS:
                try:
                    line = self._trailers.take(buf)
                except OverflowError:
                    raise DecodingError(
                        f"the trailers of the response exceed {MAX_HEAD_BYTES} bytes"
                    ) from None
                if line is None:
                    return None
                if not line:
                    self._state = _END
            else:
                return b""

    def read_eof(self) -> None:
        if self._state != _END:
            raise TransportError(
                "the server closed the connection in the middle of the body (a chunked body "
                "that never sent its last chunk)"
            )


def _chunk_size(buf: bytearray, end: int) -> int:
    """The size the chunk-size line ``buf[:end]`` announces."""
    if 0 < end <= 15:  # the common line: hex digits alone (int() would also take 0x, _, +)
        line = bytes(buf[:end])
        if not line.strip(_HEX):
            return int(line, 16)
    match = _CHUNK_SIZE.fullmatch(buf, 0, end)
    if match is None:
        raise DecodingError(f"a chunk size of the response is malformed: {bytes(buf[:80])!r}")
    digits = match[1].lstrip(b"0")
    if len(digits) > 15:  # 2**60: far past any bound of the reader's caller
        raise DecodingError(f"a chunk size of the response is too large: {match[1][:80]!r}")
    return int(digits or b"0", 16)


class UntilEOFReader:
    """A body that ends when the connection does."""

    def __init__(self) -> None:
        self._ended = False

    def __call__(self, buf: bytearray) -> bytes | None:
        if buf:
            return _take(buf, len(buf))
        return b"" if self._ended else None

    def read_eof(self) -> None:
        self._ended = True


class NoBodyReader:
    """The reader of a response without a body.

    No body (204, 304, or a body this client cannot read: ``defect`` says why, raised as a
    ``DecodingError`` when the body is read).
    """

    def __init__(self, defect: str | None = None) -> None:
        self._defect = defect

    def __call__(self, buf: bytearray) -> bytes | None:
        if self._defect is not None:
            raise DecodingError(self._defect)
        return b""

    def read_eof(self) -> None:
        pass


def body_reader(head: Head) -> BodyReader:
    """The reader of the body ``head`` announces.

    Raises ``DecodingError`` for a body this client cannot read: compressed (it asks for identity),
    a transfer coding other than chunked, a ``Content-Length`` that is not one number.
    """
    fields = head.fields
    codings = fields.get(b"content-encoding", b"identity").lower()
    if codings.replace(b"identity", b"").strip(b" \t,"):
        raise DecodingError(
            f"the response is encoded with {codings.decode('latin-1')!r} although the request "
            "asked for identity (Accept-Encoding: identity)"
        )
    if head.status in (204, 304) or head.status < 200:
        return NoBodyReader()
    transfer = fields.get(b"transfer-encoding")
    if transfer is not None:
        codings = transfer.lower().replace(b" ", b"").replace(b"\t", b"")
        codings = codings.replace(b"identity", b"").strip(b",")
        if codings == b"chunked":
            return ChunkedReader(MAX_CHUNKS)
        if codings:
            raise DecodingError(
                f"the transfer coding {transfer.decode('latin-1')!r} is not supported"
            )
        return UntilEOFReader()
    length = fields.get(b"content-length")
    if length is None:
        return UntilEOFReader()
    values = {value.strip(_OWS) for value in length.split(b",")}
    value = values.pop() if len(values) == 1 else b""
    if _DIGITS.fullmatch(value) is None:
        raise DecodingError(f"the Content-Length {length.decode('latin-1')!r} is not one number")
    return ContentLengthReader(int(value))
