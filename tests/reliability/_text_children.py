"""Child-side code of the hostile-text tests: jobs and child agents whose text is not valid
Unicode (a lone surrogate), and a parent model that encodes its requests like a real adapter.

An importable module (not the test file) so child processes load it by reference, cheaply.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from support.children import schema
from support.scripted_models import StepModel
from zett_agent.messages import AssistantMessage, ToolCall
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from zett_agent.process import emit
from zett_agent.process._wire._protocol import HEADER
from zett_agent.tools import AgentTool

#: a lone surrogate: Python holds it, UTF-8 cannot encode it
LONE = "\ud800"


def strict_utf8(request: ModelRequest) -> bytes:
    """The request as a real adapter sends it: JSON, encoded to UTF-8 strictly (raises
    ``UnicodeEncodeError`` for a lone surrogate anywhere in it)."""
    body = {
        "system": request.system_prompt,
        "messages": [dataclasses.asdict(m) | {"role": m.role} for m in request.messages],
        "tools": [dataclasses.asdict(t) for t in request.tools],
    }
    return json.dumps(body, ensure_ascii=False, default=str).encode("utf-8")


class StrictStepModel(StepModel):
    """``StepModel`` whose every request must encode to UTF-8 (else the parent's request fails,
    as it would against a model server)."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        strict_utf8(request)
        async for event in super().stream(request):
            yield event


# ------------------------------------------------------------------ engine jobs


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def write_frames(payloads: list[bytes]) -> None:
    """Tell the parent our pid, write ``payloads`` as frames into the result channel, wait to
    be killed."""
    from zett_agent.process._child._worker import _channel_fd

    emit(os.getpid())
    os.write(_channel_fd(), b"".join(frame(p) for p in payloads))
    time.sleep(600)


def emit_lone_surrogate() -> str:
    """``emit`` refuses a lone surrogate in the child; the job returns what it said."""
    try:
        emit({"note": ["fine", "x" + LONE]})
    except TypeError as exc:
        return str(exc)
    return "emit() sent it"


def return_lone_surrogate(size: int) -> dict[str, Any]:
    """A result holding a lone surrogate after ``size`` characters (streamed when long)."""
    return {"ok": "yes", "report": "r" * size + LONE}


def raise_lone_surrogate() -> None:
    raise ValueError(f"bad {LONE} text")


def emoji_pair() -> str:
    """An escaped surrogate pair, written by hand: a valid emoji."""
    from zett_agent.process._child._worker import _channel_fd

    os.write(_channel_fd(), frame(b'{"k":"event","v":"\\ud83d\\ude00 \\uD83D\\uDE00"}'))
    return "\U0001f600"


# ------------------------------------------------------------------ child agents


class LoneSurrogateChild:
    """A child whose model calls a tool whose name holds a lone surrogate, then answers with
    a report that holds one: what a model server's bad output can look like."""

    retry = RetryOptions(max_retries=0)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if not any(m.role == "tool" for m in request.messages):
            call = ToolCall("c1", "look" + LONE, {})
            message = AssistantMessage(tool_calls=(call,))
        else:
            message = AssistantMessage("report " + LONE + " end")
        yield ModelEvent.completed(ModelResponse(message, Usage(3, 2)))


class BrokenChild:
    """A child whose model raises an exception holding a lone surrogate."""

    retry = RetryOptions(max_retries=0)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        raise RuntimeError("model broke " + LONE)
        yield  # pragma: no cover  (an async generator)


def _raw_frame() -> str:
    write_frames([b'{"k":"event","v":{"kind":"progress","note":"\\udfff"}}'])
    return "unreachable"


#: a tool that writes a lone surrogate escape into the child's result channel by hand
RAW_FRAME_TOOL = AgentTool(
    "raw_frame",
    "Write a frame with a lone surrogate into the result channel.",
    schema(),
    _raw_frame,
)


class RawFrameChild:
    """A child that calls ``raw_frame`` (and never gets an answer: the parent kills it)."""

    retry = RetryOptions(max_retries=0)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        message = AssistantMessage(tool_calls=(ToolCall("r1", "raw_frame", {}),))
        yield ModelEvent.completed(ModelResponse(message, Usage(1, 1)))
