"""Notifications the agent publishes while it runs requests.

Its public names are listed once, in ``zett_agent.events``, which re-exports them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from zett_agent._messages import AssistantMessage, Message, ToolCall, ToolMessage
from zett_agent._model import Usage


class EventType(enum.Enum):
    """What kind of notification an event is (also available as ``event.type``)."""

    RUN_STARTED = "run_started"
    MESSAGE_APPENDED = "message_appended"
    TURN_STARTED = "turn_started"
    MODEL_TEXT_DELTA = "model_text_delta"
    TOOL_CALLED = "tool_called"
    TOOL_FINISHED = "tool_finished"
    TURN_FINISHED = "turn_finished"
    RUN_COMPLETED = "run_completed"
    RUN_FAILED = "run_failed"
    RUN_CANCELLED = "run_cancelled"
    INTERNAL_MESSAGE = "internal_message"


RUN_COMPLETED = EventType.RUN_COMPLETED
RUN_FAILED = EventType.RUN_FAILED
RUN_CANCELLED = EventType.RUN_CANCELLED


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """Base of every event: which session it belongs to and what kind it is."""

    session_id: str
    type: ClassVar[EventType]


@dataclass(frozen=True, slots=True)
class RunStartedEvent(AgentEvent):
    """A request of the session started (it holds the session from now on)."""

    type: ClassVar[EventType] = EventType.RUN_STARTED


@dataclass(frozen=True, slots=True)
class MessageAppendedEvent(AgentEvent):
    """A message was appended to the session's conversation."""

    message: Message
    type: ClassVar[EventType] = EventType.MESSAGE_APPENDED


@dataclass(frozen=True, slots=True)
class TurnStartedEvent(AgentEvent):
    """Turn ``turn`` (1-based) of the request starts."""

    turn: int
    type: ClassVar[EventType] = EventType.TURN_STARTED


@dataclass(frozen=True, slots=True)
class ModelTextDeltaEvent(AgentEvent):
    """A piece of text the model streamed."""

    text: str
    type: ClassVar[EventType] = EventType.MODEL_TEXT_DELTA


@dataclass(frozen=True, slots=True)
class ToolCalledEvent(AgentEvent):
    """A tool call is about to be invoked (after ``before_tool``)."""

    call: ToolCall
    type: ClassVar[EventType] = EventType.TOOL_CALLED


@dataclass(frozen=True, slots=True)
class ToolFinishedEvent(AgentEvent):
    """A tool call settled: ``message`` is what the model will see (ok, failed or skipped)."""

    call: ToolCall
    message: ToolMessage
    type: ClassVar[EventType] = EventType.TOOL_FINISHED


@dataclass(frozen=True, slots=True)
class TurnFinishedEvent(AgentEvent):
    """Turn ``turn`` settled; ``usage`` is what that turn's model call used, if reported."""

    turn: int
    usage: Usage | None = None
    type: ClassVar[EventType] = EventType.TURN_FINISHED


@dataclass(frozen=True, slots=True)
class RunCompletedEvent(AgentEvent):
    """The request answered ``result``; published after every ``on_success`` hook succeeded."""

    result: AssistantMessage
    type: ClassVar[EventType] = EventType.RUN_COMPLETED


@dataclass(frozen=True, slots=True)
class RunFailedEvent(AgentEvent):
    """The request failed; ``error`` describes the exception that reached the caller."""

    error: str
    type: ClassVar[EventType] = EventType.RUN_FAILED


@dataclass(frozen=True, slots=True)
class RunCancelledEvent(AgentEvent):
    """The request was cancelled (its caller was cancelled, or the agent closed)."""

    type: ClassVar[EventType] = EventType.RUN_CANCELLED


@dataclass(frozen=True, slots=True)
class InternalMessageEvent(AgentEvent):
    """Wake a session with a message from inside the application.

    Published to an agent for an idle session, it starts a request whose input is
    ``AgentMessage(content, source)``; for a busy session it runs after the current request.
    Consecutive internal requests without an external ``run`` are bounded by
    ``AgentRunConfig.max_internal_continuations``.
    """

    content: str
    source: str = ""
    type: ClassVar[EventType] = EventType.INTERNAL_MESSAGE
