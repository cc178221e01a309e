"""The model adapter's HTTP client: a long streamed answer, and hostile servers flooding it.

    uv run python benchmarks/bench_model_http.py [--quick] [--only NAME[,NAME...]]

Each scenario runs in a fresh interpreter (so its peak RSS is its own) whose server is a forked
process on loopback (so the client's event loop runs nothing but the client). Columns:

- ``time``: the wall time of one ``OpenAIChatModel.stream()`` consumed to its end (or to its
  error), the median of the runs for the common-path rows;
- ``cpu``: the client process's CPU time for it (the same statistic; steadier than ``time`` on a
  shared machine);
- ``max cb``: the longest single callback of the client's event loop (``asyncio.Handle._run``
  timed in CPU time of the thread, so time the machine gave other programs does not count;
  default asyncio loop), the worst of the runs;
- ``rss``: how much the client's peak RSS grew during the scenario;
- ``outcome``: the events it yielded or the error it raised; ``still running`` when the stream
  had not ended after ``--cap`` seconds (then it was cancelled).

The common-path rows (``long-*``) stream ``N`` text deltas of a few characters each, the whole
answer written by the server at once, so the client's CPU per byte is what is measured;
``long-paced`` streams ``N / 4`` of them one at a time, 0.2 ms apart, as a server generating
them would (its ``time`` is mostly the server's pace: compare ``cpu``). ``big-line`` is one
delta of 7 MiB of prose, near the largest line a stream may send.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

CHUNK = (
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m",'
    '"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]}'
)
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"


def sse_answer(n: int) -> bytes:
    events = [f"data: {CHUNK % f'tok{i % 10} '}\n\n" for i in range(n)]
    events.append('data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n')
    events.append("data: [DONE]\n\n")
    return "".join(events).encode()


def sse_big(size: int) -> bytes:
    """One event whose text is ``size`` characters of prose (the largest a line may be, near),
    then the end of the answer."""
    text = ("All work and no play, " * (size // 22 + 1))[:size]
    events = [
        f"data: {CHUNK % text}\n\n",
        'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
        "data: [DONE]\n\n",
    ]
    return "".join(events).encode()


def chunked(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def forever(first: bytes, piece: bytes) -> Callable[[], Iterator[bytes]]:
    """``first``, then ``piece`` repeated until the client goes away."""

    def gen() -> Iterator[bytes]:
        yield first
        block = piece * max(1, 65536 // len(piece))
        while True:
            yield block

    return gen


def paced(head: bytes, pieces: list[bytes], pause: float = 0.0002) -> Callable[[], Iterator[bytes]]:
    """``head``, then each piece on its own, ``pause`` seconds apart: what a server streaming
    as the model generates sends (the client reads about one event per read)."""

    def gen() -> Iterator[bytes]:
        yield head
        for piece in pieces:
            time.sleep(pause)
            yield piece

    return gen


def trickle(head: bytes, byte: bytes, pause: float) -> Callable[[], Iterator[bytes]]:
    def gen() -> Iterator[bytes]:
        yield head
        while True:
            time.sleep(pause)
            yield byte

    return gen


def scenarios(n: int) -> dict[str, Callable[[], Iterator[bytes]]]:
    answer = sse_answer(n)
    events = answer.split(b"\n\n")
    big_line = b"data: [" + b"[]," * (8 * 2**20 // 3 - 10) + b"0]\n\n"
    text = CHUNK % ("x" * 65000)
    return {
        "long-chunked": lambda: iter(
            [HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked([e + b"\n\n" for e in events])]
        ),
        "long-length": lambda: iter([HEAD + b"Content-Length: %d\r\n\r\n" % len(answer) + answer]),
        "long-paced": paced(
            HEAD + b"Transfer-Encoding: chunked\r\n\r\n",
            [b"%x\r\n%s\n\n\r\n" % (len(e) + 2, e) for e in [*events[: n // 4], *events[-3:-1]]]
            + [b"0\r\n\r\n"],
        ),
        "continue-flood": forever(b"", b"HTTP/1.1 100 Continue\r\n\r\n"),
        "head-trickle": trickle(b"HTTP/1.1 200 OK\r\n", b"X-Slow: 1\r\n", 0.05),
        "tiny-chunks": forever(HEAD + b"Transfer-Encoding: chunked\r\n\r\n", b"1\r\nx\r\n"),
        "chunk-extensions": forever(
            HEAD + b"Transfer-Encoding: chunked\r\n\r\n", b"1;" + b"e" * 3000 + b"\r\nx\r\n"
        ),
        "ping-flood": forever(HEAD + b"\r\n", b": ping\n"),
        "blank-lines": forever(HEAD + b"\r\ndata: {}\n", b"\n"),
        "tiny-events": forever(HEAD + b"\r\n", b"data: " + (CHUNK % "ab").encode() + b"\n\n"),
        "big-structure": lambda: iter([HEAD + b"\r\n", *[big_line] * 40]),
        "big-line": lambda: iter([HEAD + b"\r\n" + sse_big(7 * 2**20)]),
        "huge-answer": forever(HEAD + b"\r\n", b"data: " + text.encode() + b"\n\n"),
    }


COMMON = ("long-chunked", "long-length", "long-paced", "big-line")


def serve(listener: socket.socket, make: Callable[[], Iterator[bytes]], runs: int) -> None:
    for _ in range(runs):
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, rest = data.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            while len(rest) < length:
                rest += conn.recv(65536)
            try:
                for piece in make():
                    conn.sendall(piece)
            except OSError:
                pass  # the client went away
    os._exit(0)


def run_one(name: str, n: int, runs: int, cap: float) -> dict[str, Any]:
    from zett_agent.messages import UserMessage
    from zett_agent.model import ModelRequest
    from zett_agent.models.openai import OpenAIChatModel

    make = scenarios(n)[name]
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    pid = os.fork()
    if pid == 0:
        serve(listener, make, runs)
    listener.close()

    worst = 0.0
    original = asyncio.events.Handle._run

    def timed(self: asyncio.events.Handle) -> None:
        nonlocal worst
        start = time.thread_time()
        try:
            original(self)
        finally:
            worst = max(worst, time.thread_time() - start)

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]
    model = OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1", timeout=1.0)
    request = ModelRequest(messages=(UserMessage("hi"),))

    async def once() -> str:
        events = 0
        try:
            async with asyncio.timeout(cap):
                async for _ in model.stream(request):
                    events += 1
        except TimeoutError:
            return f"still running after {cap:g} s ({events} events)"
        except Exception as exc:
            return f"{type(exc).__name__}: {str(exc)[:150]}"
        return f"{events} events"

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times, cpu, outcome = [], [], ""
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        outcome = asyncio.run(once())
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    os.waitpid(pid, 0)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return {
        "name": name,
        "time": statistics.median(times),
        "cpu": statistics.median(cpu),
        "max_cb": worst,
        "rss_mib": grown / 1024,
        "outcome": outcome,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="")
    parser.add_argument("--cap", type=float, default=10.0)
    parser.add_argument("--scenario", help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=0)
    args = parser.parse_args()
    n = 5000 if args.quick else 20000
    if args.scenario:
        runs = args.runs or (1 if args.scenario not in COMMON else 5 if args.quick else 15)
        print(json.dumps(run_one(args.scenario, n, runs, args.cap)))
        return
    names = args.only.split(",") if args.only else list(scenarios(1))
    print(f"model HTTP client benchmark, {n} deltas per long answer, cap {args.cap:g} s")
    print(f"{'scenario':18} {'time':>9} {'cpu':>9} {'max cb':>9} {'rss':>9}  outcome")
    for name in names:
        out = subprocess.run(
            [sys.executable, __file__, "--scenario", name, "--cap", str(args.cap)]
            + (["--quick"] if args.quick else [])
            + ([f"--runs={args.runs}"] if args.runs else []),
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode:
            print(f"{name:18} failed: {out.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(out.stdout)
        print(
            f"{name:18} {r['time'] * 1000:7.1f}ms {r['cpu'] * 1000:7.1f}ms "
            f"{r['max_cb'] * 1000:7.1f}ms "
            f"{r['rss_mib']:6.1f}MiB  {r['outcome']}"
        )


if __name__ == "__main__":
    main()
