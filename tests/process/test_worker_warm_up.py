"""A spare worker warms up (runs an empty job and an empty event loop) while it waits: the job
it then gets must find the process as a fresh one would be, asyncio included."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: what a job can observe of asyncio before it ran a loop, printed as JSON
PROBE = """
import asyncio, json, warnings
seen = {"policy_class": type(asyncio.get_event_loop_policy()).__name__}
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        loop = asyncio.get_event_loop()  # creates one in a process that never ran a loop
        seen["get_event_loop"] = "closed" if loop.is_closed() else "open"
        loop.close()
    except RuntimeError as exc:
        seen["get_event_loop"] = f"RuntimeError: {exc}"
async def answer():
    return 42
seen["run"] = asyncio.run(answer())
print(json.dumps(seen))
"""


def observe(warm: bool) -> dict[str, object]:
    warm_up = "from zett_agent.process._child import _worker; _worker._warm_up(False, True)\n"
    warm_up = warm_up if warm else ""
    done = subprocess.run(
        [sys.executable, "-c", "import zett_agent.process._child._worker\n" + warm_up + PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


@pytest.mark.parametrize("warm", [False, True], ids=["fresh", "warmed"])
def test_a_job_after_the_warm_up_finds_asyncio_as_a_fresh_process_has_it(warm: bool) -> None:
    assert observe(warm) == {
        "policy_class": "_UnixDefaultEventLoopPolicy",
        "get_event_loop": "open",
        "run": 42,
    }
