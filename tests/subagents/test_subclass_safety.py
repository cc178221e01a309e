"""A subclass's own attributes never collide with the internals of the classes it extends.

Each public class a user subclasses (``Extension`` through ``AsyncSubAgentExtension`` and
``SubAgentExtension``, ``ProcessRunner``, ``ProcessPool``) is subclassed here, and the subclass
sets every single-underscore name the class used for its internals before they were
name-mangled (``PRIVATE_NAMES``, read off the code of that time) to an unrelated object (a
``threading.Lock`` for ``_guard``, as a user might). Then the whole life runs for real: start a
child, message it, wait for it, cancel another, close.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

from process import _jobs, _message_jobs
from support.beacons import Beacons
from support.calls import calls, final, task_start
from support.children import GATE, GatedAnswer, Listener
from support.jobs import first_event
from support.parent import worker
from support.scripted_models import StepModel
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension, SubAgentTaskStatus
from zett_agent.extensions.subagent import SubAgentExtension
from zett_agent.process import JobCancelled, ProcessPool
from zett_agent.runners import ProcessRunner

GUARD = 60

#: the single-underscore names each class used before its internals were name-mangled
#: (``_create_child`` is a documented override point, not an internal, and stays)
PRIVATE_NAMES = {
    "Extension": ("_agent_closed", "_extension_name"),
    "ChildAgentExtension": (
        "_child_spec", "_counter", "_factory", "_init_runtime", "_launch", "_limits",
        "_modules", "_next_number", "_profiles_text", "_runner", "_sandbox", "_submit",
        "_warm_up",
    ),
    "AsyncSubAgentExtension": (
        "_agent_closed", "_chores", "_close", "_close_task", "_closing", "_counter", "_guard",
        "_init_runtime", "_launch", "_mail", "_next_number", "_notices", "_registry", "_runner",
        "_starter", "_tool_access", "_warm_up", "_watcher",
    ),
    "ProcessRunner": (
        "_brokers", "_closed", "_closing_pool", "_init_runtime", "_lock", "_new_pool", "_own",
        "_pool", "_replace", "_serve", "_shared", "_start_own", "_wanted", "_warm", "_warming",
    ),
    "ProcessPool": (
        "_close_task", "_containment", "_engine", "_job_counter", "_launcher", "_mode",
        "_sandbox_header", "_started",
    ),
}  # fmt: skip


class Unrelated:
    """What a subclass keeps under a name the base once used: nothing the base could use."""


def occupy(obj: object, *classes: str) -> None:
    """Set every old private name of ``classes`` on ``obj`` to an unrelated object."""
    for cls in classes:
        for name in PRIVATE_NAMES[cls]:
            setattr(obj, name, threading.Lock() if name == "_guard" else Unrelated())


class MyPool(ProcessPool):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        occupy(self, "ProcessPool")


class MyRunner(ProcessRunner):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        occupy(self, "ProcessRunner")


class MyTasks(AsyncSubAgentExtension):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        occupy(self, "Extension", "ChildAgentExtension", "AsyncSubAgentExtension")


class MySubagent(SubAgentExtension):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        occupy(self, "Extension", "ChildAgentExtension")


def gate(tmp_path: Path, name: str) -> Path:
    import os

    path = tmp_path / name
    os.mkfifo(path)
    return path


async def release(path: Path) -> None:
    await asyncio.to_thread(path.write_bytes, b"go")


async def life_of_the_background_tasks(
    tmp_path: Path, beacons: Beacons, runner: ProcessRunner
) -> None:
    """Start two children, message the first and wait for it, cancel the second, close."""
    listening = gate(tmp_path, "listening")
    listener = worker(Listener(beacons.path, "listening", str(listening)), tools=(GATE,))
    never = gate(tmp_path, "never")  # never written: the child waits until it is killed
    hanger = worker(GatedAnswer(beacons.path, "hanging", str(never)), name="hanger")
    extension = MyTasks(
        [listener, hanger], extra_tools=("task_wait", "task_message"), runner=runner
    )
    async with extension:
        model = StepModel(
            [
                calls(task_start(), task_start(subagent_type="hanger", prompt="hang")),
                final("started"),
            ]
        )
        client = await create_agent(
            model, config=AgentRunConfig(session_id="parent"), extensions=[extension]
        )
        async with asyncio.timeout(GUARD):
            assert (await client.run("go")).content == "started"
            first, second = extension.tasks("parent")
            await beacons.until("listening")
            sender = asyncio.create_task(extension.send(first, "use the blue one"))
            await asyncio.sleep(0)  # the sender queued its message
            assert first.messages is not None
            await first.messages.records["msg-1"].received.wait()
            await release(listening)
            assert await sender == "msg-1"
            await extension.wait(first)
            await beacons.until("hanging")
            await extension.cancel(second)
        assert first.status is SubAgentTaskStatus.COMPLETED, first.error
        assert json.loads(first.output or "")["users"] == ["p", "use the blue one"]
        assert second.status is SubAgentTaskStatus.CANCELLED, second.error
        assert extension.task_info(first)["messages"] == {"sent": 1, "delivered": 1}
        await client.close()
    assert runner.pool is None or runner.pool.running == 0


async def test_an_async_extension_and_its_runner_subclassed(
    tmp_path: Path, beacons: Beacons
) -> None:
    await life_of_the_background_tasks(tmp_path, beacons, MyRunner())


async def test_a_shared_pool_subclassed(tmp_path: Path, beacons: Beacons) -> None:
    async with MyPool(2) as pool:
        await life_of_the_background_tasks(tmp_path, beacons, MyRunner(pool))
        # the pool on its own too: a job, a message to it, its cancel
        job = pool.submit(_message_jobs.read_one_then_end)
        assert await first_event(job) == "ready"
        await job.send("ping")
        async with asyncio.timeout(GUARD):
            assert await job == "ping"
            hanging = pool.submit(_jobs.ready_then_sleep)
            await first_event(hanging)
            await hanging.cancel()
        assert isinstance(hanging.exception(), JobCancelled)


async def test_the_blocking_extension_subclassed(tmp_path: Path, beacons: Beacons) -> None:
    """Run a child to its report, then cancel a request while its child runs, then close."""
    extension = MySubagent(
        [worker(GatedAnswer(beacons.path, "gated", str(gate(tmp_path, "g")), answer="done"))],
        runner=MyRunner(),
    )
    stuck_gate = gate(tmp_path, "stuck")  # never written
    hanging = MySubagent([worker(GatedAnswer(beacons.path, "stuck", str(stuck_gate)))])
    async with extension, hanging:
        step = calls(("subagent", {"subagent_type": "worker", "description": "d", "prompt": "p"}))
        client = await create_agent(
            StepModel([step, lambda r: final(r.messages[-1].text)]),
            extensions=[extension],
        )
        run = asyncio.create_task(client.run("go"))
        async with asyncio.timeout(GUARD):
            await beacons.until("gated")
            await release(tmp_path / "g")
            assert (await run).content == "done"
        stuck = await create_agent(StepModel([step, final()]), extensions=[hanging])
        request = asyncio.create_task(stuck.run("go"))
        async with asyncio.timeout(GUARD):
            await beacons.until("stuck")
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)
        assert request.cancelled()
        await client.close()
        await stuck.close()
