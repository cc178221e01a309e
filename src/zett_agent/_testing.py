"""Deterministic offline models for tests, examples and the demo."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeAlias

from zett_agent._messages import AssistantMessage
from zett_agent._model import ModelError, ModelEvent, ModelRequest, ModelResponse, RetryOptions

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
    request received is kept in ``requests``.

    A copy sent to another process (pickled, as for a child agent) gets the script, not the
    progress: it starts at the first response with an empty ``requests``. So a parent's
    half-used script never travels, and never makes a child replay the parent's next step.
    Give each ``SubAgentDefinition`` its own ``ScriptedModel`` (or a ``FunctionModel`` that
    answers from the request) rather than ``model=None`` with a scripted parent: a child on a
    copy of the parent's script would replay the parent's first steps.

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

    def __getstate__(self) -> dict[str, Any]:
        # the script, not the progress: a copy starts over with no history
        return {"responses": self.responses, "retry": self.retry, "requests": []}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"<ScriptedModel {len(self.requests)}/{len(self.responses)} used>"


class FunctionModel:
    """Answers each call with ``fn(request)``, which may be sync or async.

    ``fn`` returns an ``AssistantMessage``, a ``str`` or a ``ModelResponse`` (or an awaitable
    of one); what it raises, the call raises. The last ``keep_requests`` requests are kept in
    ``requests`` (oldest first), so a long-running program does not grow without bound.

    Pickles when ``fn`` does (cloudpickle handles closures and lambdas). A copy sent to another
    process (as for a child agent) gets ``fn`` and ``retry`` with an empty ``requests``: a
    child never receives the parent's history, and ``fn`` decides from each request alone,
    which makes it the offline model to share with children through ``model=None``.
    """

    def __init__(
        self,
        fn: Callable[[ModelRequest], Reply | Awaitable[Reply]],
        retry: RetryOptions = RetryOptions(max_retries=0),  # noqa: B008 - immutable
        *,
        keep_requests: int = 1000,
    ) -> None:
        if keep_requests < 0:
            raise ValueError(f"keep_requests must be >= 0, got {keep_requests}")
        self.fn = fn
        self.retry = retry
        self.keep_requests = keep_requests
        self.requests: list[ModelRequest] = []

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "requests": []}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        if len(self.requests) > self.keep_requests:
            del self.requests[: len(self.requests) - self.keep_requests]
        reply = self.fn(request)
        if inspect.isawaitable(reply):
            reply = await reply
        async for event in _stream(_as_response(reply)):
            yield event

    def __repr__(self) -> str:
        return f"<FunctionModel {getattr(self.fn, '__qualname__', self.fn)!r}>"
