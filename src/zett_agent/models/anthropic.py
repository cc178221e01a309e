"""A model for Anthropic's Messages API (Claude): streaming, tools, usage with the prompt cache."""

from __future__ import annotations

from zett_agent.models._anthropic import AnthropicModel

__all__ = ["AnthropicModel"]
