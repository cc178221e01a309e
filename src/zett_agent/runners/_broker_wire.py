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
    {"id": ID, "done": {"message": ASSISTANT, "usage": [in, out] | null}}   the response (last)
    {"id": ID | null, "error": {"message": str, "retryable": bool, "status": int | null}}

The parent decodes what a child sends as hostile data (``decode_request``: exact keys, exact
types, every failure a ``BadRequest`` naming where); the child trusts what its parent sends.
This module is imported by brokered children: it imports only the runtime's data classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zett_agent._messages import (
    AgentMessage,
    AssistantMessage,
    Message,
    ToolCall,
    ToolMessage,
    ToolStatus,
    UserMessage,
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

__all__ = [
    "KEY",
    "TOPIC",
    "BadRequest",
    "decode_error",
    "decode_request",
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
        "messages": [_encode_message(message) for message in request.messages],
        "tools": [
            {"name": t.name, "description": t.description, "parameters": dict(t.parameters)}
            for t in request.tools
        ],
        "system_prompt": request.system_prompt,
        "metadata": dict(request.metadata),
    }


def _encode_message(message: Message) -> dict[str, Any]:
    if isinstance(message, UserMessage):
        return {"role": "user", "content": message.content}
    if isinstance(message, AssistantMessage):
        return _encode_assistant(message)
    if isinstance(message, ToolMessage):
        return {
            "role": "tool",
            "call_id": message.call_id,
            "name": message.name,
            "text": message.text,
            "status": message.status.value,
        }
    if isinstance(message, AgentMessage):
        return {"role": "agent", "content": message.content, "source": message.source}
    raise TypeError(f"a model request cannot carry a {type(message).__name__}")


def _encode_assistant(message: AssistantMessage) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": message.content,
        "tool_calls": [
            {"id": call.id, "name": call.name, "arguments": dict(call.arguments)}
            for call in message.tool_calls
        ],
    }


def decode_response(data: Mapping[str, Any]) -> ModelResponse:
    """The parent's ``done`` answer back into a ``ModelResponse``."""
    message = _decode_message(data["message"], "response.message")
    if not isinstance(message, AssistantMessage):
        raise BadRequest("response.message must be an assistant message")
    usage = data.get("usage")
    return ModelResponse(message, None if usage is None else Usage(int(usage[0]), int(usage[1])))


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
            "message": _encode_assistant(response.message),
            "usage": None if usage is None else [usage.input_tokens, usage.output_tokens],
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
    request = _object(data, "request", {"messages", "tools", "system_prompt", "metadata"})
    messages = _list(request["messages"], "request.messages")
    tools = _list(request["tools"], "request.tools")
    system_prompt = request["system_prompt"]
    if system_prompt is not None and type(system_prompt) is not str:
        raise BadRequest(f"request.system_prompt must be a string or null, {_got(system_prompt)}")
    metadata = request["metadata"]
    if type(metadata) is not dict:
        raise BadRequest(f"request.metadata must be an object, {_got(metadata)}")
    return ModelRequest(
        tuple(_decode_message(m, f"request.messages[{i}]") for i, m in enumerate(messages)),
        tools=tuple(_decode_tool(t, f"request.tools[{i}]") for i, t in enumerate(tools)),
        system_prompt=system_prompt,
        metadata=metadata,
    )


_MESSAGE_KEYS = {
    "user": {"role", "content"},
    "assistant": {"role", "content", "tool_calls"},
    "tool": {"role", "call_id", "name", "text", "status"},
    "agent": {"role", "content", "source"},
}


def _decode_message(data: object, where: str) -> Message:
    if type(data) is not dict:
        raise BadRequest(f"{where} must be an object, {_got(data)}")
    role = data.get("role")
    if type(role) is not str or role not in _MESSAGE_KEYS:
        raise BadRequest(f"{where}.role must be one of user, assistant, tool, agent")
    item = _object(data, where, _MESSAGE_KEYS[role])
    if role == "user":
        return UserMessage(_str(item["content"], f"{where}.content"))
    if role == "assistant":
        calls = _list(item["tool_calls"], f"{where}.tool_calls")
        return AssistantMessage(
            _str(item["content"], f"{where}.content"),
            tuple(_decode_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)),
        )
    if role == "tool":
        status = item["status"]
        if type(status) is not str or status not in _STATUSES:
            raise BadRequest(f"{where}.status must be one of ok, failed, skipped")
        return ToolMessage(
            _str(item["call_id"], f"{where}.call_id"),
            _str(item["name"], f"{where}.name"),
            _str(item["text"], f"{where}.text"),
            _STATUSES[status],
        )
    return AgentMessage(
        _str(item["content"], f"{where}.content"), _str(item["source"], f"{where}.source")
    )


def _decode_call(data: object, where: str) -> ToolCall:
    item = _object(data, where, {"id", "name", "arguments"})
    arguments = item["arguments"]
    if type(arguments) is not dict:
        raise BadRequest(f"{where}.arguments must be an object, {_got(arguments)}")
    return ToolCall(_str(item["id"], f"{where}.id"), _str(item["name"], f"{where}.name"), arguments)


def _decode_tool(data: object, where: str) -> ToolSpec:
    item = _object(data, where, {"name", "description", "parameters"})
    parameters = item["parameters"]
    if type(parameters) is not dict:
        raise BadRequest(f"{where}.parameters must be an object, {_got(parameters)}")
    return ToolSpec(
        _str(item["name"], f"{where}.name"),
        _str(item["description"], f"{where}.description"),
        parameters,
    )


def _object(data: object, where: str, keys: set[str]) -> dict[str, Any]:
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


def _list(data: object, where: str) -> list[Any]:
    if type(data) is not list:
        raise BadRequest(f"{where} must be a list, {_got(data)}")
    return data


def _str(data: object, where: str) -> str:
    if type(data) is not str:
        raise BadRequest(f"{where} must be a string, {_got(data)}")
    return data


def _got(value: object) -> str:
    return f"got {'null' if value is None else type(value).__name__}"
