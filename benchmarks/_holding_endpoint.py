"""The holding endpoint of ``bench_subagents`` (5), in a process of its own, as a provider is.

    python benchmarks/_holding_endpoint.py

An OpenAI-compatible endpoint on loopback that reads each request (headers and body) and then
holds its response open until the client goes away, so a child that reached it stays "running"
(waiting on its model, as real children mostly are). Prints its port, then one line per request
that arrived: the ``perf_counter`` of its arrival (on Linux the same clock in every process).
Ends once its stdin closes. Imports nothing but the standard library: it starts at once and
takes no CPU of the benchmark's own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

from _serving import announce, until_stdin_closes


async def serve() -> None:
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        with contextlib.suppress(Exception):
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            sys.stdout.write(f"{time.perf_counter()!r}\n")
            sys.stdout.flush()
            await reader.read()  # hold until the client goes away

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
    announce(server)
    await until_stdin_closes()
    server.close()
    for writer in writers:
        writer.close()
    await server.wait_closed()


if __name__ == "__main__":
    asyncio.run(serve())
