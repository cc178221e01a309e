"""OpenAIChatModel against a hostile model server on loopback: every bound, every defect.

A hostile (or broken) server may send anything: protocol numbers in other scripts, interim
responses without end, heads and bodies that never end, floods of tiny chunks, blank lines and
keep-alives, answers of any size, JSON built to be expensive, text that is not valid Unicode.
Each test names what the server does and checks that the adapter ends it with a
``ModelError`` saying what the server did wrong (``TransientModelError`` when retrying may help),
that the connection is closed, and that nothing it yields or holds crossed a bound.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from support.openai_chunks import HELLO, TEXT_STREAM, chunk, completed, raises
from support.openai_loopback import LoopbackServer, Reply, collect, json_reply, sse
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from zett_agent.model import ModelError, ModelEvent, ModelRequest, ToolSpec, TransientModelError
from zett_agent.models import _http, _http_readers, _openai, _openai_wire
from zett_agent.models.openai import OpenAIChatModel

HANG_GUARD = 10.0
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
CHUNKED_HEAD = SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"


async def fails(reply: Reply, **model: Any) -> ModelError:
    """The error one stream against ``reply`` ends with; the server saw the client go away."""
    async with LoopbackServer([reply]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url, **model))
        if reply.flood or reply.hold:
            await asyncio.wait_for(server.client_gone.wait(), HANG_GUARD)
    return error


def undecodable(error: ModelError, match: str) -> None:
    """A response the client could not read: final, the defect named."""
    assert type(error) is ModelError and not error.retryable, error
    assert "sent a response that could not be decoded: " in str(error)
    assert isinstance(error.__cause__, _http.DecodingError)
    assert re.search(match, str(error)), str(error)


# --- protocol numbers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (SSE_HEAD + b"Content-Length: \xb2\r\n\r\nx", r"the Content-Length '²' is not one number"),
        (b"HTTP/1.1 \xb2\xb2\xb2 OK\r\n\r\n", r"the status line is not HTTP/1.x: b'HTTP/1.1 \\xb2"),
        (CHUNKED_HEAD + b"\xb2\r\nx\r\n0\r\n\r\n", r"a chunk size of the response is malformed"),
        (CHUNKED_HEAD + b"1" + b"0" * 30 + b"\r\n", "a chunk size of the response is too large"),
        (
            CHUNKED_HEAD + b"1;" + b"e" * 5000 + b"\r\nx\r\n",
            "chunk-size line .* exceeds 4096 bytes",
        ),
    ],
    ids=["latin-1-length", "latin-1-status", "latin-1-chunk-size", "huge-chunk-size", "long-ext"],
)
async def test_protocol_numbers_are_read_with_an_ascii_grammar(raw: bytes, match: str) -> None:
    """``"²".isdigit()`` is true and ``int("²")`` fails: once a bare ``ValueError``."""
    undecodable(await fails(Reply(raw=[raw])), match)


async def test_an_error_status_stays_retryable_whatever_its_length_says() -> None:
    error = await fails(Reply(raw=[b"HTTP/1.1 503 Busy\r\nContent-Length: \xb2\r\n\r\n"]))
    assert isinstance(error, TransientModelError) and error.status == 503
    assert "(the error body was not read: the Content-Length '²' is not one number)" in str(error)


# --- heads that never end -------------------------------------------------------------------------


async def test_an_endless_stream_of_interim_responses_is_cut_off() -> None:
    error = await fails(Reply(raw=[], flood=b"HTTP/1.1 100 Continue\r\n\r\n"))
    undecodable(error, r"the server sent more than 16 interim \(1xx\) responses before its answer")


async def test_interim_responses_share_one_head_budget() -> None:
    interim = b"HTTP/1.1 103 Early Hints\r\nLink: " + b"l" * 8000 + b"\r\n\r\n"
    error = await fails(Reply(raw=[interim] * 9 + [SSE_HEAD + b"\r\n"]))
    undecodable(error, r"the response head exceeds 65536 bytes \(8 interim responses included\)")


async def test_a_head_that_trickles_in_forever_ends_at_its_deadline() -> None:
    """Each header line comes well within the timeout, the head never ends: the whole head has
    ``timeout`` seconds (once: up to 64 KiB at this pace, two minutes)."""
    status = b"HTTP/1.1 200 OK\r\n"
    error = await fails(Reply(raw=[status], flood=b"X-Slow: 1\r\n", every=0.01), timeout=0.5)
    assert isinstance(error, TransientModelError) and error.status is None
    found = re.search(
        r"\(ReadTimeout: the response head was not complete within 0.5 s \(only "
        r"(\d+) bytes of it arrived\)\)",
        str(error),
    )
    assert found, str(error)
    assert int(found[1]) > len(status)  # header lines kept coming: no read waited 0.5 s


# --- bodies that never end ------------------------------------------------------------------------


async def test_tiny_chunks_without_a_line_end_end_at_the_line_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_openai, "_MAX_LINE_BYTES", 4096)
    error = await fails(Reply(raw=[CHUNKED_HEAD, b"6\r\ndata: \r\n"], flood=b"1\r\nx\r\n"))
    undecodable(error, "a line of the response exceeds 4096 bytes")


async def test_a_flood_of_tiny_chunks_ends_at_the_chunk_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each chunk a blank line: no line grows, few bytes arrive, the chunks are counted."""
    monkeypatch.setattr(_http_readers, "MAX_CHUNKS", 1000)
    error = await fails(Reply(raw=[CHUNKED_HEAD], flood=b"1\r\n\n\r\n"))
    undecodable(error, r"the response body comes in more than 1000 chunks \(a flood of tiny")


