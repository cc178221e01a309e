"""OpenAIChatModel against a scripted OpenAI-compatible server on loopback."""

from __future__ import annotations

import asyncio
import json
import pickle
import subprocess
import sys
from collections.abc import AsyncGenerator
from typing import Any, cast

import cloudpickle
import pytest
import uvloop

import zett_agent.models
import zett_agent.models.anthropic
import zett_agent.models.openai
from support.openai_chunks import HELLO, TEXT_STREAM, chunk, completed, raises, usage_chunk
from support.openai_loopback import (
    LoopbackServer,
    Reply,
    TunnelProxy,
    collect,
    json_reply,
    served_in_thread,
    sse,
)
from zett_agent.messages import AgentMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from zett_agent.model import (
    Model,
    ModelError,
    ModelEvent,
    ModelRequest,
    RetryOptions,
    ToolSpec,
    TransientModelError,
    Usage,
)
from zett_agent.models import model_from_spec
from zett_agent.models.openai import OpenAIChatModel

HANG_GUARD = 10.0
# --- the public surface -------------------------------------------------------------------------


def test_exports() -> None:
    assert zett_agent.models.__all__ == ["model_from_spec"]
    assert zett_agent.models.openai.__all__ == ["OpenAIChatModel"]
    assert zett_agent.models.anthropic.__all__ == ["AnthropicModel"]


def test_is_a_model_and_repr_hides_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    model = OpenAIChatModel("m", api_key="sk-secret")
    assert isinstance(model, Model)
    assert "sk-secret" not in repr(model)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-secret")
    assert repr(OpenAIChatModel("m")) == (
        "OpenAIChatModel('m', base_url='https://api.openai.com/v1', api_key=$OPENAI_API_KEY)"
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": ""}, "model name"),
        ({"model": "m", "base_url": "127.0.0.1:8000/v1"}, "http:// or https://"),
        ({"model": "m", "timeout": 0}, "timeout"),
        ({"model": "m", "deadline": -1}, "deadline"),
        ({"model": "m", "extra_body": {"x": object()}}, "JSON-serialisable"),
    ],
)
def test_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        OpenAIChatModel(**kwargs)


def test_model_from_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    local = model_from_spec("openai:qwen2.5:7b", base_url="http://127.0.0.1:8000/v1/")
    assert isinstance(local, OpenAIChatModel)
    assert (local.model, local.base_url) == ("qwen2.5:7b", "http://127.0.0.1:8000/v1")
    assert local.url == "http://127.0.0.1:8000/v1/chat/completions"
    with pytest.raises(ValueError, match="set OPENAI_API_KEY"):
        model_from_spec("openai:gpt-4o-mini", base_url=None)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    default = model_from_spec("openai:gpt-4o-mini", base_url=None)
    assert isinstance(default, OpenAIChatModel)
    assert default.base_url == "https://api.openai.com/v1"
    for bad in ("gpt-4o", "openai:", ":gpt-4o"):
        with pytest.raises(ValueError, match="PROVIDER:MODEL_NAME"):
            model_from_spec(bad)
    with pytest.raises(ValueError, match=r"unknown model provider 'claude'.*: openai, anthropic$"):
        model_from_spec("claude:x")


@pytest.mark.parametrize(
    "base_url", ["https://api.openai.com/v1", "https://API.OpenAI.com/v1/", "http://api.openai.com"]
)
def test_the_openai_api_without_a_key_fails_at_construction_in_one_line(base_url: str) -> None:
    with pytest.raises(ValueError) as info:
        OpenAIChatModel("gpt-4o-mini", base_url=base_url)
    message = str(info.value)
    assert "\n" not in message
    assert "set OPENAI_API_KEY" in message and "api_key=" in message
    # An empty variable is no key either, and a custom variable is the one named.
    with pytest.raises(ValueError, match="set MY_KEY in the environment or pass api_key="):
        OpenAIChatModel("gpt-4o-mini", base_url=base_url, api_key_env="MY_KEY")


def test_a_key_from_the_argument_or_the_environment_is_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert OpenAIChatModel("gpt-4o-mini", api_key="sk-arg")._resolve_key() == "sk-arg"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert OpenAIChatModel("gpt-4o-mini")._resolve_key() == "sk-env"


def test_other_endpoints_need_no_key() -> None:
    for url in ("http://127.0.0.1:8000/v1", "https://openai.example.com/v1"):
        assert OpenAIChatModel("m", base_url=url)._resolve_key() is None


