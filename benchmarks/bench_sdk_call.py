"""The parent's CPU for one streamed model call on the SDK, in one process, nothing else around.

    uv run python benchmarks/bench_sdk_call.py [--calls N] [--at-once C] [--runs R]

``OpenAIChatModel.stream()`` consumed to its end, ``N`` times, at most ``C`` at once, against
``bench_broker``'s endpoint in a process of its own (each answer a short tool call, its
connection closed after it, as a provider's may be). Prints this process's CPU time per call
and the wall time per call, for each of ``R`` runs. This is what a brokering parent spends on
the SDK's side of each call of its children (see docs/performance.md, "The parent's share of
one call").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from zett_agent.messages import UserMessage
from zett_agent.model import ModelRequest
from zett_agent.models.openai import OpenAIChatModel

HANG_GUARD = 60.0


async def measure(calls: int, at_once: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per call of ``calls`` calls, ``at_once`` at a time."""
    endpoint = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import sys, asyncio, bench_broker; asyncio.run(bench_broker.Endpoint(10**9).serve())",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        cwd=sys.path[0],
    )
    assert endpoint.stdin is not None and endpoint.stdout is not None
    try:
        port = int(await asyncio.wait_for(endpoint.stdout.readline(), HANG_GUARD))
        model = OpenAIChatModel(
            "bench", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", timeout=HANG_GUARD
        )
        request = ModelRequest(messages=(UserMessage(content="hello"),), tools=())
        gate = asyncio.Semaphore(at_once)

        async def one() -> None:
            async with gate:
                async for _ in model.stream(request):
                    pass

        for _ in range(50):  # the client, its TLS context and the code paths are warm
            await one()
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(one() for _ in range(calls))), HANG_GUARD)
        return (time.process_time() - cpu) / calls, (time.perf_counter() - wall) / calls
    finally:
        endpoint.stdin.close()
        await endpoint.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per run (default 1000)")
    parser.add_argument("--at-once", type=int, default=16, help="calls at once (default 16)")
    parser.add_argument("--runs", type=int, default=3, help="runs (default 3)")
    args = parser.parse_args()
    print(f"{args.calls} streamed calls, {args.at_once} at once, {args.runs} runs")
    cpus = []
    for run in range(args.runs):
        cpu, wall = asyncio.run(measure(args.calls, args.at_once))
        cpus.append(cpu)
        print(f"  run {run + 1}: parent CPU per call {cpu * 1e3:.3f} ms, wall {wall * 1e3:.3f} ms")
    print(f"median parent CPU per call: {statistics.median(cpus) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
