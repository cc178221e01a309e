"""Deterministic offline models for tests, examples and the demo."""

from __future__ import annotations

from zett_agent._testing import FunctionModel, ScriptedModel, ScriptExhaustedError

__all__ = ["FunctionModel", "ScriptExhaustedError", "ScriptedModel"]