async def test_the_openai_api_without_a_key_fails_before_any_request_in_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key that disappears after construction (a child's environment) fails in ``stream()``.

    Every request goes through the proxy below (``$HTTPS_PROXY``, as the SDK's HTTP library
    reads it; it refuses tunnels to anything but loopback): while the key is there one request
    is seen there, so its log not growing once the key is gone proves that nothing was sent.
    """
    monkeypatch.setenv("OPENAI_API_KEY", "sk-at-construction")
    model = OpenAIChatModel("gpt-4o-mini")
    async with TunnelProxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        async with asyncio.timeout(HANG_GUARD):
            refused = await raises(model)
            assert [(r.method, r.target) for r in proxy.requests] == [
                ("CONNECT", "api.openai.com:443")
            ]
            monkeypatch.delenv("OPENAI_API_KEY")
            error = await raises(model)
    assert isinstance(refused, TransientModelError) and "could not talk to" in str(refused)
    assert "403" in str(refused)  # the proxy's refusal, named
    assert type(error) is ModelError and error.retryable is False
    assert "set OPENAI_API_KEY in the environment or pass api_key=" in str(error)
    assert len(proxy.requests) == 1


# --- streaming ----------------------------------------------------------------------------------


async def test_streams_text_deltas_then_the_completed_response_with_usage() -> None:
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)]) as server:
        model = OpenAIChatModel("local-model", base_url=server.url)
        events = await collect(model.stream(HELLO))

    assert [e.text for e in events[:-1]] == ["Hel", "lo"]
    response = completed(events)
    assert response.message == AssistantMessage(content="Hello")
    assert response.usage == Usage(input_tokens=12, output_tokens=3)
    [received] = server.requests
    assert (received.method, received.path) == ("POST", "/v1/chat/completions")
    assert received.body == {
        "model": "local-model",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert "authorization" not in received.headers
    assert received.headers["content-type"] == "application/json"
    assert received.headers["accept-encoding"] == "identity"
    assert received.headers["x-stainless-retry-count"] == "0"  # the SDK retries nothing


async def test_request_body_maps_every_message_kind_tools_and_options() -> None:
    request = ModelRequest(
        system_prompt="Be brief.",
        messages=(
            UserMessage("find x"),
            AssistantMessage(
                content="",
                tool_calls=(
                    ToolCall("call_1", "search", {"q": "x", "limit": 2}),
                    ToolCall("call_2", "read", {}),
                ),
            ),
            ToolMessage(call_id="call_1", name="search", text="found x"),
            ToolMessage(call_id="call_2", name="read", text="error: no file"),
            AgentMessage("task t1 completed", source="async_subagent"),
            AssistantMessage(content="Done: x.", tool_calls=(ToolCall("c3", "note", {"s": "é"}),)),
            AssistantMessage(content="Plain answer."),
        ),
        tools=(
            ToolSpec(
                "search",
                "Search the web.",
                {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
            ),
            ToolSpec("read", "Read a file."),
        ),
    )
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)]) as server:
        model = OpenAIChatModel(
            "m",
            base_url=server.url + "/",
            api_key="sk-test",
            temperature=0.25,
            max_tokens=64,
            extra_body={"top_p": 0.5, "max_tokens": 32},
        )
        await collect(model.stream(request))

    [received] = server.requests
    assert received.headers["authorization"] == "Bearer sk-test"
    assert received.body == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "find x"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "search", "arguments": '{"q": "x", "limit": 2}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "read", "arguments": "{}"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "found x"},
            {"role": "tool", "tool_call_id": "call_2", "content": "error: no file"},
            {"role": "user", "content": "task t1 completed"},
            {
                "role": "assistant",
                "content": "Done: x.",
                "tool_calls": [
                    {
                        "id": "c3",
                        "type": "function",
                        "function": {"name": "note", "arguments": '{"s": "é"}'},
                    }
                ],
            },
            {"role": "assistant", "content": "Plain answer."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "search",
                    "description": "Search the web.",
                    "parameters": {
                        "type": "object",
                        "properties": {"q": {"type": "string"}},
                        "required": ["q"],
                    },
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "read",
                    "description": "Read a file.",
                    "parameters": {"type": "object", "properties": {}},
                },
            },
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.25,
        # extra_body is merged last and wins.
        "max_tokens": 32,
        "top_p": 0.5,
    }


async def test_api_key_comes_from_the_named_environment_variable_at_request_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with LoopbackServer([Reply(chunks=TEXT_STREAM), Reply(chunks=TEXT_STREAM)]) as server:
        model = OpenAIChatModel("m", base_url=server.url, api_key_env="MY_KEY")
        monkeypatch.setenv("MY_KEY", "sk-from-env")
        await collect(model.stream(HELLO))
        monkeypatch.setenv("MY_KEY", "")
        await collect(model.stream(HELLO))
        assert model._clients.count() == 1  # one client: the key is read and sent per call
        await model.aclose()

    assert server.requests[0].headers["authorization"] == "Bearer sk-from-env"
    assert "authorization" not in server.requests[1].headers


async def test_two_parallel_tool_calls_split_across_chunks() -> None:
    def call(index: int, **fields: Any) -> dict[str, Any]:
        return chunk({"tool_calls": [{"index": index, **fields}]})

    stream = sse(
        chunk({"role": "assistant", "content": "Looking."}),
        call(0, id="call_a", type="function", function={"name": "search", "arguments": ""}),
        call(1, id="call_b", type="function", function={"name": "read_file", "arguments": ""}),
        call(0, function={"arguments": '{"q": "ze'}),
        call(1, function={"arguments": '{"path"'}),
        call(0, function={"arguments": 'tt", "n": 3}'}),
        call(1, function={"arguments": ': "a b.txt"}'}),
        chunk({}, finish="tool_calls"),
        usage_chunk(40, 25),
    )
    async with LoopbackServer([Reply(chunks=stream)]) as server:
        events = await collect(OpenAIChatModel("m", base_url=server.url).stream(HELLO))

    assert [e.text for e in events[:-1]] == ["Looking."]
    response = completed(events)
    assert response.message == AssistantMessage(
        content="Looking.",
        tool_calls=(
            ToolCall("call_a", "search", {"q": "zett", "n": 3}),
            ToolCall("call_b", "read_file", {"path": "a b.txt"}),
        ),
    )
    assert response.usage == Usage(40, 25)


async def test_a_tool_call_without_arguments_gets_an_empty_object() -> None:
    stream = sse(
        chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "list"}}]}),
        chunk({}, finish="tool_calls"),
    )
    async with LoopbackServer([Reply(chunks=stream)]) as server:
        events = await collect(OpenAIChatModel("m", base_url=server.url).stream(HELLO))
    assert completed(events).message.tool_calls == (ToolCall("c", "list", {}),)
    assert completed(events).usage is None


async def test_a_server_that_ignores_stream_true_still_works() -> None:
    body = {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "One moment.",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "search", "arguments": '{"q": "x"}'},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7},
    }
    async with LoopbackServer([json_reply(200, body)]) as server:
        events = await collect(OpenAIChatModel("m", base_url=server.url).stream(HELLO))
    assert [e.text for e in events[:-1]] == ["One moment."]
    response = completed(events)
    assert response.message.tool_calls == (ToolCall("c1", "search", {"q": "x"}),)
    assert response.usage == Usage(5, 7)


# --- errors -------------------------------------------------------------------------------------


async def test_429_is_transient_with_the_retry_after_hint_and_the_next_call_succeeds() -> None:
    limited = json_reply(
        429,
        {"error": {"message": "Rate limit reached for m.", "type": "requests"}},
        headers={"Retry-After": "2"},
    )
    async with LoopbackServer([limited, Reply(chunks=TEXT_STREAM)]) as server:
        model = OpenAIChatModel("m", base_url=server.url)
        error = await raises(model)
        # The adapter never retries by itself: one request, then the runtime decides.
        assert len(server.requests) == 1
        events = await collect(model.stream(HELLO))

    assert isinstance(error, TransientModelError)
    assert (error.retryable, error.status) == (True, 429)
    assert "Rate limit reached for m. [requests]" in str(error)
    assert "retry after 2 s" in str(error)
    assert completed(events).message.content == "Hello"


async def test_500_is_transient_and_quotes_the_body() -> None:
    reply = Reply(status=500, chunks=[b"upstream exploded"], headers={"Content-Type": "text/plain"})
    async with LoopbackServer([reply]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url))
    assert isinstance(error, TransientModelError)
    assert error.status == 500
    assert "HTTP 500" in str(error) and "upstream exploded" in str(error)


async def test_400_is_final_and_carries_the_servers_message() -> None:
    body = {
        "error": {
            "message": "This model's maximum context length is 8192 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    async with LoopbackServer([json_reply(400, body)]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url))
    assert not isinstance(error, TransientModelError)
    assert (error.retryable, error.status) == (False, 400)
    assert "maximum context length is 8192 tokens. [context_length_exceeded]" in str(error)
    assert "refused a conversation longer than the model's context window" in str(error)


async def test_401_without_a_key_says_to_set_it() -> None:
    async with LoopbackServer([json_reply(401, {"error": "missing key"})]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url))
    assert (error.retryable, error.status) == (False, 401)
    assert "missing key" in str(error)
    assert "no API key was sent: set $OPENAI_API_KEY" in str(error)


async def test_401_with_a_key_says_to_check_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
    body = {"error": {"message": "Incorrect API key provided.", "code": "invalid_api_key"}}
    async with LoopbackServer([json_reply(401, body)]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url))
    assert server.requests[0].headers["authorization"] == "Bearer sk-wrong"
    assert error.status == 401
    assert "Incorrect API key provided." in str(error)
    assert "check the API key in $OPENAI_API_KEY" in str(error)
    assert "sk-wrong" not in str(error)


async def test_404_says_to_check_the_model_name_and_base_url() -> None:
    body = {"detail": "Not Found"}
    async with LoopbackServer([json_reply(404, body)]) as server:
        error = await raises(OpenAIChatModel("nope", base_url=server.url))
    assert (error.retryable, error.status) == (False, 404)
    assert "Check the model name 'nope' and the base URL" in str(error)
    assert server.url in str(error)


async def test_malformed_sse_is_a_model_error() -> None:
    stream = sse(chunk({"content": "ok"}), "{not json", done=False)
    async with LoopbackServer([Reply(chunks=stream)]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url))
    assert type(error) is ModelError and not error.retryable
    assert "malformed stream event (not JSON:" in str(error) and "{not json" in str(error)


async def test_a_chunk_that_is_not_an_object_is_a_model_error() -> None:
    async with LoopbackServer([Reply(chunks=sse("[1, 2]"))]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url))
    assert "not a JSON object" in str(error)


async def test_invalid_tool_arguments_name_the_tool_and_the_text() -> None:
    stream = sse(
        chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "search"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q": "x"'}}]}),
        chunk({}, finish="tool_calls"),
    )
    async with LoopbackServer([Reply(chunks=stream)]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url))
    assert not error.retryable
    assert "tool 'search'" in str(error)
    assert """'{"q": "x"'""" in str(error)


async def test_an_error_object_mid_stream_is_a_model_error() -> None:
    stream = sse(
        chunk({"content": "partial"}),
        {"error": {"message": "content filter triggered", "type": "invalid_request_error"}},
    )
    async with LoopbackServer([Reply(chunks=stream)]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url))
    assert not error.retryable
    assert "content filter triggered" in str(error)


async def test_a_dropped_connection_is_transient() -> None:
    async with LoopbackServer([Reply(drop=True)]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url))
    assert isinstance(error, TransientModelError)
    assert error.status is None
    assert server.url in str(error)


async def test_a_stream_cut_short_is_transient() -> None:
    stream = sse(chunk({"content": "Hel"}), done=False)
    async with LoopbackServer([Reply(chunks=stream)]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url))
    assert isinstance(error, TransientModelError)
    assert "before the response was complete" in str(error)


async def test_a_silent_server_times_out_as_transient() -> None:
    async with LoopbackServer([Reply(hold=True)]) as server:
        error = await raises(OpenAIChatModel("m", base_url=server.url, timeout=0.2))
        await asyncio.wait_for(server.client_gone.wait(), HANG_GUARD)
    assert isinstance(error, TransientModelError)
    assert "did not answer within 0.2 s" in str(error)


async def test_a_server_that_trickles_ends_at_the_deadline() -> None:
    """Each piece well within the timeout, the answer never ends: the whole call has
    ``deadline`` seconds."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    reply = Reply(raw=[head], flood=b": ping\n", every=0.01)
    async with LoopbackServer([reply]) as server:
        model = OpenAIChatModel("m", base_url=server.url, timeout=5, deadline=0.5)
        async with asyncio.timeout(HANG_GUARD):
            error = await raises(model)
        await asyncio.wait_for(server.client_gone.wait(), HANG_GUARD)
    assert isinstance(error, TransientModelError) and error.status is None
    assert "did not finish the call within its deadline of 0.5 s" in str(error)


# --- cancellation -------------------------------------------------------------------------------


async def test_closing_the_stream_closes_the_http_response() -> None:
    reply = Reply(chunks=sse(chunk({"content": "first"}), done=False), hold=True)
    async with LoopbackServer([reply]) as server:
        model = OpenAIChatModel("m", base_url=server.url)
        stream = cast(AsyncGenerator[ModelEvent, None], model.stream(HELLO))
        first = await anext(stream)
        assert first.text == "first"
        assert not server.client_gone.is_set()
        await stream.aclose()
        await asyncio.wait_for(server.client_gone.wait(), HANG_GUARD)


async def test_cancelling_the_consumer_closes_the_http_response() -> None:
    reply = Reply(chunks=sse(chunk({"content": "first"}), done=False), hold=True)
    got_first = asyncio.Event()
    seen: list[str] = []

    async def consume(model: OpenAIChatModel) -> None:
        async for event in model.stream(HELLO):
            seen.append(event.text)
            got_first.set()

    async with LoopbackServer([reply]) as server:
        task = asyncio.create_task(consume(OpenAIChatModel("m", base_url=server.url)))
        await asyncio.wait_for(got_first.wait(), HANG_GUARD)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.client_gone.wait(), HANG_GUARD)
    assert seen == ["first"]


