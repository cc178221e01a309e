"""What brokering adds to one model call of a child, next to the direct call, in one run.

    uv run python benchmarks/bench_broker.py [--calls N] [--rounds R]

A child agent on ``OpenAIChatModel`` makes ``N`` model calls (a tool call each, then a last
answer) against an OpenAI-compatible endpoint on loopback that answers at once. In the direct
runs the child calls the endpoint itself (``ProcessRunner(broker=False)``); in the brokered runs
(the default, ``ProcessRunner()``) it holds a keyless stand-in and the parent makes each call: the
request
goes over the child's channel to the parent, the parent sends it with the key, and the events
stream back through ``ProcessJob.send``. Each call is timed inside the child, around the
model's ``stream()`` (from the call to its first event, the time to first token, and to the
completed event), so the numbers are the model call alone, not the agent's turn. The two kinds
of run alternate, ``R`` rounds each.
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
from collections.abc import AsyncIterator
from typing import Any

from _serving import announce, until_stdin_closes

from zett_agent.agent import Agent
from zett_agent.extensions._subagent import ChildAgentExtension
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.model import Model, ModelEvent, ModelEventKind, ModelRequest, RetryOptions
from zett_agent.models.openai import OpenAIChatModel
from zett_agent.runners import ChildSpec, ProcessRunner
from zett_agent.tools import tool


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


class TimedModel:
    """Wraps the child's model; reports each call's seconds to the parent (in the child)."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner
        self.retry: RetryOptions = inner.retry

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        from zett_agent.process import emit

        started = time.perf_counter()
        first = None
        async for event in self.inner.stream(request):
            if first is None:
                first = time.perf_counter() - started
            if event.kind is ModelEventKind.COMPLETED:
                seconds = time.perf_counter() - started
                emit({"kind": "call_seconds", "seconds": seconds, "first": first})
            yield event


class Timed(ChildAgentExtension):
    """Builds the child around a ``TimedModel`` (``_create_child`` runs in the child)."""

    def _create_child(
        self, definition: SubAgentDefinition, *, model: Model, session_id: str
    ) -> Agent:
        return Agent(
            TimedModel(model),
            tools=definition.tools,
            system_prompt=definition.system_prompt,
        )


