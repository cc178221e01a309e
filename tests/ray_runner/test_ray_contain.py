"""The runner's option checks, on their own (no Ray cluster)."""

from __future__ import annotations

import pytest

from zett_agent.process import ProcessLimits
from zett_agent.runners.ray import RayRunner


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
        ({"containment": "cgroups"}, ValueError, "containment=...\\) must be one of auto, cgroup"),
        ({"num_cpus": -1}, ValueError, r"num_cpus=...\) must be a number at least 0"),
        ({"max_retries": 1.5}, TypeError, r"max_retries=...\) must be an int, got float"),
        ({"max_retries": -1}, ValueError, r"max_retries=...\) must be at least 0, got -1"),
        ({"resources": {"gpu": "one"}}, TypeError, r"resources\['gpu'\] must be a number"),
        ({"placement": {"coder": {"cpus": 2}}}, ValueError, "unknown options \\['cpus'\\]"),
        ({"limits": {"timeout": 3}}, TypeError, "takes a zett_agent.process.ProcessLimits"),
        ({"kill_timeout": 0}, ValueError, "kill_timeout=...\\) must be a number of seconds great"),
        ({"prestart_workers": -1}, ValueError, r"prestart_workers=...\) must be at least 0 and"),
        ({"address": 6379}, TypeError, r"address=...\) must be None or a str"),
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
    runner._driver.jobs[object()] = None  # type: ignore[index]
    copy = pickle.loads(pickle.dumps(runner))
    assert (copy.address, copy.num_cpus, copy.placement) == (
        "auto",
        0.5,
        {"coder": {"resources": {"big": 1.0}}},
    )
    assert copy._driver.jobs == {} and copy._remote is None
