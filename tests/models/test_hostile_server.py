"""Both adapters against a hostile model server on loopback: every bound, every defect.

A hostile (or broken) server may send anything: protocol numbers in other scripts, interim
responses without end, heads and bodies that never end, floods of tiny events, blank lines and
keep-alives, answers of any size, JSON built to be expensive, text that is not valid Unicode.
The adapters make their calls in the parent (for every brokered child), so each test names what
the server does and checks that the call ends with a ``ModelError`` saying what the server did
wrong (``TransientModelError`` when retrying may help), that the connection is closed, and that
nothing it yields or holds crossed a bound. Each runs against both wire formats: Chat
Completions (``OpenAIChatModel``) and Messages (``AnthropicModel``).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from support import anthropic_events as ant
from support.openai_chunks import HELLO, TEXT_STREAM, chunk, completed, raises
from support.openai_loopback import LoopbackServer, Reply, collect, json_reply, sse
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from zett_agent.model import (
    Model,
    ModelError,
    ModelEvent,
    ModelRequest,
    ToolSpec,
    TransientModelError,
)
from zett_agent.models import _budget, _openai_wire
from zett_agent.models.anthropic import AnthropicModel
from zett_agent.models.openai import OpenAIChatModel

HANG_GUARD = 10.0
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
CHUNKED_HEAD = SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"


@dataclass(frozen=True)
class Wire:
    """One API's wire format: a model on a server, and what its streams look like."""

    name: str
    model: Callable[..., Model]
    #: one event adding ``text`` to the answer, the stream not ended
    text_event: Callable[[str], bytes]
    #: one event streaming ``arguments`` of a tool call
    tool_event: Callable[[str], bytes]
    #: a whole streamed answer of ``text``
    answer: Callable[[str], list[bytes]]
    #: a whole answer calling tool ``name`` with the JSON text ``arguments``
    tool_answer: Callable[[str, str, str], list[bytes]]


def _openai_model(server: LoopbackServer, **options: Any) -> Model:
    return OpenAIChatModel("m", base_url=server.url, **options)


def _anthropic_model(server: LoopbackServer, **options: Any) -> Model:
    return AnthropicModel("m", base_url=server.url.removesuffix("/v1"), **options)


def _openai_tool(call_id: str, name: str, arguments: str) -> list[bytes]:
    call = {"index": 0, "id": call_id, "function": {"name": name, "arguments": arguments}}
    return sse(chunk({"tool_calls": [call]}), chunk({}, "tool_calls"))


def _anthropic_tool(call_id: str, name: str, arguments: str) -> list[bytes]:
    return ant.events(
        ant.message_start(), *ant.tool_block(0, call_id, name, arguments), *ant.message_end()
    )


WIRES = [
    Wire(
        "openai",
        _openai_model,
        lambda text: sse(chunk({"content": text}), done=False)[0],
        lambda args: sse(
            chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"arguments": args}}]}),
            done=False,
        )[0],
        lambda text: sse(chunk({"content": text}), chunk({}, "stop")),
        _openai_tool,
    ),
    Wire(
        "anthropic",
        _anthropic_model,
        lambda text: ant.event(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            }
        ),
        lambda args: ant.event(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": args},
            }
        ),
        lambda text: ant.text_message(text),
        _anthropic_tool,
    ),
]


@pytest.fixture(params=WIRES, ids=[w.name for w in WIRES])
def wire(request: pytest.FixtureRequest) -> Wire:
    return request.param  # type: ignore[no-any-return]


async def fails(wire: Wire, reply: Reply, **options: Any) -> ModelError:
    """The error one stream against ``reply`` ends with; the server saw the client go away."""
    async with LoopbackServer([reply]) as server:
        async with asyncio.timeout(HANG_GUARD):
            error = await raises(wire.model(server, **options))  # type: ignore[arg-type]
        if reply.flood or reply.hold:
            await asyncio.wait_for(server.client_gone.wait(), HANG_GUARD)
    return error


def refused(error: ModelError, match: str) -> None:
    """A response the adapter would not read further: final, the defect named."""
    assert type(error) in (ModelError, _budget.ResponseRefused), error
    assert not error.retryable, error
    assert re.search(match, str(error)), str(error)


# --- protocol numbers and heads -------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        SSE_HEAD + b"Content-Length: \xb2\r\n\r\nx",
        b"HTTP/1.1 \xb2\xb2\xb2 OK\r\n\r\n",
        CHUNKED_HEAD + b"\xb2\r\nx\r\n0\r\n\r\n",
        CHUNKED_HEAD + b"1" + b"0" * 30 + b"\r\n",
    ],
    ids=["latin-1-length", "latin-1-status", "latin-1-chunk-size", "huge-chunk-size"],
)
async def test_protocol_numbers_in_other_scripts_are_a_decoding_error(
    wire: Wire, raw: bytes
) -> None:
    """``"²".isdigit()`` is true and ``int("²")`` fails: once a bare ``ValueError``."""
    error = await fails(wire, Reply(raw=[raw]))
    refused(error, r"sent a response that could not be decoded: \w*ProtocolError")


