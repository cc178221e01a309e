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

Bounds, so a hostile or broken server cannot make a client hold much: the status line and
headers at most ``MAX_HEAD_BYTES``, a line of the body at most the ``limit`` given to
``aiter_lines``, a whole body at most the ``limit`` given to ``aread``; more is a
``DecodingError`` that says which bound was crossed.

Errors, each with one meaning (the cause is chained in ``__cause__``): ``HTTPTimeout``
(``ConnectTimeout``, ``WriteTimeout``, ``ReadTimeout``) when one step took longer than
``io_timeout``; ``TransportError`` when the connection could not be made, broke, or ended before the
response did (``OSError``, ``ssl.SSLError`` such as a certificate that does not verify, a proxy
that refused the tunnel); ``DecodingError`` when the response is not HTTP/1.x as this client
reads it; ``RequestError`` when the request cannot be sent as configured (a header value with a
line break, an unsupported proxy URL). Cancellation is never wrapped: the connection is closed
and ``CancelledError`` propagates.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import os
import ssl
from collections.abc import AsyncGenerator, Callable, Mapping
from urllib.parse import SplitResult, unquote, urlsplit

__all__ = [
    "MAX_HEAD_BYTES",
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

#: the status line and headers of a response (or of a proxy's answer to CONNECT), at most
MAX_HEAD_BYTES = 64 * 1024
#: bytes asked of the socket per read; also the most a body line may overrun its limit by
_PIECE = 64 * 1024
# Body framings.
_LENGTH, _CHUNKED, _EOF, _DONE = range(4)


class HTTPError(Exception):
    """Base of the errors of this module."""


class HTTPTimeout(HTTPError):
    """One step (connecting, sending, or one read of the response) took too long."""


class ConnectTimeout(HTTPTimeout):
    """Connecting (TCP, proxy tunnel, TLS handshake) took longer than ``io_timeout``."""


class WriteTimeout(HTTPTimeout):
    """Sending the request took longer than ``io_timeout``."""


class ReadTimeout(HTTPTimeout):
    """Nothing of the response arrived for ``io_timeout`` seconds."""


class TransportError(HTTPError):
    """The connection could not be made, broke, or ended before the response was complete."""


class DecodingError(HTTPError):
    """The response is not HTTP/1.x as this client reads it, or crossed one of its bounds."""


class RequestError(HTTPError):
    """The request cannot be sent as configured (the message says what to change)."""


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


def proxy_for(url: SplitResult, env: Mapping[str, str]) -> SplitResult | None:
    """The proxy a request to ``url`` goes through according to ``env``, or ``None``.

    ``{scheme}_proxy``, else ``all_proxy`` (lower case first; an upper-case ``HTTP_PROXY`` is
    ignored when ``REQUEST_METHOD`` is set, as in a CGI script, as urllib does), unless
    ``no_proxy`` names the host: ``*`` (every host), a host name (itself and its subdomains; a
    leading ``.`` or ``*.`` is ignored), an IP address or network (``10.0.0.0/8``), each
    optionally with ``:port`` or a ``scheme://`` prefix. A value without a scheme is an
    ``http://`` proxy.

    Raises ``RequestError`` for a proxy URL that is not ``http://host[:port]``.
    """
    scheme = url.scheme
    proxy = _env(env, f"{scheme}_proxy") or _env(env, "all_proxy")
    if not proxy or _bypassed(url, _env(env, "no_proxy") or ""):
        return None
    if "://" not in proxy:
        proxy = f"http://{proxy}"
    parsed = urlsplit(proxy)
    try:
        valid = parsed.scheme == "http" and bool(parsed.hostname) and parsed.port != 0
    except ValueError:  # a port that is not a number
        valid = False
    if not valid:
        where = "$ALL_PROXY" if not _env(env, f"{scheme}_proxy") else f"${scheme.upper()}_PROXY"
        shown = parsed._replace(netloc=parsed.netloc.rpartition("@")[2]).geturl()
        raise RequestError(
            f"the proxy {shown!r} from {where} is not supported: only http://host:port proxies "
            f"are (set {where} to one, or list {url.hostname} in $NO_PROXY to connect directly)"
        )
    return parsed


def _env(env: Mapping[str, str], name: str) -> str | None:
    if name in env:
        return env[name]  # lower case wins, even empty
    if name == "http_proxy" and "REQUEST_METHOD" in env:
        return None  # httpoxy: a CGI request's "Proxy:" header becomes HTTP_PROXY
    return env.get(name.upper())


def _bypassed(url: SplitResult, no_proxy: str) -> bool:
    host = (url.hostname or "").lower()
    port = url.port or (443 if url.scheme == "https" else 80)
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if entry == "*":
            return True
        if "://" in entry:
            scheme, _, entry = entry.partition("://")
            if scheme != url.scheme:
                continue
        entry = entry.rstrip("/")
        name, want = entry, None
        if entry.startswith("["):  # [v6] or [v6]:port
            name, _, rest = entry[1:].partition("]")
            want = rest[1:] or None
        elif entry.count(":") == 1:  # host:port (a bare IPv6 address has more colons)
            name, _, want = entry.partition(":")
        if not name or (want is not None and want != str(port)):
            continue
        if "/" in name:
            if _in_network(host, name):
                return True
            continue
        name = name.removeprefix("*").removeprefix(".")
        if host == name or host.endswith(f".{name}"):
            return True
    return False


def _in_network(host: str, network: str) -> bool:
    import ipaddress  # only for a NO_PROXY that names networks

    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(network, strict=False)
    except ValueError:
        return False


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
    tunnel and the TLS handshake together), sending, and each read. ``tls`` gives the SSL context
    for ``https://`` (called only then); ``env`` is where proxies are looked up (default
    ``os.environ``, read at each call). The caller must ``await response.aclose()``.

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
        lines += _proxy_authorization(proxy)
    for field, value in headers.items():
        if "\r" in value or "\n" in value:
            raise RequestError(f"the {field} header contains a line break; remove it")
        lines.append(f"{field}: {value}")
    lines += ["Accept-Encoding: identity", f"Content-Length: {len(content)}", "Connection: close"]
    head = "\r\n".join(lines)
    try:
        request = f"{head}\r\n\r\n".encode("ascii")
    except UnicodeEncodeError as exc:
        raise RequestError(f"a request header is not ASCII: {head[exc.start : exc.end]!r}") from exc

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
                    limit=MAX_HEAD_BYTES,
                )
            else:
                reader, writer = await asyncio.open_connection(
                    proxy.hostname, proxy.port or 80, limit=MAX_HEAD_BYTES
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
        status, reason, fields = await _read_head(reader, io_timeout)
        return Response(reader, writer, io_timeout, status, reason, fields)
    except BaseException as exc:
        if writer is not None:
            await _close(writer)
        if isinstance(exc, (OSError, EOFError, asyncio.LimitOverrunError)):
            raise _failure(exc, phase) from exc
        raise


def _proxy_authorization(proxy: SplitResult) -> list[str]:
    if proxy.username is None:
        return []
    secret = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode()
    return [f"Proxy-Authorization: Basic {binascii.b2a_base64(secret, newline=False).decode()}"]


async def _tunnel(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    proxy: SplitResult,
    authority: str,
    io_timeout: float,
) -> None:
    """``CONNECT`` through ``proxy`` to ``authority`` (``host:port``); ``TransportError`` if
    refused."""
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}", *_proxy_authorization(proxy)]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("ascii"))
    await writer.drain()
    status, reason, _ = await _read_head(reader, io_timeout)
    if not 200 <= status < 300:
        hint = " (check the credentials in the proxy URL)" if status == 407 else ""
        raise TransportError(
            f"the proxy {proxy.hostname}:{proxy.port or 80} refused the tunnel to {authority}: "
            f"HTTP {status} {reason}{hint}"
        )


