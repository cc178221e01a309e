"""The offline models replay deterministically and travel to child processes with cloudpickle."""

from __future__ import annotations

import cloudpickle

from support.calls import call
from zett_agent.messages import AssistantMessage, UserMessage
from zett_agent.model import (
    Model,
    ModelEventKind,
    ModelRequest,
    ModelResponse,
    RetryOptions,
    TransientModelError,
    Usage,
)
from zett_agent.testing import FunctionModel, ScriptedModel, ScriptExhaustedError

REQUEST = ModelRequest(messages=(UserMessage("hi"),))


async def collect(model: Model) -> list[object]:
    return [event async for event in model.stream(REQUEST)]


async def test_scripted_model_replays_items_in_order() -> None:
    usage = Usage(1, 1)
    model = ScriptedModel(
        [
            "text",
            call("echo", text="a"),
            ModelResponse(AssistantMessage("r"), usage),
            TransientModelError("x"),
        ]
    )
    assert isinstance(model, Model)
    first = await collect(model)
    assert [e.kind for e in first] == [ModelEventKind.TEXT_DELTA, ModelEventKind.COMPLETED]  # type: ignore[attr-defined]
    second = await collect(model)
    assert second[-1].response.message.tool_calls[0].name == "echo"  # type: ignore[attr-defined]
    third = await collect(model)
    assert third[-1].response.usage == usage  # type: ignore[attr-defined]
    try:
        await collect(model)
    except TransientModelError:
        pass
    else:
        raise AssertionError("the scripted exception was not raised")
    try:
        await collect(model)
    except ScriptExhaustedError as error:
        assert not error.retryable and "only 4 responses" in str(error)
    assert model.requests == [REQUEST] * 5


async def test_function_model_accepts_sync_and_async_functions() -> None:
    async def answer(request: ModelRequest) -> str:
        return f"{len(request.messages)} messages"

    assert (await collect(FunctionModel(answer)))[-1].response.message.content == "1 messages"  # type: ignore[attr-defined]
    sync = FunctionModel(lambda request: AssistantMessage("sync"))
    assert (await collect(sync))[-1].response.message.content == "sync"  # type: ignore[attr-defined]


async def test_a_pickled_scripted_model_starts_its_script_over_with_no_history() -> None:
    scripted = ScriptedModel(["a", "b"], retry=RetryOptions(max_retries=2))
    await collect(scripted)  # the parent used "a": a child must not continue at "b"
    copy = cloudpickle.loads(cloudpickle.dumps(scripted))
    assert copy.retry == RetryOptions(max_retries=2)
    assert copy.requests == [] and copy.remaining == 2
    assert (await collect(copy))[-1].response.message.content == "a"
    assert (await collect(scripted))[-1].response.message.content == "b"  # original unchanged


async def test_a_pickled_function_model_keeps_its_function_but_not_its_requests() -> None:
    prefix = "closure"
    model = FunctionModel(lambda r: f"{prefix} says hi")
    marked = ModelRequest(messages=(UserMessage("marker-7f3a of the parent's history"),))
    for _ in range(3):
        [_ async for _ in model.stream(marked)]
    data = cloudpickle.dumps(model)
    assert b"marker-7f3a" not in data  # no request of the parent travels
    copy = cloudpickle.loads(data)
    assert copy.requests == []
    assert (await collect(copy))[-1].response.message.content == "closure says hi"
    assert len(model.requests) == 3


async def test_function_model_keeps_only_its_last_requests() -> None:
    model = FunctionModel(lambda r: "ok", keep_requests=2)
    requests = [ModelRequest(messages=(UserMessage(str(i)),)) for i in range(5)]
    for request in requests:
        [_ async for _ in model.stream(request)]
    assert model.requests == requests[-2:]


async def test_a_pickled_function_model_leaves_its_request_log_behind() -> None:
    """A long-lived parent's model ships to each child at the same size, whatever it answered."""
    model = FunctionModel(lambda request: "ok")
    fresh = len(cloudpickle.dumps(model))
    for _ in range(50):
        await collect(model)
    data = cloudpickle.dumps(model)
    assert len(data) == fresh
    copy = cloudpickle.loads(data)
    assert copy.requests == [] and len(model.requests) == 50
    assert (await collect(copy))[-1].response.message.content == "ok"
    assert len(copy.requests) == 1
