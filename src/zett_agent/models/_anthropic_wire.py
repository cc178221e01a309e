"""Anthropic's Messages API as the runtime speaks it: request messages and tools, streamed events.

Pure functions and one small state machine, no I/O: ``build_request`` makes the JSON body of a
streamed ``POST /v1/messages`` from a ``ModelRequest``; ``MessageAccumulator`` builds the
``ModelResponse`` from the raw stream events the SDK hands out (``message_start``,
``content_block_start``, ``content_block_delta``, ``content_block_stop``, ``message_delta``,
``message_stop``), read defensively: they are JSON values as a server sent them, so a field may
hold anything.

How the runtime's messages map: the system prompt is ``system``; a user message, and a message
the runtime adds (``AgentMessage``), is user text; an assistant message is its text block and a
``tool_use`` block per tool call; a ``ToolMessage`` is a ``tool_result`` block of the user turn
that follows (``is_error`` when the tool failed). Consecutive messages of one role are merged
into one turn, as the API wants turns to alternate. Text is sent as valid Unicode (a lone
surrogate as U+FFFD), and read back so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from zett_agent._messages import (
    AgentMessage,
    AssistantMessage,
    ToolCall,
    ToolMessage,
    ToolStatus,
    UserMessage,
)
from zett_agent._model import ModelError, ModelRequest, ModelResponse, Usage
from zett_agent._text import valid_json, valid_text
from zett_agent.models._openai_wire import (
    MAX_TOOL_CALLS,
    MAX_TOOL_NAME,
    field_of,
    parse_arguments,
    valid_payload,
)
from zett_agent.models._sdk_errors import shorten

__all__ = ["MessageAccumulator", "build_request"]


def _turns(request: ModelRequest) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for message in request.messages:
        if isinstance(message, UserMessage | AgentMessage):
            add("user", [{"type": "text", "text": message.content or " "}])
        elif isinstance(message, AssistantMessage):
            blocks: list[dict[str, Any]] = []
            if message.content:
                blocks.append({"type": "text", "text": message.content})
            blocks += [
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": dict(call.arguments),
                }
                for call in message.tool_calls
            ]
            add("assistant", blocks)
        elif isinstance(message, ToolMessage):
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.call_id,
                "content": message.text,
            }
            if message.status is ToolStatus.FAILED:
                result["is_error"] = True
            add("user", [result])
        else:
            raise TypeError(f"cannot send a {type(message).__name__} to an Anthropic model")
    return turns


def build_request(
    model: str,
    request: ModelRequest,
    *,
    max_tokens: int,
    temperature: float | None,
    extra_body: Mapping[str, Any],
) -> dict[str, Any]:
    """The JSON body of one streamed ``POST /v1/messages``.

    ``extra_body`` is merged into it last. Raises ``TypeError`` or ``ValueError`` for a request
    JSON cannot hold.
    """
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "messages": _turns(request),
    }
    if request.system_prompt:
        body["system"] = request.system_prompt
    if request.tools:
        body["tools"] = [
            {
                "name": spec.name,
                "description": spec.description,
                "input_schema": dict(spec.parameters),
            }
            for spec in request.tools
        ]
    if temperature is not None:
        body["temperature"] = temperature
    body = valid_payload(body)
    body.update(extra_body)
    return body


@dataclass
class _ToolUse:
    id: str
    name: str
    start: Any
    json: list[str] = field(default_factory=list)


def _int(value: Any) -> int:
    """A token count: a non-negative int below 2**63, else 0."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    return 0


def _str(value: Any) -> str:
    return valid_text(value) if isinstance(value, str) else ""


