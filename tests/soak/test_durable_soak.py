"""The durable soak: a scripted 20-step task whose child, or whose host, is SIGKILLed at random
points and resumed each time (the harness: ``support.durable_faults``).

A loopback model server in this process answers each step and counts, as each call arrives,
against what the task store holds committed: no model call may come for a step whose response
was committed, no tool may run again for a step whose result was committed, and every task's
report must be the one an uninterrupted run gives; each task's file must hold every step's
line (a line twice only for a call that ran again before it was done: at-least-once).

``uv run pytest`` kills a few (``--soak-size`` / 20 children and as many hosts, at least 3
each: 3 by default); the proof the docs cite kills 500 of each:
``uv run pytest -m soak --soak-size 10000 -s tests/soak/test_durable_soak.py``, or
``uv run python benchmarks/bench_durable.py``, which also measures the journal's cost.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from support.durable_faults import Counts, child_kills, host_kills
from support.reaping import reap_adopted


def _plan(request: pytest.FixtureRequest, what: str) -> tuple[int, int]:
    kills = max(3, int(request.config.getoption("--soak-size")) // 20)
    seed = request.config.getoption("--soak-seed")
    seed = int(seed) if seed is not None else random.randrange(2**32)
    print(f"\ndurable soak: {kills} {what} killed, seed {seed} (rerun with --soak-seed {seed})")
    return kills, seed


def _check(counts: Counts, kills: int, killed: int) -> None:
    for name, value in counts.table():
        print(f"  {name:<52} {value}")
    assert killed >= kills
    assert counts.resumes >= killed  # each death resumed its task (a host's: each of them)
    assert counts.repeated_done_model == 0, "a model call came again for a done step"
    assert counts.repeated_done_tool == 0, "a done tool call ran again"
    assert counts.other_reports == [], counts.other_reports[:10]
    assert counts.identical_reports == counts.tasks > 0
    # a line written twice is a call that ran again before it was done, never another
    assert counts.duplicate_lines <= counts.rerun_not_done_tool


@pytest.mark.soak
async def test_durable_children_killed_at_random_points_resume_without_repeating_a_done_step(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    kills, seed = _plan(request, "children")
    counts = await child_kills(tmp_path, kills, seed=seed)
    _check(counts, kills, counts.child_kills)


@pytest.mark.soak
async def test_durable_hosts_killed_at_random_points_resume_their_tasks_in_the_next_host(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    kills, seed = _plan(request, "hosts")
    counts = await host_kills(tmp_path, kills, seed=seed)
    _check(counts, kills, counts.host_kills)
    assert reap_adopted() == []  # each killed host's children were reaped as it died
