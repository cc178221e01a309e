"""What the tracing tests share (tests/tracing and the Ray tests): an in-memory span exporter
behind the global tracer provider, and tools their children run (imported by name in pool
processes and Ray workers)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from support.children import schema
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
