"""Bad input to the engine fails at the call that made it, naming what was wrong and the fix:
limits, pool options, what is submitted; and the messages a user reads are in their units."""

from __future__ import annotations

import gc
import math
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from support.jobs import outcome
from zett_agent.process import (
    LimitExceeded,
    PoolClosed,
    ProcessError,
    ProcessLimits,
    ProcessPool,
    _linux,
)

from . import _jobs


@pytest.mark.parametrize(
    ("field", "value", "error", "says"),
    [
        ("cpu_seconds", math.inf, ValueError, "use None for no limit"),
        ("cpu_seconds", 1e300, ValueError, "at most"),
        ("cpu_seconds", math.nan, ValueError, "cpu_seconds"),
        ("cpu_seconds", 0, ValueError, "greater than 0"),
        ("cpu_seconds", "5", TypeError, "an int or a float"),
        ("memory_bytes", 1.5e9, TypeError, "memory_bytes=1500000000"),
        ("memory_bytes", math.inf, TypeError, "an int"),
        ("memory_bytes", 2**70, ValueError, "from 1 to"),
        ("memory_bytes", -1, ValueError, "from 1 to"),
        ("memory_bytes", True, TypeError, "bool"),
        ("max_open_files", 0.5, TypeError, "an int"),
        ("max_open_files", 0, ValueError, "from 1 to 2,147,483,647"),
        ("timeout", -1, ValueError, "timeout"),
        ("timeout", math.inf, ValueError, "use None"),
        ("timeout", [1], TypeError, "list"),
        ("max_processes", 2.0, TypeError, "max_processes"),
        ("tree_memory_bytes", 0, ValueError, "tree_memory_bytes"),
        ("env", {"A": 1}, TypeError, "str to str"),
        ("env", ["A=1"], TypeError, "mapping"),
        ("env", {"A=B": "1"}, ValueError, "name"),
        ("cwd", 5, TypeError, "cwd"),
    ],
)
def test_limits_refuse_what_would_misbehave_naming_the_field(
    field: str, value: Any, error: type[Exception], says: str
) -> None:
    with pytest.raises(error) as raised:
        ProcessLimits(**{field: value})
    assert f"ProcessLimits.{field}" in str(raised.value)
    assert says in str(raised.value)


def test_limits_accept_what_the_kernel_takes() -> None:
    limits = ProcessLimits(
        timeout=0.5,
        memory_bytes=2**30,
        cpu_seconds=1.5,
        max_open_files=64,
        env={"A": "1"},
        cwd="/",
        max_processes=10,
        tree_memory_bytes=2**30,
    )
    assert limits.applies_in_child
    assert limits.tree_wide == {"max_processes": 10, "tree_memory_bytes": 2**30}
    assert not ProcessLimits(timeout=3).applies_in_child


async def test_limits_of_another_type_are_refused_at_submit() -> None:
    async with ProcessPool(1) as pool:
        with pytest.raises(TypeError, match=r"ProcessLimits\(\*\*\{'timeout': 1\}\)"):
            pool.submit(_jobs.add, 1, 2, limits={"timeout": 1})  # type: ignore[arg-type]
        assert await pool.submit(_jobs.add, 1, 2) == 3


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"max_workers": 2.5}, TypeError, "max_workers"),
        ({"max_workers": 0}, ValueError, "at least 1"),
        ({"spare_workers": -1}, ValueError, "spare_workers"),
        ({"max_jobs_per_worker": "3"}, TypeError, "max_jobs_per_worker"),
        ({"max_frame_bytes": 8}, ValueError, "max_frame_bytes"),
        ({"max_buffered_bytes": 1024}, ValueError, "max_buffered_bytes"),
        ({"kill_grace": -1}, ValueError, "kill_grace"),
        ({"preload": "json"}, TypeError, "module names"),
        ({"containment": "none"}, ValueError, "containment"),
        ({"nice": 20}, ValueError, "nice"),
        ({"nice": 1.5}, TypeError, "nice"),
    ],
)
def test_pool_options_are_checked_at_construction(
    options: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        ProcessPool(**options)


def test_a_failed_constructor_prints_nothing_more() -> None:
    script = textwrap.dedent(
        """
        import gc, warnings
        warnings.simplefilter("always")
        from zett_agent.process import ProcessPool
        try:
            ProcessPool(max_workers=2.5)
        except TypeError as exc:
            print("refused:", exc)
        gc.collect()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.startswith("refused: ProcessPool(max_workers=...) must be an int")
    assert out.stderr == "", out.stderr  # no "Exception ignored in: ProcessPool.__del__"


async def test_what_cannot_run_is_refused_at_submit() -> None:
    async with ProcessPool(1) as pool:
        with pytest.raises(TypeError, match="takes a function to run first, got int 42"):
            pool.submit(42)  # type: ignore[arg-type]
        assert await pool.submit(_jobs.add, 1, 1) == 2
    with pytest.raises(PoolClosed):
        pool.submit(_jobs.add, 1, 1)
    gc.collect()


async def test_a_memory_limit_reads_in_human_units_and_says_what_it_measures() -> None:
    async with ProcessPool(1) as pool:
        error = await outcome(
            pool.submit(_jobs.allocate, 1 << 30, limits=ProcessLimits(memory_bytes=500 << 20))
        )
    assert isinstance(error, LimitExceeded), error
    text = str(error)
    assert "memory_bytes=500 MiB" in text and "address space" in text, text
    assert "e+08" not in text and "peak resident size of" in text, text


async def test_start_on_a_platform_without_the_engine_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_linux.sys, "platform", "darwin")
    pool = ProcessPool(1)
    with pytest.raises(ProcessError) as raised:
        await pool.start()
    message = str(raised.value)
    assert "needs Linux" in message and "darwin" in message
    assert "InProcessRunner" in message and "\n" not in message
    await pool.close()
