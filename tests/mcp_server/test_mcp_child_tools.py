"""A tool per child, called plainly: through the official SDK's client and through fastmcp's.

Each served definition is a tool of its own name: called without a task it runs the child,
sends its progress while it runs, and answers with its report; cancelling the call kills the
child's tree.
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
    TOOLS,
    ZETT_AGENT,
    fifos,
    wait_gone,
    worker_arguments,
)
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from support.liveness import alive

pytestmark = pytest.mark.timeout(180)


@asynccontextmanager
async def connect(*args: str, mode: str = "legacy") -> AsyncIterator[Client]:
    params = StdioServerParameters(command=ZETT_AGENT, args=["mcp", CHILDREN, *args], cwd=HERE)
    async with asyncio.timeout(HANG_GUARD), Client(params, mode=mode) as client:
        yield client


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_each_child_is_a_tool_that_runs_it_and_answers_its_report(
    mode: str, tmp_path: Path
) -> None:
    async with connect(mode=mode) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert list(tools) == [*TOOLS, *CHILD_TOOLS]
        worker = tools["worker"]
        assert worker.description == "does what its JSON prompt says"
        assert worker.input_schema["required"] == ["prompt"]
        # the same bounds as task_start's
        start = tools["task_start"].input_schema["properties"]
        for name in ("prompt", "description"):
            bounds = {k: v for k, v in start[name].items() if k != "description"}
            assert {k: worker.input_schema["properties"][name][k] for k in bounds} == bounds
        if mode == "legacy":  # 2025-11-25: it may run as a task
            assert worker.execution is not None and worker.execution.task_support == "optional"
        else:  # 2026-07-28 has no tasks in its core: the field is not on its wire
            assert worker.execution is None
        with fifos(tmp_path, "gate") as [gate]:
            seen: asyncio.Queue[str] = asyncio.Queue()

            async def progress(value: float, total: float | None, message: str | None) -> None:
                await seen.put(message or "")

            call = asyncio.ensure_future(
                client.call_tool(
                    "worker",
                    worker_arguments("step", gate=gate.path, steps=2),
                    progress_callback=progress,
                )
            )
            gate.write_line()
            while "1 of 2 done" not in await seen.get():  # the child's own progress
                pass
            assert not call.done()  # the call waits for the child's report
            gate.write_line()
            result = await call
        assert not result.is_error
        assert result.content[0].text == "report: took 2 steps"  # type: ignore[union-attr]
        info = result.structured_content
        assert info is not None and info["status"] == "completed" and info["tool_calls"] == 1
        # the child ran in the client's session: the task tools see it too
        listing = await client.call_tool("task_list", {})
        tasks = json.loads(listing.content[0].text)["tasks"]  # type: ignore[union-attr]
        assert [(t["task_id"], t["subagent_type"]) for t in tasks] == [(info["task_id"], "worker")]


async def test_a_child_that_fails_answers_an_error_saying_why() -> None:
    async with connect() as client:
        # the child's model reads its prompt as JSON: this one breaks it
        result = await client.call_tool("worker", {"prompt": "not json"})
        assert result.is_error
        text = result.content[0].text  # type: ignore[union-attr]
        assert text.startswith("failed: ") and "JSONDecodeError" in text
        assert result.structured_content is not None
        assert result.structured_content["status"] == "failed"


async def test_bad_arguments_get_a_failed_result_that_says_how_to_fix_them() -> None:
    async with connect() as client:
        result = await client.call_tool("worker", {})
        assert result.is_error
        text = result.content[0].text  # type: ignore[union-attr]
        assert text.startswith("Invalid arguments for tool 'worker': missing required argument")
        assert text.endswith("Fix the arguments and call 'worker' again.")
        result = await client.call_tool("worker", {"prompt": "x", "model": "big"})
        assert "unexpected argument 'model'" in result.content[0].text  # type: ignore[union-attr]
        result = await client.call_tool("worker", {"prompt": "x" * 100_001})
        assert "at most 100000 characters" in result.content[0].text  # type: ignore[union-attr]


async def test_cancelling_a_plain_call_kills_its_child(tmp_path: Path) -> None:
    with fifos(tmp_path, "report") as [report]:
        async with connect() as client:
            call = asyncio.ensure_future(
                client.call_tool("worker", worker_arguments("spin", report=report.path))
            )
            child, grandchild = map(int, (await report.read_line_async()).split())
            assert alive(child) and alive(grandchild)
            call.cancel()  # the SDK tells the server: notifications/cancelled
            with pytest.raises(asyncio.CancelledError):
                await call
            wait_gone([child, grandchild])
            # the server goes on: its next call runs
            result = await client.call_tool("worker", worker_arguments())
            assert result.content[0].text == "report: nothing to do"  # type: ignore[union-attr]


async def test_fastmcp_client_over_stdio_runs_a_child_with_progress(tmp_path: Path) -> None:
    """fastmcp's client: a second, independent client API (on the SDK's session)."""
    fastmcp = pytest.importorskip("fastmcp")
    from fastmcp.client.transports import StdioTransport

    transport = StdioTransport(ZETT_AGENT, ["mcp", CHILDREN], cwd=str(HERE), keep_alive=False)
    with fifos(tmp_path, "gate") as [gate]:
        async with asyncio.timeout(HANG_GUARD), fastmcp.Client(transport) as client:
            names = [tool.name for tool in await client.list_tools()]
            assert names == [*TOOLS, *CHILD_TOOLS]
            lines: list[str] = []
            stepped = asyncio.Event()

            async def progress(value: float, total: float | None, message: str | None) -> None:
                lines.append(message or "")
                if "1 of 1 done" in (message or ""):
                    stepped.set()

            call: asyncio.Future[Any] = asyncio.ensure_future(
                client.call_tool(
                    "worker",
                    worker_arguments("step", gate=gate.path, steps=1),
                    progress_handler=progress,
                )
            )
            gate.write_line()
            result = await call
            assert result.content[0].text == "report: took 1 steps"
            assert lines and all(line.startswith(("pending", "running")) for line in lines)
            failed = await client.call_tool("worker", {"prompt": "not json"}, raise_on_error=False)
            assert failed.is_error
