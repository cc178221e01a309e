"""The adapter's own HTTP/1.1 client: framing, bounds, TLS and proxies, on real loopback servers.

The first part drives ``zett_agent.models._http`` directly with byte-exact responses; the rest
goes through ``OpenAIChatModel`` and checks the errors a user (or the model) gets.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import cast

import pytest

from support.openai_chunks import HELLO, TEXT_STREAM, chunk, completed, raises
from support.openai_loopback import (
    TEST_CA,
    LoopbackServer,
    Reply,
    TunnelProxy,
    collect,
    served_in_thread,
    server_tls,
    sse,
)
from zett_agent.model import ModelError, ModelEvent, TransientModelError
from zett_agent.models import _http, _openai
from zett_agent.models._http import proxy_for
from zett_agent.models.openai import OpenAIChatModel

HANG_GUARD = 10.0
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"


async def lines_of(reply: Reply, limit: int = 2**20) -> tuple[int, list[str]]:
    """The status and body lines the client reads from one scripted response."""
    async with LoopbackServer([reply]) as server, asyncio.timeout(HANG_GUARD):
        response = await _http.post(
            server.url + "/chat/completions", b"{}", {}, io_timeout=HANG_GUARD
        )
        try:
            return response.status, [
                line async for lines in response.aiter_lines(limit, 2**26) for line in lines
            ]
        finally:
            await response.aclose()


async def body_of(reply: Reply, limit: int = 2**20) -> bytes:
    async with LoopbackServer([reply]) as server, asyncio.timeout(HANG_GUARD):
        response = await _http.post(server.url, b"{}", {}, io_timeout=HANG_GUARD)
        try:
            return await response.aread(limit)
        finally:
            await response.aclose()


@pytest.fixture
def test_ca(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trust the test CA: ``$SSL_CERT_FILE``, read when the process's context is next built."""
    monkeypatch.setenv("SSL_CERT_FILE", TEST_CA)
    monkeypatch.setattr(_http, "_context", None)


# --- framing ------------------------------------------------------------------------------------


async def test_chunked_body_split_anywhere_with_extensions_and_trailers() -> None:
    """Chunk boundaries inside a line, between \\r and \\n, and inside a UTF-8 character."""
    euro = "€".encode()
    body = [
        b'data: {"a"',
        b": 1}\r",
        b"\n\r\n: keep-alive\r\ndata: x" + euro[:1],
        euro[1:] + b"\n\ndata: last",
    ]
    raw = [SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"]
    for i, piece in enumerate(body):
        size = f"{len(piece):X}" if i % 2 else f"{len(piece):x}"
        raw.append(f'{size};ext="{i}"\r\n'.encode() + piece + b"\r\n")
    raw.append(b"0\r\nX-Trailer: ignored\r\n\r\n")
    status, lines = await lines_of(Reply(raw=raw))
    assert status == 200
    assert lines == ['data: {"a": 1}', "", ": keep-alive", "data: x€", "", "data: last"]


async def test_content_length_body_and_a_body_read_to_the_end_of_the_connection() -> None:
    text = b"data: one\rdata: two\r\n\ndata: three"
    framed = Reply(raw=[SSE_HEAD + f"Content-Length: {len(text)}\r\n\r\n".encode(), text])
    assert (await lines_of(framed))[1] == ["data: one", "data: two", "", "data: three"]
    unframed = Reply(raw=[SSE_HEAD + b"Connection: close\r\n\r\n", text[:7], text[7:]])
    assert (await lines_of(unframed))[1] == ["data: one", "data: two", "", "data: three"]


async def test_lines_split_byte_by_byte() -> None:
    """Every line ending (\\n, \\r\\n, \\r) still found when each chunk is one byte."""
    body = b"data: a\r\n\r\ndata: b\rdata: c\n\ndata: \xe2\x82\xac\r"
    raw = [SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"]
    raw += [b"1\r\n" + body[i : i + 1] + b"\r\n" for i in range(len(body))]
    raw.append(b"0\r\n\r\n")
    status, lines = await lines_of(Reply(raw=raw))
    assert (status, lines) == (200, ["data: a", "", "data: b", "data: c", "", "data: €"])


async def test_informational_responses_are_skipped_and_repeated_headers_joined() -> None:
    raw = [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 404 Not Found\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 2\r\n\r\nno",
    ]
    async with LoopbackServer([Reply(raw=raw)]) as server, asyncio.timeout(HANG_GUARD):
        response = await _http.post(server.url, b"{}", {}, io_timeout=HANG_GUARD)
        try:
            assert (response.status, response.reason) == (404, "Not Found")
            assert response.headers["x-a"] == "1, 2"
            assert await response.aread(100) == b"no"
        finally:
            await response.aclose()


async def test_aread_holds_at_most_its_limit() -> None:
    reply = Reply(raw=[b"HTTP/1.1 500 Oops\r\nContent-Length: 5000\r\n\r\n", b"x" * 5000])
    with pytest.raises(_http.DecodingError, match="exceeds 1000 bytes"):
        await body_of(reply, limit=1000)
    assert await body_of(reply, limit=5000) == b"x" * 5000


async def test_a_line_longer_than_the_limit_is_refused() -> None:
    reply = Reply(raw=[SSE_HEAD + b"Connection: close\r\n\r\n", b"data: " + b"y" * 300_000])
    with pytest.raises(_http.DecodingError, match="a line of the response exceeds 100000 bytes"):
        await lines_of(reply, limit=100_000)


async def test_the_request_head() -> None:
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)]) as server:
        await collect(OpenAIChatModel("m", base_url=server.url).stream(HELLO))
    [received] = server.requests
    assert received.headers["host"] == server.url.split("/")[2]
    assert received.headers["accept-encoding"] == "identity"
    assert received.headers["connection"] == "close"
    assert received.headers["user-agent"].startswith("zett-agent")
    sent = json.dumps(received.body, ensure_ascii=False).encode()  # the adapter's own encoding
    assert int(received.headers["content-length"]) == len(sent)


