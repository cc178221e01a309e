"""Tools the model may call: ``AgentTool``, ``ToolResult``, ``tool`` and ``tool_context``."""

from __future__ import annotations

from zett_agent._tool_args import ToolArgumentError, validate_arguments
from zett_agent._tool_schema import schema_for_function
from zett_agent._tools import (
    AgentTool,
    ToolContext,
    ToolResult,
    UnknownToolError,
    tool,
    tool_context,
)

__all__ = [
    "AgentTool",
    "ToolArgumentError",
    "ToolContext",
    "ToolResult",
    "UnknownToolError",
    "schema_for_function",
    "tool",
    "tool_context",
    "validate_arguments",
]
