"""The spans speak the OpenTelemetry GenAI semantic conventions, as the conventions' own package
(``opentelemetry-semantic-conventions``) spells them: every attribute name the runtime has a
constant for, and every one on a real span, is one of the package's; every operation is one of
its operation names; and the attributes it requires or recommends are on the spans of a real
run: the provider and model of every model and agent span, the child's definition as the
agent's description, and what the OpenAI adapter's response says of itself and its server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from support.calls import one_task_reported
from support.openai_chunks import TEXT_STREAM, chunk
from support.openai_loopback import LoopbackServer, Reply, sse
from support.parent import run_parent, worker
from support.scripted_models import ToolsThenAnswer
from support.tracing import by_name, exported_spans
from zett_agent._tracing import _base as _trace_attributes
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
from zett_agent.extensions.subagent import SubAgentDefinition, SubAgentExtension
from zett_agent.models.openai import OpenAIChatModel
from zett_agent.runners import ProcessRunner

pytest.importorskip("opentelemetry.sdk", reason="the tracing tests need the otel extra")
pytest.importorskip("opentelemetry.semconv", reason="needs opentelemetry-semantic-conventions")
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GenAiOperationNameValues,
    GenAiProviderNameValues,
)
from opentelemetry.semconv.attributes import error_attributes, server_attributes

HANG_GUARD = 60


def _names(*modules: ModuleType) -> set[str]:
    return {
        value
        for module in modules
        for name, value in vars(module).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, str)
    }


#: every attribute name the conventions' package knows in the namespaces the runtime uses
CONVENTIONS = _names(gen_ai_attributes, server_attributes, error_attributes)
OPERATIONS = {member.value for member in GenAiOperationNameValues}
PROVIDERS = {member.value for member in GenAiProviderNameValues}
#: the prefixes of the conventions' names the runtime uses; ``zett_agent.`` is its own
CONVENTION_PREFIXES = ("gen_ai.", "server.", "error.")


@pytest.fixture
def exporter() -> Iterator[Any]:
    with exported_spans() as exporter:
        yield exporter


def test_every_name_the_runtime_has_a_constant_for_is_the_conventions() -> None:
    """Collected from the module, not copied: each string constant of
    ``zett_agent._tracing._base`` is a conventions attribute name, a name of the runtime's
    own namespace, an operation name or a provider name the conventions list (but for the
    one documented custom provider value)."""
    constants = {
        name: value
        for name, value in vars(_trace_attributes).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, str)
    }
    assert len(constants) > 20  # the names are there to be checked
    for name, value in constants.items():
        if value.startswith(CONVENTION_PREFIXES):
            assert value in CONVENTIONS, f"{name} = {value!r} is not in the conventions"
        elif value.startswith("zett_agent."):
            continue  # the runtime's own attributes, in its own namespace
        elif value == _trace_attributes.PROVIDER_UNKNOWN:
            assert value not in PROVIDERS  # a custom value, documented in docs/tracing.md
        else:
            assert value in OPERATIONS | PROVIDERS, f"{name} = {value!r} is no known value"
    assert _trace_attributes.PROVIDER_OPENAI in PROVIDERS


def check_conventions(spans: Any) -> None:
    """What every span of a run must be: its operation first in its name and a conventions
    operation, every attribute a conventions name (or the runtime's own), and the model and
    agent spans with their provider and model."""
    assert spans
    for span in spans:
        attributes = dict(span.attributes)
        operation = attributes["gen_ai.operation.name"]
        assert operation in OPERATIONS, span.name
        assert span.name.split(" ", 1)[0] == operation, span.name
        for key in attributes:
            assert key in CONVENTIONS or key.startswith("zett_agent."), (span.name, key)
        if operation in ("chat", "invoke_agent"):
            assert attributes["gen_ai.provider.name"], span.name
            assert attributes["gen_ai.request.model"], span.name
        if operation == "chat":
            assert span.name == f"chat {attributes['gen_ai.request.model']}"


async def test_offline_models_name_the_runtime_as_their_provider(exporter: Any) -> None:
    child = ToolsThenAnswer(answer="done")
    async with AsyncSubAgentExtension([worker(child)]) as extension:
        await run_parent(extension, one_task_reported())
    spans = exporter.get_finished_spans()
    check_conventions(spans)
    models = [s for s in spans if s.attributes["gen_ai.operation.name"] != "execute_tool"]
    assert {s.attributes["gen_ai.provider.name"] for s in models} == {"zett_agent"}
    agent = by_name(spans, "invoke_agent worker")
    assert agent.attributes["gen_ai.agent.description"] == "worker profile for tests"
    assert agent.attributes["gen_ai.request.model"] == "ToolsThenAnswer"
    assert by_name(spans, "invoke_agent").attributes["gen_ai.request.model"] == "StepModel"


def _subagent_call() -> list[bytes]:
    arguments = {"subagent_type": "remote", "description": "look", "prompt": "go"}
    call = {
        "index": 0,
        "id": "call-1",
        "type": "function",
        "function": {"name": "subagent", "arguments": json.dumps(arguments)},
    }
    return sse(chunk({"role": "assistant", "tool_calls": [call]}), chunk({}, finish="tool_calls"))


@pytest.mark.parametrize("broker", [False, True], ids=["child-calls", "parent-brokers"])
async def test_openai_spans_of_a_parent_and_its_child_say_what_the_conventions_ask(
    exporter: Any, broker: bool
) -> None:
    """The parent and its child (in a process of its own, calling the endpoint itself or
    through the parent's broker) both on the OpenAI adapter, at a loopback endpoint."""
    replies = [Reply(chunks=_subagent_call()), Reply(chunks=TEXT_STREAM), Reply(chunks=TEXT_STREAM)]
    async with LoopbackServer(replies) as server:
        parent = OpenAIChatModel("parent-model", base_url=server.url)
        child = OpenAIChatModel("child-model", base_url=server.url)
        definition = SubAgentDefinition("remote", "works remotely", "You are the child.", child)
        async with SubAgentExtension([definition], runner=ProcessRunner(broker=broker)) as ext:
            client = await create_agent(parent, extensions=[ext])
            async with client, asyncio.timeout(HANG_GUARD):
                answer = await client.run("go")
        assert server.unused_replies == 0
    assert answer.content == "Hello"
    spans = exporter.get_finished_spans()
    check_conventions(spans)

    request = by_name(spans, "invoke_agent")
    assert request.attributes["gen_ai.provider.name"] == "openai"
    assert request.attributes["gen_ai.request.model"] == "parent-model"
    agent = by_name(spans, "invoke_agent remote")
    assert agent.attributes["gen_ai.provider.name"] == "openai"
    assert agent.attributes["gen_ai.request.model"] == "child-model"
    assert agent.attributes["gen_ai.agent.description"] == "works remotely"
    assert agent.attributes["zett_agent.task.description"] == "look"

    parent_chats = sorted(
        (s for s in spans if s.name == "chat parent-model"), key=lambda s: s.start_time
    )
    child_chat = by_name(spans, "chat child-model")
    assert child_chat.parent is not None and child_chat.parent.span_id == agent.context.span_id
    reasons = [("tool_calls",), ("stop",), ("stop",)]
    for chat, finish in zip([*parent_chats, child_chat], reasons, strict=True):
        attributes = chat.attributes
        assert attributes["gen_ai.provider.name"] == "openai"
        assert attributes["server.address"] == "127.0.0.1"
        assert attributes["server.port"] == server.port
        assert attributes["gen_ai.response.id"] == "chatcmpl-1"
        assert attributes["gen_ai.response.model"] == "m"
        assert tuple(attributes["gen_ai.response.finish_reasons"]) == finish
    assert child_chat.attributes["gen_ai.usage.input_tokens"] == 12