# --- broken and hostile servers, through the adapter --------------------------------------------


async def test_a_server_closing_mid_body_is_transient() -> None:
    cut = Reply(raw=[SSE_HEAD + b"Content-Length: 1000\r\n\r\n", sse(chunk({"content": "a"}))[0]])
    cut_chunk = Reply(
        raw=[SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n", b"400\r\n", b'data: {"cho']
    )
    async with LoopbackServer([cut, cut_chunk]) as server:
        model = OpenAIChatModel("m", base_url=server.url)
        for _ in range(2):
            error = await raises(model)
            assert isinstance(error, TransientModelError) and error.status is None
            assert f"could not talk to the model endpoint {model.url}" in str(error)
            assert "closed the connection in the middle of the body" in str(error)
            assert isinstance(error.__cause__, _http.TransportError)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ([b"HTTP/1.1 200 OK\r\n", b"X-Big: " + b"z" * 70_000 + b"\r\n\r\n"], "exceeds 65536"),
        ([b"HTTP/1.1 200 OK\r\n"] + [b"X-Many: %d\r\n" % i for i in range(9000)], "exceeds 65536"),
        ([b"ICY 200 OK\r\n\r\n"], "status line is not HTTP/1.x"),
        ([b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n"], "header is malformed"),
        ([SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"], "chunk size .* malformed"),
        ([SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n0x1\r\nd\r\n"], "malformed"),
        ([SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n1\r\ndata\r\n"], "longer than its size"),
        ([SSE_HEAD + b"Content-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc"], "gzip"),
        ([SSE_HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n"], "not supported"),
        ([SSE_HEAD + b"Content-Length: 3, 4\r\n\r\nabc"], "not one number"),
    ],
    ids=[
        "huge-header",
        "many-headers",
        "not-http",
        "no-colon",
        "chunk-size",
        "chunk-size-0x",
        "chunk-overrun",
        "gzip",
        "transfer-gzip",
        "two-lengths",
    ],
)
async def test_malformed_or_oversized_responses_are_model_errors(
    raw: list[bytes], match: str
) -> None:
    async with LoopbackServer([Reply(raw=raw)]) as server:
        model = OpenAIChatModel("m", base_url=server.url)
        error = await raises(model)
    assert type(error) is ModelError and not error.retryable
    assert f"the model endpoint {model.url} sent a response that could not be decoded" in str(error)
    assert isinstance(error.__cause__, _http.DecodingError)
    assert re.search(match, str(error)), str(error)  # names the bound or the defect


async def test_a_stream_line_over_the_bound_is_a_model_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_openai, "_MAX_LINE_BYTES", 4096)
    reply = Reply(chunks=sse(chunk({"content": "z" * 10_000})))
    async with LoopbackServer([reply]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url))
    assert type(error) is ModelError
    assert "could not be decoded: a line of the response exceeds 4096 bytes" in str(error)


async def test_an_event_that_never_ends_is_held_only_up_to_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Data lines with no blank line between them pile up in one event: the response's budget
    bounds them."""
    monkeypatch.setattr(_openai, "_MAX_RESPONSE_BYTES", 10_000)
    line = b"data: " + json.dumps(chunk({"content": "w" * 100})).encode() + b"\n"
    reply = Reply(chunks=[line] * 100, hold=True)
    async with LoopbackServer([reply]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url))
        await asyncio.wait_for(server.client_gone.wait(), HANG_GUARD)
    assert type(error) is ModelError and not error.retryable
    assert "could not be decoded: the response body exceeds 10000 bytes" in str(error)


async def test_an_oversized_error_body_keeps_the_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 503 stays a retryable 503 whatever its body; the body is not held past the bound."""
    monkeypatch.setattr(_openai, "_MAX_ERROR_BYTES", 1000)
    reply = Reply(status=503, chunks=[b"<html>" + b"x" * 5000], headers={})
    async with LoopbackServer([reply]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url))
    assert isinstance(error, TransientModelError) and error.status == 503
    assert "the error body was not read: the response body exceeds 1000 bytes" in str(error)


async def test_an_error_body_that_cannot_be_read_keeps_the_status() -> None:
    """A gzip error page (a misbehaving front server) or a bad length: still a retryable 503."""
    head = b"HTTP/1.1 503 Unavailable\r\n"
    gzip = head + b"Content-Encoding: gzip\r\nContent-Length: 3\r\n\r\n\x1f\x8b\x08"
    length = head + b"Content-Length: -1\r\n\r\n"
    async with LoopbackServer([Reply(raw=[gzip]), Reply(raw=[length])]) as server:
        model = OpenAIChatModel("m", base_url=server.url)
        errors = [await raises(model), await raises(model)]
    defects = ["encoded with 'gzip'", "'-1' is not one number"]
    for error, defect in zip(errors, defects, strict=True):
        assert isinstance(error, TransientModelError) and error.status == 503
        assert "(the error body was not read: the" in str(error) and defect in str(error)


async def test_a_server_that_never_answers_times_out_while_reading_the_head() -> None:
    async with LoopbackServer([Reply(raw=[], hold=True)]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url, timeout=0.2))
        await asyncio.wait_for(server.client_gone.wait(), HANG_GUARD)
    assert isinstance(error, TransientModelError)
    assert "did not answer within 0.2 s (ReadTimeout: the response head was not complete " in str(
        error
    )
    assert "(nothing of it arrived)" in str(error)


async def test_a_tls_handshake_that_never_completes_times_out_as_connecting(
    test_ca: None,
) -> None:
    """A server that accepts TCP but never answers the ClientHello: the connect timeout."""
    gone = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(1024):  # the ClientHello, then EOF when the client gives up
            pass
        gone.set()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        model = OpenAIChatModel("m", base_url=f"https://127.0.0.1:{port}/v1", timeout=0.2)
        error = await raises(model)
        await asyncio.wait_for(gone.wait(), HANG_GUARD)
    assert isinstance(error, TransientModelError) and error.status is None
    assert "did not answer within 0.2 s (ConnectTimeout: connecting (TCP, " in str(error)


async def test_a_refused_connection_is_transient() -> None:
    async with LoopbackServer([]) as server:
        url = server.url
    error = await raises(OpenAIChatModel("m", base_url=url))  # nothing listens there any more
    assert isinstance(error, TransientModelError)
    assert f"could not talk to the model endpoint {url}/chat/completions" in str(error)
    assert "ConnectionRefusedError" in str(error)


async def test_a_key_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url, api_key="sk-1\r\nX-Evil: 1"))
    assert type(error) is ModelError and not error.retryable
    assert "the Authorization header contains a line break" in str(error)
    assert server.requests == []


# --- TLS ----------------------------------------------------------------------------------------


async def test_https_with_a_ca_from_ssl_cert_file(test_ca: None) -> None:
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)], tls=server_tls()) as server:
        assert server.url.startswith("https://127.0.0.1:")
        model = OpenAIChatModel("m", base_url=server.url, api_key="sk-tls")
        events = await collect(model.stream(HELLO))
    assert completed(events).message.content == "Hello"
    assert server.requests[0].headers["authorization"] == "Bearer sk-tls"
    assert model._ssl() is _http.default_ssl_context()  # one context per process