async def test_keep_alives_forever_end_at_the_response_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No [DONE], no end, only comments, each well within the timeout: they count."""
    monkeypatch.setattr(_openai, "_MAX_RESPONSE_BYTES", 100_000)
    error = await fails(Reply(raw=[SSE_HEAD + b"\r\n", b"data: {}\n\n"], flood=b": ping\n"))
    undecodable(error, "the response body exceeds 100000 bytes")


async def test_blank_lines_forever_end_at_the_line_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_openai, "_MAX_LINES", 1000)
    error = await fails(Reply(raw=[SSE_HEAD + b"\r\n"], flood=b"\n"))
    assert type(error) is ModelError and not error.retryable
    assert "sent more than 1000 lines in one response (a flood of blank lines" in str(error)


async def stream_until_error(reply: Reply) -> tuple[list[ModelEvent], ModelError]:
    events: list[ModelEvent] = []
    async with LoopbackServer([reply]) as server:
        with pytest.raises(ModelError) as info:
            async for event in OpenAIChatModel("m", base_url=server.url).stream(HELLO):
                events.append(event)
        await asyncio.wait_for(server.client_gone.wait(), HANG_GUARD)
    return events, info.value


async def test_a_streamed_answer_is_held_only_up_to_the_response_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An endless answer (160 MiB and more), scaled down: text deltas without end."""
    monkeypatch.setattr(_openai, "_MAX_RESPONSE_BYTES", 200_000)
    event = sse(chunk({"content": "x" * 1000}), done=False)[0]
    events, error = await stream_until_error(Reply(raw=[SSE_HEAD + b"\r\n"], flood=event))
    undecodable(error, "the response body exceeds 200000 bytes")
    assert 0 < sum(len(e.text) for e in events) <= 200_000


async def test_tool_call_arguments_are_held_only_up_to_the_response_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_openai, "_MAX_RESPONSE_BYTES", 200_000)
    call = {"index": 0, "id": "c", "function": {"name": "write", "arguments": "a" * 1000}}
    event = sse(chunk({"tool_calls": [call]}), done=False)[0]
    _, error = await stream_until_error(Reply(raw=[SSE_HEAD + b"\r\n"], flood=event))
    undecodable(error, "the response body exceeds 200000 bytes")


async def test_a_non_streamed_answer_is_one_json_document_at_most_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_openai, "_MAX_JSON_BYTES", 10_000)
    body = {"choices": [{"message": {"content": "y" * 20_000}, "finish_reason": "stop"}]}
    undecodable(await fails(json_reply(200, body)), "the response body exceeds 10000 bytes")


# --- JSON built to be expensive -------------------------------------------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        (
            Reply(chunks=[f"data: {nested(100_000)}\n\n".encode()]),
            r"malformed stream event \(not JSON: nested too deeply\)",
        ),
        (
            Reply(
                chunks=sse(
                    chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "function": {
                                        "name": "t",
                                        "arguments": '{"a": ' + nested(100_000) + "}",
                                    },
                                }
                            ]
                        },
                        "tool_calls",
                    )
                )
            ),
            r"called tool 't' with arguments that are not valid JSON \(nested too deeply\)",
        ),
        (
            Reply(chunks=[b"data: [" + b"[]," * 300_000 + b"0]\n\n"]),
            r"not JSON: 900003 characters holding 300000 commas and colons outside strings, "
            r"more than the 131072 this adapter parses in one document",
        ),
        (
            json_reply(200, {"a": [[] for _ in range(300_000)]}),
            r"the body is not JSON \(\d+ characters holding \d+ commas and colons outside",
        ),
    ],
    ids=["deep-event", "deep-arguments", "wide-event", "wide-body"],
)
async def test_json_built_to_be_expensive_is_refused(reply: Reply, match: str) -> None:
    """``[[[[...`` once raised a bare RecursionError; 8 MiB of ``[],`` held the loop for a
    second and took 200 MiB."""
    error = await fails(reply)
    assert type(error) is ModelError and not error.retryable
    assert re.search(match, str(error)), str(error)[:500]