def _sse(message: dict[str, Any], finish: str) -> bytes:
    chunks = [
        {"choices": [{"index": 0, "delta": message, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
        {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2}},
    ]
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


class Endpoint:
    """Answers a tool call until the conversation has ``calls - 1`` tool results, then text.

    Runs in a process of its own (``--serve``), as a provider would: the parent's event loop
    then does only what brokering gives it, the client side of each request.
    """

    def __init__(self, calls: int) -> None:
        self.calls = calls
        self.keys: set[str] = set()

    async def serve(self) -> None:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        announce(server)
        await until_stdin_closes()
        server.close()
        await server.wait_closed()
        print(json.dumps(sorted(self.keys)), flush=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
        self.keys.add(head.split("authorization:", 1)[1].split("\r\n", 1)[0].strip())
        body = json.loads(await reader.readexactly(length))
        results = sum(1 for m in body["messages"] if m["role"] == "tool")
        if results < self.calls - 1:
            call = {"index": 0, "id": f"c{results}", "type": "function"}
            call["function"] = {"name": "noop", "arguments": "{}"}
            payload = _sse({"role": "assistant", "tool_calls": [call]}, "tool_calls")
        else:
            payload = _sse({"role": "assistant", "content": "done"}, "stop")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        await writer.drain()
        writer.close()


async def one_child(runner: ProcessRunner, model: Model, calls: int) -> list[tuple[float, float]]:
    """Run one timed child; each of its calls' (seconds to the first event, to the last)."""
    definition = SubAgentDefinition(
        "timed", "a timed child", "You call noop.", model=model, tools=[noop], max_turns=calls
    )
    job = await runner.submit(ChildSpec(definition, model, "bench/1", "go", Timed))
    seconds = [
        (e["first"], e["seconds"]) async for e in job.events() if e.get("kind") == "call_seconds"
    ]
    await job.wait()
    if job.exception() is not None:
        raise RuntimeError(f"the child failed: {job.exception()}")
    return seconds


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(calls: int, rounds: int) -> dict[str, Any]:
    """Per kind (``direct``, ``brokered``): each call's seconds (``calls``), its seconds to the
    first event (``first``), and the parent's CPU milliseconds per call (``cpu_ms``)."""
    key = "sk-bench-" + os.urandom(8).hex()
    results: dict[str, list[float]] = {"direct": [], "brokered": []}
    firsts: dict[str, list[float]] = {"direct": [], "brokered": []}
    #: CPU seconds this process (the parent) spent, and model calls made, per kind
    cpu = {"direct": 0.0, "brokered": 0.0}
    made = {"direct": 0, "brokered": 0}
    endpoint = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", str(calls), stdin=PIPE, stdout=PIPE
    )
    assert endpoint.stdin is not None and endpoint.stdout is not None
    port = int(await endpoint.stdout.readline())
    async with ProcessRunner(broker=False) as direct, ProcessRunner() as brokered:
        model = OpenAIChatModel("bench", base_url=f"http://127.0.0.1:{port}/v1", api_key=key)
        # warm both pools and code paths once, unmeasured
        await one_child(direct, model, calls)
        await one_child(brokered, model, calls)
        for _ in range(rounds):
            for name, runner in (("direct", direct), ("brokered", brokered)):
                # the first call of a child pays for its first imports: left out
                before = time.process_time()
                seconds = await one_child(runner, model, calls)
                cpu[name] += time.process_time() - before
                made[name] += len(seconds)
                results[name] += [total for _, total in seconds[1:]]
                firsts[name] += [first for first, _ in seconds[1:]]
    endpoint.stdin.close()
    keys = json.loads(await endpoint.stdout.readline())
    await endpoint.wait()
    assert keys == [f"bearer {key}"], keys  # the endpoint saw the key, from both kinds of run
    per_call = {name: 1000 * cpu[name] / made[name] for name in cpu}
    return {
        name: {"calls": results[name], "first": firsts[name], "cpu_ms": per_call[name]}
        for name in results
    }


async def main(calls: int, rounds: int) -> None:
    measured = await measure(calls, rounds)
    results = {name: measured[name]["calls"] for name in measured}
    direct_p50, broker_p50 = _ms(results["direct"], 0.5), _ms(results["brokered"], 0.5)
    print(
        f"one model call of a child ({calls} calls per child, {rounds} rounds, "
        f"{len(results['direct'])} calls measured per kind), {os.cpu_count()} CPUs"
    )
    print(f"{'':24}{'p50':>10}{'p90':>10}{'p99':>10}{'mean':>10}")
    for name, values in results.items():
        print(
            f"  {name:22}{_ms(values, 0.5):9.3f} {_ms(values, 0.9):9.3f} {_ms(values, 0.99):9.3f} "
            f"{1000 * statistics.fmean(values):9.3f}  ms"
        )
    print(
        f"  brokering adds        {broker_p50 - direct_p50:9.3f}  ms at p50 "
        f"({broker_p50 / direct_p50:.2f}x the direct call)"
    )
    first = {name: _ms(measured[name]["first"], 0.5) for name in measured}
    print(
        f"  time to first event   direct {first['direct']:.3f} ms, brokered "
        f"{first['brokered']:.3f} ms at p50 (+{first['brokered'] - first['direct']:.3f} ms)"
    )
    per_call = {name: measured[name]["cpu_ms"] for name in measured}
    print(
        f"  parent CPU per call   direct {per_call['direct']:.3f} ms (supervision), brokered "
        f"{per_call['brokered']:.3f} ms (+{per_call['brokered'] - per_call['direct']:.3f} ms)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40, help="model calls per child")
    parser.add_argument("--rounds", type=int, default=10, help="children per kind")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the endpoint's process
    arguments = parser.parse_args()
    if arguments.serve is not None:
        asyncio.run(Endpoint(arguments.serve).serve())
    else:
        asyncio.run(main(arguments.calls, arguments.rounds))
