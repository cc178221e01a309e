"""Chat Completions stream chunks and the checks the OpenAI adapter tests make of a stream.

``TEXT_STREAM`` is one plain text answer ("Hello") with a usage chunk, as the loopback server
(``support.openai_loopback``) sends it; ``completed`` and ``raises`` collect what the adapter
made of a stream.
"""

from __future__ import annotations

from typing import Any

import pytest

from support.openai_loopback import collect, sse
from zett_agent.messages import UserMessage
from zett_agent.model import ModelError, ModelEvent, ModelEventKind, ModelRequest
from zett_agent.models.openai import OpenAIChatModel

HELLO = ModelRequest(messages=(UserMessage("hi"),))


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """One streamed chunk of the first choice."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
    """The last chunk of a stream asked for with usage: no choices, the token counts."""
    return {
        "id": "chatcmpl-1",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


TEXT_STREAM = sse(
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hel"}),
    chunk({"content": "lo"}),
    chunk({}, finish="stop"),
    usage_chunk(12, 3),
)


def completed(events: list[ModelEvent]) -> Any:
    """The response of a stream of text deltas that ends completed."""
    assert events[-1].kind is ModelEventKind.COMPLETED
    assert all(e.kind is ModelEventKind.TEXT_DELTA for e in events[:-1])
    return events[-1].response


async def raises(model: OpenAIChatModel, request: ModelRequest = HELLO) -> ModelError:
    """The ``ModelError`` streaming ``request`` from ``model`` raises."""
    with pytest.raises(ModelError) as info:
        await collect(model.stream(request))
    return info.value
