"""AnthropicModel against a scripted Messages API server on loopback."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncGenerator
from typing import Any, cast

import cloudpickle
import pytest

from support.anthropic_events import (
    event,
    events,
    message_end,
    message_start,
    text_block,
    text_message,
    tool_block,
    tool_message,
)
from support.openai_chunks import HELLO, completed, raises
from support.openai_loopback import LoopbackServer, Reply, collect, json_reply
from zett_agent.messages import (
    AgentMessage,
    AssistantMessage,
    ToolCall,
    ToolMessage,
    ToolStatus,
    UserMessage,
)
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
from zett_agent.models.anthropic import AnthropicModel

HANG_GUARD = 10.0


@pytest.fixture(autouse=True)
def _no_anthropic_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)


def local(server: LoopbackServer, **options: Any) -> AnthropicModel:
    return AnthropicModel("claude-test", base_url=server.url.removesuffix("/v1"), **options)


# --- the public surface -------------------------------------------------------------------------


def test_is_a_model_repr_hides_the_key_and_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    model = AnthropicModel("claude-test", api_key="sk-ant-secret")
    assert isinstance(model, Model)
    assert "sk-ant-secret" not in repr(model)
    assert model.span_attributes == {
        "gen_ai.provider.name": "anthropic",
        "server.address": "api.anthropic.com",
        "server.port": 443,
    }
    with pytest.raises(
        ValueError, match="set ANTHROPIC_API_KEY in the environment or pass api_key="
    ):
        model_from_spec("anthropic:claude-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    spec = model_from_spec("anthropic:claude-test")
    assert isinstance(spec, AnthropicModel) and spec.url == "https://api.anthropic.com/v1/messages"
    other = model_from_spec("anthropic:c:1", base_url="http://127.0.0.1:9/")
    assert isinstance(other, AnthropicModel) and other.base_url == "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": ""}, "model name"),
        ({"model": "m", "base_url": "api.anthropic.com"}, "http:// or https://"),
        ({"model": "m", "timeout": 0, "api_key": "k"}, "timeout"),
        ({"model": "m", "deadline": 0, "api_key": "k"}, "deadline"),
        ({"model": "m", "max_tokens": 0, "api_key": "k"}, "max_tokens"),
        ({"model": "m", "extra_body": {"x": object()}, "api_key": "k"}, "JSON-serialisable"),
    ],
)
def test_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AnthropicModel(**kwargs)


# --- streaming ----------------------------------------------------------------------------------


async def test_streams_text_then_the_completed_message_with_usage_and_cache_tokens() -> None:
    stream = events(
        message_start(input_tokens=5, cache_read=100, cache_write=20),
        *text_block(0, "Hel", "lo"),
        *message_end("end_turn", 7),
    )
    async with LoopbackServer([Reply(chunks=stream)]) as server:
        events_ = await collect(local(server).stream(HELLO))
    assert [e.text for e in events_[:-1]] == ["Hel", "lo"]
    response = completed(events_)
    assert response.message == AssistantMessage(content="Hello")
    assert response.usage == Usage(125, 7, cache_read_tokens=100, cache_write_tokens=20)
    [received] = server.requests
    assert (received.method, received.path) == ("POST", "/v1/messages")
    assert received.body == {
        "model": "claude-test",
        "max_tokens": 4096,
        "stream": True,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    assert "x-api-key" not in received.headers and "authorization" not in received.headers
    assert received.headers["accept-encoding"] == "identity"


async def test_the_request_maps_system_tools_tool_use_and_results() -> None:
    request = ModelRequest(
        system_prompt="Be brief.",
        messages=(
            UserMessage("find x"),
            AssistantMessage(
                content="Looking.",
                tool_calls=(ToolCall("t1", "search", {"q": "x"}), ToolCall("t2", "read", {})),
            ),
            ToolMessage("t1", "search", "found x"),
            ToolMessage("t2", "read", "no file", ToolStatus.FAILED),
            AgentMessage("task 1 completed", source="async_subagent"),
            AssistantMessage(content="Done."),
        ),
        tools=(ToolSpec("search", "Search.", {"type": "object", "properties": {}}),),
    )
    async with LoopbackServer([Reply(chunks=text_message("ok"))]) as server:
        model = local(server, api_key="sk-ant-1", temperature=0.5, extra_body={"top_k": 3})
        await collect(model.stream(request))
    [received] = server.requests
    # the SDK sends the key as x-api-key or as a bearer token, by version
    sent = received.headers.get("x-api-key") or received.headers["authorization"]
    assert sent.removeprefix("Bearer ") == "sk-ant-1"
    assert received.body == {
        "model": "claude-test",
        "max_tokens": 4096,
        "stream": True,
        "system": "Be brief.",
        "temperature": 0.5,
        "top_k": 3,
        "tools": [
            {
                "name": "search",
                "description": "Search.",
                "input_schema": {"type": "object", "properties": {}},
            }
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "find x"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "t1", "name": "search", "input": {"q": "x"}},
                    {"type": "tool_use", "id": "t2", "name": "read", "input": {}},
                ],
            },
            {
                "role": "user",  # the results and the notice after them: one user turn
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "found x"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": "no file",
                        "is_error": True,
                    },
                    {"type": "text", "text": "task 1 completed"},
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
        ],
    }


async def test_tool_use_input_streamed_in_pieces_becomes_tool_calls() -> None:
    stream = events(
        message_start(),
        *text_block(0, "Let me look."),
        *tool_block(1, "toolu_a", "search", '{"q": "ze', 'tt", "n": 3}'),
        *tool_block(2, "toolu_b", "list"),  # no input deltas: the start's empty input
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta"}},
        *message_end("tool_use", 9),
    )
    async with LoopbackServer([Reply(chunks=stream)]) as server:
        response = completed(await collect(local(server).stream(HELLO)))
    assert response.message == AssistantMessage(
        content="Let me look.",
        tool_calls=(
            ToolCall("toolu_a", "search", {"q": "zett", "n": 3}),
            ToolCall("toolu_b", "list", {}),
        ),
    )


async def test_a_round_trip_of_a_tool_call() -> None:
    async with LoopbackServer([Reply(chunks=tool_message("toolu_1", "pid", {"a": 1}))]) as server:
        response = completed(await collect(local(server).stream(HELLO)))
    assert response.message.tool_calls == (ToolCall("toolu_1", "pid", {"a": 1}),)
    assert response.usage == Usage(20, 5)


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "transient", "says"),
    [
        (429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}, True,
         "rate-limited the request (HTTP 429): slow [rate_limit_error] (the server asks to retry "
         "after 3 s)"),
        (529, {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}, True,
         "is overloaded (HTTP 529): busy"),
        (500, {"type": "error", "error": {"type": "api_error", "message": "boom"}}, True,
         "failed (HTTP 500): boom"),
        (401, {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}},
         False, "no API key was sent: set $ANTHROPIC_API_KEY"),
        (404, {"type": "error", "error": {"type": "not_found_error", "message": "model: x"}},
         False, "Check the model name 'claude-test'"),
        (400, {"type": "error", "error": {"type": "invalid_request_error",
                                          "message": "prompt is too long: 300000 tokens"}},
         False, "refused a conversation longer than the model's context window (HTTP 400)"),
    ],
    ids=["429", "529", "500", "401", "404", "context"],
)  # fmt: skip
async def test_statuses_become_typed_errors(
    status: int, body: dict[str, Any], transient: bool, says: str
) -> None:
    reply = json_reply(status, body, headers={"Retry-After": "3"} if status == 429 else None)
    async with LoopbackServer([reply]) as server:
        error = await raises(local(server))  # type: ignore[arg-type]
        assert len(server.requests) == 1  # the SDK retried nothing
    assert isinstance(error, TransientModelError) is transient
    assert error.status == status
    assert says in str(error)


async def test_an_error_event_mid_stream() -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    invalid = {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}
    replies = [
        Reply(chunks=[*events(message_start(), *text_block(0, "par")), event(overloaded)]),
        Reply(chunks=[*events(message_start()), event(invalid)]),
    ]
    async with LoopbackServer(replies) as server:
        first = await raises(local(server))  # type: ignore[arg-type]
        second = await raises(local(server))  # type: ignore[arg-type]
    assert isinstance(first, TransientModelError)
    assert "reported an error mid-stream: Overloaded [overloaded_error]" in str(first)
    assert type(second) is ModelError and "mid-stream: no [invalid_request_error]" in str(second)


async def test_a_stream_cut_short_is_transient_and_malformed_data_final() -> None:
    cut = events(message_start(), *text_block(0, "Hel"))
    malformed = [event(message_start()), b"event: content_block_delta\ndata: {oops\n\n"]
    async with LoopbackServer([Reply(chunks=cut), Reply(chunks=malformed)]) as server:
        short = await raises(local(server))  # type: ignore[arg-type]
        bad = await raises(local(server))  # type: ignore[arg-type]
    assert isinstance(short, TransientModelError)
    assert "closed the stream before the message was complete" in str(short)
    assert type(bad) is ModelError and "malformed stream event (not JSON" in str(bad)
    assert "{oops" in str(bad)


async def test_tool_input_that_is_not_an_object_names_the_tool() -> None:
    stream = events(message_start(), *tool_block(0, "t", "search", "[1, 2]"), *message_end())
    async with LoopbackServer([Reply(chunks=stream)]) as server:
        error = await raises(local(server))  # type: ignore[arg-type]
    assert type(error) is ModelError
    assert "called tool 'search' with input that is not a JSON object: '[1, 2]'" in str(error)


async def test_the_anthropic_api_without_a_key_fails_before_any_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-at-construction")
    model = AnthropicModel("claude-test")
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    error = await raises(model)  # type: ignore[arg-type]
    assert type(error) is ModelError
    assert "set ANTHROPIC_API_KEY in the environment or pass api_key=" in str(error)


# --- cancellation and shipping ------------------------------------------------------------------


async def test_closing_the_stream_closes_the_http_response() -> None:
    reply = Reply(chunks=events(message_start(), *text_block(0, "first")[:2]), hold=True)
    async with LoopbackServer([reply]) as server:
        stream = cast(AsyncGenerator[ModelEvent, None], local(server).stream(HELLO))
        first = await anext(stream)
        await stream.aclose()
        await asyncio.wait_for(server.client_gone.wait(), HANG_GUARD)
    assert first.text == "first"


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_pickles_and_works_in_a_fresh_event_loop(dumps: Any) -> None:
    model = AnthropicModel("claude-test", api_key="sk-ant-1", retry=RetryOptions(max_retries=5))

    async def use(m: AnthropicModel) -> list[ModelEvent]:
        async with LoopbackServer([Reply(chunks=text_message("Hi"))]) as server:
            m.base_url = server.url.removesuffix("/v1")
            return await collect(m.stream(HELLO))

    asyncio.run(use(model))
    copy = pickle.loads(dumps(model))
    assert (copy.model, copy.retry) == ("claude-test", RetryOptions(max_retries=5))
    assert completed(asyncio.run(use(copy))).message.content == "Hi"
