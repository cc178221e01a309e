"""The agent runtime: ``Agent``, its per-request ``AgentRunContext`` and ``AgentRunConfig``."""

from __future__ import annotations

from zett_agent._runtime._agent import (
    Agent,
    AgentClosedError,
    AgentError,
    MaxTurnsExceeded,
    ModelStreamError,
)
from zett_agent._runtime._context import AgentRunConfig, AgentRunContext
from zett_agent._session import InMemorySessionStore, SessionData, SessionStore

__all__ = [
    "Agent",
    "AgentClosedError",
    "AgentError",
    "AgentRunConfig",
    "AgentRunContext",
    "InMemorySessionStore",
    "MaxTurnsExceeded",
    "ModelStreamError",
    "SessionData",
    "SessionStore",
]
