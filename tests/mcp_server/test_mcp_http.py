"""``zett-agent mcp --http``: Streamable HTTP on 127.0.0.1, a process of its own per test.

Real clients (the official SDK's, with its tasks; fastmcp's) over real HTTP, several at once,
each with its own tasks; and raw HTTP for what a hostile client sends.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra: uv sync --extra mcp")

import httpx2
from _mcp_sdk import TaskClient, task_client
from _mcp_testing import (
    CHILD_TOOLS,
    HANG_GUARD,
    TOOLS,
    HttpServer,
    fifos,
    http_server,
    reap,
    start_arguments,
    wait_gone,
    worker_arguments,
)
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from support.liveness import alive

pytestmark = pytest.mark.timeout(180)

ACCEPT = {"Accept": "application/json, text/event-stream"}


@asynccontextmanager
async def sdk_client(server: HttpServer, mode: str = "auto") -> AsyncIterator[Client]:
    async with (
        asyncio.timeout(HANG_GUARD),
        httpx2.AsyncClient(headers=server.headers, timeout=httpx2.Timeout(30, read=300)) as http,
        Client(streamable_http_client(server.url, http_client=http), mode=mode) as client,
    ):
        yield client


@asynccontextmanager
async def tasks_over_http(server: HttpServer) -> AsyncIterator[TaskClient]:
    async with (
        asyncio.timeout(HANG_GUARD),
        httpx2.AsyncClient(headers=server.headers, timeout=httpx2.Timeout(30, read=300)) as http,
        task_client(streamable_http_client(server.url, http_client=http)) as client,
    ):
        yield client


def post(
    server: HttpServer, message: object, headers: dict[str, str] | None = None, **options: Any
) -> tuple[httpx.Response, list[dict[str, Any]]]:
    """One raw POST; the JSON-RPC messages of its answer (a JSON body or an SSE stream)."""
    sent = {**ACCEPT, **server.headers, **(headers or {})}
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    sent.setdefault("Content-Type", "application/json")
    response = httpx.post(server.url, content=body, headers=sent, timeout=HANG_GUARD, **options)
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        messages = [
            json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")
        ]
        return response, [m for m in messages if m]
    return response, ([response.json()] if response.content else [])


def open_session(server: HttpServer) -> dict[str, str]:
    """Initialize a session in raw HTTP; the headers every later request of it carries."""
    response, _ = post(
        server,
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        },
    )
    assert response.status_code == 200, response.text
    session = {"Mcp-Session-Id": response.headers["mcp-session-id"]}
    response, _ = post(server, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    assert response.status_code == 202
    return session


async def test_the_sdk_client_falls_back_to_a_session_and_runs_children_and_tasks(
    tmp_path: Path,
) -> None:
    with http_server() as server, fifos(tmp_path, "gate") as [gate]:
        async with sdk_client(server) as client:
            # mode auto probes 2026-07-28, is told it is not served over HTTP, and initializes
            assert client.protocol_version == "2025-11-25"
            assert client.server_capabilities.tasks is not None
            names = [tool.name for tool in (await client.list_tools()).tools]
            assert names == [*TOOLS, *CHILD_TOOLS]
            lines: list[str] = []

            async def progress(value: float, total: float | None, message: str | None) -> None:
                lines.append(message or "")

            gate.write_line()
            result = await client.call_tool(
                "worker",
                worker_arguments("step", gate=gate.path, steps=1),
                progress_callback=progress,
            )
            assert result.content[0].text == "report: took 1 steps"  # type: ignore[union-attr]
            assert lines  # progress came on the call's own stream
        async with tasks_over_http(server) as tasks:
            created = await tasks.call_as_task("worker", worker_arguments())
            # the status notification comes on the session's own (GET) stream
            await tasks.wait_status(created.task.task_id, "completed")
            report = await tasks.result(created.task.task_id)
            assert report.content[0].text == "report: nothing to do"  # type: ignore[union-attr]


async def test_each_client_sees_and_cancels_only_its_own_tasks(tmp_path: Path) -> None:
    with http_server() as server, fifos(tmp_path, "report") as [report]:
        async with tasks_over_http(server) as first, tasks_over_http(server) as second:
            created = await first.call_as_task(
                "worker", worker_arguments("spin", report=report.path)
            )
            task_id = created.task.task_id
            child, grandchild = map(int, (await report.read_line_async()).split())
            started = await first.session.call_tool("task_start", start_arguments())
            theirs = json.loads(started.content[0].text)["task_id"]  # type: ignore[union-attr]
            # the second client: none of the first's tasks, by any route
            assert (await second.list()).tasks == []
            for ask in (second.get, second.result, second.cancel):
                with pytest.raises(MCPError) as foreign:
                    await ask(task_id)
                assert foreign.value.message == "Failed to retrieve task: Task not found"
            status = await second.session.call_tool("task_status", {"task_id": theirs})
            assert status.is_error and "unknown task_id" in status.content[0].text  # type: ignore[union-attr]
            assert alive(child) and alive(grandchild)
            # the first still has its own
            assert (await first.get(task_id)).status == "working"
            assert (await first.cancel(task_id)).status == "cancelled"
            assert not alive(child) and not alive(grandchild)


async def test_a_client_that_leaves_keeps_its_tasks_until_their_ttl(tmp_path: Path) -> None:
    with http_server() as server, fifos(tmp_path, "kept", "other") as [kept, other]:
        async with tasks_over_http(server) as client:
            created = await client.call_as_task(
                "worker", worker_arguments("spin", report=kept.path), ttl=4_000
            )
            task_pids = [int(p) for p in (await kept.read_line_async()).split()]
            await client.session.call_tool("task_start", start_arguments("spin", report=other.path))
            other_pids = [int(p) for p in (await other.read_line_async()).split()]
            assert created.task.ttl == 4_000
        # the client left (its transport ended the session with DELETE): the task_start
        # child, which nobody can read any more, dies now; the MCP task's runs on
        wait_gone(other_pids)
        assert all(alive(pid) for pid in task_pids)
        wait_gone(task_pids)  # until its lifetime ends


def test_requests_without_the_token_or_from_elsewhere_are_refused() -> None:
    with http_server() as server:
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        response = httpx.post(server.url, json=ping, headers=ACCEPT, timeout=HANG_GUARD)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == 'Bearer realm="mcp"'
        assert response.json()["error"]["message"].startswith("Unauthorized: send the server's")
        response, _ = post(server, ping, {"Authorization": "Bearer " + "x" * 43})
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == 'Bearer error="invalid_token"'
        response, _ = post(server, ping, {"Origin": "http://attacker.example"})
        assert response.status_code == 403
        assert "DNS rebinding" in response.json()["error"]["message"]
        response, _ = post(server, ping, {"Host": "attacker.example"})
        assert response.status_code == 403 and "Host" in response.json()["error"]["message"]
        # a page on localhost may call it (a web app), and gets its CORS answers
        preflight = httpx.options(
            server.url,
            headers={"Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST"},
            timeout=HANG_GUARD,
        )
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == "http://localhost:5173"
        assert "authorization" in preflight.headers["access-control-allow-headers"]
        response = httpx.post(server.url.replace("/mcp", "/other"), json=ping, timeout=HANG_GUARD)
        assert response.status_code == 404


def test_bad_bodies_sessions_and_revisions_get_clear_errors() -> None:
    with http_server() as server:
        response, [error] = post(server, b"{not json")
        assert response.status_code == 400 and error["error"]["code"] == -32700
        response, _ = post(server, b'{"x": "' + b"y" * (5 << 20) + b'"}')
        assert response.status_code == 413
        response, [error] = post(
            server,
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            {"Mcp-Session-Id": "forged"},
        )
        assert response.status_code == 404 and error["error"]["message"].startswith(
            "Session not found"
        )
        response, [error] = post(
            server,
            {"jsonrpc": "2.0", "id": 1, "method": "server/discover"},
            {"MCP-Protocol-Version": "2026-07-28"},
        )
        assert response.status_code == 400 and error["error"]["code"] == -32022
        assert "2025-11-25" in error["error"]["data"]["supported"]
        # and a client that behaves is served as before
        session = open_session(server)
        response, [answer] = post(
            server,
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "worker", "arguments": worker_arguments()},
            },
            session,
        )
        assert answer["result"]["content"][0]["text"] == "report: nothing to do"


def test_sigterm_kills_every_child_then_the_server_dies_of_it(tmp_path: Path) -> None:
    with fifos(tmp_path, "report") as [report]:
        server = HttpServer()
        try:
            session = open_session(server)
            _, [created] = post(
                server,
                {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {
                        "name": "worker",
                        "arguments": worker_arguments("spin", report=report.path),
                        "task": {},
                    },
                },
                session,
            )
            assert created["result"]["task"]["status"] == "working"
            child, grandchild = map(int, report.read_line().split())
            import psutil

            everything = [
                p.pid for p in psutil.Process(server.process.pid).children(recursive=True)
            ]
            assert {child, grandchild} <= set(everything)
        finally:
            status = server.stop(signal.SIGTERM)
        assert status == -signal.SIGTERM
        reap(everything)
        assert not [pid for pid in everything if alive(pid)]


async def test_a_token_file_and_fastmcps_client(tmp_path: Path) -> None:
    fastmcp = pytest.importorskip("fastmcp")
    from fastmcp.client.transports import StreamableHttpTransport

    token_file = tmp_path / "token"
    token_file.write_text("a-token-of-my-own-0123456789\n")
    with http_server("--token-file", str(token_file)) as server:
        assert server.wait_line("zett-agent mcp: bearer token: the one in")
        transport = StreamableHttpTransport(server.url, auth="a-token-of-my-own-0123456789")
        async with asyncio.timeout(HANG_GUARD), fastmcp.Client(transport) as client:
            names = [tool.name for tool in await client.list_tools()]
            assert names == [*TOOLS, *CHILD_TOOLS]
            result = await client.call_tool("worker", worker_arguments())
            assert result.content[0].text == "report: nothing to do"
        bad = StreamableHttpTransport(server.url, auth="not-the-token-0123456789")
        with pytest.raises(Exception, match=r"401|Unauthorized"):
            async with asyncio.timeout(HANG_GUARD), fastmcp.Client(bad) as client:
                await client.list_tools()
