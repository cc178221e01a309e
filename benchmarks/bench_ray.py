"""RayRunner next to the process engine, in one run, at the runner level (function jobs).

    uv run --extra ray python benchmarks/bench_ray.py [--quick]

Starts a local single-node Ray (2 CPUs, 127.0.0.1, no dashboard) through ``RayRunner`` and a
``ProcessPool`` of 2 workers, then measures for each:

1. submit -> child running: from ``submit`` until the child's first line runs (the child sends
   its ``time.monotonic()``, one clock for the machine). p50/p99 over N sequential jobs. Ray
   twice: a fresh worker per child (the default, ``max_calls=1``) and reused workers.
2. cancel -> gone: a child spinning in pure Python is cancelled; from the call until it returns
   (the worker's pid is checked dead right then). p50/p99.
3. Parallel speedup: 2 CPU-bound children (~1 s of SHA-256 each, calibrated here) at once,
   against the same work run sequentially in this process.
4. Parent loop stall during (3): how late a 5 ms ticker wakes up, p50/p99/max.

This is the runner interface the subagent extensions use; the extension-level benchmark
(``bench_subagents.py --ray``) follows once the runner is selectable there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).parent
# Ray workers import the job functions by name; a local Ray started here inherits this.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
# Under `uv run`, Ray would ship this checkout to its workers; they already run in this venv.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import _bench_ray_jobs as jobs  # noqa: E402

from zett_agent.process import ProcessPool  # noqa: E402
from zett_agent.runners.ray import RayRunner  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


Submit = Callable[..., Awaitable[Any]]


async def start_latency(submit: Submit, name: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.monotonic()
        job = await submit(jobs.stamp, name)
        event = await anext(job.events())
        out.append(event["running"] - t0)
        await job.wait()
    return out


async def cancel_latency(submit: Submit, name: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        job = await submit(jobs.spin, name)
        pid = (await anext(job.events()))["pid"]
        t0 = time.monotonic()
        await job.cancel()
        out.append(time.monotonic() - t0)
        assert dead(pid), f"pid {pid} alive after cancel"
    return out


async def parallel(submit: Submit, rounds: int) -> tuple[float, list[float]]:
    lateness: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            t = time.monotonic()
            await asyncio.sleep(0.005)
            lateness.append(time.monotonic() - t - 0.005)

    tick = asyncio.get_running_loop().create_task(ticker())
    t0 = time.monotonic()
    started = [await submit(jobs.hash_rounds, rounds) for _ in range(2)]
    for job in started:
        await job.wait()
        job.result()
    wall = time.monotonic() - t0
    stop.set()
    await tick
    return wall, lateness


def calibrate() -> int:
    rounds = 200_000
    t0 = time.monotonic()
    jobs.hash_rounds(rounds)
    return int(rounds / (time.monotonic() - t0))


async def main(quick: bool) -> None:
    n_start, n_cancel = (10, 5) if quick else (40, 20)
    rounds = calibrate()  # about 1 s of work
    t0 = time.monotonic()
    jobs.hash_rounds(rounds)
    jobs.hash_rounds(rounds)
    sequential = time.monotonic() - t0
    rows: dict[str, dict[str, str]] = {}

    pool = ProcessPool(max_workers=2, spare_workers=2)
    await pool.start()

    async def psubmit(fn: Any, *args: Any) -> Any:
        return pool.submit(fn, *args)

    try:
        s = await start_latency(psubmit, "process", n_start)
        c = await cancel_latency(psubmit, "process", n_cancel)
        wall, late = await parallel(psubmit, rounds)
    finally:
        await pool.close()
    rows["process"] = summary(s, c, wall, sequential, late)

    booted = time.monotonic()
    ray_kwargs = {"num_cpus": 2, "include_dashboard": False, "object_store_memory": 100 * 2**20}
    fresh = RayRunner(init_kwargs=ray_kwargs)
    fresh.connect()
    boot = time.monotonic() - booted
    reused = RayRunner(fresh_workers=False)
    try:
        s_reused = await start_latency(reused.submit_function, "ray", n_start)
        s = await start_latency(fresh.submit_function, "ray", n_start)
        c = await cancel_latency(fresh.submit_function, "ray", n_cancel)
        wall, late = await parallel(fresh.submit_function, rounds)
    finally:
        await reused.close()
        await fresh.close()
    rows["ray"] = summary(s, c, wall, sequential, late)
    rows["ray (reused workers)"] = {
        "start p50": ms(statistics.median(s_reused)),
        "start p99": ms(pct(s_reused, 0.99)),
    }

    print(
        f"RayRunner vs process engine, {os.cpu_count()} CPUs, n={n_start} starts, "
        f"n={n_cancel} cancels; local Ray booted in {boot:.1f} s"
    )
    keys = [
        "start p50",
        "start p99",
        "cancel p50",
        "cancel p99",
        "2 x 1 s wall",
        "speedup",
        "stall p50",
        "stall p99",
        "stall max",
    ]
    print(f"{'':24}" + "".join(f"{k:>13}" for k in keys))
    for name, row in rows.items():
        print(f"{name:24}" + "".join(f"{row.get(k, ''):>13}" for k in keys))
    print(f"sequential reference: {sequential:.3f} s")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def summary(
    s: list[float], c: list[float], wall: float, sequential: float, late: list[float]
) -> dict[str, str]:
    return {
        "start p50": ms(statistics.median(s)),
        "start p99": ms(pct(s, 0.99)),
        "cancel p50": ms(statistics.median(c)),
        "cancel p99": ms(pct(c, 0.99)),
        "2 x 1 s wall": f"{wall:.2f} s",
        "speedup": f"{sequential / wall:.2f} x",
        "stall p50": ms(statistics.median(late)),
        "stall p99": ms(pct(late, 0.99)),
        "stall max": ms(max(late)),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    asyncio.run(main(parser.parse_args().quick))
    sys.exit(0)
