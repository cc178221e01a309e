"""Killing a Ray child's whole tree: both containments, both kill paths, a hostile child, a crash
and the parent's death. Every pid below is checked right when the call returned (no waiting):
a job settles, and ``cancel()`` returns, only once the tree is gone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import _ray_children as kids
import pytest
from _ray_testing import BOUND, settle, wait_gone

from support.containment import CONTAINMENTS
from support.liveness import gone
from support.ray_cluster import driver
from zett_agent.process import JobCancelled, WorkerCrashed
from zett_agent.runners._ray import _ray_cluster
from zett_agent.runners.ray import RayRunner

pytestmark = pytest.mark.ray


async def _runner(containment: str, from_host: bool) -> Any:
    runner = RayRunner(containment=containment, kill_from_host=from_host)
    yield runner
    await asyncio.wait_for(runner.close(), BOUND)


@pytest.fixture(
    params=[(kind, from_host) for kind in CONTAINMENTS for from_host in (True, False)],
    ids=[f"{kind}-{path}" for kind in CONTAINMENTS for path in ("host", "reaper")],
)
async def runner(request: pytest.FixtureRequest, ray_cluster: dict[str, Any]) -> Any:
    """A runner per containment, killing from this process or through the node's reaper."""
    async for runner in _runner(*request.param):
        yield runner


@pytest.fixture(params=CONTAINMENTS)
async def contained(request: pytest.FixtureRequest, ray_cluster: dict[str, Any]) -> Any:
    """A runner per containment (for what the task does itself: no kill path involved)."""
    async for runner in _runner(request.param, True):
        yield runner


@pytest.fixture(params=[("cgroup", True), ("scan", False)], ids=["cgroup-host", "scan-reaper"])
async def crashing(request: pytest.FixtureRequest, ray_cluster: dict[str, Any]) -> Any:
    """Both containments, each confirmed dead by one of the kill paths."""
    async for runner in _runner(*request.param):
        yield runner


async def test_cancel_kills_a_never_yielding_child_and_its_escapees(
    runner: RayRunner, ray_cluster: dict[str, Any]
) -> None:
    job = await runner.submit_function(kids.spin_with_tree, resources={"w1": 1})
    events = job.events()
    tree = await asyncio.wait_for(anext(events), BOUND)
    assert job.pid == tree["worker"]
    assert job.info() == {"node_id": ray_cluster["nodes"]["w1"]}
    await asyncio.wait_for(job.cancel(), BOUND)
    assert job.done() and isinstance(job.exception(), JobCancelled) and job.tree_gone
    assert [pid for pid in tree.values() if not gone(pid)] == []
    assert [event async for event in events] == []


async def test_a_running_child_is_stopped_by_its_run_not_by_rays_cancel(
    runner: RayRunner,
) -> None:
    """A running child is stopped through its inbox: its run kills the tree and its Ray task
    ends on its own. Ray's cancel of a task whose reply is on its way aborts the driver's
    process (a race in Ray's bookkeeping), so it is kept for tasks that have no inbox yet."""
    cancels: list[bool] = []
    driver_cancel = runner._driver.cancel

    async def recorded(generator: Any, *, force: bool) -> None:
        cancels.append(force)
        await driver_cancel(generator, force=force)

    runner._driver.cancel = recorded  # type: ignore[method-assign]
    job = await runner.submit_function(kids.spin_with_tree, resources={"w1": 1})
    tree = await asyncio.wait_for(anext(job.events()), BOUND)
    if not runner.kill_from_host and job.node_id is not None:
        # the stop goes through the node's reaper: a reaper still starting may take longer
        # than the stop's bound on a loaded machine (then Ray's cancel stands in, by design)
        await asyncio.wait_for(runner._driver.reapers.prepare(job.node_id), BOUND)
    await asyncio.wait_for(job.cancel(), BOUND)
    assert isinstance(job.exception(), JobCancelled) and job.tree_gone
    assert [pid for pid in tree.values() if not gone(pid)] == []
    assert cancels == []
    assert job._stream_end.result() is None  # the task ended on its own, not as cancelled
    assert job._end is not None and job._end["gone"] is True


