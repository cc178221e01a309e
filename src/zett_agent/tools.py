"""Tools the model may call: ``AgentTool``, ``ToolResult`` and the ``tool`` decorator."""

from __future__ import annotations

from zett_agent._tool_args import ToolArgumentError, validate_arguments
from zett_agent._tool_schema import schema_for_function
from zett_agent._tools import AgentTool, ToolResult, UnknownToolError, tool

__all__ = [
    "AgentTool",
    "ToolArgumentError",
    "ToolResult",
    "UnknownToolError",
    "schema_for_function",
    "tool",
    "validate_arguments",
]
