"""Conversation messages: what the user, the model, the tools and the extensions say."""

from __future__ import annotations

from zett_agent._messages import (
    AgentMessage,
    AssistantMessage,
    Message,
    ToolCall,
    ToolMessage,
    ToolStatus,
    UserMessage,
)

__all__ = [
    "AgentMessage",
    "AssistantMessage",
    "Message",
    "ToolCall",
    "ToolMessage",
    "ToolStatus",
    "UserMessage",
]
