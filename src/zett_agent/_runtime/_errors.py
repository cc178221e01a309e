"""The runtime's own errors: a request failed because of its rules, not a model's or a hook's."""

from __future__ import annotations

__all__ = ["AgentClosedError", "AgentError", "MaxTurnsExceeded", "ModelStreamError"]


class AgentError(Exception):
    """A request failed because of the runtime's own rules (not a model or hook exception)."""


class MaxTurnsExceeded(AgentError):
    """The request used ``AgentRunConfig.max_turns`` turns without a final answer."""


class AgentClosedError(AgentError):
    """The agent was closed with ``close()``; create a new agent to run more requests."""


class ModelStreamError(AgentError):
    """The model's stream ended without its completed event."""
