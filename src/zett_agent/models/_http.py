"""A small HTTP/1.1 client on asyncio streams: one POST per connection, for ``OpenAIChatModel``.

Why not httpx: a child agent runs in a forked process that shares the launcher's memory until it
writes to it, and CPython writes to the pages of every function it runs (reference counts,
adaptive bytecode). A request through httpx runs about 280 functions of httpx, httpcore, h11 and
anyio, which cost each child about 4 MiB of its own memory; this module runs a few dozen.

What it does, and no more:

- ``post(url, content, headers, io_timeout=...)`` opens one connection (``http://`` or ``https://``,
  certificates verified with ``default_ssl_context()``), sends one ``POST`` with
  ``Content-Length``, ``Accept-Encoding: identity`` and ``Connection: close``, and returns the
  ``Response`` once its status line and headers are read. Redirects are not followed.
- ``Response.aiter_lines()`` and ``Response.aread()`` read the body, framed by
  ``Content-Length``, chunked transfer coding, or the end of the connection.
- ``Response.aclose()`` closes the connection; every response must be closed (``post`` closes
  its connection itself when it raises).
- Proxies are taken from the environment as httpx's ``trust_env=True`` and urllib do
  (``proxy_for``): ``https_proxy``/``HTTPS_PROXY``, ``http_proxy``/``HTTP_PROXY``,
  ``all_proxy``/``ALL_PROXY`` (lower case wins, an empty lower-case variable means none), and
  ``no_proxy``/``NO_PROXY``. Only ``http://`` proxies are supported: ``https://`` targets go
  through a ``CONNECT`` tunnel and then TLS with the target, ``http://`` targets are sent to the
  proxy in absolute form. Credentials in the proxy URL are sent as ``Proxy-Authorization: Basic``.

The framing itself (the head, Content-Length, chunked, until the end of the connection) is
``zett_agent.models._http_readers``, which does no I/O; this module moves bytes between the
socket and those readers.

Bounds, so a hostile or broken server cannot make a client hold much, spin, or stall its event
loop: the status lines and headers of a response, interim (1xx) responses included, at most
``MAX_HEAD_BYTES`` and ``MAX_INTERIM`` interim responses, all within ``io_timeout`` of the
request being sent; a whole body as received (chunk framing included) at most the ``limit``
given to ``aread`` or ``aiter_lines``, a line of it at most ``line_limit``, a chunked body at
most ``MAX_CHUNKS`` chunks; more is a ``DecodingError`` that says which bound was crossed.
Reading yields to the event loop after every ``_PACE`` units of work (a byte received is one, a
chunk or a line handed out ``_PIECE_WORK`` or ``_LINE_WORK``), so a flood of tiny lines or
chunks that arrived at once is read in slices of a millisecond or so.

Errors, each with one meaning (the cause is chained in ``__cause__``): ``HTTPTimeout``
(``ConnectTimeout``, ``WriteTimeout``, ``ReadTimeout``) when one step took longer than
``io_timeout``; ``TransportError`` when the connection could not be made, broke, or ended before the
response did (``OSError``, ``ssl.SSLError`` such as a certificate that does not verify, a proxy
that refused the tunnel); ``DecodingError`` when the response is not HTTP/1.x as this client
reads it; ``RequestError`` when the request cannot be sent as configured (a header value with a
line break, an unsupported proxy URL). Nothing else escapes a call of this module but
``CancelledError``, which is never wrapped: the connection is closed and it propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncGenerator, Callable, Mapping
from urllib.parse import SplitResult, urlsplit

from zett_agent.models._http_proxy import proxy_authorization, proxy_for
from zett_agent.models._http_readers import (
    MAX_HEAD_BYTES,
    MAX_INTERIM,
    BodyReader,
    ConnectTimeout,
    DecodingError,
    Head,
    HeadReader,
    HTTPError,
    HTTPTimeout,
    NoBodyReader,
    ReadTimeout,
    RequestError,
    TransportError,
    WriteTimeout,
    body_reader,
)

__all__ = [
    "MAX_HEAD_BYTES",
    "MAX_INTERIM",
    "ConnectTimeout",
    "DecodingError",
    "HTTPError",
    "HTTPTimeout",
    "ReadTimeout",
    "RequestError",
    "Response",
    "TransportError",
    "WriteTimeout",
    "default_ssl_context",
    "post",
    "proxy_for",
]

#: bytes asked of the socket per read; also the most a body line may overrun its limit by
_PIECE = 16 * 1024
#: what a connection's stream buffers (it stops reading the socket past twice that)
_BUFFERED = 64 * 1024
#: units of work between two yields to the event loop while reading (see the docstring)
_PACE = 32 * 1024
_LINE_WORK = 128
_PIECE_WORK = 128  # a chunk of a chunked body
#: lines ``aiter_lines`` hands out at once, at most
_BATCH = 128

_context: ssl.SSLContext | None = None


def default_ssl_context() -> ssl.SSLContext:
    """The process's one verifying SSL context, built on first use (tens of milliseconds).

    The CA bundle is ``$SSL_CERT_FILE`` if set, else ``$SSL_CERT_DIR`` if set, else certifi's,
    as httpx did; the variables are read once, when the context is built (in a process pool's
    launcher when ``zett_agent.models._openai_preload`` is preloaded there, so children share
    it). Raises ``OSError`` naming the bundle when it cannot be loaded.
    """
    global _context
    if _context is None:
        if cafile := os.environ.get("SSL_CERT_FILE"):
            where, capath = f"$SSL_CERT_FILE ({cafile})", None
        elif capath := os.environ.get("SSL_CERT_DIR"):
            where, cafile = f"$SSL_CERT_DIR ({capath})", None
        else:
            import certifi

            cafile, capath = certifi.where(), None
            where = f"certifi's CA bundle ({cafile})"
        try:
            context = ssl.create_default_context(cafile=cafile, capath=capath)
        except OSError as exc:  # ssl.SSLError too
            raise OSError(f"{where} could not be loaded: {exc}") from exc
        context.set_alpn_protocols(["http/1.1"])
        _context = context
    return _context


async def post(
    url: str,
    content: bytes,
    headers: Mapping[str, str],
    *,
    io_timeout: float,
    tls: Callable[[], ssl.SSLContext] = default_ssl_context,
    env: Mapping[str, str] | None = None,
) -> Response:
    """Send ``POST url`` with ``content`` on a new connection; the response, its head read.

    ``headers`` are sent as given, then ``Host``, ``Accept-Encoding: identity``,
    ``Content-Length`` and ``Connection: close``. ``io_timeout`` bounds connecting (TCP, the proxy
    tunnel and the TLS handshake together), sending, the whole response head (interim responses
    included), and each read of the body. ``tls`` gives the SSL context for ``https://`` (called
    only then); ``env`` is where proxies are looked up (default ``os.environ``, read at each
    call). The caller must ``await response.aclose()``.

    Raises ``RequestError`` (nothing was sent: a header value with a line break or not ASCII, an
    unsupported proxy URL, a CA bundle that cannot be loaded), ``ConnectTimeout``, ``WriteTimeout``,
    ``ReadTimeout``, ``TransportError`` or ``DecodingError``; the connection is closed first.

    Cancellation: the connection is closed (aborted) before ``CancelledError`` propagates.
    """
    target = urlsplit(url)
    https = target.scheme == "https"
    try:
        host, port = target.hostname, target.port or (443 if https else 80)
    except ValueError as exc:
        raise RequestError(f"the URL {url!r} has an invalid port: {exc}") from exc
    if not host or target.scheme not in ("http", "https"):
        raise RequestError(f"the URL {url!r} is not an http:// or https:// URL with a host")
    proxy = proxy_for(target, os.environ if env is None else env)
    name = f"[{host}]" if ":" in host else host
    authority = name if target.port is None else f"{name}:{port}"
    path = target.path or "/"
    if target.query:
        path = f"{path}?{target.query}"
    lines = [f"POST {path} HTTP/1.1", f"Host: {authority}"]
    if proxy is not None and not https:  # absolute form, to the proxy itself
        lines[0] = f"POST http://{authority}{path} HTTP/1.1"
        lines += proxy_authorization(proxy)
    for field, value in headers.items():
        if "\r" in value or "\n" in value:
            raise RequestError(f"the {field} header contains a line break; remove it")
        lines.append(f"{field}: {value}")
    lines += ["Accept-Encoding: identity", f"Content-Length: {len(content)}", "Connection: close"]
    text = "\r\n".join(lines)
    try:
        request = f"{text}\r\n\r\n".encode("ascii")
    except UnicodeEncodeError as exc:
        raise RequestError(f"a request header is not ASCII: {text[exc.start : exc.end]!r}") from exc

    try:
        context = tls() if https else None
    except OSError as exc:  # $SSL_CERT_FILE names a missing or unreadable bundle
        raise RequestError(f"cannot verify https:// servers: {exc}") from exc

    writer: asyncio.StreamWriter | None = None
    phase = "connect"
    try:
        async with asyncio.timeout(io_timeout):
            if proxy is None:
                reader, writer = await asyncio.open_connection(
                    host,
                    port,
                    ssl=context,
                    server_hostname=host if https else None,
                    limit=_BUFFERED,
                )
            else:
                reader, writer = await asyncio.open_connection(
                    proxy.hostname, proxy.port or 80, limit=_BUFFERED
                )
                if context is not None:
                    await _tunnel(reader, writer, proxy, f"{name}:{port}", io_timeout)
                    await writer.start_tls(context, server_hostname=host)
        phase = "write"
        writer.write(request)
        writer.write(content)
        async with asyncio.timeout(io_timeout):
            await writer.drain()
        phase = "read"
        buffer = bytearray()
        head = await _read_head(reader, buffer, io_timeout)
        return Response(reader, writer, io_timeout, head, buffer)
    except BaseException as exc:
        if writer is not None:
            await _close(writer)
        if isinstance(exc, OSError):
            raise _failure(exc, phase) from exc
        if isinstance(exc, UnicodeError) and phase == "connect":  # the idna codec refused it
            raise RequestError(f"the host name {host!r} is not valid: {exc}") from exc
        raise


async def _tunnel(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    proxy: SplitResult,
    authority: str,
    io_timeout: float,
) -> None:
    """``CONNECT`` through ``proxy`` to ``authority`` (``host:port``).

    ``TransportError`` if refused.
    """
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}", *proxy_authorization(proxy)]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("ascii"))
    await writer.drain()
    buffer = bytearray()
    head = await _read_head(reader, buffer, io_timeout)
    where = f"the proxy {proxy.hostname}:{proxy.port or 80}"
    if not 200 <= head.status < 300:
        hint = " (check the credentials in the proxy URL)" if head.status == 407 else ""
        reason = head.reason.decode("latin-1")
        raise TransportError(
            f"{where} refused the tunnel to {authority}: HTTP {head.status} {reason}{hint}"
        )
    if buffer:  # the target has not spoken yet: these bytes are the proxy's, and not HTTP
        raise DecodingError(f"{where} sent {bytes(buffer[:80])!r} after accepting the tunnel")


async def _read_head(reader: asyncio.StreamReader, buffer: bytearray, io_timeout: float) -> Head:
    """The head of the next final response (interim ones skipped), read into ``buffer``.

    What came after it stays there. The whole head, interim responses included, has ``io_timeout``
    seconds: a server trickling it byte by byte gets no longer.
    """
    parse = HeadReader()
    try:
        async with asyncio.timeout(io_timeout):
            while (head := parse(buffer)) is None:
                piece = await reader.read(_PIECE)
                if not piece:
                    parse.read_eof()
                buffer += piece
    except TimeoutError as exc:
        if exc.errno is not None:  # ETIMEDOUT from the socket
            raise
        got = parse.received + len(buffer)
        what = f"only {got} bytes of it arrived" if got else "nothing of it arrived"
        if parse.interim:
            what += f", after {parse.interim} interim responses"
        raise ReadTimeout(
            f"the response head was not complete within {io_timeout:g} s ({what})"
        ) from exc
    return head


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close the connection at once (no TLS close_notify: nothing more is owed either way)."""
    writer.transport.abort()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def _failure(exc: BaseException, phase: str) -> HTTPError:
    """The error of this module for a low-level failure ``exc`` during ``phase``."""
    if isinstance(exc, TimeoutError) and exc.errno is None:  # asyncio.timeout, not ETIMEDOUT
        if phase == "connect":
            return ConnectTimeout("connecting (TCP, a proxy tunnel, TLS) took too long")
        if phase == "write":
            return WriteTimeout("sending the request took too long")
        return ReadTimeout("reading the response took too long")
    return TransportError(f"{type(exc).__name__}: {exc or 'connection failed'}")


