"""What the tracing tests share (tests/tracing and the Ray tests): an in-memory span exporter
behind the global tracer provider, and tools their children run (imported by name in pool
processes and Ray workers)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from support.children import schema
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from zett_agent.tools import AgentTool


@contextmanager
def exported_spans(sampler: Any = None) -> Iterator[Any]:
    """A real SDK ``TracerProvider`` set as the global one for the block, exporting to an
    ``InMemorySpanExporter`` (yielded); the API's global is put back afterwards, so no other
    test runs traced (the API lets a program set its provider only once: tests swap it)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider() if sampler is None else TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = trace._TRACER_PROVIDER
    trace._TRACER_PROVIDER = provider
    try:
        yield exporter
    finally:
        trace._TRACER_PROVIDER = saved
        provider.shutdown()


def by_name(spans: Any, name: str) -> Any:
    """The one finished span called ``name``."""
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, f"{len(found)} spans named {name!r} in {[s.name for s in spans]}"
    return found[0]


def traceparent_of(span: Any) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _traceparent() -> str:
    return os.environ.get("TRACEPARENT", "none")


#: answers the TRACEPARENT of the process it runs in (what a process a tool starts inherits)
TRACEPARENT = AgentTool("traceparent", "Say TRACEPARENT.", schema(), _traceparent)


def _crash() -> str:
    os._exit(3)


#: ends the child's process in the middle of the tool's span
CRASH = AgentTool("crash", "Exit the process.", schema(), _crash)


def _forge_spans(count: int) -> str:
    """What a hostile child could send: span records of every wrong shape, a flood of them,
    a chain nested far too deep, ends of spans it never started; then it answers as if
    nothing happened."""
    from zett_agent.process import emit

    for bad in (
        {"kind": "span_start", "id": "1", "name": ["x"], "time": "now", "attributes": "a"},
        {"kind": "span_start", "id": 2**70, "parent": -1},
        {"kind": "span_end", "id": 10**9, "error": {"x": 1}},
        {"kind": "span_end", "id": 1, "time": 2**80, "attributes": {"k": [[1]]}},
        {"kind": "span_start"},
    ):
        emit(bad)
    for local in range(100, 100 + count):  # each under the one before
        emit(
            {
                "kind": "span_start",
                "id": local,
                "parent": local - 1 if local > 100 else None,
                "name": "deep",
                "time": 0,
                "attributes": {"k" * 300: "v" * 10_000},
            }
        )
    return "forged"


#: sends hostile span records from inside a traced child
FORGE = AgentTool(
    "forge",
    "Send bad span records.",
    schema(count="integer"),
    _forge_spans,
)


#: the largest int a span attribute may carry (OTLP's signed 64 bits)
INT64_MAX = 2**63 - 1


class HugeUsageModel:
    """A child model that calls ``huge`` once, then answers with what it said; each of its two
    responses reports ``INT64_MAX`` input and output tokens: valid usage, whose sum over the
    child's calls no longer fits in 64 bits."""

    retry = RetryOptions(max_retries=0)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        results = [m for m in request.messages if isinstance(m, ToolMessage)]
        if results:
            message = AssistantMessage(content=results[-1].text)
        else:
            message = AssistantMessage(tool_calls=(ToolCall("h", "huge", {}),))
        yield ModelEvent.completed(ModelResponse(message, Usage(INT64_MAX, INT64_MAX)))


#: the oversized values a child's span records carry in ``huge``'s records
HUGE_VALUES: dict[str, Any] = {
    "gen_ai.usage.input_tokens": INT64_MAX,
    "gen_ai.usage.output_tokens": INT64_MAX,
    "big": 2**200,
    "small": -(2**200),
    "edge": -(2**63) - 1,
    "ints": [2**64, -(2**64), 1],
}


def _huge_spans() -> str:
    """Send span records whose ints are as large as JSON lets a child make them."""
    from zett_agent.process import emit

    local = 10**6  # far from the ids the child's recorder gives (1, 2, ...)
    emit(
        {
            "kind": "span_start",
            "id": local,
            "parent": None,
            "name": "huge",
            "time": 0,
            "attributes": HUGE_VALUES,
        }
    )
    emit(
        {
            "kind": "span_end",
            "id": local,
            "time": 0,
            "attributes": HUGE_VALUES,
            "error": None,
            "error_type": None,
        }
    )
    return "huge sent"


#: sends span records with oversized ints from inside a traced child
HUGE = AgentTool("huge", "Send huge span records.", schema(), _huge_spans)
