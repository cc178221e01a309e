"""``zett-agent mcp`` through the SDK's own stdio client, run by this test process.

The client starts the real command as its subprocess, as an MCP client application does; every
test talks to a real server whose children are real processes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra: uv sync --extra mcp")

from _mcp_testing import (
    CHILD_TOOLS,
    CHILDREN,
    HANG_GUARD,
    HERE,
    ROOT,
    TOOLS,
    ZETT_AGENT,
    fifos,
    start_arguments,
)
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from support.liveness import alive
from zett_agent.process import sandbox_support

pytestmark = pytest.mark.timeout(180)


@asynccontextmanager
async def connect(
    *args: str, target: str = CHILDREN, cwd: Path = HERE, mode: str = "auto"
) -> AsyncIterator[Client]:
    """A client of ``zett-agent mcp target args...``; leaving it closes the server's stdin,
    as a client application does, and waits for it to exit."""
    params = StdioServerParameters(command=ZETT_AGENT, args=["mcp", target, *args], cwd=cwd)
    async with asyncio.timeout(HANG_GUARD), Client(params, mode=mode) as client:
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's JSON result; the call must succeed."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    text = result.content[0].text  # type: ignore[union-attr]
    value = json.loads(text)
    assert result.structured_content == value
    return value  # type: ignore[no-any-return]


async def failure(client: Client, tool: str, **arguments: Any) -> str:
    """A failed tool result's text; the call must fail as a tool result, not a protocol error."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.content
    return result.content[0].text  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_five_tools_are_listed_and_a_task_reports(mode: str) -> None:
    async with connect(mode=mode) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert list(tools) == [*TOOLS, *CHILD_TOOLS]
        assert tools["task_start"].input_schema["required"] == [
            "subagent_type",
            "description",
            "prompt",
        ]
        assert "worker: does what its JSON prompt says" in (tools["task_start"].description or "")
        started = await call(client, "task_start", **start_arguments())
        assert started["status"] in ("pending", "running")
        report = await call(client, "task_output", task_id=started["task_id"], wait_seconds=30)
        assert report["status"] == "completed"
        assert report["content"] == "report: nothing to do"
        listing = await call(client, "task_list")
        assert [t["task_id"] for t in listing["tasks"]] == [started["task_id"]]
        # no extension is declared; MCP tasks are the handshake revision's (2025-11-25) only
        assert not (client.server_capabilities.extensions or {})
        if mode == "legacy":
            assert client.protocol_version == "2025-11-25"
            assert client.server_capabilities.tasks is not None
        else:  # the 2026-07-28 revision has no tasks in its core
            assert client.protocol_version == "2026-07-28"
            assert client.server_capabilities.tasks is None


async def test_task_output_waits_and_forwards_the_childs_progress(tmp_path: Path) -> None:
    with fifos(tmp_path, "gate") as [gate]:
        async with connect() as client:
            started = await call(
                client, "task_start", **start_arguments("step", gate=gate.path, steps=3)
            )
            task_id = started["task_id"]
            # wait_seconds=0 answers at once, running, with a hint
            now = await call(client, "task_output", task_id=task_id, wait_seconds=0)
            assert now["status"] in ("pending", "running") and "hint" in now
            seen: asyncio.Queue[tuple[float, str]] = asyncio.Queue()

            async def progress(value: float, total: float | None, message: str | None) -> None:
                await seen.put((value, message or ""))

            output = asyncio.ensure_future(
                client.call_tool(
                    "task_output",
                    {"task_id": task_id, "wait_seconds": HANG_GUARD},
                    progress_callback=progress,
                )
            )
            values = [(await seen.get())[0]]  # the task's state as the wait begins
            for step in (1, 2):
                gate.write_line()
                while True:  # the step shows in a notification before the next one starts
                    value, message = await seen.get()
                    values.append(value)
                    if f"{step} of 3 done" in message:
                        break
                assert message.startswith("running, turn 1")
                assert not output.done()  # still waiting: the report needs every step
            # The last step ends the task: its answer may come before any notification of it
            # (no notification follows a call's answer), so only the answer is awaited.
            gate.write_line()
            result = await output
            assert values == sorted(set(values))  # progress grows with every notification
            report = json.loads(result.content[0].text)  # type: ignore[union-attr]
            assert report["status"] == "completed"
            assert report["content"] == "report: took 3 steps"
            assert report["tool_calls"] == 1 and report["last_tool"] == "step"