async def test_a_child_that_returns_leaves_no_process(contained: RayRunner) -> None:
    job = await settle(await contained.submit_function(kids.tree_then_return))
    tree = job.result()
    # the worker itself lives on for the next child (reused); what the child started does not
    assert [pid for pid in (tree["plain"], tree["escapee"]) if not gone(pid)] == []


async def test_a_crashed_worker_leaves_no_process(crashing: RayRunner, tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as beacons:
        beacons.bind(str(tmp_path / "beacons"))
        job = await crashing.submit_function(kids.tree_then_segfault, str(tmp_path / "beacons"))
        beacons.settimeout(BOUND)
        tree = json.loads(await asyncio.to_thread(beacons.recv, 4096))
        await settle(job)
    error = job.exception()
    assert isinstance(error, WorkerCrashed) and error.signal_name == "SIGSEGV"
    assert [pid for pid in tree.values() if not gone(pid)] == [] and job.tree_gone


async def test_a_child_cannot_stop_its_supervisors_and_its_setsid_escapee_dies(
    ray_cluster: dict[str, Any], containment: str
) -> None:
    """The child sends SIGSTOP to its pool's launcher, to the node's zygote (its template and
    gate: the launcher's parent and grandparent) and to the node's reaper, clears its subreaper
    flag and starts a grandchild
    that clears its environment, double-forks and calls setsid. Landlock scoping (Linux 6.12)
    refuses every one of those signals, and cancel kills the whole tree: the escapee too."""
    runner = RayRunner(containment=containment, kill_from_host=False)
    tree: dict[str, Any] = {}
    try:
        job = await runner.submit_function(kids.hostile, resources={"w2": 1})
        tree = await asyncio.wait_for(anext(job.events()), BOUND)
        assert job.containment is not None and job.containment.get("scoped_workers") is True
        assert tree["stopped"] == [] and len(tree["refused"]) >= 4, tree
        await asyncio.wait_for(job.cancel(), BOUND)
        assert isinstance(job.exception(), JobCancelled) and job.tree_gone
        assert [pid for pid in (tree["worker"], tree["escapee"]) if not gone(pid)] == []
        # the supervisors answer: the next child on that node runs and is cancelled at once
        again = await runner.submit_function(kids.wait_forever, resources={"w2": 1})
        pid = (await asyncio.wait_for(anext(again.events()), BOUND))["pid"]
        await asyncio.wait_for(again.cancel(), BOUND)
        assert gone(pid) and again.tree_gone
    finally:
        await asyncio.wait_for(runner.close(), BOUND)
        for pid in tree.get("stopped", []):  # only if the kernel let one through
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def test_supervisors_that_stop_answering_are_replaced_and_the_tree_dies(
    ray_cluster: dict[str, Any], containment: str
) -> None:
    """Where the kernel has no Landlock scoping (below Linux 6.12) and a child
    can stop its supervisors: the test stops the Ray worker that hosts the child's pool and the
    node's reaper. The cancel is not confirmed by the stopped task, so the driver kills from
    outside; the stopped reaper does not answer, so it is judged dead, replaced, and the new one
    kills the tree."""
    runner = RayRunner(containment=containment, kill_from_host=False)
    stopped: list[int] = []
    try:
        job = await runner.submit_function(kids.spin_with_tree, resources={"w2": 1})
        tree = await asyncio.wait_for(anext(job.events()), BOUND)
        node = job.node_id
        assert node is not None and job._tree is not None
        await asyncio.wait_for(runner._driver.reapers.prepare(node), BOUND)  # it answered once
        reaper = await asyncio.wait_for(runner._driver.reapers.get(node).pid.remote(), BOUND)
        for pid in (job._tree["worker"][0], reaper):
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        await asyncio.wait_for(job.cancel(), BOUND)
        assert isinstance(job.exception(), JobCancelled) and job.tree_gone
        assert [pid for pid in [*tree.values(), job._tree["worker"][0]] if not gone(pid)] == []
        assert runner._driver.reapers.get(node) is not None  # a new one, which answered
        assert (
            await asyncio.wait_for(runner._driver.reapers.get(node).pid.remote(), BOUND) != reaper
        )
    finally:
        await asyncio.wait_for(runner.close(), BOUND)
        for pid in stopped:  # only ours: the reaper Ray was asked to kill, the killed worker
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_a_reaper_still_starting_is_kept_when_a_call_runs_out_of_its_callers_time(
    ray_cluster: dict[str, Any],
) -> None:
    """A call with less time than a new reaper needs to start (a stop is bounded by a fraction
    of the kill's budget) times out, but the reaper is not judged dead for it: the same one
    starts, answers and serves the next call."""
    runner = RayRunner(kill_from_host=False)
    try:
        await settle(await runner.submit_function(kids.tree_then_return, resources={"w1": 1}))
        node = ray_cluster["nodes"]["w2"]  # no job of this runner ran there: no reaper yet
        reapers = runner._driver.reapers
        first = reapers.get(node)
        with pytest.raises(TimeoutError):
            await reapers.call(node, "ping", budget=0.0, deadline=time.monotonic() + 0.01)
        assert reapers.get(node) is first
        await asyncio.wait_for(reapers.prepare(node), BOUND)
        assert reapers.get(node) is first
        assert await reapers.call(node, "ping", budget=0.0, deadline=time.monotonic() + BOUND)
    finally:
        await asyncio.wait_for(runner.close(), BOUND)


async def test_a_new_reaper_that_never_answers_is_replaced_once_its_start_allowance_is_used(
    ray_cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a child can stop a reaper (below Linux 6.12), it may stop one that has not answered
    yet: it is kept only while within its start allowance, counted from when it was made, and
    judged dead after that, even by calls with less time than the allowance."""
    runner = RayRunner(kill_from_host=False)
    stopped: list[int] = []
    try:
        await settle(await runner.submit_function(kids.tree_then_return, resources={"w1": 1}))
        node = ray_cluster["nodes"]["w2"]  # no job of this runner ran there: no reaper yet
        reapers = runner._driver.reapers
        first = reapers.get(node)
        pid = await asyncio.wait_for(first.pid.remote(), BOUND)  # started (not through call)
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)
        with pytest.raises(TimeoutError):
            await reapers.call(node, "ping", budget=0.0, deadline=time.monotonic() + 0.1)
        assert reapers.get(node) is first  # within its allowance (20 + 3 s): kept
        # an allowance of 0.5 s from here on, used up once the reaper is older than that
        monkeypatch.setattr(_ray_cluster, "REAPER_START", 0.0)
        monkeypatch.setattr(_ray_cluster, "REAPER_ANSWER", 0.5)
        await asyncio.sleep(0.6)
        with contextlib.suppress(TimeoutError):
            await reapers.call(node, "ping", budget=0.0, deadline=time.monotonic() + 0.1)
        assert reapers.get(node) is not first  # judged dead, replaced
    finally:
        await asyncio.wait_for(runner.close(), BOUND)
        for pid in stopped:  # Ray was asked to kill it; make sure, since it was stopped
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_parent_dying_leaves_no_process(ray_cluster: dict[str, Any], containment: str) -> None:
    """A Ray driver SIGKILLed while its child runs a tree: Ray kills the worker (its owner
    died) and the task's sentinel kills the rest."""
    before = ray_cluster["host"].call("launchers")["launchers"]
    with driver("_dying_driver.py", ray_cluster["address"], containment) as process:
        try:
            assert process.stdout is not None
            tree = json.loads(process.stdout.readline())
        finally:
            process.kill()
    assert wait_gone(list(tree.values()), timeout=BOUND) == []
    # no host waits for the sentinel here: let it finish removing the cgroup, then exit
    left = ray_cluster["host"].call("wait_clean", within=BOUND, launchers=before)
    assert not (left["leftovers"] or left["cgroups"] or left["launchers"]), left
