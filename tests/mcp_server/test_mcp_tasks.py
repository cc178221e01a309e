"""MCP tasks (protocol 2025-11-25) through the official SDK over stdio, and in raw JSON-RPC.

A task-augmented call of a child's tool answers at once with a ``working`` task; ``tasks/get``
follows it, ``tasks/result`` waits for its report, ``tasks/cancel`` kills its tree before it
answers, ``tasks/list`` pages, and ``notifications/tasks/status`` tells each change.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra: uv sync --extra mcp")

from _mcp_sdk import TaskClient, task_client
from _mcp_testing import (
    CHILDREN,
    HANG_GUARD,
    HERE,
    ZETT_AGENT,
    RawServer,
    fifos,
    start_arguments,
    wait_gone,
    worker_arguments,
)
from mcp import MCPError
from mcp.client.stdio import StdioServerParameters, stdio_client

from support.liveness import alive

pytestmark = pytest.mark.timeout(180)

RELATED = "io.modelcontextprotocol/related-task"


@asynccontextmanager
async def connect(*args: str) -> AsyncIterator[TaskClient]:
    params = StdioServerParameters(command=ZETT_AGENT, args=["mcp", CHILDREN, *args], cwd=HERE)
    async with asyncio.timeout(HANG_GUARD), task_client(stdio_client(params)) as client:
        yield client


async def test_a_task_answers_at_once_then_reports_through_tasks_result(tmp_path: Path) -> None:
    with fifos(tmp_path, "gate") as [gate]:
        async with connect() as client:
            capabilities = client.session.server_capabilities
            assert capabilities is not None and capabilities.tasks is not None
            assert capabilities.tasks.requests is not None
            created = await client.call_as_task(
                "worker", worker_arguments("step", gate=gate.path, steps=2)
            )
            task = created.task
            # at once, before the child did anything: the gate holds it
            assert task.status == "working"
            assert task.ttl == 3_600_000 and task.poll_interval == 1_000
            assert len(task.task_id) >= 40  # 256 random bits, not "task-1"
            gate.write_line()
            now = await client.get(task.task_id)
            while "1 of 2 done" not in (now.status_message or ""):
                await asyncio.sleep(0.05)  # polling tasks/get is the protocol here
                now = await client.get(task.task_id)
            assert now.status == "working" and now.created_at == task.created_at
            result = asyncio.ensure_future(client.result(task.task_id))
            # a request sent after it is answered, it is not: it blocks while the task works
            assert (await client.get(task.task_id)).status == "working"
            assert not result.done()
            gate.write_line()
            report = await result
            assert not report.is_error
            assert report.content[0].text == "report: took 2 steps"  # type: ignore[union-attr]
            assert report.meta is not None and report.meta[RELATED] == {"taskId": task.task_id}
            status = await client.wait_status(task.task_id, "completed")
            done = await client.get(task.task_id)
            assert done.status == "completed" and done.last_updated_at == status.last_updated_at
            listed = await client.list()
            assert [t.task_id for t in listed.tasks] == [task.task_id]


async def test_a_failed_child_makes_a_failed_task_whose_result_is_an_error() -> None:
    async with connect() as client:
        created = await client.call_as_task("worker", {"prompt": "not json"})
        status = await client.wait_status(created.task.task_id, "failed")
        assert (status.status_message or "").startswith("failed: ")
        report = await client.result(created.task.task_id)
        assert report.is_error
        assert "JSONDecodeError" in report.content[0].text  # type: ignore[union-attr]


async def test_tasks_cancel_answers_once_the_childs_tree_is_dead(tmp_path: Path) -> None:
    with fifos(tmp_path, "report") as [report]:
        async with connect() as client:
            created = await client.call_as_task(
                "worker", worker_arguments("spin", report=report.path)
            )
            task_id = created.task.task_id
            child, grandchild = map(int, (await report.read_line_async()).split())
            assert alive(child) and alive(grandchild)
            cancelled = await client.cancel(task_id)
            assert cancelled.status == "cancelled"
            assert not alive(child) and not alive(grandchild)  # dead before the answer
            await client.wait_status(task_id, "cancelled")
            assert (await client.get(task_id)).status == "cancelled"
            result = await client.result(task_id)
            assert result.is_error
            with pytest.raises(MCPError) as again:
                await client.cancel(task_id)
            assert again.value.code == -32602
            assert (
                again.value.message == "Cannot cancel task: already in terminal status 'cancelled'"
            )


async def test_a_task_lives_its_ttl_then_its_child_is_killed(tmp_path: Path) -> None:
    with fifos(tmp_path, "report") as [report]:
        async with connect("--max-task-ttl", "30") as client:
            # asked for far more than the maximum: the maximum is granted
            long = await client.call_as_task("worker", worker_arguments(), ttl=10**12)
            assert long.task.ttl == 30_000
            # asked for 10 ms: the least lifetime, one second
            short = await client.call_as_task(
                "worker", worker_arguments("spin", report=report.path), ttl=10
            )
            assert short.task.ttl == 1_000
            child, grandchild = map(int, (await report.read_line_async()).split())
            wait_gone([child, grandchild])  # killed when its second was up
            with pytest.raises(MCPError) as expired:
                await client.get(short.task.task_id)
            assert expired.value.code == -32602
            assert expired.value.message == "Failed to retrieve task: Task has expired"
            assert (await client.result(long.task.task_id)).is_error is False


async def test_tasks_list_pages_with_an_opaque_cursor() -> None:
    async with connect("--max-concurrent", "8") as client:
        ids = []
        for _ in range(23):  # one page of 20, then 3
            created = await client.call_as_task("worker", worker_arguments())
            ids.append(created.task.task_id)
            if len(ids) % 8 == 0:
                for task_id in ids[-8:]:
                    await client.result(task_id)
        first = await client.list()
        assert [t.task_id for t in first.tasks] == ids[:20] and first.next_cursor
        second = await client.list(first.next_cursor)
        assert [t.task_id for t in second.tasks] == ids[20:] and second.next_cursor is None
        with pytest.raises(MCPError) as bad:
            await client.list("bm90LWEtY3Vyc29y")
        assert bad.value.code == -32602 and bad.value.message.startswith("Invalid cursor")


async def test_what_cannot_run_as_a_task_gets_the_specs_errors() -> None:
    async with connect("--max-concurrent", "1") as client:
        with pytest.raises(MCPError) as plain_only:
            await client.call_as_task("task_list", {})
        assert plain_only.value.code == -32601
        assert "'task_list' runs plainly only" in plain_only.value.message
        with pytest.raises(MCPError) as unknown:
            await client.call_as_task("nope", {})
        assert unknown.value.code == -32601 and "'nope' is not a tool here" in unknown.value.message
        with pytest.raises(MCPError) as bad:
            await client.call_as_task("worker", {})
        assert bad.value.code == -32602
        assert bad.value.message.startswith("Invalid arguments for tool 'worker'")
        for ask in (client.get, client.result, client.cancel):
            with pytest.raises(MCPError) as missing:
                await ask("x" * 43)
            assert missing.value.code == -32602
            assert missing.value.message == "Failed to retrieve task: Task not found"


async def test_max_concurrent_refuses_a_task_saying_what_runs(tmp_path: Path) -> None:
    with fifos(tmp_path, "report") as [report]:
        async with connect("--max-concurrent", "1") as client:
            first = await client.call_as_task(
                "worker", worker_arguments("spin", report=report.path)
            )
            await report.read_line_async()
            with pytest.raises(MCPError) as refused:
                await client.call_as_task("worker", worker_arguments())
            assert refused.value.code == -32602
            assert "this session already runs 1 tasks (max_concurrent=1)" in refused.value.message
            await client.cancel(first.task.task_id)


def test_task_progress_keeps_its_token_after_the_answer(tmp_path: Path) -> None:
    """Raw JSON-RPC: the progress token of a task-augmented call stays valid for its life."""
    with fifos(tmp_path, "gate") as [gate]:
        server = RawServer()
        try:
            server.initialize()
            arguments = worker_arguments("step", gate=gate.path, steps=2)
            created = server.call(
                "tools/call",
                {
                    "name": "worker",
                    "arguments": arguments,
                    "task": {"ttl": 60_000},
                    "_meta": {"progressToken": "p-1"},
                },
            )
            task_id = created["result"]["task"]["taskId"]  # type: ignore[index]
            gate.write_line()
            # after the answer, the child's progress comes with the call's token
            server.notification("notifications/progress", "1 of 2 done")
            gate.write_line()
            result = server.call("tasks/result", {"taskId": task_id})
            text = result["result"]["content"][0]["text"]  # type: ignore[index]
            assert text == "report: took 2 steps"
            progress = [
                n["params"] for n in server.notifications if n["method"] == "notifications/progress"
            ]
            assert all(p["progressToken"] == "p-1" for p in progress)  # type: ignore[index]
            values = [p["progress"] for p in progress]  # type: ignore[index]
            assert values == sorted(set(values))  # it grows with every notification
        finally:
            assert server.close() == 0


def test_before_2025_11_25_there_are_no_tasks(tmp_path: Path) -> None:
    """Raw JSON-RPC at 2025-06-18: no capability, tasks/* unknown, a call's task ignored."""
    server = RawServer()
    try:
        answer = server.initialize("2025-06-18")
        assert "tasks" not in answer["result"]["capabilities"]  # type: ignore[index]
        missing = server.call("tasks/get", {"taskId": "x"})
        assert missing["error"]["code"] == -32601  # type: ignore[index]
        plain = server.call(
            "tools/call",
            {"name": "worker", "arguments": worker_arguments(), "task": {"ttl": 1000}},
        )
        assert plain["result"]["content"][0]["text"] == "report: nothing to do"  # type: ignore[index]
        # and the five task tools are there as before
        started = server.call("tools/call", {"name": "task_start", "arguments": start_arguments()})
        assert started["result"]["isError"] is False  # type: ignore[index]
    finally:
        assert server.close() == 0
