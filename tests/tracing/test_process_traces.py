"""One trace across the process boundary: the parent's request, its model and tool calls, the
task's ``invoke_agent`` span and the spans its child made in another process (sent to the
parent as events, exported by the parent's provider), with their parents and attributes; and
how a child's span ends when the child is cancelled, times out, crashes or is killed."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.calls import call, final, one_task_reported
from support.children import SPIN, BlockingModel
from support.parent import run_parent, worker
from support.scripted_models import StepModel, tool_results
from support.scripted_models import ToolsThenAnswer as ChildModel
from support.tracing import CRASH, FORGE, TRACEPARENT, by_name, exported_spans, traceparent_of
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
from zett_agent.extensions.subagent import SubAgentExtension
from zett_agent.process import ProcessLimits
from zett_agent.runners import InProcessRunner, ProcessRunner
from zett_agent.runners._span_relay import MAX_DEPTH

pytest.importorskip("opentelemetry.sdk", reason="the tracing tests need the otel extra")
from opentelemetry.trace import SpanKind, StatusCode

HANG_GUARD = 60


@pytest.fixture
def exporter() -> Iterator[Any]:
    with exported_spans() as exporter:
        yield exporter


def parent_of(span: Any) -> int | None:
    return span.parent.span_id if span.parent is not None else None


@pytest.mark.parametrize("runner", ["process", "in-process"])
async def test_one_trace_holds_the_request_the_task_and_the_childs_model_and_tool_spans(
    exporter: Any, runner: str
) -> None:
    child = ChildModel(answer="{last}", tools=[("traceparent", {})])
    options: dict[str, Any] = {"runner": InProcessRunner()} if runner == "in-process" else {}
    async with AsyncSubAgentExtension(
        [worker(child, tools=(TRACEPARENT,))], **options
    ) as extension:
        content, _ = await run_parent(extension, one_task_reported("trace me"))
        [task] = extension.tasks("parent")
    spans = exporter.get_finished_spans()
    assert len({span.context.trace_id for span in spans}) == 1  # one trace

    request = by_name(spans, "invoke_agent")
    assert request.parent is None
    assert request.attributes["gen_ai.conversation.id"] == "parent"
    assert request.attributes["gen_ai.request.model"] == "StepModel"
    assert request.attributes["gen_ai.provider.name"] == "zett_agent"
    assert request.attributes["gen_ai.usage.input_tokens"] == 30  # three parent calls of 10
    parent_chats = [s for s in spans if s.name == "chat StepModel"]
    assert len(parent_chats) == 3
    assert all(parent_of(s) == request.context.span_id for s in parent_chats)
    assert all(s.kind is SpanKind.CLIENT for s in parent_chats)
    assert parent_chats[0].attributes["gen_ai.usage.output_tokens"] == 5
    start = by_name(spans, "execute_tool task_start")
    assert parent_of(start) == request.context.span_id
    assert start.attributes["gen_ai.tool.name"] == "task_start"
    assert start.attributes["gen_ai.operation.name"] == "execute_tool"
    assert parent_of(by_name(spans, "execute_tool task_output")) == request.context.span_id

    agent = by_name(spans, "invoke_agent worker")
    assert parent_of(agent) == start.context.span_id
    assert dict(agent.attributes) | {} == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "worker",
        "gen_ai.agent.id": task.task_id,
        "gen_ai.conversation.id": task.session_id,
        "gen_ai.agent.description": "worker profile for tests",  # the definition's
        "gen_ai.provider.name": "zett_agent",  # an offline model names no provider
        "gen_ai.request.model": "ToolsThenAnswer",
        "zett_agent.task.description": "trace me",  # what the parent's model wrote
        "gen_ai.usage.input_tokens": 14,
        "gen_ai.usage.output_tokens": 6,
    }
    assert agent.status.status_code is StatusCode.UNSET

    chats = sorted(
        (s for s in spans if s.name == "chat ToolsThenAnswer"), key=lambda s: s.start_time
    )
    assert len(chats) == 2
    for chat in chats:
        assert parent_of(chat) == agent.context.span_id
        assert chat.kind is SpanKind.CLIENT
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.request.model"] == "ToolsThenAnswer"
        assert chat.attributes["gen_ai.provider.name"] == "zett_agent"
        assert chat.attributes["gen_ai.conversation.id"] == task.session_id
        assert chat.attributes["gen_ai.usage.input_tokens"] == 7
        assert chat.attributes["gen_ai.usage.output_tokens"] == 3
    tool = by_name(spans, "execute_tool traceparent")
    assert parent_of(tool) == agent.context.span_id
    assert tool.attributes["gen_ai.tool.name"] == "traceparent"
    assert tool.status.status_code is StatusCode.UNSET
    # the child's spans sit inside its invoke_agent span, in the order they happened
    assert agent.start_time <= chats[0].start_time <= chats[0].end_time <= tool.start_time
    assert tool.end_time <= chats[1].start_time <= chats[1].end_time <= agent.end_time
    if runner == "process":  # a process the child's tool starts has the child's span as parent
        assert content == traceparent_of(agent)
    else:  # a child in the parent's own process leaves the environment (shared) alone
        assert content == "none"
    assert "TRACEPARENT" not in os.environ


async def test_the_foreground_subagent_is_traced_the_same_way(exporter: Any) -> None:
    child = ChildModel(answer="{last}", tools=[("traceparent", {})])
    async with SubAgentExtension([worker(child, tools=(TRACEPARENT,))]) as extension:
        _, model = await run_parent(
            extension,
            [call("subagent", subagent_type="worker", description="d", prompt="p"), final()],
        )
    [result] = tool_results(model.requests[-1])
    spans = exporter.get_finished_spans()
    tool = by_name(spans, "execute_tool subagent")
    agent = by_name(spans, "invoke_agent worker")
    assert parent_of(agent) == tool.context.span_id
    assert agent.attributes["gen_ai.agent.id"] == "subagent-1"
    assert agent.attributes["gen_ai.conversation.id"] == "parent/subagent-1"
    assert result.text == traceparent_of(agent)
    child_spans = [s for s in spans if parent_of(s) == agent.context.span_id]
    assert sorted(s.name for s in child_spans) == [
        "chat ToolsThenAnswer",
        "chat ToolsThenAnswer",
        "execute_tool traceparent",
    ]


async def test_a_cancelled_child_ends_its_spans_with_an_error_and_the_reason(
    exporter: Any, tmp_path: Path
) -> None:
    path = str(tmp_path / "ready")
    os.mkfifo(path)
    child = ChildModel(answer="never", tools=[("spin", {"ready_fifo": path})])
    async with AsyncSubAgentExtension([worker(child, tools=(SPIN,))]) as extension:

        async def spinning() -> str:
            def read() -> bytes:
                with open(path, "rb") as ready:
                    return ready.read()

            return (await asyncio.to_thread(read)).decode()

        from zett_agent.tools import AgentTool

        wait = AgentTool("until_spinning", "", {"type": "object"}, spinning)
        model = StepModel(
            [
                call("task_start", subagent_type="worker", description="d", prompt="p"),
                call("until_spinning"),
                call("task_cancel", task_id="task-1"),
                final(),
            ]
        )
        client = await create_agent(
            model,
            config=AgentRunConfig(session_id="parent"),
            extensions=[extension],
            tools=(wait,),
        )
        async with asyncio.timeout(HANG_GUARD):
            await client.run("go")
    spans = exporter.get_finished_spans()
    agent = by_name(spans, "invoke_agent worker")
    assert agent.status.status_code is StatusCode.ERROR
    assert agent.status.description == "cancelled"
    assert agent.attributes["error.type"] == "cancelled"
    # the child was killed in the middle of its tool: the span still closed, with the reason
    spin = by_name(spans, "execute_tool spin")
    assert parent_of(spin) == agent.context.span_id
    assert spin.status.status_code is StatusCode.ERROR
    assert spin.status.description == "the child ended before this span ended: cancelled"
    assert spin.end_time is not None and spin.end_time <= agent.end_time


async def test_a_timed_out_child_ends_its_span_with_an_error(exporter: Any) -> None:
    limits = ProcessLimits(timeout=0.5)
    async with AsyncSubAgentExtension([worker(BlockingModel(), limits=limits)]) as extension:
        await run_parent(
            extension,
            [
                call("task_start", subagent_type="worker", description="d", prompt="p"),
                lambda r: call("task_output", task_id="task-1", wait_seconds=30),
                final(),
            ],
        )
    spans = exporter.get_finished_spans()
    agent = by_name(spans, "invoke_agent worker")
    assert agent.status.status_code is StatusCode.ERROR
    assert "0.5" in (agent.status.description or "")
    assert agent.attributes["error.type"] == "JobTimeout"
    chat = by_name(spans, "chat BlockingModel")  # open when the child was killed
    assert chat.status.status_code is StatusCode.ERROR
    assert chat.status.description.startswith("the child ended before this span ended: ")


async def test_a_crashed_child_ends_its_spans_with_an_error(exporter: Any) -> None:
    child = ChildModel(answer="never", tools=[("crash", {})])
    async with AsyncSubAgentExtension([worker(child, tools=(CRASH,))]) as extension:
        await run_parent(
            extension,
            [
                call("task_start", subagent_type="worker", description="d", prompt="p"),
                lambda r: call("task_output", task_id="task-1", wait_seconds=30),
                final(),
            ],
        )
        [task] = extension.tasks("parent")
    spans = exporter.get_finished_spans()
    agent = by_name(spans, "invoke_agent worker")
    assert agent.status.status_code is StatusCode.ERROR
    assert agent.status.description == task.error
    assert agent.attributes["error.type"] == "WorkerCrashed"
    crash = by_name(spans, "execute_tool crash")
    assert crash.status.status_code is StatusCode.ERROR
    assert crash.status.description == f"the child ended before this span ended: {task.error}"
    assert [s.name for s in spans].count("chat ToolsThenAnswer") == 1


class _Recorded:
    """A child's job whose events are also kept in ``seen``."""

    def __init__(self, job: Any, seen: list[Any]) -> None:
        self._job = job
        self._seen = seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._job, name)

    async def events(self) -> Any:
        async for event in self._job.events():
            self._seen.append(event)
            yield event


