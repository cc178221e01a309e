"""The task registry as a whole: it does not grow with the number of sessions.

Idle sessions (nothing running, nothing starting, no notice owed) beyond ``max_sessions`` are
forgotten, least recently used first; a session with work in progress or an unread notice
never is. Closing an agent (or a client) releases the sessions it ran: their running children
are killed and their records forgotten, unless another open agent shares the session.
"""

from __future__ import annotations

import asyncio
import gc
import os
import weakref
from pathlib import Path
from typing import Any

import pytest

from support.beacons import Beacons
from support.calls import call, read_output, start
from support.children import AnnounceAndBlock, BlockingModel, GateModel
from support.liveness import alive
from support.parent import until_running
from support.scripted_models import StepModel, ToolsThenAnswer
from zett_agent.agent import Agent, AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions._async_subagent import task_registry
from zett_agent.extensions.async_subagent import (
    AsyncSubAgentExtension,
    SubAgentTask,
    SubAgentTaskStatus,
)
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AssistantMessage
from zett_agent.runners import InProcessRunner
from zett_agent.tools import AgentTool

HANG_GUARD = 60


def quick(answer: str = "done") -> SubAgentDefinition:
    return SubAgentDefinition("quick", "answers at once", "p", model=ToolsThenAnswer(answer))


def blocking() -> SubAgentDefinition:
    return SubAgentDefinition("block", "never answers", "p", model=BlockingModel())


def announcing(path: str, label: str) -> SubAgentDefinition:
    return SubAgentDefinition(
        label, "says it runs, then blocks", "p", AnnounceAndBlock(path, label)
    )


#: a request that starts a quick task and reads its report: the session ends up idle
FINISHED_AND_READ = [
    start("quick"),
    read_output,
    AssistantMessage("read it"),
]


def config(session: str) -> AgentRunConfig:
    return AgentRunConfig(session_id=session)


# -- forgetting idle sessions ------------------------------------------------------------------


async def test_idle_sessions_beyond_max_sessions_are_forgotten_least_recently_used_first() -> None:
    extension = AsyncSubAgentExtension([quick()], runner=InProcessRunner(), max_sessions=2)
    agent = Agent(StepModel(FINISHED_AND_READ), extensions=[extension])
    async with extension, asyncio.timeout(HANG_GUARD):
        for session in "abc":
            await agent.run("go", config=config(session))
        # three idle sessions, two kept: the least recently used one is gone
        assert extension.tasks("a") == ()
        assert [t.status for t in extension.tasks("b")] == [SubAgentTaskStatus.COMPLETED]
        assert [t.task_id for t in extension.tasks("c")] == ["task-3"]
        with pytest.raises(ValueError, match="'task-1' is not known any more") as forgotten:
            extension.get_task("a", "task-1")
        assert "idle, nothing running or unread" in str(forgotten.value)
        assert "max_sessions=2" in str(forgotten.value)

        # reading "b" (code or a request of it) makes "c" the least recently used
        extension.get_task("b", "task-2")
        await agent.run("go", config=config("d"))
        assert extension.tasks("c") == ()
        assert [t.task_id for t in extension.tasks("b")] == ["task-2"]
        assert [t.task_id for t in extension.tasks("d")] == ["task-4"]

        # a forgotten session starts afresh; its earlier ids say what happened to them (a new
        # agent: this one's conversation of "a" already went through its script)
        again = Agent(StepModel(FINISHED_AND_READ), extensions=[extension])
        await again.run("go", config=config("a"))
        assert [t.task_id for t in extension.tasks("a")] == ["task-5"]
        with pytest.raises(ValueError, match="earlier task records were forgotten"):
            extension.get_task("a", "task-1")
        assert len(task_registry(extension).sessions) == 2


