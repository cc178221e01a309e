r"""Chat Completions as the runtime speaks it: request messages and tools, streamed chunks.

Pure functions and one small state machine, no I/O: ``build_request`` makes the JSON body of a
streamed ``POST /chat/completions`` from a ``ModelRequest``; ``ResponseAccumulator`` builds the
``ModelResponse`` from the chunks the SDK streams (JSON values as the server sent them, read
defensively: a field may hold anything).

Text crosses this module only as valid Unicode a UTF-8 encoder takes: a lone surrogate in a
request (``"\\ud800"`` in a message, a tool result, a system prompt, a tool description) is sent
as U+FFFD, and so is a lone ``\\ud800`` escape in what a server sends.
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
from zett_agent._model import ModelError, ModelRequest, ModelResponse, ToolSpec, Usage
from zett_agent._text import valid_json, valid_text
from zett_agent.models._budget import CHECKED_BYTES, MAX_JSON_ITEMS, separators_outside_strings
from zett_agent.models._sdk_errors import shorten

__all__ = [
    "MAX_TOOL_CALLS",
    "MAX_TOOL_NAME",
    "ResponseAccumulator",
    "build_request",
    "field_of",
    "parse_arguments",
    "valid_payload",
]

#: tool calls in one answer, and characters in one tool name, at most
MAX_TOOL_CALLS = 1024
MAX_TOOL_NAME = 1024


def field_of(obj: Any, name: str) -> Any:
    """``obj``'s field ``name`` (an SDK object's attribute, a dict's key), or ``None``."""
    if isinstance(obj, dict):
        return obj.get(name)
    try:
        return getattr(obj, name, None)
    except Exception:  # a property of a half-built object
        return None


def _text(value: Any) -> str:
    return valid_text(value) if isinstance(value, str) else ""


