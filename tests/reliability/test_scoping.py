"""Every worker in a Landlock domain of its own: nothing a job starts reaches its supervisors.

A job (sandboxed or not) can no longer stop or kill its launcher, signal or ``pidfd`` the host,
``ptrace`` either of them, read their memory, or connect to an abstract UNIX socket outside its
worker's tree; what a job legitimately does with its own processes still works, and so does a
pool inside a job (nested domains). Needs Landlock ABI 6 (Linux 6.12); elsewhere the tests say
so and skip. An older kernel is pretended with ``ProcessPool(landlock_abi=5)``.
"""

from __future__ import annotations

import asyncio
import os

import _confined_children as confined
import pytest

from zett_agent.process import ProcessPool
from zett_agent.process._host._pool import engine_of
from zett_agent.process._sandbox._landlock import abi

GUARD = 30.0

_ABI, _WHY = abi()
pytestmark = pytest.mark.skipif(
    _ABI < 6, reason=f"needs Landlock ABI 6 (Linux 6.12); this kernel has {_ABI}: {_WHY}"
)


async def test_a_job_cannot_reach_its_launcher_or_host_and_its_own_things_still_work(
    containment: str, abstract_server: bytes
) -> None:
    async with ProcessPool(2, containment=containment) as pool:
        info = pool.containment_info
        assert info["mode"] == containment and info["scoped_workers"] is True, info
        assert info["landlock_abi"] == _ABI and "protected" in info["supervisors"], info
        launcher = engine_of(pool).launcher
        async with asyncio.timeout(GUARD):
            seen = await pool.submit(confined.attack_supervisors, os.getpid(), abstract_server)
        # the launcher lived through it: the pool keeps the same one and runs jobs on it
        async with asyncio.timeout(GUARD):
            assert await pool.submit(confined.signal_launcher_with_0) == "EPERM"
        assert engine_of(pool).launcher is launcher
    denied = {key: value for key, value in seen.items() if not key.startswith("own")}
    assert denied == {
        "stop launcher": "EPERM",
        "kill launcher": "EPERM",
        "signal host": "EPERM",
        "pidfd host": "EPERM",
        "ptrace host": "EPERM",
        "ptrace launcher": "EPERM",
        "vm_readv host": "EPERM",
        "mem host": "EACCES",
        "abstract socket": "EPERM",
    }, seen
    assert seen["own child"] == "ok" and seen["own abstract socket"] == "ok", seen
    assert seen["own memory"] == "ok", seen


async def test_a_nested_pool_in_a_job_kills_its_trees_inside_its_own_domains(
    containment: str,
) -> None:
    async with ProcessPool(1, containment=containment) as pool:
        async with asyncio.timeout(GUARD):
            seen = await pool.submit(confined.nested_pool_kills_its_trees)
    assert seen["alive before"] == [True, True], seen
    assert seen["alive after"] == [False, False], seen
    # its workers entered domains of their own, nested in the outer worker's
    assert seen["inner"]["scoped_workers"] is True, seen


async def test_an_older_kernel_is_pretended_and_said_so(containment: str) -> None:
    async with ProcessPool(1, containment=containment, landlock_abi=5) as pool:
        info = pool.containment_info
        async with asyncio.timeout(GUARD):
            reached = await pool.submit(confined.signal_launcher_with_0)
    assert info["scoped_workers"] is False and info["landlock_abi"] == 5, info
    assert info["kernel_landlock_abi"] == _ABI, info
    assert "not protected" in info["supervisors"] and "ABI 5" in info["reason"], info
    assert reached == "ok"  # what the pool must then survive (tests/process, 6. and 7.)


async def test_scoping_can_be_switched_off(containment: str) -> None:
    async with ProcessPool(1, containment=containment, scope_workers=False) as pool:
        info = pool.containment_info
        async with asyncio.timeout(GUARD):
            reached = await pool.submit(confined.signal_launcher_with_0)
    assert info["scoped_workers"] is False and "scope_workers=False" in info["reason"], info
    assert reached == "ok"


def test_the_pool_options_are_checked() -> None:
    with pytest.raises(TypeError, match="scope_workers"):
        ProcessPool(scope_workers="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="seccomp"):
        ProcessPool(seccomp=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="landlock_abi"):
        ProcessPool(landlock_abi=-1)
    assert ProcessPool().containment_info == {"mode": "auto"}
