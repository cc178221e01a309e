"""The node side of ``task_message`` on Ray (``_ray_inbox.NodeInbox``) against a real pool job,
without Ray: what it takes, what it refuses, and that it delivers a retried message once."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import _inbox_jobs as jobs
import cloudpickle
import pytest
from _ray_testing import BOUND

from zett_agent.process import ProcessJob, ProcessPool
from zett_agent.runners._ray import _ray_inbox
from zett_agent.runners._ray._ray_inbox import (
    NodeInbox,
    deliver,
    request_line,
    stop_run,
    stop_run_blocking,
)

pytestmark = pytest.mark.ray

cloudpickle.register_pickle_by_value(jobs)


def message(ident: str, text: str = "hello") -> dict[str, object]:
    return {"id": ident, "text": text, "interrupt": False}


async def test_the_inbox_hands_messages_to_the_job_once_and_refuses_the_rest(
    tmp_path: Path,
) -> None:
    job: ProcessJob | None = None
    inbox = NodeInbox(lambda: job, directory=str(tmp_path))
    await inbox.start()
    try:
        # before the job was submitted: nothing to hand it to
        with pytest.raises(RuntimeError, match="the child is not running"):
            await deliver(inbox.path, request_line(inbox.key, message("m0")), BOUND)
        async with ProcessPool(1) as pool:
            job = pool.submit(jobs.take_messages, 2)
            events = job.events()
            assert await anext(events) == "ready"
            with pytest.raises(RuntimeError, match="wrong key"):
                await deliver(inbox.path, request_line("0" * 32, message("m1")), BOUND)
            with pytest.raises(RuntimeError, match="an object with an id"):
                await deliver(inbox.path, request_line(inbox.key, "no id"), BOUND)
            with pytest.raises(RuntimeError, match="one JSON object"):
                await deliver(inbox.path, b"not json\n", BOUND)
            with pytest.raises(RuntimeError):  # longer than a line may be: cut, unanswered
                await deliver(inbox.path, b"x" * (_ray_inbox.MAX_LINE + 2) + b"\n", BOUND)
            # a retry (a reaper replaced while it sent) is taken, and delivered once
            for ident in ("m1", "m1", "m2"):
                await deliver(inbox.path, request_line(inbox.key, message(ident)), BOUND)
            await job.wait()
            assert job.result() == [message("m1"), message("m2")]
            with pytest.raises(RuntimeError, match="the child is not running"):
                await deliver(inbox.path, request_line(inbox.key, message("m3")), BOUND)
    finally:
        inbox.close()
    assert not await asyncio.to_thread(os.path.exists, inbox.path)
    with pytest.raises(RuntimeError, match="cannot be reached"):
        await deliver(inbox.path, request_line(inbox.key, message("m4")), BOUND)


async def test_a_request_to_stop_is_taken_with_the_key_only_and_says_when_the_run_ended(
    tmp_path: Path,
) -> None:
    stops: list[None] = []
    inbox = NodeInbox(lambda: None, lambda: stops.append(None), directory=str(tmp_path))
    await inbox.start()
    try:
        assert await stop_run(inbox.path, "0" * 32, BOUND) != "taken"
        assert stops == []
        assert await stop_run(inbox.path, inbox.key, BOUND) == "taken"
        assert stops == [None]
    finally:
        inbox.close()
    # the run closes its inbox when it ends: nothing is left to stop
    assert await stop_run(inbox.path, inbox.key, BOUND) == "ended"
    assert await asyncio.to_thread(stop_run_blocking, inbox.path, inbox.key, BOUND) == "ended"
    assert stops == [None]
    # a run that does not answer (its Ray worker stopped): said within the bound
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.bind(str(tmp_path / "silent"))
        silent.listen()
        assert await stop_run(str(tmp_path / "silent"), inbox.key, 0.2) == "unanswered"
        answer = await asyncio.to_thread(stop_run_blocking, str(tmp_path / "silent"), "k", 0.2)
        assert answer == "unanswered"


async def test_the_inbox_serves_a_bounded_number_of_connections(tmp_path: Path) -> None:
    inbox = NodeInbox(lambda: None, directory=str(tmp_path))
    await inbox.start()
    idle = []
    try:
        for _ in range(_ray_inbox.MAX_CONNECTIONS):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            idle.append(sock)
            sock.connect(inbox.path)
        # the inbox answers the ones it serves; one more is closed without an answer
        with pytest.raises(RuntimeError, match=r"no answer|cannot be reached"):
            await deliver(inbox.path, request_line(inbox.key, message("m1")), BOUND)
    finally:
        for sock in idle:
            sock.close()
        inbox.close()


_OPENS_AN_INBOX = """
import asyncio, json, os, sys
from zett_agent.runners._ray import _ray_inbox

async def main():
    inbox = _ray_inbox.NodeInbox(lambda: None)
    await inbox.start()
    base = os.path.dirname(inbox.path)
    print(json.dumps({"base": base, "mode": os.stat(base).st_mode & 0o777, "socket": inbox.path}))
    sys.stdout.flush()
    await asyncio.to_thread(sys.stdin.read)  # until the test closes it (or kills this process)
    inbox.close()

asyncio.run(main())
"""


def _opens_an_inbox(tmp_path: Path) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A process (a Ray worker's stand-in) that opens an inbox in its directory of inboxes, made
    in ``tmp_path`` (its temporary directory), and waits on its stdin."""
    process = subprocess.Popen(
        [sys.executable, "-c", _OPENS_AN_INBOX],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, f"the process ended first: {process.wait(BOUND)}"
    return process, json.loads(line)


def test_a_killed_workers_inboxes_are_swept_and_a_live_ones_are_kept(tmp_path: Path) -> None:
    """A Ray worker killed with SIGKILL cannot remove its directory of inboxes; its lock is then
    free, and the next sweep removes it. A live worker's directory is never taken."""
    process, opened = _opens_an_inbox(tmp_path)
    try:
        assert opened["mode"] == 0o700 and os.path.exists(opened["socket"])
        _ray_inbox.sweep_stale(str(tmp_path))
        assert os.path.exists(opened["socket"])  # its process lives: kept
    finally:
        process.kill()
        process.wait(BOUND)
        for stream in (process.stdin, process.stdout):
            assert stream is not None
            stream.close()
    assert os.path.exists(opened["base"])  # killed outright: nothing of it could remove it
    _ray_inbox.sweep_stale(str(tmp_path))
    assert not os.path.exists(opened["base"])


def test_a_worker_that_exits_removes_its_inboxes(tmp_path: Path) -> None:
    process, opened = _opens_an_inbox(tmp_path)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.close()
    assert process.wait(BOUND) == 0
    process.stdout.close()
    assert not os.path.exists(opened["base"])
