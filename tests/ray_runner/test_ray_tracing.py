"""One trace across the process boundary on the Ray cluster: the child runs in a Ray worker,
its spans reach the parent over the task's event stream and are exported by the parent's
provider under the task's ``invoke_agent`` span (see tests/tracing for the process runner)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _ray_testing import BOUND

from support.calls import call
from support.scripted_models import StepModel, ToolsThenAnswer, last_json
from support.tracing import TRACEPARENT, by_name, exported_spans, traceparent_of
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AssistantMessage
from zett_agent.runners.ray import RayRunner

pytest.importorskip("opentelemetry.sdk", reason="the tracing tests need the otel extra")
from opentelemetry.trace import SpanKind, StatusCode

pytestmark = pytest.mark.ray


def parent_of(span: Any) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_a_ray_childs_spans_join_the_parents_trace(ray_cluster: dict[str, Any]) -> None:
    child = SubAgentDefinition(
        "worker",
        "worker profile for tests",
        "You are a test child.",
        model=ToolsThenAnswer("{last}", [("traceparent", {})]),
        tools=(TRACEPARENT,),
    )
    with exported_spans() as exporter:
        async with AsyncSubAgentExtension([child], runner=RayRunner()) as extension:
            model = StepModel(
                [
                    call("task_start", subagent_type="worker", description="d", prompt="p"),
                    lambda r: call("task_output", task_id=last_json(r)["task_id"], wait_seconds=60),
                    lambda r: AssistantMessage(content=last_json(r)["content"]),
                ]
            )
            client = await create_agent(
                model, config=AgentRunConfig(session_id="parent"), extensions=[extension]
            )
            async with asyncio.timeout(BOUND):
                content = (await client.run("go")).content
            [task] = extension.tasks("parent")
        spans = exporter.get_finished_spans()
    assert len({span.context.trace_id for span in spans}) == 1
    request = by_name(spans, "invoke_agent")
    start = by_name(spans, "execute_tool task_start")
    assert parent_of(start) == request.context.span_id
    agent = by_name(spans, "invoke_agent worker")
    assert parent_of(agent) == start.context.span_id
    assert agent.attributes["gen_ai.agent.id"] == task.task_id
    assert agent.attributes["gen_ai.conversation.id"] == task.session_id
    assert agent.status.status_code is StatusCode.UNSET
    chats = [s for s in spans if s.name == "chat ToolsThenAnswer"]
    assert len(chats) == 2
    for chat in chats:
        assert parent_of(chat) == agent.context.span_id and chat.kind is SpanKind.CLIENT
        assert chat.attributes["gen_ai.usage.input_tokens"] == 7
        assert chat.attributes["gen_ai.usage.output_tokens"] == 3
    tool = by_name(spans, "execute_tool traceparent")
    assert parent_of(tool) == agent.context.span_id
    assert agent.start_time <= tool.start_time <= tool.end_time <= agent.end_time
    assert content == traceparent_of(agent)  # the Ray worker's environment carried it
