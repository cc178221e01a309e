"""The span records a child sends are hostile input to the parent: every shape of bad record
is dropped (and counted), none raises, and the number, size, nesting and attribute types of
what the parent re-creates are bounded. The child's recorder never lets tracing stop its
work. And tracing costs nothing when OpenTelemetry is absent or has no provider."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from support.scripts import python_prints
from support.tracing import by_name, exported_spans
from zett_agent._tracing import _base
from zett_agent._tracing._span_record import MAX_ATTRIBUTES, MAX_LIST, Recorder, clean_attributes
from zett_agent._tracing._trace_models import ModelNotes, note_model_call, noting
from zett_agent.runners import _span_relay
from zett_agent.runners._span_relay import MAX_DEPTH, MAX_OPEN, ChildTrace

pytest.importorskip("opentelemetry.sdk", reason="the tracing tests need the otel extra")
from opentelemetry.trace import StatusCode


@pytest.fixture
def exporter() -> Iterator[Any]:
    with exported_spans() as exporter:
        yield exporter


def child_trace() -> ChildTrace:
    trace = _span_relay.child_trace("worker", "task-1", "parent/task-1", "d")
    assert trace is not None
    return trace


def start(local: Any, name: Any = "execute_tool t", parent: Any = None, **extra: Any) -> Any:
    return {
        "kind": "span_start",
        "id": local,
        "parent": parent,
        "name": name,
        "time": time.time_ns(),
        "attributes": {},
        **extra,
    }


def end(local: Any, **extra: Any) -> Any:
    return {
        "kind": "span_end",
        "id": local,
        "time": time.time_ns(),
        "attributes": {},
        "error": None,
        "error_type": None,
        **extra,
    }


def test_bad_records_are_dropped_and_counted_never_raised(exporter: Any) -> None:
    trace = child_trace()
    # not span events: left to the progress code (fold says no)
    for other in (None, 1, "span_start", [1], {"kind": "progress"}, {"kind": ["span_start"]}):
        assert trace.fold(other) is False
    bad = [
        start("1"),
        start(1.0),
        start(True),
        start(-1),
        start(0),
        start(2**60),
        start(None),
        {"kind": "span_start"},
        {"kind": "span_end"},
        end(99),
        end("x"),
    ]
    for event in bad:
        assert trace.fold(event) is True
    # odd fields on a good id: the span is made, the odd parts replaced or left out
    assert trace.fold(start(1, name={"x": 1}, time="soon", attributes=[1, 2]))
    assert trace.fold(start(1))  # the same id again while open: dropped
    assert trace.fold(end(1, time=-5, attributes="x", error=["no"], error_type=7))
    assert trace.fold(end(1))  # ended already: dropped
    trace.end_job(None)
    assert trace.fold(start(5)) is True  # after the end: taken, ignored
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == ["invoke_agent worker", "span"]
    agent = by_name(spans, "invoke_agent worker")
    assert agent.attributes["zett_agent.spans_dropped"] == len(bad) + 2
    made = by_name(spans, "span")
    assert made.parent.span_id == agent.context.span_id
    assert made.status.status_code is StatusCode.UNSET  # a non-text error is no error
    assert agent.start_time <= made.start_time <= made.end_time <= agent.end_time


def test_times_are_clamped_into_the_childs_lifetime_as_the_parent_sees_it(exporter: Any) -> None:
    before = time.time_ns()
    trace = child_trace()
    trace.fold(start(1, time=0))  # the child's clock says 1970
    trace.fold(end(1, time=2**62))  # ... and then 2116
    trace.fold(start(2, time=2**62))
    trace.fold(end(2, time=0))  # ends before it started
    trace.end_job(None)
    after = time.time_ns()
    spans = [s for s in exporter.get_finished_spans() if s.name == "execute_tool t"]
    assert len(spans) == 2
    for span in spans:
        assert before <= span.start_time <= span.end_time <= after


def test_names_attributes_and_errors_are_cut_to_their_bounds(exporter: Any) -> None:
    trace = child_trace()
    attributes: dict[str, Any] = {f"k{i}": "v" * 10_000 for i in range(3 * MAX_ATTRIBUTES)}
    attributes.update({"nested": {"a": 1}, "nan": float("nan"), "big": 2**70})
    trace.fold(start(1, name="n" * 10_000 + "\ud800", attributes=attributes))
    mixed = {"ints": list(range(100)), "mixed": [1, "a"], "nested": [[1]], "ok": True, "f": 1.5}
    mixed |= {"huge": 2**70, "tiny": -(2**70)}
    trace.fold(end(1, attributes=mixed, error="e\n" * 10_000, error_type="t" * 1000))
    trace.end_job(None)
    span = next(s for s in exporter.get_finished_spans() if s.name.startswith("n"))
    assert len(span.name) == 128
    assert len(span.attributes) <= MAX_ATTRIBUTES + len(mixed)
    assert all(len(v) <= 256 for v in span.attributes.values() if isinstance(v, str))
    assert "nested" not in span.attributes and "nan" not in span.attributes
    assert "big" not in span.attributes and "mixed" not in span.attributes
    assert tuple(span.attributes["ints"]) == tuple(range(MAX_LIST))
    assert span.attributes["huge"] == 2**63 - 1 and span.attributes["tiny"] == -(2**63)
    assert span.status.status_code is StatusCode.ERROR
    assert len(span.status.description) <= 500 and "\n" not in span.status.description
    assert len(span.attributes["error.type"]) == 128


def test_a_childs_token_totals_saturate_at_64_bits(exporter: Any) -> None:
    trace = child_trace()
    most = {"gen_ai.usage.input_tokens": 2**63 - 1, "gen_ai.usage.output_tokens": 2**63 - 1}
    for local in (1, 2, 3):  # each record valid, their sum is not
        trace.fold(start(local, name="chat m"))
        trace.fold(end(local, attributes=most))
    trace.fold(start(4, name="chat m"))
    trace.fold(end(4, attributes={"gen_ai.usage.input_tokens": -(2**63)}))  # not counted
    trace.end_job(None)
    agent = by_name(exporter.get_finished_spans(), "invoke_agent worker")
    assert agent.attributes["gen_ai.usage.input_tokens"] == 2**63 - 1
    assert agent.attributes["gen_ai.usage.output_tokens"] == 2**63 - 1


def test_open_spans_and_nesting_are_bounded_and_all_spans_close(exporter: Any) -> None:
    trace = child_trace()
    for local in range(1, MAX_OPEN + 11):  # never ended
        trace.fold(start(local))
    chain_start = 10_000
    trace_deep = child_trace()
    for depth in range(MAX_DEPTH + 10):  # each a child of the one before, never ended
        local = chain_start + depth
        trace_deep.fold(start(local, parent=local - 1 if depth else None))
    trace.end_job(None)
    trace_deep.end_job(None)
    spans = exporter.get_finished_spans()
    agents = [s for s in spans if s.name == "invoke_agent worker"]
    # beyond MAX_OPEN, and below MAX_DEPTH (with their subtree)
    assert sorted(a.attributes["zett_agent.spans_dropped"] for a in agents) == [10, 10]
    wide, deep = sorted(agents, key=lambda a: a.start_time)
    under_wide = [s for s in spans if s.parent and s.parent.span_id == wide.context.span_id]
    assert len(under_wide) == MAX_OPEN
    # every span left open ended with an error naming why
    assert all(s.status.status_code is StatusCode.ERROR for s in under_wide)
    assert under_wide[0].status.description.startswith("the child ended before this span ended")
    by_id = {s.context.span_id: s for s in spans}
    deepest = 0
    for span in spans:
        depth, node = 0, span
        while node.parent is not None and node.parent.span_id in by_id:
            depth, node = depth + 1, by_id[node.parent.span_id]
        if node is deep:
            deepest = max(deepest, depth)
    assert deepest == MAX_DEPTH


def test_a_flood_of_records_is_bounded_in_number(exporter: Any) -> None:
    trace = child_trace()
    for local in range(1, _base.MAX_CHILD_SPANS + 501):
        trace.fold(start(local))
        trace.fold(end(local))
    trace.end_job(None)
    spans = exporter.get_finished_spans()
    assert len(spans) == _base.MAX_CHILD_SPANS + 1
    assert by_name(spans, "invoke_agent worker").attributes["zett_agent.spans_dropped"] == 1000


# -- the child's recorder -----------------------------------------------------------------------


def test_the_recorder_sends_starts_and_ends_with_parents_and_bounds() -> None:
    sent: list[Any] = []
    recorder = Recorder(sent.append, "00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    outer = recorder.start("execute_tool a", {"gen_ai.tool.name": "a", "bad": object()})  # type: ignore[dict-item]
    with outer.activate():
        inner = recorder.start("chat m", {})
        inner.set_attributes({"gen_ai.usage.input_tokens": 3, "over": 2**64})
        inner.end(error="boom\nagain", error_type="ValueError")
    outer.end()
    outer.end()  # once only
    assert [(e["kind"], e["id"]) for e in sent] == [
        ("span_start", 1),
        ("span_start", 2),
        ("span_end", 2),
        ("span_end", 1),
    ]
    assert sent[0]["parent"] is None and sent[1]["parent"] == 1
    assert sent[0]["attributes"] == {"gen_ai.tool.name": "a"}
    assert sent[2]["attributes"] == {"gen_ai.usage.input_tokens": 3, "over": 2**63 - 1}
    assert sent[2]["error_type"] == "ValueError"
    assert inner.traceparent() == recorder.traceparent
    json.dumps(sent)  # plain JSON, as the channel takes it


def test_the_recorder_stops_recording_when_the_channel_fails_never_the_child() -> None:
    calls = 0

    def refuse(event: Any) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("the frame is too large")

    recorder = Recorder(refuse, "00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    for _ in range(5):
        span = recorder.start("chat m", {})
        span.end()
    assert calls == 1 and not recorder.start("x", {}).recording


def test_the_recorder_records_at_most_max_child_spans() -> None:
    sent: list[Any] = []
    recorder = Recorder(sent.append, "00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    for _ in range(_base.MAX_CHILD_SPANS + 3):
        recorder.start("s", {}).end()
    assert len(sent) == 2 * _base.MAX_CHILD_SPANS


def test_a_model_notes_on_the_span_of_its_call_only_while_it_runs() -> None:
    sent: list[Any] = []
    recorder = Recorder(sent.append, "00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    note_model_call({"gen_ai.response.id": "outside"})  # no call running: nothing, no raise
    span = recorder.start("chat m", {})
    with noting(span):
        note_model_call({"gen_ai.response.id": "r", "gen_ai.response.finish_reasons": ["stop"]})
    note_model_call({"gen_ai.response.id": "after"})
    span.end()
    with noting(span):
        note_model_call({"gen_ai.response.id": "ended"})  # an ended span takes nothing
    assert sent[-1]["attributes"] == {
        "gen_ai.response.id": "r",
        "gen_ai.response.finish_reasons": ["stop"],
    }
    notes = ModelNotes()  # the broker's: bounded like a span's attributes
    with noting(notes):
        note_model_call({f"k{i}": 2**70 for i in range(100)})
    assert len(notes.attributes) == MAX_ATTRIBUTES
    assert set(notes.attributes.values()) == {2**63 - 1}


def test_clean_attributes_keeps_only_bounded_plain_values() -> None:
    assert clean_attributes(None) == {} and clean_attributes([("a", 1)]) == {}
    many = {f"bad{i}": object() for i in range(10**5)} | {"late": 1}
    assert clean_attributes(many) == {}  # only the first items are looked at
    assert clean_attributes({"": 1, 5: 2, "x" * 300: 3, "ok": -(2**63)}) == {"ok": -(2**63)}


# -- nothing imported, nothing paid -------------------------------------------------------------


def test_importing_and_running_zett_agent_imports_no_opentelemetry() -> None:
    program = (
        "import sys, asyncio\n"
        "import zett_agent, zett_agent.agent, zett_agent.client, zett_agent.runners\n"
        "import zett_agent.extensions.async_subagent, zett_agent.extensions.subagent\n"
        "from zett_agent._tracing import _tracer\n"
        "assert _tracer.current() is None\n"
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry',"
        " 'zett_agent._tracing._otel', 'zett_agent._tracing._span_record',"
        " 'zett_agent.runners._span_relay'))))\n"
    )
    printed = python_prints(program)
    assert printed == "[]", printed


def test_opentelemetry_without_a_provider_traces_nothing() -> None:
    program = (
        "import sys\n"
        "import opentelemetry.trace\n"
        "from zett_agent._tracing import _tracer as _tracing\n"
        "assert _tracing.current() is None\n"
        "from zett_agent.runners._span_relay import child_trace\n"
        "assert child_trace('w', 't', 's') is None\n"
        "print('zett_agent._tracing._otel' in sys.modules, 'opentelemetry.sdk' in sys.modules)\n"
    )
    printed = python_prints(program)
    assert printed == "False False", printed