async def test_https_to_a_server_the_ca_bundle_does_not_vouch_for_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setattr(_http, "_context", None)  # certifi's bundle, as in production
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)], tls=server_tls()) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url))
    assert isinstance(error, TransientModelError)
    assert "CERTIFICATE_VERIFY_FAILED" in str(error)
    assert server.requests == []


# --- proxies ------------------------------------------------------------------------------------


async def test_https_goes_through_a_connect_tunnel(
    test_ca: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        LoopbackServer([Reply(chunks=TEXT_STREAM)], tls=server_tls()) as server,
        TunnelProxy() as proxy,
    ):
        monkeypatch.setenv("HTTPS_PROXY", proxy.url.replace("http://", "http://us%40r:p%3Ass@"))
        events = await collect(OpenAIChatModel("m", base_url=server.url).stream(HELLO))
    assert completed(events).message.content == "Hello"
    authority = server.url.split("/")[2]
    [tunnel] = proxy.requests
    assert (tunnel.method, tunnel.target) == ("CONNECT", authority)
    assert tunnel.headers["host"] == authority
    # "us@r:p:ss", percent-decoded, in Basic form
    assert tunnel.headers["proxy-authorization"] == "Basic dXNAcjpwOnNz"
    [received] = server.requests  # the request itself went through the tunnel, inside TLS
    assert (received.method, received.path) == ("POST", "/v1/chat/completions")


