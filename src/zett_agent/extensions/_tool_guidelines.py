"""``ToolGuidelinesExtension``: tell the model how to use each registered tool."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zett_agent._runtime._extension import Extension

if TYPE_CHECKING:
    from zett_agent.agent import AgentRunContext

HEADING = "# Tool guidelines"


class ToolGuidelinesExtension(Extension):
    """Append the usage guidance each registered tool carries to the system prompt.

    Register it after the extensions whose tools it describes. The section is rebuilt for every
    request from the tools registered for that request; tools without ``guidelines`` add nothing.
    """

    async def before_run(self, context: AgentRunContext) -> None:
        lines = [
            f"- {name}: {tool.guidelines.strip()}"
            for name, tool in context.tools.items()
            if tool.guidelines and tool.guidelines.strip()
        ]
        if lines:
            base = context.system_prompt or ""
            context.system_prompt = (
                (base + "\n\n" if base else "") + HEADING + "\n" + "\n".join(lines)
            )
