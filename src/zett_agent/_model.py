"""The model protocol: one streamed request in, model events out."""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from zett_agent._messages import AssistantMessage, Message


@dataclass(frozen=True, slots=True)
class RetryOptions:
    """How the runtime retries a model call that failed with a transient error.

    Retries happen only while the failed attempt has not yet produced its completed response.
    The delay before retry ``n`` (1-based) is ``min(max_delay, initial_delay * backoff**(n-1))``.
    """

    max_retries: int = 2
    initial_delay: float = 0.5
    max_delay: float = 8.0
    backoff: float = 2.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.initial_delay < 0 or self.max_delay < 0:
            raise ValueError("retry delays must be >= 0")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        return float(min(self.max_delay, self.initial_delay * self.backoff ** max(0, attempt - 1)))


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one model call used, as the provider reported them.

    ``input_tokens`` counts every token of the request, those served from the provider's
    prompt cache included: of them, ``cache_read_tokens`` were read from it and
    ``cache_write_tokens`` written to it (0 when the provider says nothing of a cache).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What a model needs to know about a tool: its name, description and JSON schema."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One provider request: the conversation so far, the tools offered, the system prompt."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    system_prompt: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """The complete answer of one model call."""

    message: AssistantMessage
    usage: Usage | None = None


class ModelEventKind(enum.Enum):
    TEXT_DELTA = "text_delta"
    COMPLETED = "completed"


@dataclass(frozen=True, slots=True)
class ModelEvent:
    """One item of a model's stream: a text delta, or the completed response (always last)."""

    kind: ModelEventKind
    text: str = ""
    response: ModelResponse | None = None

    @classmethod
    def completed(cls, response: ModelResponse) -> ModelEvent:
        return cls(ModelEventKind.COMPLETED, response=response)

    @classmethod
    def text_delta(cls, text: str) -> ModelEvent:
        return cls(ModelEventKind.TEXT_DELTA, text=text)


@runtime_checkable
class Model(Protocol):
    """A language model. ``stream`` yields text deltas, then exactly one completed event.

    Models are shipped to child processes with cloudpickle, so they must not hold live
    connections in their pickled state (open them lazily).
    """

    retry: RetryOptions

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]: ...


class ModelError(Exception):
    """A model call failed. ``retryable`` marks transient failures the runtime may retry."""

    def __init__(self, message: str, *, retryable: bool = False, status: int | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.status = status


class TransientModelError(ModelError):
    """A failure worth retrying: rate limit, server error, dropped connection."""

    def __init__(self, message: str, *, status: int | None = None):
        super().__init__(message, retryable=True, status=status)
