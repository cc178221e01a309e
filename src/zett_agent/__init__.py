"""zett_agent: an asyncio agent framework whose child agents run in their own OS processes.

The names a first program needs are importable from here::

    from zett_agent import AsyncSubAgentExtension, SubAgentDefinition, create_agent, tool

Each is the same object as in its home module (``zett_agent.client.create_agent``...), and is
imported on first access: ``import zett_agent`` alone stays cheap (child processes import this
package too), and ``OpenAIChatModel`` loads its HTTP client only when asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zett_agent._lazy import lazy_names

if TYPE_CHECKING:
    from zett_agent.agent import Agent, AgentRunConfig, AgentRunContext
    from zett_agent.client import create_agent
    from zett_agent.extensions import Extension
    from zett_agent.extensions.async_subagent import (
        AsyncSubAgentExtension,
        SubAgentTask,
        SubAgentTaskStatus,
    )
    from zett_agent.extensions.subagent import SubAgentDefinition, SubAgentExtension
    from zett_agent.extensions.tool_guidelines import ToolGuidelinesExtension
    from zett_agent.messages import (
        AgentMessage,
        AssistantMessage,
        ToolCall,
        ToolMessage,
        UserMessage,
    )
    from zett_agent.models.openai import OpenAIChatModel
    from zett_agent.process import ProcessLimits, ProcessPool, Sandbox
    from zett_agent.runners import InProcessRunner, ProcessRunner
    from zett_agent.testing import FunctionModel, ScriptedModel
    from zett_agent.tools import AgentTool, ToolResult, tool

__version__ = "0.1.0"

#: public name -> the module it lives in
_HOMES: dict[str, str] = {
    "Agent": "zett_agent.agent",
    "AgentRunConfig": "zett_agent.agent",
    "AgentRunContext": "zett_agent.agent",
    "create_agent": "zett_agent.client",
    "Extension": "zett_agent.extensions",
    "AsyncSubAgentExtension": "zett_agent.extensions.async_subagent",
    "SubAgentTask": "zett_agent.extensions.async_subagent",
    "SubAgentTaskStatus": "zett_agent.extensions.async_subagent",
    "SubAgentDefinition": "zett_agent.extensions.subagent",
    "SubAgentExtension": "zett_agent.extensions.subagent",
    "ToolGuidelinesExtension": "zett_agent.extensions.tool_guidelines",
    "AgentMessage": "zett_agent.messages",
    "AssistantMessage": "zett_agent.messages",
    "ToolCall": "zett_agent.messages",
    "ToolMessage": "zett_agent.messages",
    "UserMessage": "zett_agent.messages",
    "OpenAIChatModel": "zett_agent.models.openai",
    "ProcessLimits": "zett_agent.process",
    "ProcessPool": "zett_agent.process",
    "Sandbox": "zett_agent.process",
    "InProcessRunner": "zett_agent.runners",
    "ProcessRunner": "zett_agent.runners",
    "FunctionModel": "zett_agent.testing",
    "ScriptedModel": "zett_agent.testing",
    "AgentTool": "zett_agent.tools",
    "ToolResult": "zett_agent.tools",
    "tool": "zett_agent.tools",
}

__all__ = [
    "Agent",
    "AgentMessage",
    "AgentRunConfig",
    "AgentRunContext",
    "AgentTool",
    "AssistantMessage",
    "AsyncSubAgentExtension",
    "Extension",
    "FunctionModel",
    "InProcessRunner",
    "OpenAIChatModel",
    "ProcessLimits",
    "ProcessPool",
    "ProcessRunner",
    "Sandbox",
    "ScriptedModel",
    "SubAgentDefinition",
    "SubAgentExtension",
    "SubAgentTask",
    "SubAgentTaskStatus",
    "ToolCall",
    "ToolGuidelinesExtension",
    "ToolMessage",
    "ToolResult",
    "UserMessage",
    "__version__",
    "create_agent",
    "tool",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