async def test_a_stream_through_a_tunnel_can_be_closed_early(
    test_ca: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    reply = Reply(chunks=sse(chunk({"content": "first"}), done=False), hold=True)
    async with LoopbackServer([reply], tls=server_tls()) as server, TunnelProxy() as proxy:
        monkeypatch.setenv("https_proxy", proxy.url)
        model = OpenAIChatModel("m", base_url=server.url)
        stream = cast(AsyncGenerator[ModelEvent, None], model.stream(HELLO))
        first = await anext(stream)
        await stream.aclose()
        await asyncio.wait_for(server.client_gone.wait(), HANG_GUARD)
    assert first.text == "first"


async def test_http_goes_to_the_proxy_in_absolute_form(monkeypatch: pytest.MonkeyPatch) -> None:
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)]) as server, TunnelProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url.removeprefix("http://"))  # no scheme: http
        events = await collect(OpenAIChatModel("m", base_url=server.url).stream(HELLO))
    assert completed(events).message.content == "Hello"
    [forwarded] = proxy.requests
    assert (forwarded.method, forwarded.target) == ("POST", server.url + "/chat/completions")
    assert "proxy-authorization" not in forwarded.headers
    assert server.requests[0].path == "/v1/chat/completions"


async def test_no_proxy_connects_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)]) as server, TunnelProxy() as proxy:
        monkeypatch.setenv("ALL_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "example.com, 127.0.0.0/8")
        events = await collect(OpenAIChatModel("m", base_url=server.url).stream(HELLO))
    assert completed(events).message.content == "Hello"
    assert proxy.requests == []
    assert len(server.requests) == 1


async def test_a_proxy_that_refuses_the_tunnel_is_transient(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with TunnelProxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        error = await raises(OpenAIChatModel("m", base_url="https://models.example.com/v1"))
    assert isinstance(error, TransientModelError)
    assert "refused the tunnel to models.example.com:443: HTTP 403 Forbidden" in str(error)
    assert [(r.method, r.target) for r in proxy.requests] == [("CONNECT", "models.example.com:443")]


async def test_an_unsupported_proxy_is_a_clear_model_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALL_PROXY", "socks5://user:secret@127.0.0.1:1080")
    error = await raises(OpenAIChatModel("m", base_url="http://127.0.0.1:9/v1"))
    assert type(error) is ModelError and not error.retryable
    assert "the proxy 'socks5://127.0.0.1:1080' from $ALL_PROXY is not supported" in str(error)
    assert "list 127.0.0.1 in $NO_PROXY" in str(error)
    assert "secret" not in str(error)


def _proxy(url: str, **env: str) -> str | None:
    from urllib.parse import urlsplit

    found = proxy_for(urlsplit(url), env)
    return None if found is None else found.geturl()


def test_which_proxy_a_url_gets() -> None:
    p = "http://p:3128"
    assert _proxy("https://h.io/v1") is None
    assert _proxy("https://h.io/v1", HTTPS_PROXY=p, HTTP_PROXY="http://other") == p
    assert _proxy("http://h.io/v1", HTTPS_PROXY=p) is None
    assert _proxy("http://h.io/v1", ALL_PROXY=p) == p
    assert _proxy("https://h.io/v1", https_proxy=p, HTTPS_PROXY="http://upper") == p
    assert _proxy("https://h.io/v1", https_proxy="", HTTPS_PROXY="http://upper") is None
    assert _proxy("https://h.io/v1", https_proxy="", ALL_PROXY=p) == p
    assert _proxy("https://h.io/v1", HTTPS_PROXY="p:3128") == p
    # httpoxy: under CGI an upper-case HTTP_PROXY may come from a request header
    assert _proxy("http://h.io/v1", HTTP_PROXY=p, REQUEST_METHOD="GET") is None
    assert _proxy("http://h.io/v1", http_proxy=p, REQUEST_METHOD="GET") == p


@pytest.mark.parametrize(
    ("url", "no_proxy", "bypassed"),
    [
        ("https://h.io/v1", "*", True),
        ("https://h.io/v1", "h.io", True),
        ("https://api.h.io/v1", "h.io", True),
        ("https://api.h.io/v1", ".h.io", True),
        ("https://api.h.io/v1", "*.h.io", True),
        ("https://xh.io/v1", "h.io", False),
        ("https://h.io/v1", "other.io, H.IO ", True),
        ("https://h.io:8443/v1", "h.io:8443", True),
        ("https://h.io/v1", "h.io:8443", False),
        ("https://h.io/v1", "h.io:443", True),
        ("http://h.io/v1", "https://h.io", False),
        ("https://h.io/v1", "https://h.io", True),
        ("http://10.1.2.3:8000/v1", "10.0.0.0/8", True),
        ("http://11.1.2.3:8000/v1", "10.0.0.0/8", False),
        ("http://[::1]:8000/v1", "::1", True),
        ("http://[::1]:8000/v1", "[::1]:8000", True),
        ("http://[fd00::5]/v1", "fd00::/8", True),
        ("http://localhost:8000/v1", "localhost", True),
    ],
)
def test_no_proxy_forms(url: str, no_proxy: str, bypassed: bool) -> None:
    found = _proxy(url, ALL_PROXY="http://p:3128", NO_PROXY=no_proxy)
    assert (found is None) is bypassed


async def test_a_ca_bundle_that_cannot_be_loaded_is_a_model_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))
    monkeypatch.setattr(_http, "_context", None)
    error = await raises(OpenAIChatModel("m", base_url="https://127.0.0.1:9/v1"))
    assert type(error) is ModelError and not error.retryable
    missing = tmp_path / "missing.pem"
    assert f"$SSL_CERT_FILE ({missing}) could not be loaded" in str(error)


