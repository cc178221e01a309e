"""The host dies: a host script runs an ``AsyncSubAgentExtension`` with several children, each
with grandchildren (one of them in a session of its own), and then is SIGKILLed, SIGTERMed, or
ends ``asyncio.run`` without calling ``close()``. Within 1 s of the host's death no process it
started may exist.

The host runs under a small harness that is a child subreaper: every orphan of the host's tree
is reparented to it and reaped there, so "gone" is checked honestly (PID 1 on this machine never
reaps, and a zombie must not count as gone by accident). The harness reports when the host died
and when its last descendant was reaped.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from support.host_death import harnessed_host, read_line
from zett_agent.process._containment._cgroup import DIR_NAME, cgroup_problem

CHILDREN = 3

HOST = textwrap.dedent(
    r"""
    import asyncio, json, os, socket, subprocess, sys

    from zett_agent.agent import AgentRunConfig
    from zett_agent.client import create_agent
    from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
    from zett_agent.extensions.subagent import SubAgentDefinition
    from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage
    from zett_agent.model import ModelEvent, ModelResponse, RetryOptions
    from zett_agent.process import ProcessPool
    from zett_agent.process._host._pool import engine_of
    from zett_agent.tools import AgentTool

    MODE, BEACON, N, CONTAINMENT = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

    def spawn_grandchildren(path):
        # a plain grandchild, and one in a session of its own (as a daemon would)
        plain = subprocess.Popen(["sleep", "1000"])
        escaped = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(1000)"], start_new_session=True
        )
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(json.dumps([os.getpid(), plain.pid, escaped.pid]).encode(), path)
        return "spawned"

    SPAWN = AgentTool("spawn", "", {"type": "object", "properties": {"path": {"type": "string"}}},
                      spawn_grandchildren)

    class Child:
        retry = RetryOptions(max_retries=0)
        async def stream(self, request):
            if not any(isinstance(m, ToolMessage) for m in request.messages):
                call = ToolCall("c", "spawn", {"path": BEACON})
                yield ModelEvent.completed(ModelResponse(AssistantMessage(tool_calls=(call,))))
                return
            await asyncio.Event().wait()  # then works forever

    class Parent:
        retry = RetryOptions(max_retries=0)
        async def stream(self, request):
            turn = sum(isinstance(m, AssistantMessage) for m in request.messages)
            if turn == 0:
                calls = tuple(
                    ToolCall(f"s{i}", "task_start",
                             {"subagent_type": "child", "description": f"c{i}", "prompt": "go"})
                    for i in range(N)
                )
                message = AssistantMessage(tool_calls=calls)
            elif turn == 1:
                message = AssistantMessage(tool_calls=(ToolCall("w", "report", {}),))
            elif MODE == "clean":
                message = AssistantMessage("leaving without close()")
            else:
                await asyncio.Event().wait()  # busy until the signal
            yield ModelEvent.completed(ModelResponse(message))

    async def main():
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(BEACON)
        sock.setblocking(False)

        async def report():
            pids = [json.loads(await loop.sock_recv(sock, 1024)) for _ in range(N)]
            print(json.dumps({"host": os.getpid(), "launcher": engine_of(pool).launcher.pid,
                              "children": pids, "containment": pool.containment}), flush=True)
            return "reported"

        definition = SubAgentDefinition("child", "spawns grandchildren", "p", model=Child(),
                                        tools=(SPAWN,))
        # a pool of its own is never closed here: the host dies (or leaves) with it open
        pool = ProcessPool(max_workers=N, containment=CONTAINMENT)
        extension = AsyncSubAgentExtension([definition], max_concurrent=N, pool=pool)
        client = await create_agent(
            Parent(), config=AgentRunConfig(session_id="s"), extensions=[extension],
            tools=(AgentTool("report", "", {"type": "object", "properties": {}}, report),),
        )
        await client.run("start the children")
        sock.close()
        # MODE == "clean": return from asyncio.run with the children running, no close()

    asyncio.run(main())
    """
)


def cgroup_base() -> str | None:
    """Where this process's pools put their cgroups (None without cgroup containment)."""
    if cgroup_problem() is not None:
        return None
    from zett_agent.process._containment._cgroup import _base

    host, _ = _base()
    return None if host is None else f"{host}/{DIR_NAME}"


def _pool_cgroups(host: int) -> list[str]:
    """The cgroups of the pools of process ``host`` (there are none under scan containment)."""
    base = cgroup_base()
    if base is None:
        return []
    return (
        [name for name in os.listdir(base) if name.startswith(f"pool-{host}-")]
        if os.path.isdir(base)
        else []
    )


@pytest.mark.parametrize("mode", ["SIGKILL", "SIGTERM", "clean"])
def test_host_death_leaves_no_descendant_after_one_second(
    mode: str, containment: str, tmp_path: Path
) -> None:
    """Within a second of the host's death no process it started is left, whatever the
    containment; the launcher prints nothing (no traceback on the host's terminal) and leaves
    no cgroup behind."""
    with harnessed_host(
        tmp_path, HOST, mode, str(tmp_path / "beacon"), str(CHILDREN), containment
    ) as harness:
        line = read_line(harness.stdout, 60)
        assert line, harness.stderr.read()
        info: dict[str, Any] = json.loads(line)
        descendants = [info["launcher"], *(pid for trio in info["children"] for pid in trio)]
        assert len(set(descendants)) == 1 + 3 * CHILDREN
        assert all(psutil.pid_exists(pid) for pid in descendants)
        if mode != "clean":
            os.kill(info["host"], getattr(signal, mode))
        report = json.loads(read_line(harness.stdout, 30))
        expected_status = {"SIGKILL": -signal.SIGKILL, "SIGTERM": -signal.SIGTERM, "clean": 0}
        assert report["host_status"] == expected_status[mode], harness.stderr.read()
        print(
            f"{mode}: every descendant reaped {report['after_host'] * 1000:.0f} ms after the host"
        )
        assert report["after_host"] < 1.0, report
        # the harness reaped the orphaned launcher (which reaped its workers' trees first);
        # the harness only ends once it has no child left at all, so nothing is running
        assert info["launcher"] in report["reaped"], report
        assert not [pid for pid in descendants if psutil.pid_exists(pid)]
        assert info["containment"] == containment
        # the launcher cleaned up after itself: it printed nothing and left no cgroup
        assert harness.wait(timeout=30) == 0
        assert "Traceback" not in harness.stderr.read()
        assert _pool_cgroups(info["host"]) == []
