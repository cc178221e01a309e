"""Call `zett-agent mcp --http` with the official SDK's client and the server's bearer token.

    python docs/_examples/mcp_http_client.py        # from the repository root

It starts the server on a free port of 127.0.0.1, reads the URL and the token it prints once,
connects, runs the line_counter child plainly (its progress arrives while it runs), then stops
the server with SIGTERM, which kills every child before the server exits.
"""

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

FOLDER = Path(__file__).resolve().parent  # the folder whose Python files the child counts
TARGET = "docs._examples.mcp_children:definitions"


async def progress(value: float, total: float | None, message: str | None) -> None:
    print(f"  progress: {message}")


async def main() -> None:
    command = [sys.executable, "-m", "zett_agent.cli", "mcp", TARGET, "--http", "127.0.0.1:0"]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        url = server.stderr.readline().split()[-1]  # zett-agent mcp: serving http://...
        token = server.stderr.readline().split()[-1]  # zett-agent mcp: bearer token (...): ...
        headers = {"Authorization": f"Bearer {token}"}
        timeout = httpx2.Timeout(30, read=300)  # a server may hold a response stream open
        async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                print(f"connected to {url}, protocol {client.protocol_version}")
                prompt = f"Count the lines of the Python files in {FOLDER}"
                result = await client.call_tool(
                    "line_counter", {"prompt": prompt}, progress_callback=progress
                )
                print(f"report: {result.content[0].text}")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait()


asyncio.run(main())