async def test_a_session_with_a_running_task_or_an_unread_notice_is_never_forgotten(
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    gated = SubAgentDefinition("gated", "answers once let", "p", model=GateModel(str(gate)))
    extension = AsyncSubAgentExtension(
        [quick(), blocking(), gated], runner=InProcessRunner(), max_sessions=1
    )
    model = StepModel([lambda r: start(r.messages[0].content), AssistantMessage("started")])
    agent = Agent(model, extensions=[extension])
    async with extension, asyncio.timeout(HANG_GUARD):
        await agent.run("block", config=config("busy"))  # its child never answers
        await agent.run("gated", config=config("unread"))
        [unread] = extension.tasks("unread")
        await asyncio.to_thread(gate.write_bytes, b"go")  # it finishes after its request
        await extension.wait(unread)  # its notice is owed until the session's next request
        reader = Agent(StepModel(FINISHED_AND_READ), extensions=[extension])
        for i in range(5):
            await reader.run("go", config=config(f"idle-{i}"))
        assert [s for s in task_registry(extension).sessions] == ["busy", "unread", "idle-4"]
        [busy] = extension.tasks("busy")
        assert busy.status is SubAgentTaskStatus.RUNNING

        # the unread session's next request delivers the notice: from then on it is idle,
        # and the least recently used idle session goes
        notified = Agent(StepModel([AssistantMessage("noted")]), extensions=[extension])
        await notified.run("hello", config=config("unread"))
        assert extension.tasks("idle-4") == ()
        assert extension.tasks("unread") == (unread,)

        # a cancelled task owes its notice too: the session stays until that is delivered
        await extension.cancel(busy)
        assert extension.tasks("busy") == (busy,)


async def test_3000_sessions_each_with_a_read_report_keep_the_registry_bounded() -> None:
    # each session ran one task whose report was read, and was left idle. The registry keeps
    # the 1,000 most recently used idle sessions (the documented default), and the records of
    # the others, reports included, are freed
    report = "r" * 20_000
    alive_tasks: weakref.WeakSet[SubAgentTask] = weakref.WeakSet()

    class Counting(AsyncSubAgentExtension):
        async def task_started(self, task: SubAgentTask) -> None:
            alive_tasks.add(task)

    extension = Counting([quick(report + "{pid}")], runner=InProcessRunner(copy=False))
    assert extension.max_sessions == 1000
    agent = Agent(StepModel(FINISHED_AND_READ), extensions=[extension])
    async with extension, asyncio.timeout(600):
        for i in range(3000):
            await agent.run("go", config=config(f"s{i}"))
        assert len(task_registry(extension).sessions) == 1000
        assert len(task_registry(extension).idle) == 1000
        assert len(task_registry(extension).forgotten) <= 1000
        assert extension.tasks("s1999") == () and len(extension.tasks("s2000")) == 1
        gc.collect()
        # what the registry still holds: 1,000 tasks and their 20 kB reports, not 3,000
        assert len(alive_tasks) == 1000
        held = sum(len(t.output or "") for t in alive_tasks)
        assert 1000 * len(report) <= held < 1001 * (len(report) + 10)


def test_max_sessions_is_checked_like_the_other_options() -> None:
    with pytest.raises(
        ValueError,
        match=r"AsyncSubAgentExtension\(max_sessions=\.\.\.\) must be at least 0, got -1",
    ):
        AsyncSubAgentExtension([quick()], runner=InProcessRunner(), max_sessions=-1)
    for bad in (True, "3", 2.0):
        with pytest.raises(TypeError, match=r"\(max_sessions=\.\.\.\) must be an int"):
            AsyncSubAgentExtension([quick()], runner=InProcessRunner(), max_sessions=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("option", "value", "error", "message"),
    [
        ("stall_seconds", "60", TypeError, r"\(stall_seconds=\.\.\.\) must be a number of seconds"),
        ("stall_seconds", 0, ValueError, r"\(stall_seconds=\.\.\.\) must be .* greater than 0"),
        ("stall_seconds", float("inf"), ValueError, r"\(stall_seconds=\.\.\.\) must be"),
        ("session_token_budget", 1.5, TypeError, r"\(session_token_budget=\.\.\.\) must be an int"),
        (
            "session_token_budget",
            0,
            ValueError,
            r"\(session_token_budget=\.\.\.\) must be at least 1",
        ),
        ("max_concurrent", 0, ValueError, r"\(max_concurrent=\.\.\.\) must be at least 1, got 0"),
        ("store", 42, TypeError, r"\(store=\.\.\.\) must be a path or a TaskStore, got int 42"),
    ],
)
def test_options_are_checked_with_one_wording(
    option: str, value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=r"^AsyncSubAgentExtension" + message):
        AsyncSubAgentExtension([quick()], runner=InProcessRunner(), **{option: value})  # type: ignore[arg-type]


# -- closing an agent releases its sessions ------------------------------------------------------


async def test_closing_a_client_releases_its_session_and_kills_its_running_child(
    beacons: Beacons,
) -> None:
    async with AsyncSubAgentExtension([announcing(beacons.path, "child")]) as extension:
        client = await create_agent(
            StepModel([start("child"), AssistantMessage("started")]),
            config=config("s"),
            extensions=[extension],
        )
        async with asyncio.timeout(HANG_GUARD):
            await client.run("go")
            pid = (await beacons.until("child"))["child"]
            [task] = extension.tasks("s")
            await until_running(task)
            assert task.status is SubAgentTaskStatus.RUNNING
            await client.close()
        # by the time close() returned, the child's process was gone and the session forgotten
        assert not alive(pid)
        assert task.status is SubAgentTaskStatus.CANCELLED
        assert extension.tasks("s") == ()
        with pytest.raises(ValueError, match="forgotten \\(the agent that ran it was closed\\)"):
            extension.get_task("s", task.task_id)
        await client.close()  # idempotent


async def test_a_shared_extension_keeps_the_sessions_another_open_agent_uses(
    beacons: Beacons,
) -> None:
    labels = ["a", "b", "shared"]
    extension = AsyncSubAgentExtension([announcing(beacons.path, label) for label in labels])

    def first_step(request: Any) -> AssistantMessage:
        asked = request.messages[0].content  # "list", or the profile to start
        return call("task_list") if asked == "list" else start(asked)

    model = StepModel([first_step, AssistantMessage("done")])
    first = Agent(model, extensions=[extension])
    second = Agent(model, extensions=[extension])
    async with extension, asyncio.timeout(HANG_GUARD):
        await first.run("a", config=config("a"))
        await second.run("b", config=config("b"))
        await first.run("shared", config=config("shared"))
        await second.run("list", config=config("shared"))  # the second agent uses it too
        pids = await beacons.until(*labels)
        await until_running(*(task for label in labels for task in extension.tasks(label)))

        await first.close()
        assert not alive(pids["a"]) and extension.tasks("a") == ()
        # the other agent's session, and the one it shares, run on
        assert alive(pids["b"]) and alive(pids["shared"])
        assert [t.status for t in extension.tasks("b")] == [SubAgentTaskStatus.RUNNING]
        assert [t.status for t in extension.tasks("shared")] == [SubAgentTaskStatus.RUNNING]

        await second.close()
        assert not alive(pids["b"]) and not alive(pids["shared"])
        assert extension.tasks("b") == () and extension.tasks("shared") == ()


async def test_a_request_of_a_closed_agent_can_start_no_task(beacons: Beacons) -> None:
    extension = AsyncSubAgentExtension([announcing(beacons.path, "child")])
    client: Any = None

    async def close_agent() -> str:
        await beacons.until("child")  # the first child runs
        await client.close()  # from inside its own request: the request goes on
        return "closed"

    model = StepModel(
        [start("child"), call("close_agent"), start("child"), AssistantMessage("went on")]
    )
    async with extension, asyncio.timeout(HANG_GUARD):
        client = await create_agent(
            model,
            config=config("s"),
            extensions=[extension],
            tools=[AgentTool("close_agent", "", {"type": "object", "properties": {}}, close_agent)],
        )
        answer = await client.run("go")
        pid = (await beacons.until("child"))["child"]
    assert answer.content == "went on"
    assert not alive(pid)
    refused = [m for m in model.requests[-1].messages if getattr(m, "name", "") == "task_start"][-1]
    assert refused.failed and "the agent is closed" in refused.text
    assert [t.status for t in extension.tasks("s")] == []  # released, nothing started after
