"""Immutable conversation messages shared by the runtime, the models and the extensions."""

from __future__ import annotations

import enum
from collections.abc import Mapping, MutableSequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias


@dataclass(frozen=True, slots=True)
class UserMessage:
    """Input from the user (or a steering message)."""

    content: str
    role: ClassVar[str] = "user"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call requested by the model.

    ``arguments`` is the decoded JSON object the model sent; treat it as read-only.
    """

    id: str
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    """What the model answered: text, tool calls, or both."""

    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    role: ClassVar[str] = "assistant"

    def __post_init__(self) -> None:
        if not isinstance(self.tool_calls, tuple):
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))


class ToolStatus(enum.Enum):
    """How one tool call ended."""

    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class ToolMessage:
    """The result of one tool call, answered to the model under the call's id."""

    call_id: str
    name: str
    text: str
    status: ToolStatus = ToolStatus.OK
    role: ClassVar[str] = "tool"

    @property
    def failed(self) -> bool:
        """True when the call raised, was refused, or had bad arguments."""
        return self.status is ToolStatus.FAILED

    @property
    def skipped(self) -> bool:
        """True when steering interrupted the batch before this call ran."""
        return self.status is ToolStatus.SKIPPED

    @property
    def ok(self) -> bool:
        return self.status is ToolStatus.OK


@dataclass(frozen=True, slots=True)
class AgentMessage:
    """An ordinary message the runtime or an extension adds (for example a completion notice).

    Models see it as user-side context; ``source`` names who added it.
    """

    content: str
    source: str = ""
    role: ClassVar[str] = "agent"


Message: TypeAlias = UserMessage | AssistantMessage | ToolMessage | AgentMessage


def message_json(message: Message) -> dict[str, Any]:
    """``message`` as JSON data: the one form the brokered model calls and the task journal carry.

    Raises ``TypeError`` for an object that is none of the four messages.
    """
    if isinstance(message, UserMessage):
        return {"role": "user", "content": message.content}
    if isinstance(message, AssistantMessage):
        return {
            "role": "assistant",
            "content": message.content,
            "tool_calls": [
                {"id": call.id, "name": call.name, "arguments": dict(call.arguments)}
                for call in message.tool_calls
            ],
        }
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
    raise TypeError(f"a {type(message).__name__} is no conversation message: it has no JSON form")


def skip_unanswered_calls(messages: MutableSequence[Message], text: str) -> None:
    """Answer, as skipped with ``text``, every unanswered call of the last assistant message.

    A conversation that ends in the middle of a turn would otherwise leave tool calls without
    results, which providers reject on its next request.
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AssistantMessage):
            answered = {m.call_id for m in messages[index + 1 :] if isinstance(m, ToolMessage)}
            for call in message.tool_calls:
                if call.id not in answered:
                    messages.append(ToolMessage(call.id, call.name, text, ToolStatus.SKIPPED))
            return
