"""Children on Ray, tried as a hostile (or careless) child would, with the same
guarantees as on processes. Each child runs in a process of its node's ``ProcessPool``, so each
case below holds for the reason it holds there; every case runs under both containments where
it applies. A child stopping its supervisors is in ``test_ray_kill.py``, the loopback-only
listening of a Ray the runner starts in ``test_ray_local.py``."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

import _ray_children as kids
import psutil
import pytest
from _ray_testing import BOUND, settle

from support.containment import CONTAINMENTS
from support.liveness import gone
from support.survivors import survivors
from zett_agent.process import JobFailed, ProtocolError, WorkerCrashed
from zett_agent.runners._ray import _ray_cluster
from zett_agent.runners.ray import RayRunner

pytestmark = pytest.mark.ray


@pytest.fixture(params=CONTAINMENTS)
async def runner(request: pytest.FixtureRequest, ray_cluster: dict[str, Any]) -> Any:
    runner = RayRunner(containment=request.param)
    yield runner
    await asyncio.wait_for(runner.close(), BOUND)


# -- a crash lets no quiet helper go ---------------------------------------------------------------


async def test_a_crash_kills_a_new_session_helper_with_a_minimal_environment(
    runner: RayRunner, tmp_path: Path
) -> None:
    """A helper started with ``start_new_session=True`` and only ``PATH`` and ``LANG`` (the
    subreaper flag left alone), then a segfault: the job fails ``WorkerCrashed`` with the tree
    gone, and the helper and its command are gone when it settles."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as beacons:
        beacons.bind(str(tmp_path / "beacons"))
        job = await runner.submit_function(
            kids.quiet_helper_then_segfault, str(tmp_path / "beacons")
        )
        beacons.settimeout(BOUND)
        tree = json.loads(await asyncio.to_thread(beacons.recv, 4096))
        await settle(job)
    error = job.exception()
    assert isinstance(error, WorkerCrashed) and error.signal_name == "SIGSEGV", error
    assert job.tree_gone
    assert [name for name, pid in tree.items() if not gone(pid)] == []


# -- a thread left in the worker -------------------------------------------------------------------


async def test_a_thread_left_behind_cannot_start_anything_after_the_result(
    runner: RayRunner, tmp_path: Path
) -> None:
    """The child leaves a thread that would start a process once the test opens its FIFO, and
    returns. The worker that ran it does not outlive the job with that thread (the pool retires
    a worker whose job left a thread): when the result is in, nothing reads the FIFO any more,
    so the thread can never start its process."""
    gate = str(tmp_path / "gate")
    os.mkfifo(gate)
    job = await settle(await runner.submit_function(kids.thread_starts_a_process_later, gate))
    worker = job.result()["worker"]
    assert job.tree_gone and gone(worker)
    with pytest.raises(OSError) as refused:
        os.close(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))
    assert refused.value.errno == errno.ENXIO  # no reader: the thread is gone with its process
    # and the next child on that runner runs in a fresh worker
    again = await settle(await runner.submit_function(kids.echo, 1))
    assert again.result()["pid"] != worker


# -- what a child sends is bounded as on processes -------------------------------------------------


async def test_a_lone_surrogate_fails_that_job_only_naming_it(runner: RayRunner) -> None:
    """A result holding a lone surrogate fails in the child (naming where it is); a frame
    written by hand that escapes one is refused by the node's pool; neither reaches the parent
    as text it could not encode. A subagent's report that holds one arrives replaced."""
    error = (await settle(await runner.submit_function(kids.return_lone_surrogate))).exception()
    assert isinstance(error, JobFailed) and "lone surrogate" in error.message, error
    job = await settle(await runner.submit_function(kids.raw_lone_surrogate_frame))
    error = job.exception()
    assert isinstance(error, ProtocolError) and "lone surrogate" in str(error), error
    assert job.tree_gone
    from zett_agent.extensions.subagent import SubAgentDefinition
    from zett_agent.runners import ChildSpec

    model = kids.LoneSurrogateModel()
    definition = SubAgentDefinition("bad", "a lone surrogate", "p", model=model)
    job = await settle(await runner.submit(ChildSpec(definition, model, "s/task-1", "go")))
    content = job.result()["content"]
    assert content == "report \ufffd end"
    content.encode("utf-8")  # what the parent's next model request does with it


