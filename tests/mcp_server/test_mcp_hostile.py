"""Hostile clients over stdio, in raw JSON-RPC: every bad message gets a clear error, and the
server stays up and bounded."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra: uv sync --extra mcp")

from _mcp_testing import HANG_GUARD, RawServer, fifos, reap, worker_arguments

from support.liveness import alive

pytestmark = pytest.mark.timeout(180)


def test_bad_lines_get_json_rpc_errors_and_the_server_goes_on() -> None:
    server = RawServer()
    try:
        server.send(b"{not json")
        assert server.next_message() == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {
                "code": -32700,
                "message": "Parse error: Invalid JSON: key must be a string at line 1 column 2",
            },
        }
        server.send(b"\xff\xfe not even text")
        parse = server.next_message()
        assert parse["id"] is None and parse["error"]["code"] == -32700  # type: ignore[index]
        server.send(b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]')
        batch = server.next_message()
        assert batch["error"] == {  # type: ignore[index]
            "code": -32600,
            "message": "Invalid Request: batches are not supported; send one message",
        }
        server.send(b'{"jsonrpc": "1.0", "id": 7, "method": "ping"}')
        invalid = server.next_message()
        assert invalid["id"] == 7 and invalid["error"]["code"] == -32600  # type: ignore[index]
        # a line of 5 MiB is skipped unread, and says so
        server.send(
            b'{"jsonrpc": "2.0", "id": 8, "method": "ping", "params": {"x": "'
            + b"y" * (5 << 20)
            + b'"}}'
        )
        huge = server.next_message()
        assert huge["id"] is None and huge["error"]["code"] == -32600  # type: ignore[index]
        assert "a message of more than 4194304 bytes" in huge["error"]["message"]  # type: ignore[index]
        # after all that, the server answers as if nothing happened
        assert "result" in server.initialize()
        unknown = server.call("tools/explode")
        assert unknown["error"]["code"] == -32601  # type: ignore[index]
        answer = server.call("tools/call", {"name": "worker", "arguments": worker_arguments()})
        assert answer["result"]["content"][0]["text"] == "report: nothing to do"  # type: ignore[index]
    finally:
        assert server.close() == 0


def test_huge_arguments_are_refused_by_the_schema_not_run() -> None:
    server = RawServer()
    try:
        server.initialize()
        big = {"prompt": "x" * 3_000_000}  # under the line bound, over the prompt's
        plain = server.call("tools/call", {"name": "worker", "arguments": big})
        assert plain["result"]["isError"] is True  # type: ignore[index]
        assert "at most 100000 characters" in plain["result"]["content"][0]["text"]  # type: ignore[index]
        as_task = server.call("tools/call", {"name": "worker", "arguments": big, "task": {}})
        assert as_task["error"]["code"] == -32602  # type: ignore[index]
        assert len(json.dumps(as_task)) < 2_000  # the error does not echo the argument
    finally:
        assert server.close() == 0


def test_a_thousand_tasks_get_a_second_are_all_answered_and_memory_stays_flat() -> None:
    server = RawServer()
    try:
        server.initialize()
        created = server.call(
            "tools/call", {"name": "worker", "arguments": worker_arguments(), "task": {}}
        )
        task_id = created["result"]["task"]["taskId"]  # type: ignore[index]
        server.call("tasks/result", {"taskId": task_id})
        process = psutil.Process(server.process.pid)
        before = process.memory_info().rss
        rounds = []
        for _ in range(3):
            began = time.monotonic()
            numbers = [
                server.request("tasks/get", {"taskId": task_id if n % 2 else f"forged-{n}"})
                for n in range(1000)
            ]
            answers = [server.answer(number) for number in numbers]
            rounds.append(time.monotonic() - began)
            assert all(a["result"]["status"] == "completed" for a in answers[1::2])  # type: ignore[index]
            assert all(
                a["error"]["message"] == "Failed to retrieve task: Task not found"  # type: ignore[index]
                for a in answers[::2]
            )
        grown = process.memory_info().rss - before
        print(f"1000 tasks/get: {[round(r, 3) for r in rounds]} s; rss grew {grown >> 10} KiB")
        assert min(rounds) < 1.0  # a thousand in under a second
        assert grown < 32 << 20  # nothing kept per request
        assert server.call("tasks/get", {"taskId": task_id})["result"]["status"] == "completed"  # type: ignore[index]
    finally:
        assert server.close() == 0


def test_sigterm_over_stdio_kills_every_child_then_the_server_dies_of_it(tmp_path: Path) -> None:
    """The client keeps stdin open and sends nothing: the signal alone ends the server."""
    with fifos(tmp_path, "report") as [report]:
        server = RawServer()
        everything: list[int] = []
        try:
            server.initialize()
            created = server.call(
                "tools/call",
                {
                    "name": "worker",
                    "arguments": worker_arguments("spin", report=report.path),
                    "task": {},
                },
            )
            assert created["result"]["task"]["status"] == "working"  # type: ignore[index]
            child, grandchild = map(int, report.read_line().split())
            process = psutil.Process(server.process.pid)
            everything = [p.pid for p in process.children(recursive=True)]
            assert {child, grandchild} <= set(everything)
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(timeout=HANG_GUARD) == -signal.SIGTERM
            reap(everything)
            assert not [pid for pid in everything if alive(pid)]
        finally:
            server.close()
