"""A model for any OpenAI-compatible Chat Completions endpoint (streaming, tools, usage)."""

from __future__ import annotations

from zett_agent.models._openai import OpenAIChatModel

__all__ = ["OpenAIChatModel"]
