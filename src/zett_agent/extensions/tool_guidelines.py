"""Put each registered tool's usage guidance into the system prompt."""

from __future__ import annotations

from zett_agent.extensions._tool_guidelines import ToolGuidelinesExtension

__all__ = ["ToolGuidelinesExtension"]