async def test_long_text_full_of_commas_and_colons_is_not_taken_for_structure() -> None:
    """Only those outside strings count: code and prose in a long string hold plenty."""
    code = 'print("a, b", [1, {2: 3}], "\\\\", "\\"")\n' * 40_000  # quotes, backslashes too
    arguments = json.dumps({"path": "x.py", "text": code})
    stream = sse(
        chunk({"content": code}),
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c", "function": {"name": "write", "arguments": arguments}}
                ]
            }
        ),
        chunk({}, "tool_calls"),
    )
    async with LoopbackServer([Reply(chunks=stream)]) as server:
        events = await collect(OpenAIChatModel("m", base_url=server.url).stream(HELLO))
    assert _openai_wire._separators(code) > _openai_wire.MAX_JSON_ITEMS  # the first count fails
    message = completed(events).message
    assert message.content == code
    assert message.tool_calls == (ToolCall("c", "write", {"path": "x.py", "text": code}),)


async def test_too_many_tool_calls_or_too_long_a_name() -> None:
    many = [{"index": i, "id": f"c{i}", "function": {"name": "t"}} for i in range(1025)]
    long = [{"index": 0, "id": "c", "function": {"name": "n" * 2000}}]
    for calls, match in [
        (many, "sent more than 1024 tool calls in one answer"),
        (long, "sent a tool name longer than 1024 characters: 'nnn"),
    ]:
        error = await fails(Reply(chunks=sse(chunk({"tool_calls": calls}), done=False)))
        assert type(error) is ModelError and match in str(error)


def test_calls_without_an_index_are_matched_by_id_or_to_the_last_call() -> None:
    """Through a dict of ids and the last index (once a scan of every call per delta)."""
    accumulator = _openai_wire.ResponseAccumulator()
    for i in range(1000):
        accumulator.add_chunk(chunk({"tool_calls": [{"id": f"c{i}", "function": {"name": "t"}}]}))
        accumulator.add_chunk(chunk({"tool_calls": [{"function": {"arguments": '{"i": '}}]}))
    for i in range(1000):  # the ids again, in order: more of each call
        accumulator.add_chunk(
            chunk({"tool_calls": [{"id": f"c{i}", "function": {"arguments": f"{i}}}"}}]})
        )
    calls = accumulator.response().message.tool_calls
    assert calls == tuple(ToolCall(f"c{i}", "t", {"i": i}) for i in range(1000))


# --- text that is not valid Unicode -------------------------------------------------------------


async def test_lone_surrogates_in_a_request_are_sent_as_replacement_characters() -> None:
    """A child's text may hold ``"\\ud800"`` (from ``surrogateescape``, or a slice between the
    halves of a pair); UTF-8 cannot: it once raised UnicodeEncodeError."""
    request = ModelRequest(
        messages=(
            UserMessage("user \ud800 end"),
            AssistantMessage(
                content="said \udfff",
                tool_calls=(ToolCall("c1", "look", {"path": "a\udc80b", "pair": "\ud83d\ude00"}),),
            ),
            ToolMessage("c1", "look", "result \ud800\ud800 end"),
            UserMessage("astral 😀 and a pair of halves \ud83d\ude00"),
        ),
        tools=(
            ToolSpec(
                "look",
                "looks \udbff",
                {"type": "object", "properties": {"path": {"description": "\ud800"}}},
            ),
        ),
        system_prompt="system \udc00",
    )
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)]) as server:
        events = await collect(OpenAIChatModel("m", base_url=server.url).stream(request))
    assert completed(events).message.content == "Hello"
    [received] = server.requests
    body = json.loads(received.raw.decode("utf-8"))  # strict: the endpoint got valid UTF-8
    messages = body["messages"]
    assert messages[0] == {"role": "system", "content": "system \ufffd"}
    assert messages[1]["content"] == "user \ufffd end"
    assert messages[2]["content"] == "said \ufffd"
    arguments = json.loads(messages[2]["tool_calls"][0]["function"]["arguments"])
    assert arguments == {"path": "a\ufffdb", "pair": "😀"}
    assert messages[3]["content"] == "result \ufffd\ufffd end"
    assert messages[4]["content"] == "astral 😀 and a pair of halves 😀"
    function = body["tools"][0]["function"]
    assert function["description"] == "looks \ufffd"
    assert function["parameters"]["properties"]["path"]["description"] == "\ufffd"


def encodes(text: str) -> str:
    text.encode("utf-8")  # raises for a lone surrogate
    return text


