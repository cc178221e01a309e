"""Tracing in the runtime: which tracer a request uses, and the spans it makes.

The runtime asks ``current()`` once per request. It answers ``None`` (nothing traced, nothing
imported) unless one of two holds:

- this code runs inside a traced child agent (``run_child`` installs a *recorder*: the child's
  spans become plain-data events on its channel to the parent, see ``ChildTracing``); or
- ``opentelemetry.trace`` is already imported (``sys.modules``, so absence costs a dict
  look-up) and its global tracer provider is a real one (not the API's proxy or no-op
  provider): then the spans go to that provider through ``zett_agent._tracing._otel``.

A traced request is an ``invoke_agent`` span; each model call in it a ``chat {model}`` span and
each tool call an ``execute_tool {tool}`` span, named and described after the OpenTelemetry
GenAI semantic conventions (the names: ``zett_agent._tracing._base``; what they say of a
model: ``zett_agent._tracing._trace_models``). Nothing here raises into the runtime for tracing's
sake:
a tracer that fails is logged once and the request goes on.

This module is imported by every agent, children included: it imports nothing heavy.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from zett_agent._tracing._base import (
    CHAT,
    CONVERSATION,
    EXECUTE_TOOL,
    INPUT_TOKENS,
    INVOKE_AGENT,
    MAX_DESCRIPTION,
    OPERATION,
    OUTPUT_TOKENS,
    REQUEST_MODEL,
    TOOL_CALL_ID,
    TOOL_NAME,
    TOOL_TYPE,
    AttributeValue,
    Traced,
    Tracer,
    clamp_int,
    describe,
    error_type,
    origin,
    text,
)
from zett_agent._tracing._trace_models import (
    ModelNotes,
    agent_attributes,
    model_attributes,
    model_name,
    note_model_call,
    noting,
)

if TYPE_CHECKING:
    from zett_agent._messages import ToolCall, ToolMessage
    from zett_agent._model import Model, ModelEvent, ModelRequest

__all__ = [
    "ChildTracing",
    "ModelNotes",
    "agent_attributes",
    "current",
    "model_attributes",
    "model_name",
    "model_stream",
    "note_model_call",
    "request",
    "tool_call",
    "warn_once",
]

log = logging.getLogger("zett_agent.tracing")

_T = TypeVar("_T")
#: what a request's spans read of it: an ``AgentRunContext``, typed as itself for its callbacks
_C = TypeVar("_C", bound=Traced)

# the names of operations and attributes, what a span is, and the gate every attribute value
# passes (``clean_attributes``): zett_agent._tracing._base


# -- which tracer -----------------------------------------------------------------------------

#: set by ``ChildTracing`` for the duration of a child agent: its recorder, or ``_OFF``
_CHILD: contextvars.ContextVar[object] = contextvars.ContextVar("zett_agent_child_tracer")
_OFF = object()
_warned: set[str] = set()


def current() -> Tracer | None:
    """The tracer for a request starting now, or ``None`` when nothing is traced.

    Costs a context variable and a ``sys.modules`` look-up when OpenTelemetry is not imported;
    with it imported but no provider set, a call of ``get_tracer_provider()`` as well.
    """
    tracer = _CHILD.get(None)
    if tracer is not None:
        return None if tracer is _OFF else tracer  # type: ignore[return-value]
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    try:
        provider = trace.get_tracer_provider()
        if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
            return None
        from zett_agent._tracing import _otel

        return _otel.tracer_for(provider)
    except Exception:
        warn_once("provider", "OpenTelemetry tracing is off: the tracer provider failed")
        return None


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, exc_info=True)


# -- what the runtime traces ------------------------------------------------------------------


def _usage_attributes(usage: Any) -> dict[str, AttributeValue]:
    """The token counts of ``usage`` (ints only; the span clamps them to 64 bits)."""
    if usage is None:
        return {}
    counts: dict[str, AttributeValue] = {}
    for key, value in (
        (INPUT_TOKENS, getattr(usage, "input_tokens", None)),
        (OUTPUT_TOKENS, getattr(usage, "output_tokens", None)),
    ):
        if isinstance(value, int) and not isinstance(value, bool):
            counts[key] = clamp_int(value)
    return counts


async def request(
    tracer: Tracer,
    context: _C,
    execute: Callable[[_C], Awaitable[_T]],
) -> _T:
    """Run ``execute(context)`` (one request) as an ``invoke_agent`` span.

    The span is current while it runs. Exceptions (cancellation included) end the span with an error
    and propagate.
    """
    if not tracer.request_spans:
        return await execute(context)
    span = tracer.start(
        INVOKE_AGENT,
        {
            OPERATION: INVOKE_AGENT,
            CONVERSATION: text(context.session_id),
            **agent_attributes(context.model),
        },
    )
    try:
        with span.activate():
            result = await execute(context)
    except BaseException as exc:
        span.set_attributes(_usage_attributes(context.usage))
        span.end(error=describe(exc), error_type=error_type(exc))
        raise
    span.set_attributes(_usage_attributes(context.usage))
    span.end()
    return result


def model_stream(
    tracer: Tracer, context: Traced, model: Model
) -> Callable[[ModelRequest], AsyncIterator[ModelEvent]]:
    """Return ``model.stream`` with every call a ``chat {model}`` span (kind client).

    The span carries ``model_attributes(model)``, the usage the completed response reports, and
    what the model notes while it computes (``note_model_call``). It is current only while the
    model computes its next event, never across a ``yield``. Closing the stream early
    (cancellation) ends the span with an error unless the completed response had arrived; the
    model's own stream is closed too.
    """
    from zett_agent._model import ModelEventKind

    attributes = {
        **model_attributes(model),
        OPERATION: CHAT,
        CONVERSATION: text(context.session_id),
    }
    name = f"{CHAT} {attributes[REQUEST_MODEL]}"

    async def stream(request: ModelRequest) -> AsyncIterator[ModelEvent]:
        span = tracer.start(name, attributes, kind="client")
        inner = model.stream(request)
        completed = False
        failure: BaseException | None = None
        try:
            while True:
                with span.activate(), noting(span):  # noting: for the model's note_model_call
                    try:
                        event = await anext(inner)
                    except StopAsyncIteration:
                        break
                if event.kind is ModelEventKind.COMPLETED and event.response is not None:
                    completed = True
                    span.set_attributes(_usage_attributes(event.response.usage))
                yield event
        except BaseException as exc:
            failure = exc
            raise
        finally:
            try:
                aclose = getattr(inner, "aclose", None)
                if aclose is not None:
                    await aclose()
            finally:
                if failure is None or (completed and isinstance(failure, GeneratorExit)):
                    span.end()
                else:
                    span.end(error=describe(failure), error_type=error_type(failure))

    return stream


async def tool_call(
    tracer: Tracer,
    context: _C,
    call: ToolCall,
    run: Callable[[_C, ToolCall], Awaitable[ToolMessage]],
) -> ToolMessage:
    """Run one tool call (its hooks included) as an ``execute_tool {tool}`` span.

    The span is current while it runs, so what the tool starts (a child agent) is its child. A
    failed call ends it with an error (``error.type`` ``tool_error``); an exception or cancellation
    too, and propagates.
    """
    from zett_agent._messages import ToolStatus

    name = text(call.name, 128)
    span = tracer.start(
        f"{EXECUTE_TOOL} {name}",
        {
            OPERATION: EXECUTE_TOOL,
            TOOL_NAME: name,
            TOOL_CALL_ID: text(call.id),
            TOOL_TYPE: "function",
            CONVERSATION: text(context.session_id),
        },
    )
    try:
        with span.activate():
            message = await run(context, call)
    except BaseException as exc:
        span.end(error=describe(exc), error_type=error_type(exc))
        raise
    if message.status is ToolStatus.FAILED:
        first = message.text.strip().splitlines()[0] if message.text.strip() else "failed"
        span.end(error=text(first, MAX_DESCRIPTION), error_type="tool_error")
    else:
        span.end()
    return message


# -- children ---------------------------------------------------------------------------------


class ChildTracing:
    """For the duration of one child agent (``run_child``): record its spans as events.

    ``trace`` is what the parent shipped (``ChildSpec.trace``): ``{"traceparent": str,
    "record": bool, "origin": [pid, token]}``, or ``None`` when the parent traces nothing.
    Inside the block, ``current()`` answers the child's recorder (so the child's agent never
    uses a tracer provider of its own process: its spans go to the parent, which exports
    them), or ``None`` when the parent traces nothing or its span is sampled out. When the
    child runs in a process of its own, ``TRACEPARENT`` is set in its environment for
    processes its tools start, and restored on exit (a pool process runs later jobs).
    """

    __slots__ = ("_emit", "_env", "_token", "_trace")

    def __init__(self, trace: Mapping[str, Any] | None, emit: Callable[[Any], None]) -> None:
        self._trace = trace
        self._emit = emit
        self._env: str | None = None
        self._token: contextvars.Token[object] | None = None

    def __enter__(self) -> None:
        trace = self._trace
        traceparent = trace.get("traceparent") if isinstance(trace, Mapping) else None
        recorder: object = _OFF
        if isinstance(trace, Mapping) and isinstance(traceparent, str) and len(traceparent) == 55:
            if trace.get("record") is True:
                from zett_agent._tracing._span_record import Recorder

                recorder = Recorder(self._emit, traceparent)
            if trace.get("origin") != origin():
                self._env = os.environ.get("TRACEPARENT", "")
                os.environ["TRACEPARENT"] = traceparent
        self._token = _CHILD.set(recorder)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _CHILD.reset(self._token)
        if self._env is not None:
            if self._env:
                os.environ["TRACEPARENT"] = self._env
            else:
                os.environ.pop("TRACEPARENT", None)
