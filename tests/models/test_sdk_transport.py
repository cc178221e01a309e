"""The adapters' HTTP through their SDK: TLS, proxies, connections that fail, in loopback.

What the project still decides about the transport the SDK's HTTP library gives it: which CA
bundle verifies, that a silent peer or a TLS handshake that never completes ends within the
timeout, that proxies come from the environment, that a failure is a ``TransientModelError``
naming it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import cast

import pytest

from support.openai_chunks import HELLO, TEXT_STREAM, chunk, completed, raises
from support.openai_loopback import (
    TEST_CA,
    LoopbackServer,
    Reply,
    TunnelProxy,
    collect,
    server_tls,
    sse,
)
from zett_agent.model import ModelError, ModelEvent, TransientModelError
from zett_agent.models import _sdk_http
from zett_agent.models.openai import OpenAIChatModel

HANG_GUARD = 10.0


@pytest.fixture
def test_ca(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trust the test CA: ``$SSL_CERT_FILE``, read when the process's context is next built."""
    monkeypatch.setenv("SSL_CERT_FILE", TEST_CA)
    monkeypatch.setattr(_sdk_http, "_context", None)


async def test_https_with_a_ca_from_ssl_cert_file(test_ca: None) -> None:
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)], tls=server_tls()) as server:
        assert server.url.startswith("https://127.0.0.1:")
        model = OpenAIChatModel("m", base_url=server.url, api_key="sk-tls")
        events = await collect(model.stream(HELLO))
    assert completed(events).message.content == "Hello"
    assert server.requests[0].headers["authorization"] == "Bearer sk-tls"
    assert _sdk_http.tls_context() is _sdk_http.tls_context()  # one context per process


async def test_https_to_a_server_the_ca_bundle_does_not_vouch_for_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setattr(_sdk_http, "_context", None)  # certifi's bundle, as in production
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)], tls=server_tls()) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url))
    assert isinstance(error, TransientModelError)
    assert "CERTIFICATE_VERIFY_FAILED" in str(error)
    assert server.requests == []


async def test_a_ca_bundle_that_cannot_be_loaded_is_a_model_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", "/nonexistent/ca.pem")
    monkeypatch.setattr(_sdk_http, "_context", None)
    error = await raises(OpenAIChatModel("m", base_url="https://127.0.0.1:9/v1"))
    assert type(error) is ModelError
    assert "$SSL_CERT_FILE (/nonexistent/ca.pem) could not be loaded" in str(error)


async def test_a_tls_handshake_that_never_completes_times_out(test_ca: None) -> None:
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
        async with asyncio.timeout(HANG_GUARD):
            error = await raises(model)
        await asyncio.wait_for(gone.wait(), HANG_GUARD)
    assert isinstance(error, TransientModelError) and error.status is None
    assert "did not answer within 0.2 s" in str(error)


async def test_a_server_that_never_answers_times_out() -> None:
    async with LoopbackServer([Reply(raw=[], hold=True)]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url, timeout=0.2))
        await asyncio.wait_for(server.client_gone.wait(), HANG_GUARD)
    assert isinstance(error, TransientModelError) and error.status is None
    assert "did not answer within 0.2 s" in str(error)


async def test_a_refused_connection_is_transient() -> None:
    async with LoopbackServer([]) as server:
        url = server.url
    error = await raises(OpenAIChatModel("m", base_url=url))  # nothing listens there any more
    assert isinstance(error, TransientModelError)
    assert f"could not talk to the model endpoint {url}/chat/completions" in str(error)
    assert "ConnectError" in str(error)


async def test_a_key_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url, api_key="sk-1\r\nX-Evil: 1"))
    assert type(error) is ModelError and not error.retryable
    assert "the API key in api_key= holds a line break" in str(error)
    assert "sk-1" not in str(error)
    assert server.requests == []