async def test_an_endless_stream_of_interim_responses_ends_at_the_deadline(wire: Wire) -> None:
    error = await fails(wire, Reply(raw=[], flood=b"HTTP/1.1 100 Continue\r\n\r\n"), deadline=0.5)
    assert isinstance(error, TransientModelError) and error.status is None
    assert "did not finish the call within its deadline of 0.5 s" in str(error)


async def test_a_head_that_trickles_in_forever_ends_at_the_deadline(wire: Wire) -> None:
    reply = Reply(raw=[b"HTTP/1.1 200 OK\r\n"], flood=b"X-Slow: 1\r\n", every=0.01)
    error = await fails(wire, reply, timeout=5, deadline=0.5)
    assert isinstance(error, TransientModelError)
    assert "within its deadline of 0.5 s" in str(error)


async def test_a_server_that_stops_mid_stream_ends_at_the_timeout(wire: Wire) -> None:
    reply = Reply(chunks=[wire.text_event("first")], hold=True)
    async with LoopbackServer([reply]) as server:
        seen: list[ModelEvent] = []
        with pytest.raises(TransientModelError) as info:
            async for event in wire.model(server, timeout=0.3).stream(HELLO):
                seen.append(event)
        await asyncio.wait_for(server.client_gone.wait(), HANG_GUARD)
    assert [e.text for e in seen] == ["first"]
    assert "did not answer within 0.3 s" in str(info.value)


# --- bodies that never end ------------------------------------------------------------------------


async def test_a_line_without_end_ends_at_the_line_bound(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_budget, "MAX_LINE_BYTES", 4096)
    error = await fails(wire, Reply(raw=[CHUNKED_HEAD, b"6\r\ndata: \r\n"], flood=b"1\r\nx\r\n"))
    refused(error, "sent a line longer than 4096 bytes")


async def test_keep_alives_forever_end_at_the_response_budget(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No end, only comments, each well within the timeout: they count."""
    monkeypatch.setattr(_budget, "MAX_RESPONSE_BYTES", 100_000)
    error = await fails(wire, Reply(raw=[SSE_HEAD + b"\r\n"], flood=b": ping\n"))
    refused(error, "answer exceeds 100000 bytes")


async def test_blank_lines_forever_end_at_the_line_count(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_budget, "MAX_LINES", 1000)
    error = await fails(wire, Reply(raw=[SSE_HEAD + b"\r\n"], flood=b"\n"))
    refused(error, "sent more than 1000 lines in one response")


async def test_tiny_events_forever_end_at_the_event_count(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_budget, "MAX_EVENTS", 1000)
    error = await fails(wire, Reply(raw=[SSE_HEAD + b"\r\n"], flood=wire.text_event("")))
    refused(error, "sent more than 1000 events in one response")


async def test_a_streamed_answer_is_held_only_up_to_the_response_budget(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An endless answer, scaled down: text deltas without end."""
    monkeypatch.setattr(_budget, "MAX_RESPONSE_BYTES", 200_000)
    events: list[ModelEvent] = []
    async with LoopbackServer(
        [Reply(raw=[SSE_HEAD + b"\r\n"], flood=wire.text_event("x" * 1000))]
    ) as server:
        with pytest.raises(ModelError) as info:
            async for event in wire.model(server).stream(HELLO):
                events.append(event)
        await asyncio.wait_for(server.client_gone.wait(), HANG_GUARD)
    refused(info.value, "answer exceeds 200000 bytes")
    assert 0 < sum(len(e.text) for e in events) <= 200_000


async def test_tool_call_arguments_are_held_only_up_to_the_response_budget(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_budget, "MAX_RESPONSE_BYTES", 200_000)
    start = (
        _openai_tool("c", "write", "")[0]
        if wire.name == "openai"
        else b"".join(ant.events(ant.message_start(), ant.tool_block(0, "c", "write")[0]))
    )
    reply = Reply(raw=[SSE_HEAD + b"\r\n", start], flood=wire.tool_event("a" * 1000))
    refused(await fails(wire, reply), "answer exceeds 200000 bytes")


async def test_a_non_streamed_answer_is_one_json_document_at_most_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_budget, "MAX_JSON_BYTES", 10_000)
    body = {"choices": [{"message": {"content": "y" * 20_000}, "finish_reason": "stop"}]}
    refused(await fails(WIRES[0], json_reply(200, body)), "exceeds 10000 bytes")