class MessageAccumulator:
    """Builds one ``ModelResponse`` from the raw events of a streamed message.

    ``take`` returns the text an event adds; ``stop_reason`` is set by ``message_delta``,
    ``stopped`` by ``message_stop``. What it holds is at most what it was given (the budget
    bounds the response).
    """

    def __init__(self) -> None:
        self._text: list[str] = []
        self._blocks: dict[int, _ToolUse | None] = {}  # index -> tool use (None: another kind)
        self._uses: list[_ToolUse] = []
        self._input = 0
        self._cache_read = 0
        self._cache_write = 0
        self._output = 0
        self._usage_seen = False
        self.stop_reason: str | None = None
        self.stopped = False
        #: the message's ``id`` and ``model`` (``message_start``), for the span
        self.response_id: str | None = None
        self.response_model: str | None = None

    def take(self, event: Any) -> str:
        """Take one event; return the text it adds (``""`` if none).

        Raises ``ModelError`` for more than ``MAX_TOOL_CALLS`` tool uses, or a tool name longer
        than ``MAX_TOOL_NAME``.
        """
        kind = field_of(event, "type")
        if kind == "content_block_delta":
            return self._delta(field_of(event, "index"), field_of(event, "delta"))
        if kind == "content_block_start":
            return self._start(field_of(event, "index"), field_of(event, "content_block"))
        if kind == "message_start":
            message = field_of(event, "message")
            if isinstance(field_of(message, "id"), str):
                self.response_id = shorten(_str(field_of(message, "id")), 200)
            if isinstance(field_of(message, "model"), str):
                self.response_model = shorten(_str(field_of(message, "model")), 200)
            self._take_usage(field_of(message, "usage"))
        elif kind == "message_delta":
            reason = field_of(field_of(event, "delta"), "stop_reason")
            if reason:
                self.stop_reason = shorten(_str(reason) or "unknown", 100)
            self._take_usage(field_of(event, "usage"))
        elif kind == "message_stop":
            self.stopped = True
        return ""

    def _take_usage(self, usage: Any) -> None:
        """Counts of a ``message_start`` or ``message_delta`` (cumulative: the last one wins)."""
        if usage is None or isinstance(usage, str | int | float | list):
            return
        self._usage_seen = True
        for name, attribute in (
            ("input_tokens", "_input"),
            ("cache_read_input_tokens", "_cache_read"),
            ("cache_creation_input_tokens", "_cache_write"),
            ("output_tokens", "_output"),
        ):
            value = field_of(usage, name)
            if value is not None:
                setattr(self, attribute, _int(value))

    def _start(self, index: Any, block: Any) -> str:
        if type(index) is not int or index in self._blocks:
            return ""
        kind = field_of(block, "type")
        if kind == "tool_use":
            if len(self._uses) >= MAX_TOOL_CALLS:
                raise ModelError(
                    f"the model endpoint sent more than {MAX_TOOL_CALLS} tool calls in one answer"
                )
            name = _str(field_of(block, "name"))
            if len(name) > MAX_TOOL_NAME:
                raise ModelError(
                    f"the model endpoint sent a tool name longer than {MAX_TOOL_NAME} "
                    f"characters: {shorten(name, 100)!r}"
                )
            use = _ToolUse(_str(field_of(block, "id")), name, field_of(block, "input"))
            self._blocks[index] = use
            self._uses.append(use)
            return ""
        self._blocks[index] = None
        text = _str(field_of(block, "text")) if kind == "text" else ""
        if text:
            self._text.append(text)
        return text

    def _delta(self, index: Any, delta: Any) -> str:
        kind = field_of(delta, "type")
        if kind == "text_delta":
            text = _str(field_of(delta, "text"))
            if text:
                self._text.append(text)
            return text
        if kind == "input_json_delta" and type(index) is int:
            use = self._blocks.get(index)
            partial = field_of(delta, "partial_json")
            if use is not None and isinstance(partial, str):
                use.json.append(partial)
        return ""  # thinking, signatures, citations: not the answer's text

    def response(self) -> ModelResponse:
        """The complete response. Raises ``ModelError`` for a tool use with unusable input."""
        calls = tuple(_finish(use, index) for index, use in enumerate(self._uses))
        message = AssistantMessage(content="".join(self._text), tool_calls=calls)
        usage = None
        if self._usage_seen:
            usage = Usage(
                input_tokens=self._input + self._cache_read + self._cache_write,
                output_tokens=self._output,
                cache_read_tokens=self._cache_read,
                cache_write_tokens=self._cache_write,
            )
        return ModelResponse(message=message, usage=usage)


def _finish(use: _ToolUse, index: int) -> ToolCall:
    if not use.name:
        raise ModelError(f"the model sent tool use #{index} without a name")
    text = "".join(use.json)
    if text.strip():
        try:
            arguments = parse_arguments(text)
        except ValueError as exc:
            raise ModelError(
                f"the model called tool {use.name!r} with input that is not valid JSON "
                f"({exc}): {shorten(valid_text(text))!r}"
            ) from exc
    elif isinstance(use.start, dict):
        arguments = valid_json(use.start)
    else:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ModelError(
            f"the model called tool {use.name!r} with input that is not a JSON object: "
            f"{shorten(valid_text(text or json.dumps(use.start, default=str)))!r}"
        )
    return ToolCall(id=use.id or f"toolu_{index}", name=use.name, arguments=arguments)
