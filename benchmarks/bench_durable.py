"""Durable tasks under fault injection, and what the journal costs per step, in one run.

    uv run python benchmarks/bench_durable.py [--child-kills N] [--host-kills N]
        [--cost-runs R] [--seed S]

A scripted 20-step task (each step a model call to a loopback model server in this process
and a tool call that appends a line to a file) runs durably (``store=``, ``durable=True``):

- children killed: tasks run in this process's extension, four at a time; each task's child is
  SIGKILLed 1 to 4 times, each at a random moment of its run, and resumed from the journal,
  until ``N`` children were killed;
- hosts killed: host processes run four tasks each and are SIGKILLed 1 to 3 times per round,
  each at a random moment; the next host on the same store resumes the tasks, until ``N``
  hosts were killed.

The model server counts, as each call arrives, against what the task store holds committed:
model calls for a step whose response was committed, tool runs for a step whose result was
committed (both must be 0), and tool calls run again that were started but not done (the
at-least-once the docs state). Every final report is compared with an uninterrupted run's.
Then ``R`` tasks durable and ``R`` with ``durable=False`` (the same store otherwise) alternate,
and the p50 of the time between two model calls of a task (one step) is compared. The harness
lives in ``tests/support/durable_faults.py``; the soak test ``tests/soak/test_durable_soak.py``
runs it too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from support.durable_faults import (  # noqa: E402 - after its folder is on the path
    STEPS,
    Counts,
    child_kills,
    host_kills,
    journal_cost,
)
from zett_agent.process import _linux  # noqa: E402


def _print(title: str, counts: Counts, seconds: float) -> None:
    print(f"\n{title} ({seconds:.0f} s)")
    for name, value in counts.table():
        print(f"  {name:<52} {value}")
    for line in counts.other_reports[:10]:
        print(f"  other report: {line}")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child-kills", type=int, default=500)
    parser.add_argument("--host-kills", type=int, default=500)
    parser.add_argument("--cost-runs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    print(f"seed {seed}, {STEPS} steps per task, {os.cpu_count()} cores")
    _linux.set_child_subreaper(True)  # a killed host's children are reaped here
    failed = False
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        if args.child_kills:
            began = time.monotonic()
            counts = await child_kills(directory, args.child_kills, seed=seed)
            _print("children killed", counts, time.monotonic() - began)
            failed |= not counts.clean()
        if args.host_kills:
            began = time.monotonic()
            counts = await host_kills(directory, args.host_kills, seed=seed + 1)
            _print("hosts killed", counts, time.monotonic() - began)
            failed |= not counts.clean()
        if args.cost_runs:
            durable, plain = await journal_cost(directory, args.cost_runs)
            print(f"\njournal cost ({args.cost_runs} tasks of {STEPS} steps each way, alternating)")
            print(f"  one step, p50, durable=True   {durable:.3f} ms")
            print(f"  one step, p50, durable=False  {plain:.3f} ms")
            print(f"  added per step, p50           {durable - plain:.3f} ms")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
