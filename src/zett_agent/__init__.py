"""zett_agent: an asyncio agent framework whose child agents run in their own OS processes."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