# --- shipping to other loops and processes ------------------------------------------------------


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_pickles_after_use_and_works_in_a_fresh_event_loop(dumps: Any) -> None:
    model = OpenAIChatModel(
        "m",
        api_key="sk-1",
        retry=RetryOptions(max_retries=5),
        temperature=0.1,
        max_tokens=9,
        extra_body={"seed": 1},
        timeout=5,
    )

    async def use(m: OpenAIChatModel) -> tuple[list[ModelEvent], LoopbackServer]:
        async with LoopbackServer([Reply(chunks=TEXT_STREAM)]) as server:
            m.base_url = server.url  # each loop gets its own server; the model is reused as is
            events = await collect(m.stream(HELLO))
            await m.aclose()
            await m.aclose()
        return events, server

    asyncio.run(use(model))  # first use caches what it can (the TLS context)
    data = dumps(model)
    assert b"SSLContext" not in data
    copy = pickle.loads(data)
    assert isinstance(copy, OpenAIChatModel)
    assert (copy.model, copy.retry, copy.temperature, copy.max_tokens, copy.timeout) == (
        "m",
        RetryOptions(max_retries=5),
        0.1,
        9,
        5.0,
    )
    events, server = asyncio.run(use(copy))
    assert completed(events).message.content == "Hello"
    assert server.requests[0].headers["authorization"] == "Bearer sk-1"
    assert server.requests[0].body["seed"] == 1
    # The original still works after its copy ran in another loop.
    events, _ = asyncio.run(use(model))
    assert completed(events).usage == Usage(12, 3)


