"""``create_agent`` and the client it returns."""

from __future__ import annotations

from zett_agent._runtime._client import AgentClient, create_agent

__all__ = ["AgentClient", "create_agent"]
