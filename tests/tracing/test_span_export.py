"""No value a child can shape fails an export: every integer attribute is clamped into the
64 bits OTLP carries where it is set or summed, whatever tracer it enters (the parent's
OpenTelemetry spans, a child's recorder, the parent's relay of the child's records), and a
whole batch (the parent's own spans with the child's) goes through the real OTLP protobuf
encoder."""

from __future__ import annotations

import ast
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.calls import one_task_reported
from support.parent import run_parent, worker
from support.tracing import HUGE, INT64_MAX, HugeUsageModel, by_name, exported_spans
from zett_agent._tracing import _base
from zett_agent._tracing import _tracer as _tracing
from zett_agent._tracing._base import INT_MIN, add_ints, clamp_int, clean_attributes
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension

pytest.importorskip("opentelemetry.sdk", reason="the tracing tests need the otel extra")
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

SRC = Path(__file__).parents[2] / "src" / "zett_agent"


@pytest.fixture
def exporter() -> Iterator[Any]:
    with exported_spans() as exporter:
        yield exporter


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    return getattr(value, kind)


def encoded(spans: Any, caplog: pytest.LogCaptureFixture) -> list[tuple[str, dict[str, Any]]]:
    """``spans`` through the OTLP protobuf encoder and back: each span's name and attributes.

    Fails if the encoder logged a problem (it drops an attribute it cannot encode, with an
    error in the log, where older versions raised and lost the whole batch).
    """
    with caplog.at_level(logging.WARNING):
        data = encode_spans(spans).SerializeToString()
    problems = [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")]
    assert not problems, problems
    request = ExportTraceServiceRequest.FromString(data)
    return [
        (span.name, {kv.key: _value(kv.value) for kv in span.attributes})
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]


def one(batch: list[tuple[str, dict[str, Any]]], name: str) -> dict[str, Any]:
    [attributes] = [attributes for span, attributes in batch if span == name]
    return attributes


async def test_a_childs_oversized_ints_are_clamped_and_the_whole_batch_encodes(
    exporter: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A real child in its own process: two model calls that each report 2**63-1 tokens (each
    valid, their sum is not), and a tool whose span records carry ints far past 64 bits."""
    async with AsyncSubAgentExtension([worker(HugeUsageModel(), tools=(HUGE,))]) as extension:
        content, _ = await run_parent(extension, one_task_reported())
        [task] = extension.tasks("parent")
    assert content == "huge sent" and task.error is None
    spans = exporter.get_finished_spans()

    agent = by_name(spans, "invoke_agent worker")
    # 3 * (2**63 - 1) summed from the child's chat spans and its forged record: saturated
    assert agent.attributes["gen_ai.usage.input_tokens"] == INT64_MAX
    assert agent.attributes["gen_ai.usage.output_tokens"] == INT64_MAX
    chats = [s for s in spans if s.name == "chat HugeUsageModel"]
    assert [s.attributes["gen_ai.usage.input_tokens"] for s in chats] == [INT64_MAX] * 2
    huge = by_name(spans, "huge")
    assert huge.attributes["big"] == INT64_MAX
    assert huge.attributes["small"] == INT_MIN and huge.attributes["edge"] == INT_MIN
    assert tuple(huge.attributes["ints"]) == (INT64_MAX, INT_MIN, 1)

    batch = encoded(spans, caplog)
    # the whole batch: the parent's own spans beside the child's, every attribute kept
    assert sorted(name for name, _ in batch) == sorted(s.name for s in spans)
    assert {"invoke_agent", "execute_tool task_start", "chat StepModel"} <= {n for n, _ in batch}
    for name, attributes in batch:
        span = next(s for s in spans if s.name == name)
        assert set(attributes) == set(span.attributes), name
    assert one(batch, "invoke_agent worker")["gen_ai.usage.input_tokens"] == INT64_MAX
    assert one(batch, "huge")["big"] == INT64_MAX
    assert one(batch, "huge")["ints"] == (INT64_MAX, INT_MIN, 1)
    assert one(batch, "invoke_agent")["gen_ai.conversation.id"] == "parent"


def test_the_parents_own_spans_clamp_what_is_set_on_them(
    exporter: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The OpenTelemetry tracer is a gate of its own: at the start, later, and in an error."""
    tracer = _tracing.current()
    assert tracer is not None
    span = tracer.start("s", {"start": 2**64, "inf": float("inf"), "flag": True})
    span.set_attributes({"later": -(2**70), "ok": 5, "nan": float("nan"), "f": 1.5})
    span.end(error="e" * 10_000, error_type="t")
    [finished] = exporter.get_finished_spans()
    assert dict(finished.attributes) == {
        "start": INT64_MAX,
        "flag": True,
        "later": INT_MIN,
        "ok": 5,
        "f": 1.5,
        "error.type": "t",
    }
    assert type(finished.attributes["flag"]) is bool
    assert len(finished.status.description) <= _base.MAX_DESCRIPTION
    [(_, attributes)] = encoded([finished], caplog)
    assert attributes["start"] == INT64_MAX and attributes["later"] == INT_MIN


def test_the_gate_clamps_ints_keeps_bools_and_drops_what_cannot_be_encoded() -> None:
    class Count(int):
        def __int__(self) -> int:  # never called: the gate converts without the subclass
            raise AssertionError

    class Name(str):
        def __str__(self) -> str:
            raise AssertionError

    cleaned = clean_attributes(
        {
            "max": INT64_MAX,
            "over": INT64_MAX + 1,
            "under": INT_MIN - 1,
            "yes": True,
            "no": False,
            "count": Count(3),
            "name": Name("n"),
            "inf": float("-inf"),
            "nan": float("nan"),
            "list": [2**64, 0, -(2**64)],
            "bools": [True, 1],  # mixed types: left out
        }
    )
    assert cleaned == {
        "max": INT64_MAX,
        "over": INT64_MAX,
        "under": INT_MIN,
        "yes": True,
        "no": False,
        "count": 3,
        "name": "n",
        "list": [INT64_MAX, 0, INT_MIN],
    }
    assert type(cleaned["count"]) is int and type(cleaned["name"]) is str
    assert type(cleaned["yes"]) is bool
    assert clamp_int(2**1000) == INT64_MAX and clamp_int(-(2**1000)) == INT_MIN
    assert add_ints(INT64_MAX, INT64_MAX) == INT64_MAX and add_ints(INT_MIN, -1) == INT_MIN


def test_only_the_opentelemetry_tracer_touches_opentelemetry_spans() -> None:
    """The gate cannot be gone around: no module but ``_otel`` imports OpenTelemetry or calls
    a method that puts attributes on one of its spans (every other one goes through
    ``OtelSpan``, whose ``set_attributes`` is the gate)."""
    otel_only = {
        "set_attribute",
        "start_span",
        "start_as_current_span",
        "add_event",
        "record_exception",
        "add_link",
    }
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "_otel.py":
            continue
        where = path.relative_to(SRC)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in otel_only:
                found.append(f"{where}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.Import | ast.ImportFrom):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                modules.append(getattr(node, "module", None) or "")
                found += [
                    f"{where}:{node.lineno} imports {m}" for m in modules if "opentelemetry" in m
                ]
    assert not found, found