async def test_lone_surrogate_escapes_from_the_server_become_replacement_characters() -> None:
    # JSON escapes as a server writes them (json.dumps would escape the backslashes).
    content = (
        r"lone \ud800, low \uDFFF, pair \ud83d\ude00, reversed \ude00\ud83d, "
        r"escaped backslash \\ud800, end"
    )
    text = json.dumps(chunk({"content": "@"})).replace("@", content)
    call = {"index": 0, "id": "c@", "function": {"name": "t#", "arguments": '{"k": "%"}'}}
    calls = json.dumps(chunk({"tool_calls": [call]}, "tool_calls"))
    # "%": an escape inside the arguments' own JSON, so escaped once more in the event's
    calls = calls.replace("@", r"\ud800").replace("#", r"\udfff").replace("%", r"\\ud800")
    stream = [f"data: {text}\n\n".encode(), f"data: {calls}\n\n".encode(), b"data: [DONE]\n\n"]
    async with LoopbackServer([Reply(chunks=stream)]) as server:
        events = await collect(OpenAIChatModel("m", base_url=server.url).stream(HELLO))
    expected = (
        "lone \ufffd, low \ufffd, pair 😀, reversed \ufffd\ufffd, escaped backslash \\ud800, end"
    )
    assert [encodes(e.text) for e in events[:-1]] == [expected]
    message = completed(events).message
    assert encodes(message.content) == expected
    assert message.tool_calls == (ToolCall("c\ufffd", "t\ufffd", {"k": "\ufffd"}),)


async def test_surrogates_in_a_non_streamed_answer_or_an_error_body() -> None:
    """``json.loads(bytes)`` decodes with ``surrogatepass``: the bytes of a UTF-8-encoded
    surrogate would have come through."""
    body = (
        b'{"choices":[{"index":0,"finish_reason":"stop","message":{"content":'
        b'"raw \xed\xa0\x80 escaped \\ud800"}}]}'
    )
    answer = Reply(chunks=[body], headers={"Content-Type": "application/json"})
    error = Reply(400, [b'{"error": {"message": "bad \\ud800 thing"}}'], headers={})
    async with LoopbackServer([answer, error]) as server:
        model = OpenAIChatModel("m", base_url=server.url)
        events = await collect(model.stream(HELLO))
        failure = await raises(model)
    assert encodes(completed(events).message.content) == "raw \ufffd\ufffd\ufffd escaped \ufffd"
    assert "bad \ufffd thing" in encodes(str(failure))


# --- nothing but ModelError ---------------------------------------------------------------------


async def test_an_unexpected_failure_is_still_a_model_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: Any, chunk: Any) -> str:
        raise KeyError("a defect of the adapter")

    monkeypatch.setattr(_openai.ResponseAccumulator, "add_chunk", broken)
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)]) as server:
        model = OpenAIChatModel("m", base_url=server.url)
        error = await raises(model)
    assert type(error) is ModelError and not error.retryable
    assert f"talking to the model endpoint {model.url} failed unexpectedly (KeyError:" in str(error)
    assert isinstance(error.__cause__, KeyError)


async def test_a_request_that_cannot_be_encoded_is_a_model_error() -> None:
    request = ModelRequest(messages=(UserMessage("hi"),), tools=(ToolSpec("t", "", {"x": {1j}}),))
    async with LoopbackServer([]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url), request)
    assert type(error) is ModelError
    assert "cannot encode a request for" in str(error) and "TypeError" in str(error)
    assert server.requests == []


# --- the event loop stays free ------------------------------------------------------------------


class _Closed:
    """The writer side of a connection that is already gone (``Response.aclose`` aborts it)."""

    class transport:
        @staticmethod
        def abort() -> None:
            pass

    async def wait_closed(self) -> None:
        pass


@pytest.mark.parametrize(
    ("head", "body"),
    [
        (SSE_HEAD + b"\r\n", b"\n" * 2**20),
        (CHUNKED_HEAD, b"1\r\n\n\r\n" * 2**18 + b"0\r\n\r\n"),
        (SSE_HEAD + b"\r\n", b"data: {}\n\n" * 2**17),
    ],
    ids=["blank-lines", "tiny-chunks", "tiny-events"],
)
async def test_a_flood_that_arrived_at_once_is_read_in_slices(head: bytes, body: bytes) -> None:
    """A megabyte already in the stream's buffer: a read never waits, so only the client's own
    pacing lets another task run while it reads (without it the other task would run 0 times)."""
    reader = asyncio.StreamReader(limit=2**30)
    reader.feed_data(head + body)
    reader.feed_eof()
    ticks = 0
    done = False

    async def other_task() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(other_task())
    buffer = bytearray()
    head = await _http._read_head(reader, buffer, HANG_GUARD)
    response = _http.Response(reader, _Closed(), HANG_GUARD, head, buffer)  # type: ignore[arg-type]
    async for _ in response.aiter_lines(2**20, 2**30):
        pass
    done = True
    await ticker
    assert ticks >= len(body) // 2**16, ticks  # at least once per 64 KiB received