class _SpyRunner:
    """A ``ProcessRunner`` whose specs and child events the test sees."""

    def __init__(self) -> None:
        self.inner = ProcessRunner()
        self.seen: list[Any] = []
        self.specs: list[Any] = []

    def warm_up(self, modules: Any = ()) -> None:
        self.inner.warm_up(modules)

    async def submit(self, spec: Any, **options: Any) -> Any:
        self.specs.append(spec)
        return _Recorded(await self.inner.submit(spec, **options), self.seen)

    async def close(self) -> None:
        await self.inner.close()


async def test_without_a_provider_nothing_is_traced_nor_sent() -> None:
    """No provider in the parent: the child gets no trace and no TRACEPARENT, and its event
    stream holds no span event (its progress is as before)."""
    from opentelemetry import trace

    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    child = ChildModel(answer="{last}", tools=[("traceparent", {})])
    spy = _SpyRunner()
    async with AsyncSubAgentExtension([worker(child, tools=(TRACEPARENT,))], runner=spy) as ext:
        content, _ = await run_parent(ext, one_task_reported())
    assert content == "none"
    assert [spec.trace for spec in spy.specs] == [None]
    kinds = [event.get("kind") for event in spy.seen]
    assert not [k for k in kinds if str(k).startswith("span")], kinds
    assert "started" in kinds and "turn_finished" in kinds


