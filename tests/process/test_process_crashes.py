"""The crash matrix: every way a job can die gives its typed error, and a sibling job that runs
at the same time in the same pool completes normally."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from support.jobs import GUARD, first_event, outcome
from support.liveness import alive
from zett_agent.process import JobFailed, JobStatus, ProcessPool, ProtocolError, WorkerCrashed
from zett_agent.process._wire._protocol import HEADER

from . import _jobs


def _frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def _check_crash(**expected: Any) -> Callable[[BaseException | None], None]:
    def check(error: BaseException | None) -> None:
        assert isinstance(error, WorkerCrashed), error
        for name, value in expected.items():
            assert getattr(error, name) == value, (name, error)

    return check


def _check_failed(type_name: str, text: str = "") -> Callable[[BaseException | None], None]:
    def check(error: BaseException | None) -> None:
        assert isinstance(error, JobFailed), error
        assert error.type_name == type_name
        assert text in str(error)
        assert type_name in str(error)

    return check


def _check_protocol(text: str) -> Callable[[BaseException | None], None]:
    def check(error: BaseException | None) -> None:
        assert isinstance(error, ProtocolError), error
        assert text in error.reason

    return check


CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...], Any]] = {
    "segfault": (_jobs.segfault, (), _check_crash(signal_name="SIGSEGV", exitcode=None)),
    "os._exit(3)": (_jobs.exit3, (), _check_crash(exitcode=3, signal_name=None)),
    "abort": (_jobs.abort, (), _check_crash(signal_name="SIGABRT")),
    "raises": (_jobs.raise_value_error, (), _check_failed("ValueError", "boom")),
    "SystemExit": (_jobs.raise_system_exit, (), _check_failed("SystemExit", "5")),
    "KeyboardInterrupt": (_jobs.raise_keyboard_interrupt, (), _check_failed("KeyboardInterrupt")),
    "dies mid result": (_jobs.die_mid_result, (), _check_crash(signal_name="SIGKILL")),
    "result not JSON": (
        _jobs.return_unserializable,
        (),
        _check_failed("TypeError", "results must be JSON data"),
    ),
    "garbage bytes": (
        _jobs.write_garbage,
        (b"\xff" * 64,),
        _check_protocol("larger than any frame"),
    ),
    "invalid JSON": (_jobs.write_garbage, (_frame(b"{nope"),), _check_protocol("not valid JSON")),
    "invalid UTF-8": (_jobs.write_garbage, (_frame(b'"\xff"'),), _check_protocol("UTF-8")),
    "unknown kind": (_jobs.write_garbage, (_frame(b'{"k":"hello"}'),), _check_protocol("kind")),
    "text not UTF-8": (_jobs.bad_text_result, (), _check_protocol("UTF-8")),
    "oversized frame": (
        _jobs.write_garbage,
        (HEADER.pack(1 << 30) + b"x" * 100,),
        _check_protocol("larger than any frame"),
    ),
    "oversized JSON frame": (
        _jobs.write_garbage,
        (_frame(b'{"k":"event","v":"' + b"x" * (1 << 17) + b'"}'),),
        _check_protocol("at most 32768"),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_crash_gives_typed_error_and_sibling_completes(
    case: str, fifo: tuple[str, int], containment: str
) -> None:
    fn, args, check = CASES[case]
    path, keep = fifo
    async with ProcessPool(2, containment=containment) as pool:
        sibling = pool.submit(_jobs.wait_for_go, path)
        assert await first_event(sibling) == "ready"
        job = pool.submit(fn, *args)
        started = time.monotonic()
        error = await outcome(job)
        assert time.monotonic() - started < 5
        check(error)
        assert job.status is JobStatus.FAILED
        with pytest.raises(type(error)):
            await job
        assert sibling.status is JobStatus.RUNNING
        os.write(keep, b"still fine\n")
        async with asyncio.timeout(GUARD):
            assert await sibling == "still fine"
        # the pool still works after the crash
        assert await pool.submit(_jobs.add, 2, 2) == 4


async def test_killed_from_outside_is_a_crash_and_sibling_completes(
    fifo: tuple[str, int],
    containment: str,
) -> None:
    path, keep = fifo
    async with ProcessPool(2, containment=containment) as pool:
        sibling = pool.submit(_jobs.wait_for_go, path)
        victim = pool.submit(_jobs.ready_then_sleep)
        assert await first_event(sibling) == "ready"
        pid = await first_event(victim)
        assert victim.pid == pid
        os.kill(pid, signal.SIGKILL)
        error = await outcome(victim)
        assert isinstance(error, WorkerCrashed) and error.signal_name == "SIGKILL"
        assert "SIGKILL" in str(error)
        assert not alive(pid)
        os.write(keep, b"ok\n")
        async with asyncio.timeout(GUARD):
            assert await sibling == "ok"


async def test_protocol_error_kills_the_worker(containment: str) -> None:
    async with ProcessPool(1, containment=containment) as pool:
        job = pool.submit(_jobs.write_garbage, _frame(b"[]"))
        error = await outcome(job)
        assert isinstance(error, ProtocolError)
        assert "not a message object" in str(error)


async def test_remote_traceback_is_kept(containment: str) -> None:
    async with ProcessPool(1, containment=containment) as pool:
        error = await outcome(pool.submit(_jobs.raise_value_error))
    assert isinstance(error, JobFailed)
    assert "raise_value_error" in error.traceback_text
    assert "ValueError: boom" in error.traceback_text
