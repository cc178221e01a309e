"""What the brokered children of ``test_brokered_model.py`` run (sent to them by value)."""

from __future__ import annotations

import json
import os
from typing import Any

from zett_agent._model import ModelEventKind, ModelRequest, RetryOptions
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from zett_agent.process import emit
from zett_agent.process._child._inbox import receive
from zett_agent.runners._broker._standin import BrokeredModel
from zett_agent.runners._broker._wire import KEY, TOPIC
from zett_agent.tools import AgentTool

_EMPTY: dict[str, Any] = {"type": "object", "properties": {}}


def _pid() -> str:
    return json.dumps({"pid": os.getpid()})


PID_TOOL = AgentTool("pid", "Return the process id.", _EMPTY, _pid)


def pid_step(request: ModelRequest) -> AssistantMessage:
    """A child's model: call ``pid``, then report what it returned."""
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    if not results:
        return AssistantMessage(tool_calls=(ToolCall("p", "pid", {}),))
    return AssistantMessage(results[-1].text)


def _wait_here(ready: str, go: str) -> str:
    """Tell the test our pid through ``ready``, then block until it writes to ``go``."""
    with open(ready, "w") as stream:
        stream.write(f"{os.getpid()}\n")
    with open(go) as stream:
        return stream.readline().strip()


WAIT_TOOL = AgentTool(
    "wait_here",
    "Wait for the test.",
    {
        "type": "object",
        "properties": {"ready": {"type": "string"}, "go": {"type": "string"}},
        "required": ["ready", "go"],
    },
    _wait_here,
)


def _block_until_line(path: str) -> None:
    """Block the whole child (its event loop too, on purpose) until the test writes a line."""
    with open(path) as stream:
        stream.readline()


def _valid_request(text: str = "hi") -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": text}],
        "tools": [],
        "system_prompt": None,
        "metadata": {},
    }


async def _answers(count: int) -> list[dict[str, Any]]:
    return [await receive(TOPIC) for _ in range(count)]


async def _attack(max_calls: int, max_request_bytes: int, go: str) -> str:
    """Break every rule of the broker protocol, collect the parent's answers, then show that
    the calls the rules allow are still served."""
    malformed: list[Any] = [
        "not an object",
        {"op": "call", "id": -1},
        {"op": "call", "id": True},
        {"op": "call", "id": 2**60},
        {"op": "call", "id": "7"},
        {"op": "steal", "id": 5},
        {"op": "call", "id": 6, "slot": 0},
        {"op": "call", "id": 7, "slot": 99, "request": _valid_request()},
        {"op": "call", "id": 8, "slot": "0", "request": _valid_request()},
        {"op": "call", "id": 9, "slot": 0, "request": {"messages": [{"role": "root"}]}},
        {
            "op": "call",
            "id": 10,
            "slot": 0,
            "request": {**_valid_request(), "messages": [{"role": "user", "content": 5}]},
        },
        {
            "op": "call",
            "id": 11,
            "slot": 0,
            "request": {
                **_valid_request(),
                "messages": [{"role": "user", "content": "x", "base_url": "http://evil"}],
            },
        },
        {"op": "call", "id": 12, "slot": 0, "request": {**_valid_request(), "model": "gpt-9"}},
        {"op": "call", "id": 13, "slot": 0, "request": _valid_request("x" * max_request_bytes)},
    ]
    for message in malformed:
        emit({KEY: message})
    answers = await _answers(len(malformed))
    # as many calls as the parent serves at once (the endpoint holds each open), then more
    for call_id in range(100, 100 + max_calls + 2):
        emit({KEY: {"op": "call", "id": call_id, "slot": 0, "request": _valid_request()}})
    emit({KEY: {"op": "call", "id": 100, "slot": 0, "request": _valid_request()}})
    # the held calls stream their first delta; the extra ones and the duplicate are refused
    answers += await _answers(max_calls + 3)
    for call_id in range(100, 100 + max_calls):
        emit({KEY: {"op": "cancel", "id": call_id}})
    # a flood of garbage: the parent answers a bounded number and stays responsive
    for _ in range(2000):
        emit({KEY: [1, 2, 3]})
    # wait for the test to see the held upstream requests closed by the cancels
    _block_until_line(go)
    # a legitimate stand-in (slot 0) is still served after all that
    model = BrokeredModel(0, "direct", RetryOptions(max_retries=0))
    text = ""
    async for event in model.stream(ModelRequest((UserMessage("after the attack"),))):
        if event.kind is ModelEventKind.COMPLETED and event.response is not None:
            text = event.response.message.content
    return json.dumps({"answers": answers, "after": text})


def attack_tool(max_calls: int, max_request_bytes: int) -> AgentTool:
    async def attack(go: str) -> str:
        return await _attack(max_calls, max_request_bytes, go)

    return AgentTool(
        "attack",
        "Misbehave.",
        {"type": "object", "properties": {"go": {"type": "string"}}, "required": ["go"]},
        attack,
    )


async def _close_early(go: str) -> str:
    """Open a call with a stand-in, take its first delta, close the stream, then wait."""
    stream = BrokeredModel(0, "direct", RetryOptions(max_retries=0)).stream(
        ModelRequest((UserMessage("stream, then stop"),))
    )
    first = await anext(stream)
    await stream.aclose()
    _block_until_line(go)
    return first.text


CLOSE_EARLY_TOOL = AgentTool(
    "close_early",
    "Open a model stream and close it.",
    {"type": "object", "properties": {"go": {"type": "string"}}, "required": ["go"]},
    _close_early,
)


async def _abandon(times: int, text: str) -> str:
    """Make ``times`` model calls one after the other, each dropped after its first delta."""
    model = BrokeredModel(0, "direct", RetryOptions(max_retries=0))
    request = ModelRequest((UserMessage(text),))
    for _ in range(times):
        stream = model.stream(request)
        await anext(stream)
        await stream.aclose()  # before the completed event, which would carry the usage
    return f"abandoned {times} calls"


def abandon_tool(times: int, text: str) -> AgentTool:
    async def abandon() -> str:
        return await _abandon(times, text)

    return AgentTool("abandon", "Call the model and hang up early.", _EMPTY, abandon)
