"""The events an agent publishes, including ``InternalMessageEvent`` and ``RUN_COMPLETED``."""

from __future__ import annotations

from zett_agent._events import (
    RUN_CANCELLED,
    RUN_COMPLETED,
    RUN_FAILED,
    AgentEvent,
    EventType,
    InternalMessageEvent,
    MessageAppendedEvent,
    ModelTextDeltaEvent,
    RunCancelledEvent,
    RunCompletedEvent,
    RunFailedEvent,
    RunStartedEvent,
    ToolCalledEvent,
    ToolFinishedEvent,
    TurnFinishedEvent,
    TurnStartedEvent,
)

__all__ = [
    "RUN_CANCELLED",
    "RUN_COMPLETED",
    "RUN_FAILED",
    "AgentEvent",
    "EventType",
    "InternalMessageEvent",
    "MessageAppendedEvent",
    "ModelTextDeltaEvent",
    "RunCancelledEvent",
    "RunCompletedEvent",
    "RunFailedEvent",
    "RunStartedEvent",
    "ToolCalledEvent",
    "ToolFinishedEvent",
    "TurnFinishedEvent",
    "TurnStartedEvent",
]
