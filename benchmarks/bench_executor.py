"""The engine as a ``concurrent.futures.Executor`` against the standard library's
``ProcessPoolExecutor``, loky and pebble, through ``loop.run_in_executor``, side by side in one run.

    uv run --group bench python benchmarks/bench_executor.py [--quick]

Rows: one no-op at a time (latency p50/p99), many at once (throughput), and what a crash does
to the executor (the stdlib's breaks; ours goes on). Then reused workers in the executor's two
modes, in alternating rounds (same load): pickled results (the default, the standard library's
semantics) against the strict JSON wire; the pickled mode must keep at least 90% of the JSON
mode's throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as cf
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _bench_jobs import noop

from zett_agent.process import ProcessPool, ProcessPoolExecutor

WORKERS = 2
#: jobs a reused worker runs (the pool's default is a fresh worker per job)
REUSE = 1_000_000


def crash() -> None:
    os._exit(3)


class PebbleExecutor(cf.Executor):
    """pebble's ``ProcessPool`` behind ``submit``, for ``run_in_executor``."""

    def __init__(self, workers: int) -> None:
        import pebble

        self._pool = pebble.ProcessPool(max_workers=workers)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        return self._pool.schedule(fn, args=args, kwargs=kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.close()
        if wait:
            self._pool.join()


def loky_executor() -> cf.Executor:
    import loky

    return loky.ProcessPoolExecutor(WORKERS)


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
    throughput = await rate(executor, count)
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


async def rate(executor: cf.Executor, count: int) -> float:
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    await asyncio.gather(*(loop.run_in_executor(executor, noop) for _ in range(count)))
    return count / (time.perf_counter() - started)


async def zett_pool(n: int, count: int, results: str = "pickle") -> dict[str, Any]:
    async with ProcessPool(WORKERS, max_jobs_per_worker=REUSE) as pool:
        return await rows(pool.executor(results=results), n, count)


async def zett_fresh(n: int, count: int) -> dict[str, Any]:
    async with ProcessPool(WORKERS) as pool:
        return await rows(pool.executor(), n, count)


def run(make: Callable[[], cf.Executor], n: int, count: int) -> dict[str, Any]:
    with make() as executor:
        return asyncio.run(rows(executor, n, count))


async def modes(rounds: int, count: int) -> tuple[list[float], list[float]]:
    """Reused workers, pickled against JSON results, in alternating rounds on one pool."""
    pickled: list[float] = []
    strict: list[float] = []
    async with ProcessPool(WORKERS, max_jobs_per_worker=REUSE) as pool:
        executors = {"pickle": pool.executor(), "json": pool.executor(results="json")}
        for executor in executors.values():
            await rate(executor, count)  # warm both paths
        for round_ in range(rounds):
            # each mode first in every other round: neither always runs on a warmer machine
            order = ("pickle", "json") if round_ % 2 == 0 else ("json", "pickle")
            for mode in order:
                (pickled if mode == "pickle" else strict).append(await rate(executors[mode], count))
    return pickled, strict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    n, count, rounds = (200, 500, 6) if args.quick else (1000, 2000, 12)
    results = {
        "stdlib ProcessPoolExecutor": run(lambda: cf.ProcessPoolExecutor(WORKERS), n, count),
        "loky ProcessPoolExecutor": run(loky_executor, n, count),
        "pebble ProcessPool": run(lambda: PebbleExecutor(WORKERS), n, count),
        "zett pool.executor() (reused)": asyncio.run(zett_pool(n, count)),
        "zett pool.executor() json (reused)": asyncio.run(zett_pool(n, count, "json")),
        "zett pool.executor() (fresh)": asyncio.run(zett_fresh(n, count)),
        "zett ProcessPoolExecutor": run(lambda: ProcessPoolExecutor(WORKERS), n, count),
    }
    stdlib = results["stdlib ProcessPoolExecutor"]
    print(
        f"run_in_executor of a no-op, {WORKERS} workers, {os.cpu_count()} CPUs "
        f"(load {os.getloadavg()[0]:.1f})"
    )
    print(f"{'':36} {'p50 ms':>8} {'p99 ms':>8} {'jobs/s':>9} {'ratio':>6}  after a crash")
    for name, row in results.items():
        ratio = row["throughput"] / stdlib["throughput"]
        print(
            f"{name:36} {row['p50']:8.3f} {row['p99']:8.3f} {row['throughput']:9.0f} "
            f"{ratio:6.2f}  {row['crash']}, then {row['after']}"
        )
    pickled, strict = asyncio.run(modes(rounds, max(count, 2000)))
    share = statistics.median(p / s for p, s in zip(pickled, strict, strict=True))
    print(
        f"\nreused workers, {rounds} alternating rounds of {count} no-ops on one pool: "
        f"pickled {statistics.median(pickled):.0f} jobs/s, json {statistics.median(strict):.0f} "
        f"jobs/s; pickled/json {share:.2f} (target >= 0.90: "
        f"{'met' if share >= 0.9 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
