"""The runtime's spans on OpenTelemetry: the tracer of a process with a tracer provider.

Imported only by ``zett_agent._tracing._tracer.current()``, and only once ``opentelemetry.trace`` is
imported and its global tracer provider is a real one (the application configured it): a
program without OpenTelemetry, or without a provider, never imports this module. Needs
``opentelemetry-api`` (the ``otel`` extra); the application brings the SDK and its exporter.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from zett_agent._tracing._base import (
    ERROR_TYPE,
    MAX_DESCRIPTION,
    Attributes,
    Kind,
    clean_attributes,
    text,
)

if TYPE_CHECKING:
    from zett_agent._tracing._base import Span as RuntimeSpan

__all__ = ["OtelSpan", "OtelTracer", "tracer_for"]

_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}
_INSTRUMENTATION = "zett_agent"


class OtelSpan:
    """An OpenTelemetry span behind the runtime's span interface.

    Every attribute passes ``clean_attributes`` on its way in (ints clamped to 64 bits, text
    bounded), so nothing set here can fail an exporter's encoding.
    """

    __slots__ = ("span",)

    def __init__(self, span: trace.Span) -> None:
        self.span = span

    @property
    def recording(self) -> bool:
        return self.span.is_recording()

    def set_attributes(self, attributes: Attributes) -> None:
        cleaned = clean_attributes(attributes)
        if cleaned:
            self.span.set_attributes(cleaned)

    def end(
        self,
        *,
        error: str | None = None,
        error_type: str | None = None,
        end_ns: int | None = None,
    ) -> None:
        if error is not None:
            self.set_attributes({ERROR_TYPE: error_type or "_OTHER"})
            self.span.set_status(Status(StatusCode.ERROR, text(error, MAX_DESCRIPTION)))
        self.span.end(end_time=end_ns)

    @contextmanager
    def activate(self) -> Iterator[object]:
        # the runtime sets the status itself: the API's exception recording stays off
        with trace.use_span(
            self.span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        ):
            yield self

    def traceparent(self) -> str | None:
        context = self.span.get_span_context()
        if not context.is_valid:
            return None
        return (
            f"00-{trace.format_trace_id(context.trace_id)}-"
            f"{trace.format_span_id(context.span_id)}-{int(context.trace_flags):02x}"
        )


class OtelTracer:
    """Starts the runtime's spans with one ``opentelemetry.trace.Tracer``.

    Names are cut to ``MAX_TEXT`` characters, attributes pass ``clean_attributes``.
    """

    request_spans = True

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def start(
        self,
        name: str,
        attributes: Attributes,
        *,
        parent: RuntimeSpan | None = None,
        start_ns: int | None = None,
        kind: Kind = "internal",
    ) -> OtelSpan:
        context = trace.set_span_in_context(parent.span) if isinstance(parent, OtelSpan) else None
        return OtelSpan(
            self._tracer.start_span(
                text(name),
                context=context,
                kind=_KINDS[kind],
                attributes=clean_attributes(attributes),
                start_time=start_ns,
            )
        )


_cached: tuple[trace.TracerProvider, OtelTracer] | None = None


def tracer_for(provider: trace.TracerProvider) -> OtelTracer:
    """The runtime's tracer on ``provider`` (made once per provider)."""
    global _cached
    cached = _cached
    if cached is not None and cached[0] is provider:
        return cached[1]
    tracer = OtelTracer(provider.get_tracer(_INSTRUMENTATION))
    _cached = (provider, tracer)
    return tracer