def _split(buffer: bytearray, cut: int, line_limit: int) -> list[str]:
    """The lines of ``buffer[:cut]``, which ends with a line end (or is the last line).

    Raises ``DecodingError`` for one longer than ``line_limit`` bytes.
    """
    region = buffer[:cut]
    if cut > line_limit and max(map(len, region.splitlines())) > line_limit:
        raise DecodingError(f"a line of the response exceeds {line_limit} bytes")
    if b"\r" in region:
        return [line.decode("utf-8", "replace") for line in region.splitlines()]
    # The common case, \n alone, split at C speed. No UTF-8 sequence holds a \n byte, so
    # decoding the lines together is decoding them one by one.
    lines = region.decode("utf-8", "replace").split("\n")
    if not lines[-1]:
        lines.pop()
    return lines


class Response:
    """One response.

    Its ``status``, ``reason`` and ``headers`` (lower-case names, values decoded as Latin-1), and a
    body to read once with ``aiter_lines()`` or ``aread()``. ``aclose()`` closes the connection.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        io_timeout: float,
        head: Head,
        buffer: bytearray,
    ) -> None:
        self.status = head.status
        self.reason = head.reason.decode("latin-1")
        self.headers = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in head.fields.items()
        }
        self._reader = reader
        self._writer: asyncio.StreamWriter | None = writer
        self._timeout = io_timeout
        self._buffer = buffer  # received, not yet framed
        self._received = len(buffer)  # bytes of the body received so far, framing included
        self._work = 0  # since the last yield to the event loop
        self._eof = False
        # A body this client cannot read is an error when the body is read, not before: the
        # status of an error response still counts (a 503 stays retryable whatever its body).
        self._body: BodyReader
        try:
            self._body = body_reader(head)
        except DecodingError as exc:
            self._body = NoBodyReader(defect=str(exc))

    def __repr__(self) -> str:
        return f"<Response {self.status} {self.reason}{' closed' if self._writer is None else ''}>"

    async def aread(self, limit: int) -> bytes:
        """The whole (rest of the) body.

        Raises ``DecodingError`` once more than ``limit`` bytes of it were received (chunk framing
        counts), and the errors ``post`` lists for reading. Cancellation: propagates; the caller
        closes.
        """
        body = bytearray()
        try:
            while piece := await self._next_piece(limit):
                body += piece
        except OSError as exc:
            raise _failure(exc, "read") from exc
        return bytes(body)

    async def aiter_lines(self, line_limit: int, limit: int) -> AsyncGenerator[list[str], None]:
        r"""Yield the body's lines as they arrive.

        The body's lines as they arrive, in lists of at most ``_BATCH`` (the lines one read
        completed), without their ends (``\\n``, ``\\r\\n`` or ``\\r``), decoded as UTF-8
        (undecodable bytes replaced).

        Raises ``DecodingError`` for a line longer than ``line_limit`` bytes (holding at most
        that plus one read), once more than ``limit`` bytes of the body were received (every
        byte counts: comments, blank lines, chunk framing), and the errors ``post`` lists for
        reading. Cancellation: propagates; the caller closes.
        """
        buffer = bytearray()
        try:
            while piece := await self._next_piece(limit):
                # What is left of the buffer holds no line end but perhaps a last \r: search only
                # from there, so a long line arriving in tiny pieces costs linear time.
                start = max(len(buffer) - 1, 0)
                buffer += piece
                # A \r at the very end may be the first half of a \r\n: keep it for later.
                end = len(buffer) - 1
                cut = max(buffer.rfind(b"\n", start), buffer.rfind(b"\r", start, end)) + 1
                if cut:
                    lines = _split(buffer, cut, line_limit)
                    del buffer[:cut]
                if len(buffer) > line_limit:
                    raise DecodingError(f"a line of the response exceeds {line_limit} bytes")
                if not cut:
                    continue
                for first in range(0, len(lines), _BATCH):
                    batch = lines[first : first + _BATCH]
                    yield batch
                    self._work += _LINE_WORK * len(batch)
                    if self._work >= _PACE:
                        await self._yield()
        except OSError as exc:
            raise _failure(exc, "read") from exc
        if buffer:
            yield _split(buffer, len(buffer), line_limit)

    async def _next_piece(self, limit: int) -> bytes:
        """What the body holds of the bytes received by one read (``b""`` at its end)."""
        if self._received > limit:  # what came with the head may be more than the limit already
            raise DecodingError(f"the response body exceeds {limit} bytes")
        body = self._body
        pieces: list[bytes] = []
        while True:
            data = body(self._buffer)
            if data is None:
                if pieces:
                    break
                await self._receive(limit)
            elif data:
                pieces.append(data)
                if len(pieces) == _BATCH:  # tiny chunks: the rest waits for the next call
                    break
            else:
                break
        if len(pieces) == 1:
            return pieces[0]
        self._work += _PIECE_WORK * len(pieces)
        if self._work >= _PACE:
            await self._yield()
        return b"".join(pieces)

    async def _receive(self, limit: int) -> None:
        """One read from the socket into the buffer.

        At the end of the connection, what the framing makes of it (``read_eof``).
        """
        try:
            async with asyncio.timeout(self._timeout):
                piece = await self._reader.read(_PIECE)
        except TimeoutError as exc:
            if exc.errno is not None:
                raise
            raise ReadTimeout(
                f"nothing of the response body arrived for {self._timeout:g} s"
            ) from exc
        if not piece:
            if self._eof:  # the framing took the end of the connection but wants more
                raise TransportError("the server closed the connection in the middle of the body")
            self._eof = True
            self._body.read_eof()
            return
        self._buffer += piece
        self._received += len(piece)
        if self._received > limit:
            raise DecodingError(f"the response body exceeds {limit} bytes")
        self._work += len(piece)
        if self._work >= _PACE:
            await self._yield()

    async def _yield(self) -> None:
        """Let the event loop run what is ready.

        A flood that arrived at once is read in bounded slices.
        """
        self._work = 0
        await asyncio.sleep(0)

    async def aclose(self) -> None:
        """Close the connection at once (the server sees the client go away). Idempotent.

        Cancellation: the connection is closed before the wait for it to finish closing, which
        a cancellation may cut short.
        """
        if self._writer is not None:
            writer, self._writer = self._writer, None
            await _close(writer)
