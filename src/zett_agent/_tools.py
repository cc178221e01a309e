"""Tools the model may call: ``ToolResult``, ``AgentTool`` and the ``tool`` decorator.

Also what a running handler may ask about its own call: ``tool_context()``.

Argument validation lives in ``zett_agent._tool_args`` and building a schema from a function
in ``zett_agent._tool_schema``. The public names of all three are listed once, in
``zett_agent.tools``, which re-exports them.
"""

from __future__ import annotations

import contextvars
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from zett_agent._messages import ToolCall
from zett_agent._model import ToolSpec
from zett_agent._tool_args import validate_arguments
from zett_agent._tool_schema import _enum_adapter, schema_for_function


@dataclass(slots=True)
class ToolResult:
    """What a tool handler returns to the model.

    ``content`` is a string (sent as is) or any JSON-compatible value (sent as JSON text).
    ``is_error`` marks the call as failed, so the model sees a failed ``ToolMessage``.

    Mutable on purpose: an ``after_tool`` hook may change ``content`` or ``is_error`` in place,
    and the changed result is what is appended, persisted and sent to the next model request.
    The runtime hands ``after_tool`` its own copy, so a handler that returns one shared
    ``ToolResult`` object every time never sees another call's changes.
    """

    content: Any
    is_error: bool = False

    @property
    def text(self) -> str:
        """The content as the model reads it: a string unchanged, anything else as JSON."""
        if isinstance(self.content, str):
            return self.content
        return json.dumps(self.content, ensure_ascii=False, default=str)

    @classmethod
    def error(cls, message: str) -> ToolResult:
        """A failed result whose text tells the model what went wrong."""
        return cls(message, is_error=True)


@dataclass(frozen=True, slots=True)
class ToolContext:
    """The tool call a handler is running for, as ``tool_context()`` returns it.

    ``idempotency_key`` names this call so that its effect can be made exactly-once: a
    handler that sends an email, charges a card or writes a record passes it to the service
    (or keeps it beside the effect) and skips the effect when the key was seen. In a child of
    ``AsyncSubAgentExtension(durable=True)`` it is the same on every resume of the call (a
    call started but not recorded done runs again when its task resumes: tool calls are
    at-least-once there); elsewhere it is unique to the call. 32 hexadecimal characters.

    Attributes:
        call: The call: its id, the tool's name and the arguments the model sent.
        session_id: The session whose request made the call.
        idempotency_key: The call's key (see above).
    """

    call: ToolCall
    session_id: str
    idempotency_key: str


_CURRENT_CALL: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar(
    "zett_agent_tool_call", default=None
)


def tool_context() -> ToolContext:
    """The tool call the calling handler runs for (``ToolContext``), inside a tool handler.

    Works in sync and async handlers, in the ``on_tool_call`` chain, and in threads a
    handler starts with ``asyncio.to_thread`` (they copy the context).

    Raises:
        LookupError: Called outside a tool call.
    """
    current = _CURRENT_CALL.get()
    if current is None:
        raise LookupError(
            "tool_context() is called outside a tool call; call it inside the tool's handler"
        )
    return current


def enter_tool_call(context: ToolContext) -> None:
    """Make ``context`` what ``tool_context()`` returns in the current task from now on.

    For the runtime, which calls it as each tool call starts (each call runs in an asyncio
    task of its own), and for what runs in a durable child, which gives a call its stable key.
    """
    _CURRENT_CALL.set(context)


class UnknownToolError(LookupError):
    """The model called a tool that is not registered for this request."""

    def __init__(self, name: str, available: Sequence[str]):
        self.name = name
        self.available = tuple(available)
        listing = ", ".join(sorted(self.available)) or "(none)"
        super().__init__(
            f"Unknown tool {name!r}. Available tools: {listing}. "
            "Call one of these by its exact name."
        )


ToolHandler = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class AgentTool:
    """A tool the model may call.

    ``parameters`` is the JSON schema of the keyword arguments; ``handler`` is a sync or async
    callable invoked with those keyword arguments. Sync handlers run on the event loop thread,
    so they must be quick; offload blocking work yourself. ``guidelines`` is optional usage
    guidance for the system prompt (see ``ToolGuidelinesExtension``).
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    handler: ToolHandler = field(repr=False)
    guidelines: str | None = None

    def __post_init__(self) -> None:
        if not self.name or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.name):
            raise ValueError(
                f"tool name {self.name!r} must be 1-64 characters of letters, digits, _ . -"
            )
        if not callable(self.handler):
            raise TypeError(f"handler of tool {self.name!r} must be callable")

    @property
    def spec(self) -> ToolSpec:
        """What the model is told about this tool."""
        return ToolSpec(self.name, self.description, self.parameters)

    async def invoke(self, arguments: Mapping[str, Any]) -> ToolResult:
        """Validate ``arguments`` against the schema, call the handler, return its result.

        A ``ToolResult`` returned by the handler is used as is; any other value ``v`` becomes
        ``ToolResult(v)``.

        Raises:
            ToolArgumentError: the arguments do not match the schema (the handler is not called).
            Exception: whatever the handler raises, unchanged.

        Cancellation: cancels an async handler; a sync handler runs to completion first.
        """
        validate_arguments(self.name, self.parameters, arguments)
        value = self.handler(**dict(arguments))
        if inspect.isawaitable(value):
            value = await value
        return value if isinstance(value, ToolResult) else ToolResult(value)


@overload
def tool(fn: Callable[..., Any], /) -> AgentTool: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    guidelines: str | None = None,
) -> Callable[[Callable[..., Any]], AgentTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    guidelines: str | None = None,
) -> AgentTool | Callable[[Callable[..., Any]], AgentTool]:
    """Turn a typed sync or async function into an :class:`AgentTool`.

    The JSON schema comes from the type hints (``str``, ``int``, ``float``, ``bool``,
    ``list[...]``, ``dict``, ``Literal[...]``, Enums, ``Optional[...]``, defaults); the
    description is the docstring's first paragraph and an ``Args:`` section describes each
    parameter. Use bare (``@tool``) or with options (``@tool(name=..., guidelines=...)``).

    Raises:
        TypeError: a parameter type cannot be expressed as JSON schema.
        ValueError: the tool has no description (write a docstring or pass ``description``).
    """

    def build(func: Callable[..., Any]) -> AgentTool:
        doc_description, parameters = schema_for_function(func)
        final_description = description if description is not None else doc_description
        tool_name = name or func.__name__
        if not final_description:
            raise ValueError(
                f"tool {tool_name!r} needs a description: give the function a docstring "
                "or pass description=..."
            )
        return AgentTool(
            name=tool_name,
            description=final_description,
            parameters=parameters,
            handler=_enum_adapter(func),
            guidelines=guidelines,
        )

    if fn is not None:
        return build(fn)
    return build