# --- a warm child -------------------------------------------------------------------------------

_WARM_CHILD = """
import asyncio, json, os, sys
import zett_agent.models._openai_preload  # what a launcher imports before it forks a child
from zett_agent.messages import UserMessage
from zett_agent.model import ModelRequest
from zett_agent.models.openai import OpenAIChatModel

async def main():
    model = OpenAIChatModel("m", base_url=sys.argv[1])
    before = set(sys.modules)
    events = [e async for e in model.stream(ModelRequest(messages=(UserMessage("hi"),)))]
    return {"content": events[-1].response.message.content,
            "imported": sorted(set(sys.modules) - before)}

print(json.dumps(asyncio.run(main())))
"""


def test_a_first_https_request_imports_nothing_the_preload_did_not() -> None:
    """A child forked after the preload pays no import at its first request, TLS included."""
    with served_in_thread([Reply(chunks=TEXT_STREAM)], tls=server_tls()) as server:
        child = subprocess.run(
            [sys.executable, "-c", _WARM_CHILD, server.url],
            env={**os.environ, "SSL_CERT_FILE": TEST_CA},
            capture_output=True,
            timeout=60,
            check=False,
        )
    assert child.returncode == 0, child.stderr.decode()
    assert json.loads(child.stdout) == {"content": "Hello", "imported": []}
    assert len(server.requests) == 1