async def test_an_error_body_is_read_up_to_its_bound_and_the_status_decides(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_budget, "MAX_ERROR_BYTES", 1000)
    reply = Reply(raw=[b"HTTP/1.1 503 Busy\r\nContent-Type: text/plain\r\n\r\n"], flood=b"e" * 100)
    error = await fails(wire, reply)
    assert isinstance(error, TransientModelError) and error.status == 503
    assert "(HTTP 503): eeee" in str(error)


async def test_a_compressed_body_is_refused(wire: Wire) -> None:
    head = SSE_HEAD + b"Content-Encoding: gzip\r\nContent-Length: 4\r\n\r\nabcd"
    refused(
        await fails(wire, Reply(raw=[head])), r"sent a compressed body \(Content-Encoding: gzip\)"
    )


# --- JSON built to be expensive -------------------------------------------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


async def test_deep_json_is_refused(wire: Wire) -> None:
    """``[[[[...`` once raised a bare RecursionError."""
    event = f"data: {nested(100_000)}\n\n".encode()
    if wire.name == "anthropic":
        event = b"event: content_block_delta\n" + event
    refused(
        await fails(wire, Reply(chunks=[event])),
        r"malformed stream event \(not JSON: nested too deeply\)",
    )


async def test_deep_tool_arguments_are_refused(wire: Wire) -> None:
    stream = wire.tool_answer("c", "t", '{"a": ' + nested(100_000) + "}")
    error = await fails(wire, Reply(chunks=stream))
    refused(error, r"called tool 't' with \w+ that \w+ not valid JSON \(nested too deeply\)")


async def test_wide_json_is_refused_before_it_is_parsed(wire: Wire) -> None:
    """8 MiB of ``[],`` held the loop for a second and took 200 MiB."""
    event = b"data: [" + b"[]," * 300_000 + b"0]\n\n"
    if wire.name == "anthropic":
        event = b"event: content_block_delta\n" + event
    error = await fails(wire, Reply(chunks=[event]))
    refused(error, r"a line of \d+ bytes holding 30000[01] commas and colons outside strings")


async def test_a_wide_non_streamed_body_is_refused() -> None:
    error = await fails(WIRES[0], json_reply(200, {"a": [[] for _ in range(300_000)]}))
    refused(error, r"holding \d+ commas and colons outside strings")


async def test_long_text_full_of_commas_and_colons_is_not_taken_for_structure(
    wire: Wire,
) -> None:
    """Only those outside strings count: code and prose in a long string hold plenty."""
    code = 'print("a, b", [1, {2: 3}], "\\\\", "\\"")\n' * 40_000  # quotes, backslashes too
    arguments = json.dumps({"path": "x.py", "text": code})
    assert _budget.separators_outside_strings(json.dumps(code)) <= _budget.MAX_JSON_ITEMS
    stream = [wire.text_event(code), *wire.tool_answer("c", "write", arguments)]
    if wire.name == "anthropic":  # the text block, then a tool block after it
        stream = ant.events(
            ant.message_start(),
            *ant.text_block(0, code),
            *ant.tool_block(1, "c", "write", arguments),
            *ant.message_end("tool_use"),
        )
    async with LoopbackServer([Reply(chunks=stream)]) as server:
        events = await collect(wire.model(server).stream(HELLO))
    message = completed(events).message
    assert message.content == code
    assert message.tool_calls == (ToolCall("c", "write", {"path": "x.py", "text": code}),)


async def test_too_many_tool_calls_or_too_long_a_name(wire: Wire) -> None:
    if wire.name == "openai":
        many = [{"index": i, "id": f"c{i}", "function": {"name": "t"}} for i in range(1025)]
        long = [{"index": 0, "id": "c", "function": {"name": "n" * 2000}}]
        streams = [sse(chunk({"tool_calls": calls}), done=False) for calls in (many, long)]
    else:
        starts = [ant.tool_block(i, f"c{i}", "t")[0] for i in range(1025)]
        streams = [
            ant.events(ant.message_start(), *starts),
            ant.events(ant.message_start(), ant.tool_block(0, "c", "n" * 2000)[0]),
        ]
    for stream, match in zip(
        streams,
        ["sent more than 1024 tool calls in one answer", "sent a tool name longer than 1024"],
        strict=True,
    ):
        error = await fails(wire, Reply(chunks=stream))
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