_CHILD = """
import asyncio, json, sys
import cloudpickle
from zett_agent.messages import UserMessage
from zett_agent.model import ModelRequest

model = cloudpickle.loads(sys.stdin.buffer.read())

async def main():
    events = [e async for e in model.stream(ModelRequest(messages=(UserMessage("hi"),)))]
    response = events[-1].response
    return {"deltas": [e.text for e in events[:-1]], "content": response.message.content,
            "usage": [response.usage.input_tokens, response.usage.output_tokens]}

print(json.dumps(asyncio.run(main())))
"""


def test_works_in_a_freshly_spawned_interpreter() -> None:
    """The model has no state bound to the parent's loop or process: ship it and use it."""
    with served_in_thread([Reply(chunks=TEXT_STREAM)]) as server:
        model = OpenAIChatModel("m", base_url=server.url)
        child = subprocess.run(
            [sys.executable, "-c", _CHILD],
            input=cloudpickle.dumps(model),
            capture_output=True,
            timeout=60,
            check=False,
        )
    assert child.returncode == 0, child.stderr.decode()
    expected = {"deltas": ["Hel", "lo"], "content": "Hello", "usage": [12, 3]}
    assert json.loads(child.stdout) == expected
    assert server.requests[0].body["messages"] == [{"role": "user", "content": "hi"}]


def test_runs_under_uvloop() -> None:
    reply = Reply(chunks=sse(chunk({"content": "first"}), done=False), hold=True)

    async def scenario() -> list[str]:
        async with LoopbackServer([Reply(chunks=TEXT_STREAM), reply]) as server:
            model = OpenAIChatModel("m", base_url=server.url)
            events = await collect(model.stream(HELLO))
            stream = cast(AsyncGenerator[ModelEvent, None], model.stream(HELLO))
            first = await anext(stream)
            await stream.aclose()
            await asyncio.wait_for(server.client_gone.wait(), HANG_GUARD)
        return [e.text for e in events[:-1]] + [first.text]

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(scenario()) == ["Hel", "lo", "first"]
