"""The HTTP client's framing over byte strings, no server: ``zett_agent.models._http_readers``.

Each reader is fed the bytes in one piece and again one byte at a time (what a slow or hostile
server can make of any response), and must read the same thing both ways.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from zett_agent.models import _http_readers as readers
from zett_agent.models._http_readers import (
    MAX_CHUNK_LINE,
    MAX_HEAD_BYTES,
    MAX_INTERIM,
    ChunkedReader,
    ContentLengthReader,
    DecodingError,
    Head,
    HeadReader,
    NoBodyReader,
    TransportError,
    UntilEOFReader,
    body_reader,
)


def pieces(data: bytes, bytewise: bool) -> Iterable[bytes]:
    return (data[i : i + 1] for i in range(len(data))) if bytewise else [data]


def read_head(data: bytes, *, bytewise: bool = False, **kwargs: Any) -> tuple[Head, bytes]:
    """The head ``data`` starts with, and what of the bytes fed was left after it."""
    reader = HeadReader(**kwargs)
    buf = bytearray()
    for piece in pieces(data, bytewise):
        buf += piece
        head = reader(buf)
        if head is not None:
            return head, bytes(buf)
    raise AssertionError("the head did not end")


def read_body(
    make: Callable[[], readers.BodyReader], data: bytes, *, bytewise: bool, eof: bool = True
) -> bytes:
    """The body ``make()`` reads from ``data``, then the end of the connection (``eof``)."""
    reader = make()
    buf = bytearray()
    out = bytearray()
    for piece in pieces(data, bytewise):
        buf += piece
        while data_ := reader(buf):
            out += data_
        if data_ == b"":
            return bytes(out)
    if eof:
        reader.read_eof()
        while data_ := reader(buf):
            out += data_
        assert data_ == b"", "a reader that took the end of the connection wants more"
    return bytes(out)


both = pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])


# --- the head -----------------------------------------------------------------------------------


@both
def test_a_head_with_folded_repeated_and_spaced_fields(bytewise: bool) -> None:
    data = (
        b"\r\n"  # an empty line before the status line is tolerated
        b"HTTP/1.1 200 OK then\r\n"
        b"X-A: 1\r\n"
        b"x-a:2  \r\n"
        b"X-Folded: one\r\n"
        b"  two\r\n"
        b"\tthree\n"  # a bare \n ends a line too
        b"Empty:\r\n"
        b"Latin: caf\xe9\r\n"
        b"\r\n"
        b"body"
    )
    head, rest = read_head(data, bytewise=bytewise)
    assert (head.status, head.reason) == (200, b"OK then")
    assert head.fields == {
        b"x-a": b"1, 2",
        b"x-folded": b"one two three",
        b"empty": b"",
        b"latin": b"caf\xe9",
    }
    assert rest == (b"body" if not bytewise else b"")


@both
def test_interim_responses_are_skipped(bytewise: bool) -> None:
    data = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.0 404\r\nX: y\r\n\r\n"  # no reason phrase, not even its space
    )
    head, _ = read_head(data, bytewise=bytewise)
    assert (head.status, head.reason, head.fields) == (404, b"", {b"x": b"y"})


@pytest.mark.parametrize(
    "line",
    [
        "HTTP/1.1 ²²² OK",  # Latin-1 superscript digits: str.isdigit() says yes, int() no
        "HTTP/1.1 ٢٠٠ OK",  # Arabic-Indic digits: int() would take them
        "HTTP/1.1 20 OK",
        "HTTP/1.1 2000 OK",
        "HTTP/2 200 OK",
        "HTTP/1.1 200 O\x00K",
        "HTTP/1.1 200 O\rK",
        "ICY 200 OK",
    ],
)
def test_a_status_line_is_read_with_an_ascii_grammar(line: str) -> None:
    with pytest.raises(DecodingError, match=r"the status line is not HTTP/1\.x"):
        read_head(line.encode("utf-8") + b"\r\n\r\n")


@pytest.mark.parametrize(
    "field",
    [b"No colon", b" X: folded first", b"X : space before the colon", b"X: a\x00b", b"X\x7f: v"],
)
def test_a_malformed_field_is_refused(field: bytes) -> None:
    with pytest.raises(DecodingError, match="a response header is malformed"):
        read_head(b"HTTP/1.1 200 OK\r\n" + field + b"\r\n\r\n")


def test_one_budget_for_the_heads_of_all_interim_responses() -> None:
    """Each interim head is small, together they are not: the budget does not start again."""
    interim = b"HTTP/1.1 103 Early Hints\r\nLink: " + b"l" * 8000 + b"\r\n\r\n"
    final = b"HTTP/1.1 200 OK\r\n\r\n"
    head, _ = read_head(interim * 7 + final)
    assert head.status == 200
    with pytest.raises(DecodingError, match=r"head exceeds 65536 bytes \(8 interim responses"):
        read_head(interim * 9 + final)


def test_the_number_of_interim_responses_is_bounded() -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    head, _ = read_head(interim * MAX_INTERIM + b"HTTP/1.1 200 OK\r\n\r\n")
    assert head.status == 200
    with pytest.raises(DecodingError, match=f"more than {MAX_INTERIM} interim .*100 b'Continue'"):
        read_head(interim * (MAX_INTERIM + 1) + b"HTTP/1.1 200 OK\r\n\r\n")


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 OK\r\nX: " + b"v" * MAX_HEAD_BYTES,  # one line that never ends
        b"HTTP/1.1 200 OK\r\n" + b"X: v\r\n" * (MAX_HEAD_BYTES // 6),
        b"\r\n" * MAX_HEAD_BYTES,  # empty lines before a status line that never comes
    ],
    ids=["long-line", "many-lines", "blank-lines"],
)
@both
def test_a_head_that_never_ends_is_refused_at_the_budget(data: bytes, bytewise: bool) -> None:
    reader = HeadReader()
    buf = bytearray()
    with pytest.raises(DecodingError, match="the response head exceeds 65536 bytes"):
        for piece in pieces(data, bytewise):
            buf += piece
            assert reader(buf) is None
    assert reader.received <= MAX_HEAD_BYTES


def test_what_an_early_close_of_the_head_means() -> None:
    reader = HeadReader()
    with pytest.raises(TransportError, match="closed the connection without answering"):
        reader.read_eof()
    for partial in (b"HTTP/1.1 2", b"HTTP/1.1 200 OK\r\nX: 1\r\n"):
        reader = HeadReader()
        assert reader(bytearray(partial)) is None
        with pytest.raises(TransportError, match="in the middle of the response head"):
            reader.read_eof()


# --- choosing the framing -----------------------------------------------------------------------


def head(status: int = 200, **fields: str) -> Head:
    """A head with ``fields`` (``content_length=`` for Content-Length), as a server would send
    them: Latin-1 where it can, else UTF-8."""

    def encode(value: str) -> bytes:
        return value.encode("latin-1" if max(map(ord, value), default=0) < 256 else "utf-8")

    return Head(status, b"", {k.replace("_", "-").encode(): encode(v) for k, v in fields.items()})


def test_the_framing_a_head_announces() -> None:
    assert isinstance(body_reader(head(transfer_encoding="chunked")), ChunkedReader)
    assert isinstance(body_reader(head(transfer_encoding="Identity, Chunked")), ChunkedReader)
    chunked = body_reader(head(transfer_encoding="chunked", content_length="5"))
    assert isinstance(chunked, ChunkedReader)  # chunked wins over a length (RFC 9112 6.3)
    assert isinstance(body_reader(head(content_length="5")), ContentLengthReader)
    assert isinstance(body_reader(head(content_length="5, 5")), ContentLengthReader)
    assert isinstance(body_reader(head()), UntilEOFReader)
    assert isinstance(body_reader(head(transfer_encoding="identity")), UntilEOFReader)
    assert isinstance(body_reader(head(204, content_length="5")), NoBodyReader)
    assert isinstance(body_reader(head(304)), NoBodyReader)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"content_length": "²"}, r"the Content-Length '²' is not one number"),
        ({"content_length": "١٢"}, "is not one number"),
        ({"content_length": "-1"}, "is not one number"),
        ({"content_length": "+5"}, "is not one number"),
        ({"content_length": "5_0"}, "is not one number"),
        ({"content_length": "3, 4"}, "is not one number"),
        ({"content_length": "1" * 20}, "is not one number"),
        ({"content_length": ""}, "is not one number"),
        (
            {"transfer_encoding": "gzip, chunked"},
            "transfer coding 'gzip, chunked' is not supported",
        ),
        ({"content_encoding": "br"}, "encoded with 'br' although the request asked for identity"),
    ],
)
def test_a_body_this_client_cannot_read_is_refused(fields: dict[str, str], match: str) -> None:
    with pytest.raises(DecodingError, match=match):
        body_reader(head(**fields))


def test_a_defect_is_raised_when_the_body_is_read() -> None:
    reader = NoBodyReader(defect="the defect")
    with pytest.raises(DecodingError, match="the defect"):
        reader(bytearray())


# --- the body readers ---------------------------------------------------------------------------


@both
def test_a_content_length_body(bytewise: bool) -> None:
    assert read_body(lambda: ContentLengthReader(5), b"hello", bytewise=bytewise) == b"hello"
    # what comes after the body is not the body (the connection closes after it)
    assert read_body(lambda: ContentLengthReader(3), b"abcdef", bytewise=bytewise) == b"abc"
    assert read_body(lambda: ContentLengthReader(0), b"", bytewise=bytewise) == b""


def test_a_content_length_body_cut_short() -> None:
    with pytest.raises(TransportError, match=r"middle of the body \(after 3 of the 10 bytes"):
        read_body(lambda: ContentLengthReader(10), b"abc", bytewise=False)


@both
def test_a_body_until_the_end_of_the_connection(bytewise: bool) -> None:
    assert read_body(UntilEOFReader, b"all of it", bytewise=bytewise) == b"all of it"


CHUNKED = (
    b"5\r\nhello\r\n"
    b'0006;name=value;quoted="a b"\r\n world\r\n'  # leading zeros, extensions
    b"A \t; spaced\r\n0123456789\n"  # BWS before the extension, a bare \n after the data
    b"1a\r\n" + b"z" * 26 + b"\r\n"
    b"0\r\nTrailer: ignored\r\nMore: too\r\n\r\n"
)


@both
def test_a_chunked_body(bytewise: bool) -> None:
    body = read_body(ChunkedReader, CHUNKED + b"after", bytewise=bytewise, eof=False)
    assert body == b"hello world0123456789" + b"z" * 26


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"zz\r\n", "chunk size of the response is malformed"),
        (b"0x1\r\nd\r\n", "malformed"),  # int(b"0x1", 16) would say 1
        (b"+1\r\nd\r\n", "malformed"),
        (b"1_0\r\n", "malformed"),
        (b"\xc2\xb2\r\nd\r\n", "malformed"),  # "²" in UTF-8
        (b"\xb2\r\nd\r\n", "malformed"),  # "²" in Latin-1
        (b" 1\r\nd\r\n", "malformed"),
        (b"\r\n", "malformed"),
        (b"1;ext\x00\r\nd\r\n", "malformed"),  # a control byte in an extension
        (b"1" + b"0" * 16 + b"\r\n", "chunk size of the response is too large"),
        (b"F" * 40 + b"\r\n", "too large"),
        (b"1;" + b"e" * MAX_CHUNK_LINE + b"\r\n", f"chunk-size line .* exceeds {MAX_CHUNK_LINE}"),
        (b"1\r\ndata\r\n", "a chunk of the response is longer than its size says"),
        (b"0\r\n" + b"T: v\r\n" * (MAX_HEAD_BYTES // 6 + 1), "trailers of the response exceed"),
    ],
)
@both
def test_a_malformed_chunked_body_is_refused(data: bytes, match: str, bytewise: bool) -> None:
    with pytest.raises(DecodingError, match=match):
        read_body(ChunkedReader, data, bytewise=bytewise, eof=False)


def test_leading_zeros_do_not_make_a_size_too_large() -> None:
    data = b"0" * 100 + b"3\r\nabc\r\n0\r\n\r\n"
    assert read_body(ChunkedReader, data, bytewise=False) == b"abc"


def test_the_number_of_chunks_is_bounded() -> None:
    data = b"1\r\nx\r\n" * 10 + b"0\r\n\r\n"
    assert read_body(lambda: ChunkedReader(max_chunks=11), data, bytewise=False) == b"x" * 10
    with pytest.raises(DecodingError, match="comes in more than 10 chunks"):
        read_body(lambda: ChunkedReader(max_chunks=10), data, bytewise=False)


@pytest.mark.parametrize(
    "data", [b"", b"5\r\nhel", b"5\r\nhello", b"5\r\nhello\r", b"5\r\nhello\r\n0\r\n"]
)
def test_a_chunked_body_cut_short(data: bytes) -> None:
    with pytest.raises(TransportError, match="never sent its last chunk"):
        read_body(ChunkedReader, data, bytewise=False)


def test_a_chunk_size_line_trickling_in_is_searched_once() -> None:
    """A reader that searched the whole buffer again at each byte would still be correct, so
    this looks at where the next search starts."""
    reader = ChunkedReader()
    buf = bytearray()
    for byte in b"1;" + b"e" * 1000:
        buf.append(byte)
        assert reader(buf) is None
        assert reader._searched == len(buf)
    buf += b"\r\nx\r\n0\r\n\r\n"
    assert reader(buf) == b"x"
