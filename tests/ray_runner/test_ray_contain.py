"""The node-side containment pieces on their own (no Ray cluster): the sweep of cgroups whose
worker died, and the runner's option checks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from _ray_testing import gone, wait_gone

from zett_agent.process import ProcessLimits
from zett_agent.runners import _ray_contain
from zett_agent.runners.ray import RayRunner

NO_CGROUP = _ray_contain.cgroup_problem()


@pytest.mark.skipif(NO_CGROUP is not None, reason=f"no cgroup containment here: {NO_CGROUP}")
def test_sweep_kills_and_removes_the_cgroup_of_a_dead_worker() -> None:
    """Every killer of a task was itself killed: the next sweep on the node finds the cgroup
    by its name (a dead worker's pid and start time) and kills what is in it."""
    own = _ray_contain._own_cgroup()
    assert own is not None
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    cgroup = f"{own}/{_ray_contain.DIR_NAME}/task-{dead.pid}-1-{os.urandom(4).hex()}"
    os.makedirs(cgroup)
    left = subprocess.Popen(["sleep", "3600"])
    with open(f"{cgroup}/cgroup.procs", "w") as procs:
        procs.write(str(left.pid))
    live = (
        f"{own}/{_ray_contain.DIR_NAME}/task-{os.getpid()}-{_ray_contain.start_time(os.getpid())}-x"
    )
    os.makedirs(live)
    try:
        removed = _ray_contain.sweep()
        assert os.path.basename(cgroup) in removed and not os.path.exists(cgroup)
        assert os.path.exists(live)  # a live worker's cgroup is never touched
        left.wait(timeout=10)
        assert wait_gone([left.pid], timeout=0) == [] and gone(left.pid)
    finally:
        left.kill()
        left.wait()
        os.rmdir(live)
        if os.path.exists(cgroup):
            os.rmdir(cgroup)


def test_limits_ray_cannot_enforce_are_refused_clearly() -> None:
    import asyncio

    runner = RayRunner()

    async def submit() -> None:
        await runner.submit_function(print, limits=ProcessLimits(max_processes=10))

    with pytest.raises(ValueError, match="RayRunner cannot enforce max_processes"):
        asyncio.run(submit())
    assert runner._remote is None  # refused before connecting to anything


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"containment": "cgroups"}, ValueError, "containment must be one of auto, cgroup, scan"),
        ({"num_cpus": -1}, ValueError, "num_cpus must be a number >= 0"),
        ({"max_retries": 1.5}, ValueError, "max_retries must be an int >= 0"),
        ({"resources": {"gpu": "one"}}, ValueError, r"resources\['gpu'\] must be a number"),
        ({"placement": {"coder": {"cpus": 2}}}, ValueError, "unknown options \\['cpus'\\]"),
        ({"limits": {"timeout": 3}}, TypeError, "takes a zett_agent.process.ProcessLimits"),
        ({"kill_timeout": 0}, ValueError, "kill_timeout must be a positive number"),
        ({"address": 6379}, TypeError, "address must be None or a str"),
    ],
)
def test_bad_options_name_what_was_wrong(
    options: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        RayRunner(**options)  # type: ignore[arg-type]


def test_a_runner_travels_as_its_configuration() -> None:
    import pickle

    runner = RayRunner("auto", num_cpus=0.5, placement={"coder": {"resources": {"big": 1}}})
    runner._jobs.add(object())  # type: ignore[arg-type]
    copy = pickle.loads(pickle.dumps(runner))
    assert (copy.address, copy.num_cpus, copy.placement) == (
        "auto",
        0.5,
        {"coder": {"resources": {"big": 1.0}}},
    )
    assert copy._jobs == set() and copy._remote is None
