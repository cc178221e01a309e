"""``docs/_examples/fastapi_app.py`` served by a real uvicorn and driven over real HTTP.

Several sessions chat at once while one of their children spins the CPU; ``/health`` must stay
responsive meanwhile, p99 under 50 ms (a responsiveness guarantee of the embedding, not a speed
benchmark), and SIGTERM to the server must end every process of its tree (the pool's launcher,
the spare workers and the spinning child included). The server runs on the test's own kind of
loop (asyncio or uvloop), so both are covered.

A bound on latency can only be checked where the machine gives a ready process its CPU. So a
bare uvicorn app with nothing but ``/health`` is probed in the same window, request for request:
if even its p99 takes half the bound, other load on the machine decides the figures (on this
shared 2-core machine, parallel test runs of other work do that) and the latency check is
skipped with both numbers; the SIGTERM checks run regardless. Otherwise the bound must hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import uvloop

from support.liveness import alive

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "_examples"
HANG_GUARD = 60.0
#: /health stays responsive while a child spins: p99 under 50 ms.
HEALTH_P99_BOUND = 0.050
HEALTH_SAMPLES = 500
HEALTH_INTERVAL = 0.005  # between probes: a client polling, not a load test
SESSION_PAUSE = 0.5  # a user reading the answer before the next message
SPIN = 10**12  # counting the primes below it takes days: the child spins until it is killed

pytestmark = pytest.mark.slow


def _primes_below(limit: int) -> dict[int, int]:
    """How many primes lie below each bound up to ``limit`` (a sieve, to check the reports)."""
    sieve = bytearray([1]) * limit
    sieve[:2] = b"\x00\x00"
    for n in range(2, int(limit**0.5) + 1):
        if sieve[n]:
            sieve[n * n :: n] = bytes(len(range(n * n, limit, n)))
    counts, seen = {}, 0
    for n in range(limit):
        counts[n] = seen
        seen += sieve[n]
    return counts


PRIMES_BELOW = _primes_below(100_000)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


#: The reference: an ASGI app that only answers /health, under the same uvicorn.
BARE_APP = """
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"status":"ok"}'})
"""


class Server:
    """``python -m uvicorn MODULE:app`` in a subprocess, with its log read as it comes."""

    def __init__(self, process: asyncio.subprocess.Process, port: int) -> None:
        self.process = process
        self.url = f"http://127.0.0.1:{port}"
        self.log: list[str] = []
        self.ready = asyncio.Event()
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.log.append(line)
            if "Uvicorn running on" in line:
                self.ready.set()

    def tree(self) -> list[psutil.Process]:
        root = psutil.Process(self.process.pid)
        return [root, *root.children(recursive=True)]


@contextlib.asynccontextmanager
async def serve(app: str = "fastapi_app:app", app_dir: Path = EXAMPLES) -> AsyncIterator[Server]:
    loop = "uvloop" if isinstance(asyncio.get_running_loop(), uvloop.Loop) else "asyncio"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "uvicorn",
        app,
        "--app-dir",
        str(app_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--loop",
        loop,
        "--timeout-graceful-shutdown",
        "5",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    server = Server(process, port)
    try:
        async with asyncio.timeout(HANG_GUARD):
            await asyncio.wait(
                [asyncio.ensure_future(server.ready.wait()), server.reader],
                return_when=asyncio.FIRST_COMPLETED,
            )
        assert server.ready.is_set(), "\n".join(server.log)
        yield server
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
        await server.reader


async def chat(client: httpx.AsyncClient, session: str, below: int) -> str:
    reply = await client.post(
        f"/sessions/{session}/chat", json={"text": f"count the primes below {below}"}
    )
    assert reply.status_code == 200, reply.text
    answer: str = reply.json()["answer"]
    return answer.split()[1]  # "Started task-1 in the background."


async def read(client: httpx.AsyncClient, session: str, task_id: str, wait: float = 0) -> Any:
    reply = await client.get(f"/sessions/{session}/tasks/{task_id}", params={"wait": wait})
    assert reply.status_code == 200, reply.text
    return reply.json()


async def until_running(client: httpx.AsyncClient, session: str, task_id: str) -> Any:
    """Poll the task's status until its child runs (bounded by the caller's timeout)."""
    while True:
        info = await read(client, session, task_id)
        if info["status"] == "running" and info["pid"]:
            return info
        assert info["status"] == "pending", info
        await asyncio.sleep(0.02)


async def wait_gone(pidfds: dict[int, int]) -> None:
    """Wait until every process behind ``pidfds`` has exited (a pidfd polls readable then)."""
    loop = asyncio.get_running_loop()
    waiters = []

    def exited(fd: int, gone: asyncio.Future[None]) -> None:
        loop.remove_reader(fd)
        if not gone.done():
            gone.set_result(None)

    for fd in pidfds.values():
        gone: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, exited, fd, gone)
        waiters.append(gone)
    try:
        await asyncio.gather(*waiters)
    finally:
        for fd in pidfds.values():
            loop.remove_reader(fd)


def p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[-(-len(ordered) * 99 // 100) - 1]


def describe(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    return (
        f"p50 {ordered[len(ordered) // 2] * 1000:.2f} ms, p99 {p99(ordered) * 1000:.2f} ms, "
        f"max {ordered[-1] * 1000:.2f} ms"
    )


async def test_health_stays_fast_while_a_child_spins_and_sigterm_leaves_no_process(
    tmp_path: Path,
) -> None:
    (tmp_path / "bare_app.py").write_text(BARE_APP)
    async with (
        serve() as server,
        serve("bare_app:app", tmp_path) as bare,
        httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=HANG_GUARD) as client,
        httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=HANG_GUARD) as probe,
        httpx.AsyncClient(base_url=bare.url, trust_env=False, timeout=HANG_GUARD) as reference,
    ):
        async with asyncio.timeout(HANG_GUARD):
            # One session's child spins the CPU; it keeps spinning through the whole test.
            spinner_id = await chat(client, "alice", SPIN)
            spinner = await until_running(client, "alice", spinner_id)

            latencies: list[float] = []
            baseline: list[float] = []
            measured = asyncio.Event()

            async def timed(http: httpx.AsyncClient, into: list[float]) -> None:
                begin = time.perf_counter()
                reply = await http.get("/health")
                into.append(time.perf_counter() - begin)
                assert reply.json() == {"status": "ok"}

            async def sample_health() -> None:
                while len(latencies) < HEALTH_SAMPLES:
                    await timed(probe, latencies)
                    await timed(reference, baseline)
                    await asyncio.sleep(HEALTH_INTERVAL)
                measured.set()

            async def session(name: str) -> list[Any]:
                """Chat, long-poll the report, pause, again, until the measurement is over."""
                reports = []
                while not measured.is_set():
                    below = 2000 + 100 * len(reports)
                    task_id = await chat(client, name, below)
                    reports.append((below, await read(client, name, task_id, wait=30)))
                    await asyncio.sleep(SESSION_PAUSE)
                return reports

            sampler = asyncio.ensure_future(sample_health())
            try:
                sessions = await asyncio.gather(*(session(f"user{i}") for i in range(3)))
            finally:
                measured.set()
                await sampler
            still = await read(client, "alice", spinner_id)

        for reports in sessions:
            assert reports
            for below, report in reports:
                assert report["status"] == "completed", report
                assert report["content"] == f"There are {PRIMES_BELOW[below]} primes below {below}."
        assert still["status"] == "running" and still["cpu_seconds"] > 0
        print(
            f"/health over {len(latencies)} requests while a child spun and "
            f"{sum(map(len, sessions))} other children ran: {describe(latencies)}; a bare "
            f"uvicorn app meanwhile: {describe(baseline)}"
        )

        # SIGTERM: uvicorn drains, the lifespan closes the extension, every process ends.
        tree = server.tree()
        assert spinner["pid"] in {p.pid for p in tree}
        assert len(tree) >= 3  # the server, the pool's launcher, the spinning worker
        pidfds: dict[int, int] = {}
        try:
            for proc in tree:
                with contextlib.suppress(ProcessLookupError):
                    pidfds[proc.pid] = os.pidfd_open(proc.pid)
            server.process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(HANG_GUARD):
                await wait_gone(pidfds)
                await server.process.wait()
                await server.reader
        finally:
            for fd in pidfds.values():
                os.close(fd)
        # uvicorn re-raises the signal it caught once it has shut down cleanly.
        assert server.process.returncode in (0, -signal.SIGTERM), "\n".join(server.log)
        assert any("Application shutdown complete" in line for line in server.log), server.log
        alive = [pid for pid in pidfds if psutil.pid_exists(pid) and alive(pid)]
        assert not alive, f"processes of the server's tree outlived SIGTERM: {alive}"

    if p99(baseline) >= HEALTH_P99_BOUND / 2:
        pytest.skip(
            f"the machine is too loaded to check a latency bound: a bare uvicorn app's /health "
            f"p99 was {p99(baseline) * 1000:.1f} ms in the same window (this server's "
            f"{p99(latencies) * 1000:.1f} ms)"
        )
    assert p99(latencies) < HEALTH_P99_BOUND, (
        f"/health p99 {p99(latencies) * 1000:.1f} ms over {len(latencies)} requests while a "
        f"child spun ({describe(latencies)}; a bare uvicorn app: {describe(baseline)})"
    )