async def test_task_cancel_answers_once_the_childs_tree_is_gone(tmp_path: Path) -> None:
    with fifos(tmp_path, "report") as [report]:
        async with connect() as client:
            started = await call(
                client, "task_start", **start_arguments("spin", report=report.path)
            )
            child, grandchild = map(int, report.read_line().split())
            assert alive(child) and alive(grandchild)
            cancelled = await call(client, "task_cancel", task_id=started["task_id"])
            assert cancelled["status"] == "cancelled"
            assert not alive(child) and not alive(grandchild)
            # a cancelled task stays readable, and cancelling it again changes nothing
            again = await call(client, "task_cancel", task_id=started["task_id"])
            assert again["status"] == "cancelled"


async def test_bad_calls_get_short_failed_results_that_say_how_to_fix_them(
    tmp_path: Path,
) -> None:
    with fifos(tmp_path, "report") as [report]:
        async with connect("--max-concurrent", "1") as client:
            text = await failure(
                client, "task_start", subagent_type="nope", description="d", prompt="p"
            )
            assert text == (
                "task_start failed: ValueError: unknown subagent_type 'nope'; choose one of: "
                "'worker'"
            )
            text = await failure(client, "task_start", subagent_type="worker")
            assert text.startswith("Invalid arguments for tool 'task_start': missing required")
            assert text.endswith("Fix the arguments and call 'task_start' again.")
            text = await failure(
                client, "task_start", subagent_type="worker", description="d", prompt="  "
            )
            assert text.endswith("prompt is empty; give the task the full instructions to work on")
            text = await failure(client, "task_output", task_id="task-9", wait_seconds=1)
            assert text.endswith("unknown task_id 'task-9'; this session's tasks are: none")
            text = await failure(client, "task_output", task_id="task-9", wait_seconds=-1)
            assert "wait_seconds" in text and text.endswith("call 'task_output' again.")
            text = await failure(client, "task_launch")
            assert text.startswith("Unknown tool 'task_launch'. Available tools: task_cancel,")
            # --max-concurrent 1: a second task is refused while the first runs, naming it
            first = await call(client, "task_start", **start_arguments("spin", report=report.path))
            report.read_line()
            text = await failure(client, "task_start", **start_arguments())
            assert "this session already runs 1 tasks (max_concurrent=1): task-1" in text
            await call(client, "task_cancel", task_id=first["task_id"])
            second = await call(client, "task_start", **start_arguments())
            assert second["task_id"] == "task-2"


@pytest.mark.skipif(not sandbox_support()["required_ok"], reason="no enforceable Sandbox here")
async def test_sandbox_confines_every_child(tmp_path: Path) -> None:
    async with connect("--sandbox") as client:
        started = await call(client, "task_start", **start_arguments())
        report = await call(client, "task_output", task_id=started["task_id"], wait_seconds=30)
        assert report["status"] == "completed", report
        assert report["sandbox"]["network"] == "none"
        assert report["sandbox"]["seccomp"] is True


async def test_the_documented_definitions_module_is_served() -> None:
    target = "docs._examples.mcp_children:definitions"
    async with connect(target=target, cwd=ROOT) as client:
        tools = (await client.list_tools()).tools
        assert [tool.name for tool in tools] == [*TOOLS, "line_counter"]
        started = await call(
            client,
            "task_start",
            subagent_type="line_counter",
            description="count lines",
            prompt=f"Count the lines of the Python files in {ROOT / 'docs' / '_examples'}",
        )
        report = await call(client, "task_output", task_id=started["task_id"], wait_seconds=60)
        assert report["status"] == "completed", report
        assert "mcp_children.py" in report["content"]
