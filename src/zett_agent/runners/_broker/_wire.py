"""The JSON forms of model requests, events and errors between a brokered child and its parent.

Child to parent, as an event on the child's channel (``zett_agent.process.emit``)::

    {"zett.broker": {"op": "call", "id": ID, "slot": SLOT, "request": REQUEST}}
    {"zett.broker": {"op": "cancel", "id": ID}}

``REQUEST`` is ``{"messages": [MESSAGE, ...], "tools": [TOOL, ...], "system_prompt": str | null,
"metadata": {...}}``; a ``MESSAGE`` is one of ``{"role": "user", "content": str}``, ``{"role":
"assistant", "content": str, "tool_calls": [{"id": str, "name": str, "arguments": {...}}]}``,
``{"role": "tool", "call_id": str, "name": str, "text": str, "status": "ok" | "failed" |
"skipped"}``, ``{"role": "agent", "content": str, "source": str}``; a ``TOOL`` is ``{"name":
str, "description": str, "parameters": {...}}`` (the tool's shell: what the model sees of it).

Parent to child, as messages on topic ``TOPIC`` (``ProcessJob.send``)::

    {"id": ID, "text": str}                                         a text delta
    {"id": ID, "done": {"message": ASSISTANT, "usage": [in, out, cache read, cache write] | null}}
    {"id": ID | null, "error": {"message": str, "retryable": bool, "status": int | null}}

The parent decodes what a child sends as hostile data (``decode_request``: exact keys, exact
types, every failure a ``BadRequest`` naming where); the child trusts what its parent sends.
This module is imported by brokered children: it imports only the runtime's data classes.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING, Any

from zett_agent._messages import (
    AgentMessage,
    AssistantMessage,
    ToolCall,
    ToolMessage,
    ToolStatus,
    UserMessage,
    message_json,
)
from zett_agent._model import (
    ModelError,
    ModelEvent,
    ModelEventKind,
    ModelRequest,
    ModelResponse,
    ToolSpec,
    TransientModelError,
    Usage,
)

if TYPE_CHECKING:
    from zett_agent._messages import Message

__all__ = [
    "KEY",
    "TOPIC",
    "BadRequest",
    "advance",
    "decode_error",
    "decode_request",
    "decode_request_in_steps",
    "decode_response",
    "encode_error",
    "encode_event",
    "encode_request",
]

#: the key of a child's event that is a broker request, not progress
KEY = "zett.broker"
#: the topic of the parent's answers in the child's inbox
TOPIC = "zett.broker"
#: largest id a request may carry (JSON numbers beyond 2**53 lose precision elsewhere)
MAX_ID = 2**53

_STATUSES = {status.value: status for status in ToolStatus}


class BadRequest(ValueError):
    """What a child sent is not a valid broker request; the message says where and why."""


# -- the child's side: requests out, answers in -------------------------------------------------


def encode_request(request: ModelRequest) -> dict[str, Any]:
    """``request`` as JSON data (tools as shells: name, description, schema)."""
    return {
        "messages": [message_json(message) for message in request.messages],
        "tools": [
            {"name": t.name, "description": t.description, "parameters": dict(t.parameters)}
            for t in request.tools
        ],
        "system_prompt": request.system_prompt,
        "metadata": dict(request.metadata),
    }


def decode_response(data: Mapping[str, Any]) -> ModelResponse:
    """The parent's ``done`` answer back into a ``ModelResponse``."""
    message = _decode_message(data["message"], "response.message")
    if not isinstance(message, AssistantMessage):
        raise BadRequest("response.message must be an assistant message")
    usage = data.get("usage")
    if usage is None:
        return ModelResponse(message, None)
    cache = (int(usage[2]), int(usage[3])) if len(usage) == 4 else (0, 0)
    return ModelResponse(message, Usage(int(usage[0]), int(usage[1]), *cache))


def decode_error(data: Mapping[str, Any]) -> ModelError:
    """The parent's ``error`` answer as the error the real model raised (transient or not)."""
    message = str(data.get("message", "the parent's model failed"))
    status = data.get("status")
    status = status if isinstance(status, int) and not isinstance(status, bool) else None
    if data.get("retryable") is True:
        return TransientModelError(message, status=status)
    return ModelError(message, retryable=False, status=status)


