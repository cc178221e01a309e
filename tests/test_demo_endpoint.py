"""``zett-agent demo --model openai:NAME --base-url URL``: parent and children on an endpoint.

The endpoint is an OpenAI-compatible server on loopback, started by the test, whose answers come
from the demo's own scripted models applied to the conversation each request carries. So the
whole path is real: the CLI, the adapter in the parent and in every child process, HTTP, SSE.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from support.openai_endpoint import OfflineEndpoint
from zett_agent._demo._models import DemoChildModel, DemoParentModel
from zett_agent._demo._scenario import PARENT_PROMPT
from zett_agent.messages import AssistantMessage, UserMessage
from zett_agent.model import ModelEventKind, ModelRequest

HANG_GUARD = 120


async def answer(request: ModelRequest) -> AssistantMessage:
    """The demo's own scripted models, applied to the conversation the request carries."""
    first = request.messages[0]
    if isinstance(first, UserMessage) and first.content.startswith(PARENT_PROMPT):
        model: Any = DemoParentModel(json.loads(first.content[len(PARENT_PROMPT) :]))
    else:
        model = DemoChildModel()
    async for event in model.stream(request):
        if event.kind is ModelEventKind.COMPLETED:
            assert event.response is not None
            return event.response.message
    raise AssertionError("the scripted model gave no answer")


async def test_demo_runs_parent_and_children_on_an_openai_compatible_endpoint(
    tmp_path: Path,
) -> None:
    for i in range(4):
        (tmp_path / f"f{i}.txt").write_text(f"data {i}\n")
    async with OfflineEndpoint(answer) as endpoint:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "zett_agent.cli",
            "demo",
            str(tmp_path),
            "--json",
            "--rounds",
            "100",
            "--hashers",
            "2",
            "--model",
            "openai:scripted",
            "--base-url",
            endpoint.url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "NO_PROXY": "*"},
        )
        async with asyncio.timeout(HANG_GUARD):
            out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    result = json.loads(out)
    statuses = sorted((t["subagent_type"], t["status"]) for t in result["tasks"])
    assert statuses == [
        ("crasher", "failed"),
        ("hasher", "completed"),
        ("hasher", "completed"),
        ("snooper", "completed"),  # sandboxed, with the network open to reach its model
        ("spinner", "cancelled"),
    ]
    [snooper] = [t for t in result["tasks"] if t["subagent_type"] == "snooper"]
    if snooper["sandbox"].get("filesystem"):
        assert "was denied" in snooper["content"], snooper
    assert all(t["input_tokens"] > 0 for t in result["tasks"])  # usage came through the children
    models = {r["model"] for r in endpoint.requests}
    assert models == {"scripted"}
    child_calls = [
        r for r in endpoint.requests if r["messages"][0]["content"].startswith("You are a worker")
    ]
    assert len(child_calls) >= 2 * 2 + 2  # each hasher twice, spinner and crasher once
