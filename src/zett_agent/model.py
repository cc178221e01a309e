"""The model protocol and the request, response and event types it streams."""

from __future__ import annotations

from zett_agent._model import (
    Model,
    ModelError,
    ModelEvent,
    ModelEventKind,
    ModelRequest,
    ModelResponse,
    RetryOptions,
    ToolSpec,
    TransientModelError,
    Usage,
)

__all__ = [
    "Model",
    "ModelError",
    "ModelEvent",
    "ModelEventKind",
    "ModelRequest",
    "ModelResponse",
    "RetryOptions",
    "ToolSpec",
    "TransientModelError",
    "Usage",
]
