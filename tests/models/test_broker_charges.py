"""What the broker charges a child for each model call, however the call ends.

Unit tests: a ``Broker`` over a fake job and scripted models, in this process. The end-to-end
case (a real child that abandons every stream, stopped by its budget) is in
``test_brokered_model.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from zett_agent._model import (
    ModelError,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    RetryOptions,
    ToolSpec,
    Usage,
)
from zett_agent.messages import AgentMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from zett_agent.runners._broker import _parent as _broker
from zett_agent.runners._broker._usage import (
    CallCharge,
    estimated_tokens,
    request_chars,
    request_chars_in_steps,
    response_chars,
)
from zett_agent.runners._broker._wire import encode_request

HANG_GUARD = 60

# -- the estimate ------------------------------------------------------------------------------


def test_the_estimate_counts_about_four_characters_a_token() -> None:
    request = ModelRequest(
        (
            UserMessage("u" * 10),  # 10
            AssistantMessage(
                "a" * 3,
                # 3 + "c1" + "grep" = 9, and the arguments: "pattern" "xy" "n" 1 2 "deep" "k"
                # None = 7 + 2 + 1 + 1 + 1 + 4 + 1 + 1 = 18
                (ToolCall("c1", "grep", {"pattern": "xy", "n": [1, 2], "deep": {"k": None}}),),
            ),
            ToolMessage("c1", "grep", "t" * 5),  # 2 + 4 + 5 = 11
            AgentMessage("n" * 4, source="tasks"),  # 4 + 5 = 9
        ),
        # "grep" "search" = 10, and the schema: "type" "object" = 10
        tools=(ToolSpec("grep", "search", {"type": "object"}),),
        system_prompt="s" * 7,  # 7
        metadata={"not sent": "to the provider" * 100},
    )
    assert request_chars(request) == 7 + 10 + 9 + 18 + 11 + 9 + 10 + 10
    assert [estimated_tokens(n) for n in (0, 1, 4, 5, 84, 85)] == [0, 1, 1, 2, 21, 22]
    answer = AssistantMessage("x" * 6, (ToolCall("c2", "read", {"path": "/a/b"}),))
    assert response_chars(answer) == 6 + len("read") + len("path") + len("/a/b")


def test_a_large_request_is_walked_a_slice_at_a_time() -> None:
    arguments = {"files": [f"file-{n}" for n in range(10_000)]}
    request = ModelRequest(
        (AssistantMessage("", (ToolCall("c", "write", arguments),)),),
        tools=tuple(ToolSpec(f"tool{n}", "", {}) for n in range(1_000)),
    )
    steps = request_chars_in_steps(request, step=100)
    yields = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            total = done.value
            break
        yields += 1
    assert yields >= 10_000 // 100  # one tool call's arguments are split across slices too
    assert total == request_chars(request)
    expected = len("c") + len("write") + len("files") + sum(len(f) for f in arguments["files"])
    assert total == expected + sum(len(f"tool{n}") for n in range(1_000))


def test_a_call_is_charged_what_was_reported_else_the_estimate_else_nothing() -> None:
    charge = CallCharge()
    charge.input_chars = 40
    assert charge.final() == (0, 0)  # never made
    charge.reached = True
    assert charge.final() == (10, 0)  # made, nothing streamed
    charge.streamed = True
    assert charge.final() == (10, 1)  # something streamed (an empty delta): at least one token
    charge.output_chars = 9
    assert charge.final() == (10, 3)
    charge.reported = Usage(7, 2)
    assert charge.final() == (7, 2)  # the provider's word wins
    refused = CallCharge()
    refused.input_chars, refused.reached, refused.refused = 40, True, True
    assert refused.final() == (0, 0)  # an HTTP error answer before any output


# -- each way a call ends ----------------------------------------------------------------------


class FakeJob:
    """What a ``Broker`` needs of a job: ``send`` (recorded; each send wakes ``until``)."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self._changed = asyncio.Event()

    async def send(self, value: Any, *, topic: str = "") -> None:
        self.sent.append(value)
        self._changed.set()

    async def until(self, count: int) -> None:
        async with asyncio.timeout(HANG_GUARD):
            while len(self.sent) < count:
                self._changed.clear()
                await self._changed.wait()


class Scripted:
    """A model that streams ``deltas``, then does ``then``: complete (with ``usage``), hang,
    raise, or end without completing. Counts its calls, and the streams closed early."""

    retry = RetryOptions()

    def __init__(self, deltas: list[str], then: str, usage: Usage | None = None) -> None:
        self.deltas, self.then, self.usage = deltas, then, usage
        self.calls = 0
        self.closed_early = 0
        self.answer = AssistantMessage("".join(deltas))

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.calls += 1
        finished = False
        try:
            for text in self.deltas:
                yield ModelEvent.text_delta(text)
            if self.then == "complete":
                finished = True
                yield ModelEvent.completed(ModelResponse(self.answer, self.usage))
            elif self.then == "hang":
                await asyncio.Event().wait()
            elif self.then == "refuse":
                raise ModelError("HTTP 429: slow down", status=429)
            elif self.then == "drop":
                raise ModelError("the connection dropped")
        finally:
            if not finished:
                self.closed_early += 1