# -- the parent's side: requests in (hostile), answers out -------------------------------------


def encode_event(call_id: int, event: ModelEvent) -> dict[str, Any]:
    """One model event as the answer to call ``call_id``."""
    if event.kind is ModelEventKind.TEXT_DELTA:
        return {"id": call_id, "text": event.text}
    response = event.response
    if event.kind is not ModelEventKind.COMPLETED or response is None:
        raise ValueError(f"the model yielded an event the broker cannot carry: {event!r:.200}")
    usage = response.usage
    return {
        "id": call_id,
        "done": {
            "message": message_json(response.message),
            "usage": None
            if usage is None
            else [
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens,
                usage.cache_write_tokens,
            ],
        },
    }


def encode_error(call_id: int | None, error: ModelError) -> dict[str, Any]:
    status = error.status if isinstance(error.status, int) else None
    return {
        "id": call_id,
        "error": {"message": str(error), "retryable": bool(error.retryable), "status": status},
    }


def decode_request(data: object) -> ModelRequest:
    """A child's ``request`` as a ``ModelRequest``, checked key by key and type by type.

    The values come from the engine's JSON decoder, so they are JSON types, no deeper than its
    bound; what is checked here is the shape. Raises ``BadRequest`` naming the first problem.
    """
    steps = decode_request_in_steps(data)
    while (request := advance(steps)) is None:
        pass
    return request


def advance(steps: Generator[None, None, ModelRequest]) -> ModelRequest | None:
    """Take one step of ``decode_request_in_steps``: the request once it is complete, else ``None``.

    Raises ``BadRequest`` as the decoding does.
    """
    try:
        next(steps)
    except StopIteration as done:
        request: ModelRequest = done.value
        return request
    return None


def decode_request_in_steps(data: object, step: int = 256) -> Generator[None, None, ModelRequest]:
    """Decode a request in steps.

    ``decode_request`` as a generator that yields after every ``step`` messages or tools
    (and returns the request): the parent decodes a large request a slice at a time between
    its other callbacks. The place of a problem is built only once one is found.
    """
    request = _object(data, "request", _REQUEST_KEYS)
    messages = request["messages"]
    if type(messages) is not list:
        raise BadRequest(f"request.messages must be a list, {_got(messages)}")
    tools = request["tools"]
    if type(tools) is not list:
        raise BadRequest(f"request.tools must be a list, {_got(tools)}")
    system_prompt = request["system_prompt"]
    if system_prompt is not None and type(system_prompt) is not str:
        raise BadRequest(f"request.system_prompt must be a string or null, {_got(system_prompt)}")
    metadata = request["metadata"]
    if type(metadata) is not dict:
        raise BadRequest(f"request.metadata must be an object, {_got(metadata)}")
    decoded = []
    for index, message in enumerate(messages):
        decoded.append(_decode_message(message, "request.messages", index))
        if index % step == step - 1:
            yield
    specs = []
    for index, item in enumerate(tools):
        specs.append(_decode_tool(item, index))
        if index % step == step - 1:
            yield
    return ModelRequest(
        tuple(decoded), tools=tuple(specs), system_prompt=system_prompt, metadata=metadata
    )


_REQUEST_KEYS = frozenset({"messages", "tools", "system_prompt", "metadata"})
_MESSAGE_KEYS = {
    "user": frozenset({"role", "content"}),
    "assistant": frozenset({"role", "content", "tool_calls"}),
    "tool": frozenset({"role", "call_id", "name", "text", "status"}),
    "agent": frozenset({"role", "content", "source"}),
}
_CALL_KEYS = frozenset({"id", "name", "arguments"})
_TOOL_KEYS = frozenset({"name", "description", "parameters"})


