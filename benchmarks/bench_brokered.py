"""Brokered children on the real adapter, the figures of issue 30 side by side in one run.

    uv run python benchmarks/bench_brokered.py [--children N] [--streamers M] [--deltas D]
                                               [--calls C] [--rounds R] [--repeats K]
                                               [--nice 0,10]

Four measurements, each against an OpenAI-compatible endpoint on loopback, with
``OpenAIChatModel`` (the official SDK) as every child's model:

1. unique memory (USS) of a running child, brokered (the default ``ProcessRunner()``) and calling
   the endpoint itself (``broker=False``): ``N`` children wait on an endpoint that holds every
   request open (``bench_subagents.measure_running``, median of ``K`` repeats);
2. the time until those ``N`` children are all running (the endpoint has all ``N`` requests);
3. the time to first token of one call, brokered minus direct, at p50 (``bench_broker.measure``:
   ``C`` calls per child, ``R`` children per kind, timed inside the child around ``stream()``);
4. ``M`` brokered children streaming at once through one parent: the endpoint (a process of its
   own) holds every request until all ``M`` have arrived, then streams ``D`` numbered text deltas
   to each. Each child (its model wrapped by ``_counting_child``, a module light to import)
   checks it got every delta, in order; a 1 ms ticker on the parent's event
   loop measures how late it wakes while they stream (the parent's loop stall, p99 and max).
   Once per niceness of ``--nice``: at 0 the pool's session shares the CPU with the parent's
   as an equal, at 10 (``ProcessRunner``'s default) it yields to it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from asyncio.subprocess import PIPE
from typing import Any

import bench_broker
import bench_subagents
from _counting_child import Counting
from _serving import announce, until_stdin_closes

from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.models.openai import OpenAIChatModel
from zett_agent.runners import DEFAULT_NICE, ChildSpec, ProcessRunner

HANG_GUARD = 600.0
TICK = 0.001


def expected(deltas: int) -> str:
    return "".join(f"{i}," for i in range(deltas))


class FanOutEndpoint:
    """Holds each request until ``children`` arrived, then streams ``deltas`` text deltas to each.

    Runs in a process of its own (``--serve``): prints its port, then ``go`` when it releases
    the streams, then the number of requests it served once its stdin closes.
    """

    def __init__(self, children: int, deltas: int) -> None:
        self.children = children
        self.deltas = deltas
        self.arrived = 0
        self.served = 0
        self.release = asyncio.Event()

    async def serve(self) -> None:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=4096)
        announce(server)
        await until_stdin_closes()
        server.close()
        print(self.served, flush=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
        await reader.readexactly(length)
        self.arrived += 1
        if self.arrived == self.children:
            print("go", flush=True)
            self.release.set()
        await self.release.wait()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        )
        for i in range(self.deltas):
            delta = {"role": "assistant", "content": f"{i},"} if i == 0 else {"content": f"{i},"}
            chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            writer.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await writer.drain()
            await asyncio.sleep(0)  # each delta its own write, interleaved across the children
        end = [
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": self.deltas}},
        ]
        writer.write(b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in end))
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()
        writer.close()
        self.served += 1


async def fan_out(children: int, deltas: int, nice: int = 0) -> dict[str, Any]:
    """``children`` brokered children at ``nice`` stream ``deltas`` deltas each through this
    parent."""
    endpoint = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--serve",
        str(children),
        str(deltas),
        stdin=PIPE,
        stdout=PIPE,
    )
    assert endpoint.stdin is not None and endpoint.stdout is not None
    port = int(await endpoint.stdout.readline())
    model = OpenAIChatModel("bench", base_url=f"http://127.0.0.1:{port}/v1", timeout=HANG_GUARD)
    definition = SubAgentDefinition("streamer", "streams", "You stream.", model=model)
    stamps: list[tuple[float, float]] = []  # (when the tick ended, how late it was)
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            begin = time.perf_counter()
            await asyncio.sleep(TICK)
            end = time.perf_counter()
            stamps.append((end, end - begin - TICK))

    async def collect(job: Any) -> dict[str, Any]:
        reports = [e async for e in job.events() if e.get("kind") == "deltas"]
        await job.wait()
        if job.exception() is not None:
            raise RuntimeError(f"a child failed: {job.exception()}")
        [report] = reports
        return dict(report)

    async with ProcessRunner(max_children=children, nice=nice) as runner:
        began = time.perf_counter()
        tick = asyncio.ensure_future(ticker())
        jobs = [
            await runner.submit(ChildSpec(definition, model, f"bench/{i}", "go", Counting))
            for i in range(children)
        ]
        submitted = time.perf_counter()
        go_line = await asyncio.wait_for(endpoint.stdout.readline(), HANG_GUARD)
        go = time.perf_counter()
        assert go_line.strip() == b"go", go_line
        reports = await asyncio.wait_for(asyncio.gather(*map(collect, jobs)), HANG_GUARD)
        done = time.perf_counter()
        stop.set()
        await tick
    endpoint.stdin.close()
    served = int(await endpoint.stdout.readline())
    await endpoint.wait()
    want = expected(deltas)
    lost = sum(1 for r in reports if r["count"] != deltas or r["text"] != want)
    window = [late for end, late in stamps if go <= end <= done]
    return {
        "children": children,
        "nice": nice,
        "deltas": deltas,
        "served": served,
        "wrong": lost,
        "submit_s": submitted - began,
        "all_running_s": go - began,
        "stream_s": done - go,
        "stall_p99_ms": 1e3 * bench_subagents.pct(window, 0.99),
        "stall_max_ms": 1e3 * max(window),
        "ticks": len(window),
    }


async def main(arguments: argparse.Namespace) -> None:
    print(f"command: uv run python benchmarks/bench_brokered.py {' '.join(sys.argv[1:])}")
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    running = await bench_subagents.measure_running(
        arguments.children, arguments.repeats, ("process", "process, direct")
    )
    calls = await bench_broker.measure(arguments.calls, arguments.rounds)
    fanned = [
        await fan_out(arguments.streamers, arguments.deltas, int(nice))
        for nice in arguments.nice.split(",")
    ]
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    p50 = {name: 1e3 * bench_subagents.pct(calls[name]["first"], 0.5) for name in calls}
    rows = [
        (
            "running child's unique memory (USS), median",
            f"{statistics.median(running['process']['uss']):.2f} MiB",
            f"{statistics.median(running['process, direct']['uss']):.2f} MiB",
            "<= 4.0 MiB",
        ),
        (
            f"{arguments.children} children all running, median",
            f"{statistics.median(running['process']['time']):.3f} s",
            f"{statistics.median(running['process, direct']['time']):.3f} s",
            "<= 0.5 s (100)",
        ),
        (
            "time to first token, p50",
            f"{p50['brokered']:.3f} ms",
            f"{p50['direct']:.3f} ms",
            "",
        ),
        (
            "  brokered minus direct",
            f"{p50['brokered'] - p50['direct']:+.3f} ms",
            "",
            "<= 1 ms",
        ),
        (
            "parent CPU per call",
            f"{calls['brokered']['cpu_ms']:.3f} ms",
            f"{calls['direct']['cpu_ms']:.3f} ms",
            "",
        ),
    ]
    for streamed in fanned:
        rows += [
            (
                f"{streamed['children']} streaming at nice {streamed['nice']}"
                f"{' (default)' if streamed['nice'] == DEFAULT_NICE else ''}: stall p99",
                f"{streamed['stall_p99_ms']:.2f} ms",
                "",
                "<= 5 ms (1,000)",
            ),
            ("  loop stall max", f"{streamed['stall_max_ms']:.2f} ms", "", ""),
            (
                "  events lost or out of order",
                f"{streamed['wrong']} of {streamed['children']} children",
                "",
                "none",
            ),
        ]
    print()
    print(f"| {'measurement':<46} | {'brokered':>18} | {'direct':>10} | {'target':>15} |")
    print(f"|{'-' * 48}|{'-' * 19}:|{'-' * 11}:|{'-' * 16}:|")
    for name, ours, direct, target in rows:
        print(f"| {name:<46} | {ours:>18} | {direct:>10} | {target:>15} |")
    print()
    for streamed in fanned:
        print(
            f"streaming at nice {streamed['nice']}: {streamed['children']} children x "
            f"{streamed['deltas']} deltas, all "
            f"submitted in {streamed['submit_s']:.2f} s, all running (the endpoint had every "
            f"request) after {streamed['all_running_s']:.2f} s, streamed in "
            f"{streamed['stream_s']:.2f} s ({streamed['ticks']} ticks measured); the endpoint "
            f"served {streamed['served']}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=100, help="children for (1) and (2)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of (1) and (2)")
    parser.add_argument("--calls", type=int, default=40, help="model calls per child in (3)")
    parser.add_argument("--rounds", type=int, default=5, help="children per kind in (3)")
    parser.add_argument("--streamers", type=int, default=1000, help="children in (4)")
    parser.add_argument("--deltas", type=int, default=20, help="text deltas per child in (4)")
    parser.add_argument(
        "--nice", default="0,10", help="the children's niceness in (4), one run each"
    )
    parser.add_argument("--serve", type=int, nargs=2, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.serve is not None:
        asyncio.run(FanOutEndpoint(*arguments.serve).serve())
    else:
        asyncio.run(main(arguments))
