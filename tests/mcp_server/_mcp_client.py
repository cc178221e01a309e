"""An MCP client in its own process, driven by the test: the SDK's stdio client, which starts
``zett-agent mcp`` as its subprocess.

    python _mcp_client.py MODE ARG...     # MODE: the SDK's connect mode; ARG...: zett-agent's

Reads one JSON order per line on stdin, ``{"id": n, "tool": name, "arguments": {...}}``, runs
each as a tool call concurrently with the others, and writes one JSON line per event to stdout:
``{"ready": true, "server_pid": p, "tools": [...]}`` once connected, ``{"id": n, "progress":
message}`` for each progress notification of a call, ``{"id": n, "is_error": b, "text": t}``
for its result. The test kills this process to play a client that dies.
"""

from __future__ import annotations

import json
import sys

import anyio
import psutil
from mcp import Client
from mcp.client.stdio import StdioServerParameters


def say(**event: object) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def main(mode: str, command: str, args: list[str]) -> None:
    params = StdioServerParameters(command=command, args=args)
    async with Client(params, mode=mode) as client:
        tools = await client.list_tools()
        [server] = psutil.Process().children()
        say(ready=True, server_pid=server.pid, tools=[tool.name for tool in tools.tools])

        async def call(order: dict[str, object]) -> None:
            number = order["id"]

            async def progress(value: float, total: float | None, message: str | None) -> None:
                say(id=number, progress=message, value=value)

            result = await client.call_tool(
                str(order["tool"]), dict(order.get("arguments") or {}), progress_callback=progress
            )
            say(id=number, is_error=result.is_error, text=result.content[0].text)

        async with anyio.create_task_group() as group:
            async for line in anyio.wrap_file(sys.stdin):
                if line.strip():
                    group.start_soon(call, json.loads(line))
            group.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3:])