def valid_payload(payload: Any) -> Any:
    """``payload`` (JSON data) as UTF-8 can carry it: surrogates joined or replaced.

    A pair of surrogates becomes the character it encodes, a lone one U+FFFD.

    Raises ``TypeError`` or ``ValueError`` for a value JSON cannot hold.
    """
    text = json.dumps(payload, ensure_ascii=False)
    try:
        text.encode()
    except UnicodeEncodeError:
        # a pair of surrogates becomes the character it encodes, a lone one U+FFFD
        return json.loads(text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace"))
    return payload


def parse_arguments(text: str) -> Any:
    """The JSON value of a tool call's arguments, its cost bounded by its length.

    Raises ``ValueError`` (the message says why) for text that is not JSON, nests too deeply, or
    is longer than ``CHECKED_BYTES`` and holds more than ``MAX_JSON_ITEMS`` commas and colons
    outside its strings.
    """
    if len(text) > CHECKED_BYTES:
        items = separators_outside_strings(text)
        if items > MAX_JSON_ITEMS:
            raise ValueError(
                f"{len(text)} characters holding {items} commas and colons outside strings, "
                f"more than the {MAX_JSON_ITEMS} the adapter parses in one document"
            )
    try:
        return valid_json(json.loads(text))
    except RecursionError:
        raise ValueError("nested too deeply") from None


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


def build_request(
    model: str,
    request: ModelRequest,
    *,
    temperature: float | None,
    max_tokens: int | None,
    extra_body: Mapping[str, Any],
) -> dict[str, Any]:
    """The JSON body of one streamed ``POST /chat/completions``.

    ``extra_body`` is merged into it last, so it can add provider-specific fields or override
    ours. Raises ``TypeError`` or ``ValueError`` for a request JSON cannot hold.
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
    body = valid_payload(body)
    body.update(extra_body)
    return body


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ResponseAccumulator:
    """Builds one ``ModelResponse`` from streamed chunks (or from one non-streamed answer).

    What it holds is at most what it was given (the budget bounds the response); a delta costs
    constant time whatever came before it.
    """

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, _PartialCall] = {}
        self._by_id: dict[str, int] = {}  # for servers that send ids but no index
        self._max = -1  # the highest index of a call so far
        self._usage: Usage | None = None
        self.finish_reason: str | None = None
        #: the ``id`` and ``model`` the server's chunks name (the first of each), for the span
        self.response_id: str | None = None
        self.response_model: str | None = None

    def add_chunk(self, chunk: Any) -> str:
        """Take one chunk; return the text it adds (``""`` if none).

        Raises ``ModelError`` for a chunk that is not a JSON object, more than
        ``MAX_TOOL_CALLS`` tool calls, or a tool name longer than ``MAX_TOOL_NAME``.
        """
        if chunk is None or isinstance(chunk, str | int | float | list):
            raise ModelError(
                "the model endpoint sent a stream chunk that is not a JSON object: "
                f"{shorten(valid_text(json.dumps(chunk, default=str)))}"
            )
        if self.response_id is None and isinstance(field_of(chunk, "id"), str):
            self.response_id = shorten(valid_text(field_of(chunk, "id")), 200)
        if self.response_model is None and isinstance(field_of(chunk, "model"), str):
            self.response_model = shorten(valid_text(field_of(chunk, "model")), 200)
        usage = field_of(chunk, "usage")
        if usage is not None and not isinstance(usage, str | int | float | list):
            details = field_of(usage, "prompt_tokens_details")
            self._usage = Usage(
                input_tokens=_int(field_of(usage, "prompt_tokens")),
                output_tokens=_int(field_of(usage, "completion_tokens")),
                cache_read_tokens=_int(field_of(details, "cached_tokens")),
            )
        choice = _first_choice(field_of(chunk, "choices"))
        if choice is None:
            return ""
        reason = field_of(choice, "finish_reason")
        if reason:
            self.finish_reason = shorten(_text(reason) or "unknown", 100)
        # "delta" in streamed chunks, "message" in a non-streamed answer.
        delta = field_of(choice, "delta") or field_of(choice, "message")
        if delta is None:
            return ""
        calls = field_of(delta, "tool_calls")
        if isinstance(calls, list):
            for call in calls:
                self._add_call_delta(call)
        text = _text(field_of(delta, "content")) + _text(field_of(delta, "refusal"))
        if text:
            self._text.append(text)
        return text

    def _add_call_delta(self, delta: Any) -> None:
        index = field_of(delta, "index")
        call_id = _text(field_of(delta, "id"))
        if type(index) is not int:
            # Servers that omit "index" send either a new call (with a new id) or more of the last.
            if call_id in self._by_id:
                index = self._by_id[call_id]
            elif call_id or not self._calls:
                index = self._max + 1
            else:
                index = self._max
        partial = self._calls.get(index)
        if partial is None:
            if len(self._calls) >= MAX_TOOL_CALLS:
                raise ModelError(
                    f"the model endpoint sent more than {MAX_TOOL_CALLS} tool calls in one answer"
                )
            partial = self._calls[index] = _PartialCall()
            self._max = max(self._max, index)
        if call_id:
            partial.id = call_id
            self._by_id.setdefault(call_id, index)
        function = field_of(delta, "function")
        if function is None:
            return
        name = _text(field_of(function, "name"))
        # OpenAI sends the whole name once; tolerate servers that repeat it or send it in pieces.
        if name and name != partial.name:
            if len(partial.name) + len(name) > MAX_TOOL_NAME:
                raise ModelError(
                    f"the model endpoint sent a tool name longer than {MAX_TOOL_NAME} "
                    f"characters: {shorten(partial.name + name, 100)!r}"
                )
            partial.name += name
        arguments = field_of(function, "arguments")
        if isinstance(arguments, str):
            partial.arguments.append(arguments)
        elif isinstance(arguments, dict):
            partial.arguments.append(json.dumps(arguments, ensure_ascii=False))

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
            arguments = parse_arguments(text)
        except ValueError as exc:
            raise ModelError(
                f"the model called tool {partial.name!r} with arguments that are not valid JSON "
                f"({exc}): {shorten(valid_text(text))!r}"
            ) from exc
    if not isinstance(arguments, dict):
        raise ModelError(
            f"the model called tool {partial.name!r} with arguments that are not a JSON object: "
            f"{shorten(valid_text(text))!r}"
        )
    return ToolCall(id=partial.id or f"call_{index}", name=partial.name, arguments=arguments)


def _first_choice(choices: Any) -> Any:
    if not isinstance(choices, list):
        return None
    for choice in choices:
        # Only n=1 is requested; ignore any other choice a server might add.
        index = field_of(choice, "index")
        if choice is not None and not isinstance(choice, str) and index in (0, None):
            return choice
    return None


def _int(value: Any) -> int:
    """A token count: a non-negative int below 2**63, else 0."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    return 0