async def test_lone_surrogates_in_a_request_are_sent_as_replacement_characters(wire: Wire) -> None:
    """A child's text may hold ``"\\ud800"``; UTF-8 cannot: it once raised UnicodeEncodeError."""
    request = ModelRequest(
        messages=(
            UserMessage("user \ud800 end"),
            AssistantMessage(
                content="said \udfff",
                tool_calls=(ToolCall("c1", "look", {"path": "a\udc80b", "pair": "\ud83d\ude00"}),),
            ),
            ToolMessage("c1", "look", "result \ud800\ud800 end"),
        ),
        tools=(ToolSpec("look", "looks \udbff", {"type": "object", "properties": {}}),),
        system_prompt="system \udc00",
    )
    async with LoopbackServer([Reply(chunks=wire.answer("Hello"))]) as server:
        events = await collect(wire.model(server).stream(request))
    assert completed(events).message.content == "Hello"
    [received] = server.requests
    text = received.raw.decode("utf-8")  # strict: the endpoint got valid UTF-8
    assert "\ufffd" in text and "\\ud800" not in text.lower()
    body = json.loads(text)
    assert "system \ufffd" in json.dumps(body, ensure_ascii=False)
    assert "result \ufffd\ufffd end" in json.dumps(body, ensure_ascii=False)
    assert '"pair": "😀"' in json.dumps(body, ensure_ascii=False).replace('\\"', '"')


def encodes(text: str) -> str:
    text.encode("utf-8")  # raises for a lone surrogate
    return text


async def test_lone_surrogate_escapes_from_the_server_become_replacement_characters(
    wire: Wire,
) -> None:
    # JSON escapes as a server writes them (json.dumps would escape the backslashes).
    content = (
        r"lone \ud800, low \uDFFF, pair \ud83d\ude00, reversed \ude00\ud83d, "
        r"escaped backslash \\ud800, end"
    )
    text = wire.text_event("@").replace(b"@", content.encode())
    arguments = json.dumps({"k": "%"}).replace("%", "\\ud800")
    if wire.name == "openai":
        stream = [text, *wire.tool_answer("c@", "t#", arguments)]
    else:
        stream = [
            ant.event(ant.message_start()),
            ant.event(ant.text_block(0)[0]),
            text,
            *ant.events(*ant.tool_block(1, "c@", "t#", arguments), *ant.message_end("tool_use")),
        ]
    stream = [e.replace(b"c@", b"c\\ud800").replace(b"t#", b"t\\udfff") for e in stream]
    async with LoopbackServer([Reply(chunks=stream)]) as server:
        events = await collect(wire.model(server).stream(HELLO))
    expected = (
        "lone \ufffd, low \ufffd, pair 😀, reversed \ufffd\ufffd, escaped backslash \\ud800, end"
    )
    assert [encodes(e.text) for e in events[:-1]] == [expected]
    message = completed(events).message
    assert encodes(message.content) == expected
    assert message.tool_calls == (ToolCall("c\ufffd", "t\ufffd", {"k": "\ufffd"}),)


async def test_surrogates_in_an_error_body(wire: Wire) -> None:
    error_reply = Reply(
        400, [b'{"error": {"message": "bad \\ud800 \xed\xa0\x80 thing"}}'], headers={}
    )
    error = await fails(wire, error_reply)
    assert "bad \ufffd \ufffd\ufffd\ufffd thing" in encodes(str(error))


# --- nothing but ModelError ---------------------------------------------------------------------


async def test_an_unexpected_failure_is_still_a_model_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: Any, chunk: Any) -> str:
        raise KeyError("a defect of the adapter")

    monkeypatch.setattr(_openai_wire.ResponseAccumulator, "add_chunk", broken)
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)]) as server:
        model = OpenAIChatModel("m", base_url=server.url)
        error = await raises(model)
    assert type(error) is ModelError and not error.retryable
    assert f"talking to the model endpoint {model.url} (model 'm') failed unexpectedly" in str(
        error
    )
    assert isinstance(error.__cause__, KeyError)


async def test_a_request_that_cannot_be_encoded_is_a_model_error(wire: Wire) -> None:
    request = ModelRequest(messages=(UserMessage("hi"),), tools=(ToolSpec("t", "", {"x": {1j}}),))
    async with LoopbackServer([]) as server:
        error = await raises(wire.model(server), request)  # type: ignore[arg-type]
    assert type(error) is ModelError
    assert "cannot encode a request for" in str(error) and "TypeError" in str(error)
    assert server.requests == []


# --- the event loop stays free ------------------------------------------------------------------


async def test_a_flood_that_arrived_at_once_is_handed_out_in_slices(wire: Wire) -> None:
    """Thousands of tiny events in one read: the SDK hands them out without waiting, so only
    the adapter's pacing lets another task run while they are handled (without it the other
    task would run a few times in all)."""
    count = 20_000
    body = wire.text_event("x") * count
    ticks = 0
    done = False

    async def other_task() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(other_task())
    reply = Reply(raw=[SSE_HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode() + body])
    async with LoopbackServer([reply]) as server:
        with pytest.raises(ModelError):  # the answer never ends properly
            async for _ in wire.model(server).stream(HELLO):
                pass
    done = True
    await ticker
    assert ticks >= count // 64, ticks  # at least once per 64 events
