"""Deterministic offline models for tests, examples and the demo."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeAlias

from zett_agent._messages import AssistantMessage
from zett_agent._model import (
    ModelError,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    RetryOptions,
)

__all__ = ["FunctionModel", "ScriptExhaustedError", "ScriptedModel"]

Reply: TypeAlias = AssistantMessage | str | ModelResponse
"""What an offline model answers: a message, plain text (a final answer), or a response."""


class ScriptExhaustedError(ModelError):
    """A ``ScriptedModel`` was asked for more responses than its script holds (not retried)."""


def _as_response(reply: Reply) -> ModelResponse:
    if isinstance(reply, ModelResponse):
        return reply
    if isinstance(reply, AssistantMessage):
        return ModelResponse(reply)
    if isinstance(reply, str):
        return ModelResponse(AssistantMessage(content=reply))
    raise TypeError(
        "an offline model reply must be an AssistantMessage, a str or a ModelResponse, "
        f"got {type(reply).__name__}"
    )


async def _stream(response: ModelResponse) -> AsyncIterator[ModelEvent]:
    if response.message.content:
        yield ModelEvent.text_delta(response.message.content)
    yield ModelEvent.completed(response)


class ScriptedModel:
    """Replays ``responses`` in order, one per model call.

    Each item is an ``AssistantMessage``, a ``str`` (a final answer), a ``ModelResponse``, or
    an ``Exception`` instance, which that call raises (use ``TransientModelError`` to exercise
    retries). Text content is streamed as one text delta before the completed event. Every
    request received is kept in ``requests``. Holds no locks or loops, so it pickles.

    Raises:
        ScriptExhaustedError: on a call beyond the end of the script.
    """

    def __init__(
        self,
        responses: Sequence[Reply | Exception],
        retry: RetryOptions = RetryOptions(max_retries=0),  # noqa: B008 - immutable
    ) -> None:
        self.responses = list(responses)
        self.retry = retry
        self.requests: list[ModelRequest] = []

    @property
    def remaining(self) -> int:
        """How many scripted responses are left."""
        return len(self.responses) - len(self.requests)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        index = len(self.requests)
        self.requests.append(request)
        if index >= len(self.responses):
            raise ScriptExhaustedError(
                f"ScriptedModel has only {len(self.responses)} responses and was asked for "
                f"response {index + 1}; add responses to the script (last message of the "
                f"request: {request.messages[-1] if request.messages else None!r})"
            )
        item = self.responses[index]
        if isinstance(item, BaseException):
            raise item
        async for event in _stream(_as_response(item)):
            yield event

    def __repr__(self) -> str:
        return f"<ScriptedModel {len(self.requests)}/{len(self.responses)} used>"


class FunctionModel:
    """Answers each call with ``fn(request)``, which may be sync or async.

    ``fn`` returns an ``AssistantMessage``, a ``str`` or a ``ModelResponse`` (or an awaitable
    of one); what it raises, the call raises. Every request is kept in ``requests``. Pickles
    when ``fn`` does (cloudpickle handles closures and lambdas); a pickled copy (the one a child
    process gets when a definition uses the parent's model) starts with an empty ``requests``,
    so shipping the model costs the same after a thousand requests as after none.
    """

    def __init__(
        self,
        fn: Callable[[ModelRequest], Reply | Awaitable[Reply]],
        retry: RetryOptions = RetryOptions(max_retries=0),  # noqa: B008 - immutable
    ) -> None:
        self.fn = fn
        self.retry = retry
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        reply = self.fn(request)
        if inspect.isawaitable(reply):
            reply = await reply
        async for event in _stream(_as_response(reply)):
            yield event

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "requests": []}

    def __repr__(self) -> str:
        return f"<FunctionModel {getattr(self.fn, '__qualname__', self.fn)!r}>"
