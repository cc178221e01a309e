"""The wire format of OpenAI-compatible Chat Completions: request bodies, SSE, streamed deltas.

Pure functions and small state machines with no I/O, so the HTTP layer in ``openai.py`` stays thin
and every piece of the protocol can be tested without a server.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from zett_agent._messages import (
    AgentMessage,
    AssistantMessage,
    Message,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from zett_agent._model import (
    ModelError,
    ModelRequest,
    ModelResponse,
    ToolSpec,
    TransientModelError,
    Usage,
)

_SNIPPET = 300


def shorten(text: str, limit: int = _SNIPPET) -> str:
    """``text`` cut to ``limit`` characters, marking the cut, for error messages."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def encode_message(message: Message) -> dict[str, Any]:
    """One conversation message as a Chat Completions message object."""
    if isinstance(message, UserMessage):
        return {"role": "user", "content": message.content}
    if isinstance(message, AgentMessage):
        # Completion notices and other runtime additions are context the model should read as
        # user-side input; Chat Completions has no other role for them.
        return {"role": "user", "content": message.content}
    if isinstance(message, AssistantMessage):
        if not message.tool_calls:
            return {"role": "assistant", "content": message.content}
        return {
            "role": "assistant",
            # null, not "", is the canonical "no text" of a tool-calling assistant turn.
            "content": message.content or None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": json.dumps(dict(call.arguments), ensure_ascii=False),
                    },
                }
                for call in message.tool_calls
            ],
        }
    if isinstance(message, ToolMessage):
        return {"role": "tool", "tool_call_id": message.call_id, "content": message.text}
    raise TypeError(f"cannot send a {type(message).__name__} to a Chat Completions model")


def encode_tools(tools: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """Tool specs as Chat Completions ``tools`` entries."""
    return [
        {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": dict(spec.parameters),
            },
        }
        for spec in tools
    ]


def build_body(
    model: str,
    request: ModelRequest,
    *,
    temperature: float | None,
    max_tokens: int | None,
    extra_body: Mapping[str, Any],
) -> dict[str, Any]:
    """The JSON body of one streamed Chat Completions request.

    ``extra_body`` is merged last, so it can add provider-specific fields or override ours.
    """
    messages: list[dict[str, Any]] = []
    if request.system_prompt:
        messages.append({"role": "system", "content": request.system_prompt})
    messages.extend(encode_message(message) for message in request.messages)
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = encode_tools(request.tools)
    if temperature is not None:
        body["temperature"] = temperature
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    body.update(extra_body)
    return body


def error_detail(body: bytes) -> str:
    """The human-readable message of an error body, in the shapes OpenAI-compatible servers use.

    ``{"error": {"message": ..., "type": ..., "code": ...}}`` (OpenAI, vLLM, llama.cpp),
    ``{"error": "..."}``, ``{"message": ...}``, ``{"detail": ...}`` (FastAPI); anything else is
    returned as (shortened) text.
    """
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, str) and error:
            return shorten(error)
        if isinstance(error, dict):
            message = error.get("message") or error.get("detail")
            if isinstance(message, str) and message:
                code = error.get("code") or error.get("type")
                suffix = f" [{code}]" if isinstance(code, str) and code else ""
                return shorten(message) + suffix
            if message:
                return shorten(json.dumps(message))
    return shorten(" ".join(text.split())) if text else "(empty response body)"


class SSEDecoder:
    """Collects the ``data`` of Server-Sent Events, line by line, as the SSE spec defines.

    ``feed`` takes one line without its line ending and returns the data of an event when the line
    completes one (a blank line), else ``None``. Comments and fields other than ``data`` are
    ignored.
    """

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> list[str] | None:
        """The completed event's data lines, or ``None`` while an event is still open."""
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

    def flush(self) -> list[str] | None:
        """The data of an event the stream ended without terminating, if any."""
        data, self._data = self._data, []
        return data or None


