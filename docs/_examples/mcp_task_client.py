"""Run a child as an MCP task (protocol 2025-11-25) with the official SDK's own parts.

    python docs/_examples/mcp_task_client.py        # from the repository root

It starts `zett-agent mcp docs._examples.mcp_children:definitions` over stdio, calls the
line_counter child's tool as a task, follows it with tasks/get and reads its report with
tasks/result. The SDK (2.3) ships the task types but no task API in its client, and its
call_tool checks every answer as a CallToolResult: so the task-augmented call goes through the
SDK's JSON-RPC dispatcher, and the tasks/* requests through its ClientSession.
"""

import asyncio
import sys
from pathlib import Path

from mcp import ClientSession, types
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

FOLDER = Path(__file__).resolve().parent  # the folder whose Python files the child counts


async def main() -> None:
    server = StdioServerParameters(
        command=sys.executable,  # the zett-agent command of this environment
        args=["-m", "zett_agent.cli", "mcp", "docs._examples.mcp_children:definitions"],
    )
    async with stdio_client(server) as (read, write):
        dispatcher = JSONRPCDispatcher(read, write)
        async with ClientSession(dispatcher=dispatcher) as session:
            await session.initialize()  # negotiates 2025-11-25, the revision with tasks
            prompt = f"Count the lines of the Python files in {FOLDER}"
            answer = await dispatcher.send_raw_request(
                "tools/call",
                {"name": "line_counter", "arguments": {"prompt": prompt}, "task": {"ttl": 600_000}},
            )
            task = types.CreateTaskResult.model_validate(answer).task
            print(f"started task {task.task_id[:8]}...: {task.status}, kept {task.ttl} ms")

            which = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task.task_id))
            now = await session.send_request(which, types.GetTaskResult)
            print(f"tasks/get: {now.status} ({now.status_message})")

            # tasks/result waits until the task ends, then answers what a plain call would have
            result = types.GetTaskPayloadRequest(
                params=types.GetTaskPayloadRequestParams(task_id=task.task_id)
            )
            report = await session.send_request(result, types.CallToolResult)
            print(f"tasks/result: {report.content[0].text}")


asyncio.run(main())