class _Peak:
    """The driver's peak resident memory while a job runs, read off the loop in a thread."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        self.before = self.peak = self.me.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.me.memory_info().rss)

    def grown(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak - self.before


async def test_an_amplifying_result_fails_within_the_budget(ray_cluster: dict[str, Any]) -> None:
    """``[{}] * 20_000_000`` (60 MB of JSON, 1.5 GiB decoded): refused for
    ``max_buffered_bytes`` before the driver holds more than the budget."""
    budget = 32 << 20
    runner = RayRunner(max_buffered_bytes=budget)
    try:
        peak = _Peak()
        job = await settle(await runner.submit_function(kids.amplify, 20_000_000))
        grown = peak.grown()
        error = job.exception()
        assert isinstance(error, ProtocolError) and "max_buffered_bytes" in str(error), error
        assert grown < 2 * budget, f"the driver grew by {grown >> 20} MiB"
    finally:
        await asyncio.wait_for(runner.close(), BOUND)


async def test_unread_events_are_dropped_oldest_first_within_the_budget(
    ray_cluster: dict[str, Any],
) -> None:
    """8000 events of 64 KiB that nobody reads (500 MiB): the job completes, the oldest are
    dropped, and what is kept stays within ``max_buffered_bytes``."""
    budget = 32 << 20
    runner = RayRunner(max_buffered_bytes=budget)
    try:
        peak = _Peak()
        job = await settle(await runner.submit_function(kids.many_events, 8000, 64 << 10))
        grown = peak.grown()
        assert job.result() == "emitted"
        assert job.dropped_events > 0 and job._relay.held <= budget
        assert grown < 4 * budget, f"the driver grew by {grown >> 20} MiB"
        kept = [event async for event in job.events()]
        assert 0 < len(kept) == 8000 - job.dropped_events
    finally:
        await asyncio.wait_for(runner.close(), BOUND)


# -- scan-mode cancel against pid-hopping lineages -------------------------------------------------


@pytest.mark.parametrize("lineages", [8, 24])
async def test_cancel_kills_pid_hopping_lineages(
    runner: RayRunner, tmp_path: Path, lineages: int
) -> None:
    """Processes that fork a successor and exit, over and over: cancel kills every one (the
    node's pool kills its job's tree as on processes, within its own deadline)."""
    record = tmp_path / "hops"
    job = await runner.submit_function(kids.hopping_lineages, str(record), lineages)
    assert await asyncio.wait_for(anext(job.events()), BOUND) == "hopping"
    await asyncio.wait_for(job.cancel(), BOUND)
    assert job.tree_gone
    # which kill confirmed it: the node's pool (its end record) or the driver's, from outside
    assert survivors(record) == [], f"end record: {job._end!r}"


# -- cancelling many waiting children --------------------------------------------------------------


async def test_cancelling_50_waiting_children_makes_no_ray_call_on_the_loop(
    ray_cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """50 children wait for one CPU; all are cancelled at once. Every ``ray.cancel`` (of the
    queued ones: the running one is stopped through its inbox) runs in the runner's call thread,
    never on the event loop, and in one batch per loop iteration (the stall this bounds is
    measured by ``benchmarks/bench_subagents.py --ray``)."""
    import ray

    loop_thread = threading.get_ident()
    calls: list[int] = []
    real = ray.cancel

    def cancel(*args: Any, **kwargs: Any) -> Any:
        calls.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(ray, "cancel", cancel)
    runner = RayRunner()
    try:
        first = await runner.submit_function(kids.wait_forever, resources={"w1": 1})
        await asyncio.wait_for(anext(first.events()), BOUND)
        queued = [
            await runner.submit_function(kids.echo, i, resources={"w1": 1}) for i in range(50)
        ]
        batches: list[int] = []
        cancel_all = _ray_cluster._cancel_all

        def counted(batch: list[Any]) -> None:
            batches.append(len(batch))
            cancel_all(batch)

        monkeypatch.setattr(_ray_cluster, "_cancel_all", counted)
        await asyncio.wait_for(asyncio.gather(*(job.cancel() for job in [first, *queued])), BOUND)
    finally:
        await asyncio.wait_for(runner.close(), BOUND)
    assert calls and loop_thread not in calls
    # the first round of cancels went as one call: the 50 queued ones (the running one is
    # stopped through its inbox)
    assert batches[0] == 50, batches