async def test_hostile_span_records_from_a_real_child_are_dropped_and_the_task_completes(
    exporter: Any,
) -> None:
    child = ChildModel(answer="{last}", tools=[("forge", {"count": 300})])
    async with AsyncSubAgentExtension([worker(child, tools=(FORGE,))]) as extension:
        content, _ = await run_parent(extension, one_task_reported())
        [task] = extension.tasks("parent")
    assert content == "forged" and task.error is None
    spans = exporter.get_finished_spans()
    agent = by_name(spans, "invoke_agent worker")
    assert agent.status.status_code is StatusCode.UNSET
    # the five bad records, and the chain below MAX_DEPTH (its first 32 spans are kept)
    assert agent.attributes["zett_agent.spans_dropped"] == 5 + 300 - MAX_DEPTH
    deep = [s for s in spans if s.name == "deep"]
    assert len(deep) == MAX_DEPTH
    assert all(
        len(key) <= 256 and len(str(v)) <= 256 for s in deep for key, v in s.attributes.items()
    )
    # left open by the child: closed when it ended, within its lifetime
    assert all(s.status.status_code is StatusCode.ERROR for s in deep)
    assert all(agent.start_time <= s.start_time <= s.end_time <= agent.end_time for s in deep)
    tool = by_name(spans, "execute_tool forge")
    assert tool.status.status_code is StatusCode.UNSET and parent_of(tool) == agent.context.span_id


async def test_a_sampled_out_child_records_nothing_and_still_carries_the_trace() -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    child = ChildModel(answer="{last}", tools=[("traceparent", {})])
    with exported_spans(ALWAYS_OFF) as exporter:
        spy = _SpyRunner()
        async with AsyncSubAgentExtension([worker(child, tools=(TRACEPARENT,))], runner=spy) as e:
            content, _ = await run_parent(e, one_task_reported())
        assert exporter.get_finished_spans() == ()
    [spec] = spy.specs
    assert spec.trace["record"] is False
    assert content == spec.trace["traceparent"]
    assert not int(content.rsplit("-", 1)[1], 16) & 1  # the sampled flag is off
    assert not [e for e in spy.seen if str(e.get("kind")).startswith("span")]