async def test_https_goes_through_a_connect_tunnel(
    test_ca: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        LoopbackServer([Reply(chunks=TEXT_STREAM)], tls=server_tls()) as server,
        TunnelProxy() as proxy,
    ):
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        events = await collect(OpenAIChatModel("m", base_url=server.url).stream(HELLO))
    assert completed(events).message.content == "Hello"
    authority = server.url.split("/")[2]
    [tunnel] = proxy.requests
    assert (tunnel.method, tunnel.target) == ("CONNECT", authority)
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


async def test_http_goes_to_the_proxy_and_no_proxy_connects_directly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replies = [Reply(chunks=TEXT_STREAM), Reply(chunks=TEXT_STREAM)]
    async with LoopbackServer(replies) as server, TunnelProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        events = await collect(OpenAIChatModel("m", base_url=server.url).stream(HELLO))
        assert [r.method for r in proxy.requests] == ["POST"]
        monkeypatch.setenv("NO_PROXY", "example.com, 127.0.0.1")
        again = await collect(OpenAIChatModel("m", base_url=server.url).stream(HELLO))
    assert completed(events).message.content == completed(again).message.content == "Hello"
    assert len(proxy.requests) == 1
    assert [r.path for r in server.requests] == ["/v1/chat/completions"] * 2


# -- what the connections promise whatever carries them -------------------------------------------


async def test_bytes_a_server_sends_before_the_tls_handshake_are_never_parsed(
    test_ca: None,
) -> None:
    """What arrives before TLS is no part of what TLS protects: refused, never an answer."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 0\r\n\r\n"
    sent, gone = asyncio.Event(), asyncio.Event()

    async def early(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(answer)  # at once, in plain text, before a ClientHello is answered
            await writer.drain()
            sent.set()
            while await reader.read(1024):  # until the client gives up (or resets)
                pass
        except OSError:
            pass
        finally:
            writer.close()
            gone.set()

    server = await asyncio.start_server(early, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        model = OpenAIChatModel("m", base_url=f"https://127.0.0.1:{port}/v1", timeout=5.0)
        async with asyncio.timeout(HANG_GUARD):
            error = await raises(model)
            await gone.wait()  # the client closed its side
    assert sent.is_set()
    assert isinstance(error, TransientModelError) and error.status is None
    assert "could not talk to the model endpoint" in str(error)


async def test_an_idle_connection_the_server_closed_is_not_used_again() -> None:
    """A kept-alive connection the server has closed since is dropped, not sent the next call."""
    served: list[int] = []  # the connection (by number) each request came on
    connections = 0
    closed = asyncio.Event()  # the server closed the connection it last answered on
    body = b"".join(sse(chunk({"role": "assistant", "content": "Hello"}), chunk({}, "stop")))

    async def keep_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        number = connections
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        await reader.readexactly(length)
        served.append(number)
        writer.write(  # kept alive, as far as the client knows
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()  # then closed while the client holds it idle
        await writer.wait_closed()
        closed.set()

    server = await asyncio.start_server(keep_then_close, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        model = OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1", timeout=5.0)
        try:
            for _ in range(3):
                closed.clear()
                events = await asyncio.wait_for(collect(model.stream(HELLO)), HANG_GUARD)
                assert completed(events).message.content == "Hello"
                # the server's close reached the client's socket (on loopback, as it was sent)
                await asyncio.wait_for(closed.wait(), HANG_GUARD)
        finally:
            await model.aclose()
    assert served == [1, 2, 3]  # each call on a new connection, none lost on a dead one


async def test_a_large_body_streams_whole() -> None:
    """A body of a megabyte, read a piece at a time in turns, comes whole and in order."""
    text = "x" * 1000
    pieces = 1024
    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": text}) for _ in range(pieces)] + [chunk({}, "stop")]
    async with LoopbackServer([Reply(chunks=[b"".join(sse(*chunks))])]) as server:
        model = OpenAIChatModel("m", base_url=server.url, timeout=5.0)
        events = await asyncio.wait_for(collect(model.stream(HELLO)), HANG_GUARD)
    assert completed(events).message.content == text * pieces