def decode_event(data: list[str]) -> list[Any] | None:
    """The JSON chunks of one SSE event, or ``None`` for the ``[DONE]`` sentinel.

    Raises ``ModelError`` when the payload is not JSON.
    """
    joined = "\n".join(data)
    if joined.strip() == "[DONE]":
        return None
    try:
        return [json.loads(joined)]
    except ValueError:
        pass
    # Some servers omit the blank line between events, so one "event" holds several chunks.
    chunks: list[Any] = []
    for line in data:
        if line.strip() == "[DONE]":
            chunks.append(None)
            continue
        try:
            chunks.append(json.loads(line))
        except ValueError as exc:
            raise ModelError(
                f"the model endpoint sent a malformed stream event (not JSON): {shorten(joined)!r}"
            ) from exc
    return chunks


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ResponseAccumulator:
    """Builds one ``ModelResponse`` from streamed chunks (or from one non-streamed body)."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, _PartialCall] = {}
        self._usage: Usage | None = None
        self.finish_reason: str | None = None

    def add_chunk(self, chunk: Any) -> str:
        """Take one decoded chunk; return the text it adds (``""`` if none).

        Raises ``ModelError`` for an error object or a chunk that is not a JSON object.
        """
        if not isinstance(chunk, dict):
            raise ModelError(
                f"the model endpoint sent a stream chunk that is not a JSON object: "
                f"{shorten(json.dumps(chunk))}"
            )
        if chunk.get("error"):
            raise _stream_error(chunk)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = Usage(
                input_tokens=_int(usage.get("prompt_tokens")),
                output_tokens=_int(usage.get("completion_tokens")),
            )
        choice = _first_choice(chunk.get("choices"))
        if choice is None:
            return ""
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        # "delta" in streamed chunks, "message" in a non-streamed body.
        delta = choice.get("delta") or choice.get("message") or {}
        if not isinstance(delta, dict):
            return ""
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if isinstance(call, dict):
                    self._add_call_delta(call)
        text = "".join(
            part for part in (delta.get("content"), delta.get("refusal")) if isinstance(part, str)
        )
        if text:
            self._text.append(text)
        return text

    def _add_call_delta(self, delta: dict[str, Any]) -> None:
        index = delta.get("index")
        if not isinstance(index, int):
            # Servers that omit "index" send either a new call (with a new id) or more of the last.
            call_id = delta.get("id")
            known = {c.id: i for i, c in self._calls.items() if c.id}
            if isinstance(call_id, str) and call_id in known:
                index = known[call_id]
            elif call_id or not self._calls:
                index = max(self._calls, default=-1) + 1
            else:
                index = max(self._calls)
        partial = self._calls.setdefault(index, _PartialCall())
        if isinstance(delta.get("id"), str) and delta["id"]:
            partial.id = delta["id"]
        function = delta.get("function")
        if not isinstance(function, dict):
            return
        name = function.get("name")
        # OpenAI sends the whole name once; tolerate servers that repeat it or send it in pieces.
        if isinstance(name, str) and name and name != partial.name:
            partial.name += name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            partial.arguments.append(arguments)
        elif isinstance(arguments, dict):
            partial.arguments.append(json.dumps(arguments))

    def response(self) -> ModelResponse:
        """The complete response. Raises ``ModelError`` for a call with unusable arguments."""
        calls = tuple(_finish_call(self._calls[index], index) for index in sorted(self._calls))
        message = AssistantMessage(content="".join(self._text), tool_calls=calls)
        return ModelResponse(message=message, usage=self._usage)


def _finish_call(partial: _PartialCall, index: int) -> ToolCall:
    if not partial.name:
        raise ModelError(
            f"the model sent tool call #{index} without a function name "
            f"(arguments {shorten(''.join(partial.arguments))!r})"
        )
    text = "".join(partial.arguments)
    if not text.strip():
        arguments: Any = {}
    else:
        try:
            arguments = json.loads(text)
        except ValueError as exc:
            raise ModelError(
                f"the model called tool {partial.name!r} with arguments that are not valid JSON: "
                f"{shorten(text)!r}"
            ) from exc
    if not isinstance(arguments, dict):
        raise ModelError(
            f"the model called tool {partial.name!r} with arguments that are not a JSON object: "
            f"{shorten(text)!r}"
        )
    return ToolCall(id=partial.id or f"call_{index}", name=partial.name, arguments=arguments)


def _first_choice(choices: Any) -> dict[str, Any] | None:
    if not isinstance(choices, list):
        return None
    for choice in choices:
        # Only n=1 is requested; ignore any other choice a server might add.
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _stream_error(chunk: dict[str, Any]) -> ModelError:
    error = chunk["error"]
    detail = error_detail(json.dumps(chunk).encode())
    code = error.get("code") if isinstance(error, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    status = code if isinstance(code, int) else None
    if (status is not None and (status == 429 or status >= 500)) or kind in (
        "server_error",
        "rate_limit_exceeded",
        "overloaded_error",
    ):
        return TransientModelError(
            f"the model endpoint reported an error mid-stream: {detail}", status=status
        )
    return ModelError(f"the model endpoint reported an error mid-stream: {detail}", status=status)
