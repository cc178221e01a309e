"""Extensions: the ``Extension`` base class and its hooks (see SPEC section 3)."""

from __future__ import annotations

from zett_agent._runtime._extension import Extension, ModelCallNext, ToolCallNext, closing_stream

__all__ = ["Extension", "ModelCallNext", "ToolCallNext", "closing_stream"]
