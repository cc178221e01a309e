"""Child agents in their own processes: definitions, built-in profiles, the foreground tool."""

from __future__ import annotations

from zett_agent.extensions._definition import (
    SubAgentDefinition,
    default_subagents,
    explore_profile,
    reasoning_profile,
)
from zett_agent.extensions._subagent import SubAgentExtension

__all__ = [
    "SubAgentDefinition",
    "SubAgentExtension",
    "default_subagents",
    "explore_profile",
    "reasoning_profile",
]
