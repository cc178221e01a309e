"""Anthropic Messages stream events, as the loopback server (``support.openai_loopback``) sends.

``events(...)`` turns event objects into SSE (``event: TYPE`` then ``data: JSON``);
``text_message`` and ``tool_message`` are whole streamed answers, the way the Messages API
streams them.
"""

from __future__ import annotations

import json
from typing import Any


def event(data: dict[str, Any]) -> bytes:
    """One server-sent event, named by its ``type``."""
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def events(*items: dict[str, Any]) -> list[bytes]:
    return [event(item) for item in items]


def message_start(input_tokens: int = 10, cache_read: int = 0, cache_write: int = 0) -> dict:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [],
            "stop_reason": None,
            "usage": {
                "input_tokens": input_tokens,
                "cache_read_input_tokens": cache_read,
                "cache_creation_input_tokens": cache_write,
                "output_tokens": 1,
            },
        },
    }


def text_block(index: int, *pieces: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "text", "text": ""},
        },
        *(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": p},
            }
            for p in pieces
        ),
        {"type": "content_block_stop", "index": index},
    ]


def tool_block(index: int, call_id: str, name: str, *json_pieces: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}},
        },
        *(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": p},
            }
            for p in json_pieces
        ),
        {"type": "content_block_stop", "index": index},
    ]


def message_end(stop_reason: str = "end_turn", output_tokens: int = 3) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


def text_message(*pieces: str, input_tokens: int = 12, output_tokens: int = 3) -> list[bytes]:
    return events(
        message_start(input_tokens),
        {"type": "ping"},
        *text_block(0, *pieces),
        *message_end("end_turn", output_tokens),
    )


def tool_message(call_id: str, name: str, arguments: dict[str, Any]) -> list[bytes]:
    text = json.dumps(arguments)
    half = len(text) // 2
    return events(
        message_start(20),
        *tool_block(0, call_id, name, text[:half], text[half:]),
        *message_end("tool_use", 5),
    )