def _decode_message(data: object, where: str, index: int | None = None) -> Message:
    if type(data) is not dict:
        raise BadRequest(f"{_at(where, index)} must be an object, {_got(data)}")
    role = data.get("role")
    keys = _MESSAGE_KEYS.get(role) if type(role) is str else None
    if keys is None:
        raise BadRequest(f"{_at(where, index)}.role must be one of user, assistant, tool, agent")
    if data.keys() != keys:
        _object(data, _at(where, index), keys)  # raises, naming the keys
    if role == "user":
        content = data["content"]
        if type(content) is str:
            return UserMessage(content)
        raise _bad_field(where, index, "content", content)
    if role == "assistant":
        content, calls = data["content"], data["tool_calls"]
        if type(content) is not str:
            raise _bad_field(where, index, "content", content)
        if type(calls) is not list:
            raise BadRequest(f"{_at(where, index)}.tool_calls must be a list, {_got(calls)}")
        decoded = []
        for number, call in enumerate(calls):
            decoded.append(_decode_call(call, where, index, number))
        return AssistantMessage(content, tuple(decoded))
    if role == "tool":
        call_id, name, text, status = data["call_id"], data["name"], data["text"], data["status"]
        for field, value in (("call_id", call_id), ("name", name), ("text", text)):
            if type(value) is not str:
                raise _bad_field(where, index, field, value)
        found = _STATUSES.get(status) if type(status) is str else None
        if found is None:
            raise BadRequest(f"{_at(where, index)}.status must be one of ok, failed, skipped")
        return ToolMessage(call_id, name, text, found)
    content, source = data["content"], data["source"]
    if type(content) is not str:
        raise _bad_field(where, index, "content", content)
    if type(source) is not str:
        raise _bad_field(where, index, "source", source)
    return AgentMessage(content, source)


def _decode_call(data: object, where: str, index: int | None, number: int) -> ToolCall:
    if type(data) is not dict or data.keys() != _CALL_KEYS:
        _object(data, f"{_at(where, index)}.tool_calls[{number}]", _CALL_KEYS)
    assert type(data) is dict
    call_id, name, arguments = data["id"], data["name"], data["arguments"]
    if type(call_id) is str and type(name) is str and type(arguments) is dict:
        return ToolCall(call_id, name, arguments)
    place = f"{_at(where, index)}.tool_calls[{number}]"
    if type(arguments) is not dict:
        raise BadRequest(f"{place}.arguments must be an object, {_got(arguments)}")
    field, value = ("id", call_id) if type(call_id) is not str else ("name", name)
    raise BadRequest(f"{place}.{field} must be a string, {_got(value)}")


def _decode_tool(data: object, index: int) -> ToolSpec:
    place = f"request.tools[{index}]"
    item = _object(data, place, _TOOL_KEYS)
    name, description, parameters = item["name"], item["description"], item["parameters"]
    if type(parameters) is not dict:
        raise BadRequest(f"{place}.parameters must be an object, {_got(parameters)}")
    for field, value in (("name", name), ("description", description)):
        if type(value) is not str:
            raise BadRequest(f"{place}.{field} must be a string, {_got(value)}")
    return ToolSpec(name, description, parameters)


def _at(where: str, index: int | None) -> str:
    return where if index is None else f"{where}[{index}]"


def _bad_field(where: str, index: int | None, field: str, value: object) -> BadRequest:
    return BadRequest(f"{_at(where, index)}.{field} must be a string, {_got(value)}")


def _object(data: object, where: str, keys: frozenset[str]) -> dict[str, Any]:
    if type(data) is not dict:
        raise BadRequest(f"{where} must be an object, {_got(data)}")
    if data.keys() != keys:
        missing = sorted(keys - data.keys())
        extra = sorted(str(k)[:40] for k in list(data.keys() - keys)[:5])
        detail = "; ".join(
            part
            for part in (
                f"missing {', '.join(missing)}" if missing else "",
                f"unknown {', '.join(extra)}" if extra else "",
            )
            if part
        )
        raise BadRequest(f"{where} must have exactly the keys {', '.join(sorted(keys))} ({detail})")
    return data


def _got(value: object) -> str:
    return f"got {'null' if value is None else type(value).__name__}"
