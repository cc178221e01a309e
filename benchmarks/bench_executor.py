"""The engine as a ``concurrent.futures.Executor`` against the standard library's
``ProcessPoolExecutor``, through ``loop.run_in_executor``, side by side in one run.

    uv run python benchmarks/bench_executor.py [--quick]

Rows: one no-op at a time (latency p50/p99), many at once (throughput), and what a crash does
to the executor (the stdlib's breaks; ours goes on).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as cf
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _bench_jobs import noop

from zett_agent.process import ProcessPool, ProcessPoolExecutor

WORKERS = 2


def crash() -> None:
    os._exit(3)


async def rows(executor: cf.Executor, n: int, count: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    for _ in range(20):
        await loop.run_in_executor(executor, noop)
    latencies = []
    for _ in range(n):
        started = time.perf_counter()
        await loop.run_in_executor(executor, noop)
        latencies.append(time.perf_counter() - started)
    latencies.sort()
    started = time.perf_counter()
    await asyncio.gather(*(loop.run_in_executor(executor, noop) for _ in range(count)))
    throughput = count / (time.perf_counter() - started)
    try:
        await loop.run_in_executor(executor, crash)
    except Exception as exc:
        crashed = type(exc).__name__
    try:
        await loop.run_in_executor(executor, noop)
        after = "goes on"
    except Exception as exc:
        after = type(exc).__name__
    return {
        "p50": latencies[len(latencies) // 2] * 1e3,
        "p99": latencies[int(len(latencies) * 0.99)] * 1e3,
        "throughput": throughput,
        "crash": crashed,
        "after": after,
    }


async def zett_pool(n: int, count: int) -> dict[str, Any]:
    async with ProcessPool(WORKERS, max_jobs_per_worker=1_000_000) as pool:
        return await rows(pool.executor(), n, count)


async def zett_fresh(n: int, count: int) -> dict[str, Any]:
    async with ProcessPool(WORKERS) as pool:
        return await rows(pool.executor(), n, count)


def run(make: Callable[[], cf.Executor], n: int, count: int) -> dict[str, Any]:
    with make() as executor:
        return asyncio.run(rows(executor, n, count))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    n, count = (200, 500) if args.quick else (1000, 2000)
    results = {
        "stdlib ProcessPoolExecutor": run(lambda: cf.ProcessPoolExecutor(WORKERS), n, count),
        "zett pool.executor() (reused)": asyncio.run(zett_pool(n, count)),
        "zett pool.executor() (fresh)": asyncio.run(zett_fresh(n, count)),
        "zett ProcessPoolExecutor": run(
            lambda: ProcessPoolExecutor(WORKERS, max_jobs_per_worker=1_000_000), n, count
        ),
    }
    stdlib = results["stdlib ProcessPoolExecutor"]
    print(
        f"run_in_executor of a no-op, {WORKERS} workers, {os.cpu_count()} CPUs "
        f"(load {os.getloadavg()[0]:.1f})"
    )
    print(f"{'':32} {'p50 ms':>8} {'p99 ms':>8} {'jobs/s':>9} {'ratio':>6}  after a crash")
    for name, row in results.items():
        ratio = row["throughput"] / stdlib["throughput"]
        print(
            f"{name:32} {row['p50']:8.3f} {row['p99']:8.3f} {row['throughput']:9.0f} "
            f"{ratio:6.2f}  {row['crash']}, then {row['after']}"
        )


if __name__ == "__main__":
    main()
