"""Bad input from the model: every task tool called with missing, wrong-typed, oversized and
unknown arguments, unknown and evicted task ids, and absurd ``wait_seconds``. Each call gives a
failed tool result that says what was wrong and how to fix it, short enough for a model's
context, and the parent's request goes on to its final answer."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest

from support.calls import tool_call
from support.scripted_models import StepModel, ToolsThenAnswer, tool_results
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension, SubAgentTaskStatus
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AssistantMessage, ToolCall

HANG_GUARD = 60
#: the longest failed result a model should get back for a bad call
MAX_ERROR_CHARS = 2000
MEGABYTE = "x" * (1 << 20)

DEFINITION = SubAgentDefinition(
    name="worker",
    description="worker profile for tests",
    system_prompt="You are a test child.",
    model=ToolsThenAnswer("ok"),
)

GOOD_START = {"subagent_type": "worker", "description": "d", "prompt": "p"}

# (tool, arguments, fragments every one of which the failed result must contain)
BAD_CALLS: list[tuple[str, Any, tuple[str, ...]]] = [
    # task_start
    ("task_start", {}, ("missing required argument 'subagent_type'", "'prompt'", "Fix")),
    ("task_start", {"subagent_type": "worker", "description": "d"}, ("'prompt'",)),
    ({"name": "task_start"}, {**GOOD_START, "subagent_type": 5}, ("'subagent_type'", "string")),
    ("task_start", {**GOOD_START, "description": ["d"]}, ("'description'", "string")),
    ("task_start", {**GOOD_START, "prompt": {"a": 1}}, ("'prompt'", "string")),
    ("task_start", {**GOOD_START, "prompt": None}, ("'prompt'", "string")),
    ("task_start", {**GOOD_START, "prompt": MEGABYTE}, ("'prompt'", "at most")),
    ("task_start", {**GOOD_START, "prompt": ""}, ("'prompt'", "at least 1")),
    ("task_start", {**GOOD_START, "prompt": " \n\t "}, ("prompt is empty",)),
    ("task_start", {**GOOD_START, "description": "d" * 10_000}, ("'description'", "at most")),
    ("task_start", {**GOOD_START, "subagent_type": "nope"}, ("'nope'", "'worker'")),
    ("task_start", {**GOOD_START, "subagent_type": MEGABYTE}, ("subagent_type", "'worker'")),
    ("task_start", {**GOOD_START, "priority": "high"}, ("unexpected argument 'priority'",)),
    ("task_start", ["worker", "d", "p"], ("JSON object",)),
    ("task_start", "worker", ("JSON object",)),
    # task_list
    ("task_list", {"task_id": "task-1"}, ("unexpected argument 'task_id'",)),
    ("task_list", None, ("JSON object",)),
]
for _tool in ("task_status", "task_output", "task_cancel"):
    BAD_CALLS += [
        (_tool, {}, ("missing required argument 'task_id'", "task_start")),
        (_tool, {"task_id": 1}, ("'task_id'", "string")),
        (_tool, {"task_id": None}, ("'task_id'", "string")),
        (_tool, {"task_id": ["task-1"]}, ("'task_id'", "string")),
        (_tool, {"task_id": ""}, ("'task_id'", "at least 1")),
        (_tool, {"task_id": "t" * 10_000}, ("'task_id'", "at most")),
        (_tool, {"task_id": "task-404"}, ("unknown task_id 'task-404'", "task-2")),
        (_tool, {"task_id": "task-1"}, ("evicted", "start it again")),
        (_tool, {"task_id": "task-2", "force": True}, ("unexpected argument 'force'",)),
    ]
for _wait, _fragment in [
    (-1, ">= 0"),
    (-math.inf, ">= 0"),
    (1e9, "<= 600"),
    (math.inf, "<= 600"),
    (math.nan, "between 0 and 600"),
    ("5", "number"),
    (True, "number"),
    (None, "number"),
    ([5], "number"),
]:
    BAD_CALLS.append(("task_output", {"task_id": "task-2", "wait_seconds": _wait}, (_fragment,)))
BAD_CALLS = [(t if isinstance(t, str) else t["name"], a, f) for t, a, f in BAD_CALLS]


def _describe(tool: str, arguments: Any) -> str:
    text = json.dumps(arguments, default=repr)
    return f"{tool}({text[:80]})"


@pytest.mark.parametrize("batched", [True, False], ids=["one batch", "one call per turn"])
async def test_every_bad_call_fails_clearly_and_the_request_goes_on(batched: bool) -> None:
    calls = [ToolCall(f"bad-{i}", tool, args) for i, (tool, args, _) in enumerate(BAD_CALLS)]
    setup = [
        # task-1 and task-2 complete and are read; max_retained=1 then forgets task-1
        tool_call("task_start", **GOOD_START),
        tool_call("task_output", task_id="task-1", wait_seconds=30),
        tool_call("task_start", **GOOD_START),
        tool_call("task_output", task_id="task-2", wait_seconds=30),
    ]
    steps: list[Any] = [AssistantMessage(tool_calls=(c,)) for c in setup]
    if batched:
        steps.append(AssistantMessage(tool_calls=tuple(calls)))
    else:
        steps += [AssistantMessage(tool_calls=(c,)) for c in calls]
    # after every bad call, the model can still use the tools normally
    steps += [
        AssistantMessage(tool_calls=(tool_call("task_status", task_id="task-2"),)),
        AssistantMessage("recovered"),
    ]
    model = StepModel(steps)
    async with AsyncSubAgentExtension([DEFINITION], max_retained=1) as extension:
        client = await create_agent(
            model,
            config=AgentRunConfig(session_id="parent", max_turns=500),
            extensions=[extension],
        )
        async with client, asyncio.timeout(HANG_GUARD):
            answer = await client.run("go")
            retained = extension.tasks("parent")  # closing the client releases them
    assert answer.content == "recovered"
    assert [(t.task_id, t.status) for t in retained] == [("task-2", SubAgentTaskStatus.COMPLETED)]

    results = {m.call_id: m for m in tool_results(model.requests[-1])}
    assert all(results[c.id].ok for c in setup), [results[c.id] for c in setup]
    problems = []
    for bad, (tool, arguments, fragments) in zip(calls, BAD_CALLS, strict=True):
        result = results[bad.id]
        where = _describe(tool, arguments)
        if not result.failed:
            problems.append(f"{where}: did not fail: {result.text[:200]}")
            continue
        missing = [f for f in fragments if f not in result.text]
        if missing:
            problems.append(f"{where}: {missing} not in {result.text[:300]!r}")
        if len(result.text) > MAX_ERROR_CHARS:
            problems.append(f"{where}: {len(result.text)} characters of error text")
    assert not problems, "\n".join(problems)
    final_status = json.loads(results[steps[-2].tool_calls[0].id].text)
    assert final_status["status"] == "completed"