PROMPT = "p" * 100  # 25 tokens in


def call(call_id: int, text: str = PROMPT) -> dict[str, Any]:
    request = encode_request(ModelRequest((UserMessage(text),)))
    return {_broker.KEY: {"op": "call", "id": call_id, "slot": 0, "request": request}}


def cancel(call_id: int) -> dict[str, Any]:
    return {_broker.KEY: {"op": "cancel", "id": call_id}}


async def settle(broker: _broker.Broker) -> None:
    async with asyncio.timeout(HANG_GUARD):
        while broker.busy:
            await broker.wait_closed()


def told(broker: _broker.Broker, answer: Callable[[int], bool] | None = None) -> list[Any]:
    """Record what ``on_usage`` is told: ``(input, output, more)`` each time."""
    heard: list[Any] = []

    def on_usage(more: int) -> bool:
        heard.append((broker.input_tokens, broker.output_tokens, more))
        return True if answer is None else answer(more)

    broker.on_usage = on_usage
    return heard


@pytest.mark.parametrize(
    ("deltas", "then", "usage", "end", "charged"),
    [
        (["Hello", " there"], "complete", Usage(7, 3), None, (7, 3)),
        # no usage in the completed event: its content, 11 characters
        (["Hello", " there"], "complete", None, None, (25, 3)),
        (["abcdefghi"], "hang", None, "child cancels", (25, 3)),
        (["abcdefghi"], "hang", None, "broker closes", (25, 3)),
        ([""], "hang", None, "child cancels", (25, 1)),  # something streamed: one token
        (["abcd"], "drop", None, None, (25, 1)),  # an error mid-stream
        ([], "drop", None, None, (25, 0)),  # a dropped connection: the input was sent
        ([], "refuse", None, None, (0, 0)),  # an HTTP error answer: the provider did no work
        (["abcdefgh"], "end", None, None, (25, 2)),  # ended without a completed event
    ],
)
async def test_each_way_a_call_ends_charges_it_once(
    deltas: list[str], then: str, usage: Usage | None, end: str | None, charged: tuple[int, int]
) -> None:
    job = FakeJob()
    model = Scripted(deltas, then, usage)
    broker = _broker.Broker(job, [model])  # type: ignore[arg-type]
    heard = told(broker)
    calls = 1 if end == "broker closes" else 2  # two: the totals are two charges, each once
    for number in range(calls):
        assert broker.accept(call(number), 100)
        if end is not None:
            await job.until(len(job.sent) + len(deltas))  # the deltas reached the child
            if end == "child cancels":
                assert broker.accept(cancel(number), 10)
            else:
                broker.close()
        await settle(broker)
    assert model.calls == calls
    assert (broker.input_tokens, broker.output_tokens) == (
        calls * charged[0],
        calls * charged[1],
    )
    assert heard[0] == (0, 0, 25)  # asked before the first call was made, with its input
    assert heard[-1][:2] == (broker.input_tokens, broker.output_tokens)  # told the end


async def test_parallel_calls_cannot_each_pass_under_the_budget() -> None:
    job = FakeJob()
    model = Scripted(["x"], "hang")
    broker = _broker.Broker(job, [model])  # type: ignore[arg-type]
    budget = 60

    def within(more: int) -> bool:  # what the task guard answers
        return broker.input_tokens + broker.output_tokens + more <= budget

    heard = told(broker, within)
    for number in range(_broker.MAX_CALLS):  # all at once, before any is answered
        assert broker.accept(call(number), 100)
    await settle(broker)  # the third call would pass the budget: the broker closed
    assert model.calls == 2 and model.closed_early == 2
    assert (broker.input_tokens, broker.output_tokens) == (2 * 25, 2 * 1)
    # each call was asked about with the inputs of those under way held
    assert [held for held, _, more in heard if more] == [0, 25, 50]
    assert broker.calls == 2


async def test_a_long_stream_is_stopped_by_the_budget_mid_way() -> None:
    job = FakeJob()
    model = Scripted(["word"] * 1_000, "complete", Usage(25, 1_000))
    broker = _broker.Broker(job, [model])  # type: ignore[arg-type]
    told(broker, lambda more: broker.input_tokens + broker.output_tokens + more <= 100)
    assert broker.accept(call(1), 100)
    await settle(broker)
    assert model.closed_early == 1  # closed before its end
    sent = [answer for answer in job.sent if "text" in answer]
    assert not [answer for answer in job.sent if "done" in answer]
    # the budget hears every _TELL_EVERY estimated tokens: it stops the stream there
    assert len(sent) < 1_000 and broker.output_tokens == _broker._TELL_EVERY
    assert broker.input_tokens == 25