async def _read_head(
    reader: asyncio.StreamReader, io_timeout: float
) -> tuple[int, str, dict[str, str]]:
    """The status, reason and headers (lower-case names, repeats joined with ``", "``) of the
    next final response; informational (1xx) responses are skipped."""
    while True:
        size = 0
        lines: list[bytes] = []
        while True:
            async with asyncio.timeout(io_timeout):
                line = await reader.readuntil(b"\n")
            size += len(line)
            if size > MAX_HEAD_BYTES:
                raise DecodingError(f"the response head exceeds {MAX_HEAD_BYTES} bytes")
            line = line.rstrip(b"\r\n")
            if line:
                lines.append(line)
            elif lines:
                break
        version, _, rest = lines[0].decode("latin-1").partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise DecodingError(f"the status line is not HTTP/1.x: {lines[0][:200]!r}")
        headers: dict[str, str] = {}
        name = ""
        for field in lines[1:]:
            text = field.decode("latin-1")
            if text[0] in " \t" and name:  # obsolete line folding: more of the last value
                headers[name] += " " + text.strip()
                continue
            name, colon, value = text.partition(":")
            if not colon or not name or name != name.strip():
                raise DecodingError(f"a response header is malformed: {field[:200]!r}")
            name = name.lower()
            value = value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        status = int(code)
        if not 100 <= status < 200 or status == 101:
            return status, reason.strip(), headers


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close the connection at once (no TLS close_notify: nothing more is owed either way)."""
    writer.transport.abort()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def _failure(exc: BaseException, phase: str) -> HTTPError:
    """The error of this module for a low-level failure ``exc`` during ``phase``."""
    if isinstance(exc, TimeoutError) and exc.errno is None:  # asyncio.timeout, not ETIMEDOUT
        kind = {"connect": ConnectTimeout, "write": WriteTimeout}.get(phase, ReadTimeout)
        return kind(f"{phase} timed out")
    if isinstance(exc, asyncio.IncompleteReadError):
        return TransportError("the server closed the connection before the response was complete")
    if isinstance(exc, asyncio.LimitOverrunError):
        return DecodingError(
            f"a header or chunk-size line of the response exceeds {MAX_HEAD_BYTES} bytes"
        )
    return TransportError(f"{type(exc).__name__}: {exc or 'connection failed'}")


class Response:
    """One response: its ``status``, ``reason`` and ``headers`` (lower-case names), and a body
    to read once with ``aiter_lines()`` or ``aread()``. ``aclose()`` closes the connection."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        io_timeout: float,
        status: int,
        reason: str,
        headers: dict[str, str],
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self._reader = reader
        self._writer: asyncio.StreamWriter | None = writer
        self._timeout = io_timeout
        self._left = 0  # bytes left of the body (_LENGTH) or of the current chunk (_CHUNKED)
        self._crlf_due = False  # a chunk's data was read, its CRLF not yet
        # A body this client cannot read is an error when the body is read, not before: the
        # status of an error response still counts (a 503 stays retryable whatever its body).
        self._defect: str | None = None
        try:
            self._framing = self._frame()
        except DecodingError as exc:
            self._defect, self._framing = str(exc), _DONE

    def __repr__(self) -> str:
        return f"<Response {self.status} {self.reason}{' closed' if self._writer is None else ''}>"

    def _frame(self) -> int:
        codings = self.headers.get("content-encoding", "identity").lower()
        if codings.replace("identity", "").strip(" ,"):
            raise DecodingError(
                f"the response is encoded with {codings!r} although the request asked for "
                "identity (Accept-Encoding: identity)"
            )
        if self.status in (204, 304):
            return _DONE
        transfer = self.headers.get("transfer-encoding")
        if transfer is not None:
            codings = transfer.lower().replace(" ", "").replace("identity", "").strip(",")
            if codings == "chunked":
                return _CHUNKED
            if codings:
                raise DecodingError(f"the transfer coding {transfer!r} is not supported")
            return _EOF
        length = self.headers.get("content-length")
        if length is None:
            return _EOF
        values = {v.strip() for v in length.split(",")}
        if len(values) != 1 or not (value := values.pop()).isdigit():
            raise DecodingError(f"the Content-Length {length!r} is not one number")
        self._left = int(value)
        return _LENGTH if self._left else _DONE

    async def aread(self, limit: int) -> bytes:
        """The whole (rest of the) body. Raises ``DecodingError`` past ``limit`` bytes, and the
        errors ``post`` lists for reading. Cancellation: propagates; the caller closes."""
        body = bytearray()
        try:
            while piece := await self._next_piece():
                body += piece
                if len(body) > limit:
                    raise DecodingError(f"the response body exceeds {limit} bytes")
        except (OSError, EOFError, asyncio.LimitOverrunError) as exc:
            raise _failure(exc, "read") from exc
        return bytes(body)

    async def aiter_lines(self, limit: int) -> AsyncGenerator[str, None]:
        """The body's lines as they arrive, without their ends (``\\n``, ``\\r\\n`` or ``\\r``),
        decoded as UTF-8 (undecodable bytes replaced). Raises ``DecodingError`` for a line longer
        than ``limit`` bytes (holding at most ``limit`` plus one read), and the errors ``post``
        lists for reading. Cancellation: propagates; the caller closes."""
        buffer = bytearray()
        try:
            while piece := await self._next_piece():
                # What is left of the buffer holds no line end but perhaps a last \r: search only
                # from there, so a long line arriving in tiny pieces costs linear time.
                start = max(len(buffer) - 1, 0)
                buffer += piece
                # A \r at the very end may be the first half of a \r\n: keep it for later.
                end = len(buffer) - 1
                cut = max(buffer.rfind(b"\n", start), buffer.rfind(b"\r", start, end)) + 1
                lines = buffer[:cut].splitlines()
                del buffer[:cut]
                if len(buffer) > limit or max(map(len, lines), default=0) > limit:
                    raise DecodingError(f"a line of the response exceeds {limit} bytes")
                for line in lines:
                    yield line.decode("utf-8", "replace")
        except (OSError, EOFError, asyncio.LimitOverrunError) as exc:
            raise _failure(exc, "read") from exc
        for line in buffer.splitlines():
            yield line.decode("utf-8", "replace")

    async def _next_piece(self) -> bytes:
        """The next piece of the body as framed, ``b""`` at its end."""
        if self._defect is not None:
            raise DecodingError(self._defect)
        framing = self._framing
        if framing == _CHUNKED and not self._left:
            if self._crlf_due and (await self._readline()).strip():
                raise DecodingError("a chunk of the response is longer than its size says")
            size = await self._readline()
            digits = size.partition(b";")[0].strip()
            if not digits or len(digits) > 16 or digits.strip(b"0123456789abcdefABCDEF"):
                raise DecodingError(f"a chunk size of the response is malformed: {size[:80]!r}")
            self._left = int(digits, 16)
            if not self._left:
                trailers = 0
                while (line := await self._readline()).strip():  # trailers: read, ignored
                    trailers += len(line)
                    if trailers > MAX_HEAD_BYTES:
                        raise DecodingError(f"the trailers exceed {MAX_HEAD_BYTES} bytes")
                self._framing = _DONE
                return b""
        elif framing == _DONE:
            return b""
        async with asyncio.timeout(self._timeout):
            piece = await self._reader.read(_PIECE if framing == _EOF else min(self._left, _PIECE))
        if framing == _EOF:
            if not piece:
                self._framing = _DONE
            return piece
        if not piece:
            raise TransportError("the server closed the connection in the middle of the body")
        self._left -= len(piece)
        self._crlf_due = framing == _CHUNKED
        if framing == _LENGTH and not self._left:
            self._framing = _DONE
        return piece

    async def _readline(self) -> bytes:
        async with asyncio.timeout(self._timeout):
            return await self._reader.readuntil(b"\n")

    async def aclose(self) -> None:
        """Close the connection at once (the server sees the client go away). Idempotent.

        Cancellation: the connection is closed before the wait for it to finish closing, which
        a cancellation may cut short.
        """
        if self._writer is not None:
            writer, self._writer = self._writer, None
            await _close(writer)
