"""Tools the model may call: ``AgentTool``, ``ToolResult`` and the ``tool`` decorator."""

from __future__ import annotations

from zett_agent._tools import (
    AgentTool,
    ToolArgumentError,
    ToolResult,
    UnknownToolError,
    schema_for_function,
    tool,
    validate_arguments,
)

__all__ = [
    "AgentTool",
    "ToolArgumentError",
    "ToolResult",
    "UnknownToolError",
    "schema_for_function",
    "tool",
    "validate_arguments",
]
