"""The model call of one turn: through the extensions' ``on_model_request`` chain, with retries.

``ModelCall`` streams one request through every extension that overrides
``on_model_request`` (the first registered is the outermost layer) down to the model itself,
traced as a ``chat`` span when the request is traced. Each streamed text delta is published as
a ``ModelTextDeltaEvent``; a retryable ``ModelError`` before the completed event is retried as
the model's ``retry`` options say.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from zett_agent._events import ModelTextDeltaEvent
from zett_agent._model import ModelError, ModelEvent, ModelEventKind, RetryOptions
from zett_agent._runtime._errors import ModelStreamError
from zett_agent._runtime._extension import closing_stream
from zett_agent._tracing import _tracer as _tracing

if TYPE_CHECKING:
    from zett_agent._model import Model, ModelRequest, ModelResponse
    from zett_agent._runtime._context import AgentRunContext, RunState
    from zett_agent._runtime._extension import Extension
    from zett_agent._runtime._hooks import Hooks

__all__ = ["ModelCall"]

logger = logging.getLogger("zett_agent.agent")


class ModelCall:
    """Calls an agent's model for a request: ``await model_call(run, context, request)``.

    ``wrappers`` are the extensions that override ``on_model_request``, in registration order.
    """

    __slots__ = ("_hooks", "_model", "_wrappers")

    def __init__(self, model: Model, wrappers: tuple[Extension, ...], hooks: Hooks) -> None:
        self._model = model
        self._wrappers = wrappers
        self._hooks = hooks

    def _chain(
        self, run: RunState, context: AgentRunContext, index: int
    ) -> Callable[[ModelRequest], AsyncIterator[ModelEvent]]:
        if index == len(self._wrappers):
            if run.tracer is not None:
                return _tracing.model_stream(run.tracer, context, self._model)
            return self._model.stream
        wrapper = self._wrappers[index]
        inner = self._chain(run, context, index + 1)

        def call_next(request: ModelRequest) -> AsyncIterator[ModelEvent]:
            return wrapper.on_model_request(context, request, inner)

        return call_next

    async def __call__(
        self, run: RunState, context: AgentRunContext, request: ModelRequest
    ) -> ModelResponse:
        """Stream ``request`` through the chain and return the completed response.

        Raises:
            ModelStreamError: the stream ended without its completed event.
            ModelError: the model failed and retries (per ``model.retry``) were exhausted.
            Exception: whatever an ``on_model_request`` or ``on_event`` hook raised.

        Cancellation: closes the stream (so the provider's connection is released) and
        propagates.
        """
        retry: RetryOptions = getattr(self._model, "retry", None) or RetryOptions(max_retries=0)
        hooks = self._hooks
        session_id = context.session_id
        attempt = 0
        while True:
            completed: ModelResponse | None = None
            try:
                async with closing_stream(self._chain(run, context, 0)(request)) as stream:
                    async for event in stream:
                        if event.kind is ModelEventKind.TEXT_DELTA:
                            await hooks.publish(
                                run, context, ModelTextDeltaEvent(session_id, event.text)
                            )
                        elif event.kind is ModelEventKind.COMPLETED:
                            completed = event.response
                if completed is None:
                    raise ModelStreamError(
                        f"the stream of {type(self._model).__name__} ended without a completed "
                        "event; a model must yield ModelEvent.completed(response) last"
                    )
                return completed
            except ModelError as error:
                if completed is not None or not error.retryable or attempt >= retry.max_retries:
                    raise
                attempt += 1
                delay = retry.delay(attempt)
                logger.info(
                    "model call failed (%s); retry %d/%d in %.2fs",
                    error,
                    attempt,
                    retry.max_retries,
                    delay,
                )
                await asyncio.sleep(delay)
