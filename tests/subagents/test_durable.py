"""Durable tasks: a child's steps journaled by its parent, and resumed after a death.

A child dies for real (it SIGKILLs its own process at a step the test chose, or the test kills
its host); each test then reads what the children did from their log (``support.durable_children``):
which steps the model was asked for, which tool calls ran and with which idempotency key, and
checks that no done step was repeated, that the resumed task's report is the one an
uninterrupted run gives, and what ``task_status`` says of the resumes and deaths.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from support.beacons import Beacons
from support.calls import call, final
from support.durable_children import (
    AFTER_EFFECT,
    BEFORE_EFFECT,
    IN_MODEL,
    BrokeredSteps,
    Compacts,
    Log,
    Steps,
    die_at,
    work_tool,
)
from support.parent import worker
from support.reaping import reap_adopted
from support.runners import make_runner, runner_params
from support.scripted_models import StepModel, tool_results
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import (
    AsyncSubAgentExtension,
    SubAgentTask,
    SubAgentTaskStatus,
    TaskStore,
)
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AgentMessage
from zett_agent.model import ModelRequest
from zett_agent.process import ProcessLimits, Sandbox
from zett_agent.process._sandbox._landlock import abi
from zett_agent.runners import InProcessRunner, ProcessRunner
from zett_agent.tools import AgentTool

HANG_GUARD = 60
HERE = Path(__file__).resolve().parent
#: the report of an uninterrupted run of ``Steps(..., 4)``
REPORT = "report: 4 steps, results did 0,did 1,did 2,did 3"


@pytest.fixture(params=runner_params("process", "in-process"))
def runner(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def definition(directory: Path, steps: int = 4, **fields: Any) -> SubAgentDefinition:
    return worker(
        Steps(str(directory), steps, fields.pop("beacons", "")),
        tools=[work_tool(str(directory))],
        max_turns=50,
        **fields,
    )


def durable(directory: Path, *definitions: SubAgentDefinition, **options: Any) -> Any:
    return AsyncSubAgentExtension(
        list(definitions) or [definition(directory)],
        store=directory / "tasks.sqlite",
        durable=True,
        **options,
    )


async def session(extension: AsyncSubAgentExtension, name: str = "parent") -> Any:
    """An open client of ``name`` that ran a request (the tests start tasks from code)."""
    client = await create_agent(
        StepModel([final()]), config=AgentRunConfig(session_id=name), extensions=[extension]
    )
    await client.run("hello")
    return client


async def start(extension: AsyncSubAgentExtension, client: Any, prompt: str = "go") -> SubAgentTask:
    context = client.agent._new_context(client.config, None)
    return await extension.start(
        context, extension.subagents[0], description="steps", prompt=prompt
    )


async def finished(extension: AsyncSubAgentExtension, task: SubAgentTask) -> SubAgentTask:
    async with asyncio.timeout(HANG_GUARD):
        await extension.wait(task)
    return task


def assert_once_each(log: Log, steps: int, *, again: tuple[int, ...] = ()) -> None:
    """The model was asked once per step and each tool ran once, but for ``again`` (tool
    calls that ran a second time, with the same idempotency key)."""
    assert log.model_steps() == list(range(steps + 1))
    expected = sorted([*range(steps), *again])
    assert sorted(log.tool_steps()) == expected
    for step in again:
        keys = {key for s, key, _ in log.tool if s == step}
        assert len(keys) == 1, f"step {step} ran again under another key: {keys}"


# -- options --------------------------------------------------------------------------------------


def test_durable_needs_a_store_and_task_resume_needs_durable(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"durable=True\) needs a store.*store='tasks.sqlite'"):
        AsyncSubAgentExtension(durable=True)
    with pytest.raises(ValueError, match=r"task_resume.*add durable=True \(and store=...\)"):
        AsyncSubAgentExtension(extra_tools=("task_resume",))
    with pytest.raises(ValueError, match=r"max_resumes=...\) must be"):
        AsyncSubAgentExtension(store=tmp_path / "s", durable=True, max_resumes=-1)
    with pytest.raises(TypeError, match=r"durable=...\) must be"):
        AsyncSubAgentExtension(store=tmp_path / "s", durable=1)  # type: ignore[arg-type]


# -- resuming after the child's death -------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "again"),
    [(BEFORE_EFFECT, ()), (AFTER_EFFECT, (2,)), (IN_MODEL, ())],
    ids=["before-the-tool's-effect", "after-the-tool's-effect", "in-the-model-call"],
)
async def test_a_child_that_dies_resumes_without_repeating_a_done_step(
    tmp_path: Path, where: str, again: tuple[int, ...]
) -> None:
    die_at(tmp_path, 2, where)
    async with durable(tmp_path) as extension:
        client = await session(extension)
        task = await finished(extension, await start(extension, client))
        assert (task.status, task.output) == (SubAgentTaskStatus.COMPLETED, REPORT)
        info = extension.task_info(task)
        assert info["resumes"] == 1
        assert info["deaths"] == [{"try": 1, "reason": "the child process was killed by SIGKILL"}]
        log = Log.read(tmp_path)
        # the response of step 2 was committed before its call started (unless the child
        # died in that model call): it is not asked for again; a call that had its effect
        # but no committed result runs again, with the same key
        assert_once_each(log, 4, again=again)
        assert len({pid for _, pid in log.model}) == 2
        await client.close()


async def test_max_resumes_bounds_the_resumes_and_each_death_is_listed(tmp_path: Path) -> None:
    die_at(tmp_path, 1, BEFORE_EFFECT, always=True)
    async with durable(tmp_path, max_resumes=2) as extension:
        client = await session(extension)
        task = await finished(extension, await start(extension, client))
        assert task.status is SubAgentTaskStatus.FAILED
        assert task.error == (
            "the child process was killed by SIGKILL (its child died 3 times: it was resumed "
            "max_resumes=2 times; each try's death is in deaths)"
        )
        info = extension.task_info(task)
        assert info["resumes"] == 2
        assert [d["try"] for d in info["deaths"]] == [1, 2, 3]
        assert Log.read(tmp_path).model_steps() == [0, 1]  # step 1 answered once: done
        await client.close()
    for name in ("off", "again"):
        (tmp_path / name).mkdir()
    die_at(tmp_path / "off", 1, BEFORE_EFFECT)
    async with durable(tmp_path / "off", max_resumes=0) as extension:
        client = await session(extension)
        task = await finished(extension, await start(extension, client))
        assert (task.status, task.error) == (
            SubAgentTaskStatus.FAILED,
            "the child process was killed by SIGKILL",
        )
        assert extension.task_info(task)["resumes"] == 0
        await client.close()


async def test_a_cancel_a_timeout_and_a_budget_stop_are_never_resumed(
    tmp_path: Path, beacons: Beacons
) -> None:
    blocking = definition(tmp_path, beacons=beacons.path)
    timed = definition(
        tmp_path, name="timed", beacons=beacons.path, limits=ProcessLimits(timeout=0.5)
    )
    costly = definition(tmp_path, name="costly", token_budget=20)
    (tmp_path / "block-1").touch()
    async with durable(tmp_path, blocking, timed, costly) as extension:
        client = await session(extension)
        context = client.agent._new_context(client.config, None)
        cancelled = await extension.start(context, blocking, description="c", prompt="go")
        await beacons.until("blocked")
        await extension.cancel(cancelled)
        (tmp_path / "block-1").touch()
        timeout = await extension.start(context, timed, description="t", prompt="go")
        await finished(extension, timeout)
        budget = await finished(
            extension, await extension.start(context, costly, description="b", prompt="go")
        )
        assert (cancelled.status, timeout.status, budget.status) == (
            SubAgentTaskStatus.CANCELLED,
            SubAgentTaskStatus.FAILED,
            SubAgentTaskStatus.FAILED,
        )
        assert "ran out of time" in (timeout.error or "")
        assert (budget.error or "").startswith("token budget exceeded")
        for task in (cancelled, timeout, budget):
            assert extension.task_info(task)["resumes"] == 0
            assert "deaths" not in extension.task_info(task)
        await client.close()


# -- a hostile child's journal --------------------------------------------------------------------


def _forger(kind: str) -> AgentTool:
    def forge() -> str:
        from zett_agent.process import emit

        message = {"role": "user", "content": "x"}
        if kind == "out of order":
            emit({"kind": "journal", "step": 99, "entry": {"m": message}})
        elif kind == "not an entry":
            emit({"kind": "journal", "step": 3, "entry": {"m": {"role": "wizard"}}})
        elif kind == "unknown keys":
            emit({"kind": "journal", "step": 3, "entry": {"m": message}, "x": 1})
        elif kind == "too large":
            big = {"role": "user", "content": "x" * (9 << 20)}
            emit({"kind": "journal", "step": 3, "entry": {"m": big}})
        elif kind == "too many":
            for step in range(3, 3 + 20):
                emit({"kind": "journal", "step": step, "entry": {"m": message}})
        import time

        time.sleep(60)  # the parent stops it first
        return "never"

    return AgentTool("forge", "Forge journal steps.", {"type": "object", "properties": {}}, forge)


FORGERIES = {
    "out of order": "step 99 came where step 3 was due",
    "not an entry": "m.role must be one of user, assistant, tool, agent",
    "unknown keys": "unknown keys ['x']",
    "too large": "larger than the 8388608 a step holds",
    "too many": "its journal went past its bound (10 steps",
}


@pytest.mark.parametrize("kind", FORGERIES)
async def test_journal_steps_a_hostile_child_forges_stop_only_its_own_task(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zett_agent.extensions._tasks import _task_journal

    monkeypatch.setattr(_task_journal, "MAX_STEPS", 10)
    forger = worker(StepModel([call("forge"), final()]), name="forger", tools=[_forger(kind)])
    honest = definition(tmp_path)
    async with durable(tmp_path, forger, honest) as extension:
        client = await session(extension)
        context = client.agent._new_context(client.config, None)
        bad = await extension.start(context, forger, description="f", prompt="go")
        good = await extension.start(context, honest, description="h", prompt="go")
        await finished(extension, bad)
        await finished(extension, good)
        assert bad.status is SubAgentTaskStatus.FAILED
        assert (bad.error or "").startswith(
            "the child sent a journal step the parent refused and was stopped: "
        ) or (bad.error or "").startswith("its journal went past its bound")
        assert FORGERIES[kind] in (bad.error or "")
        assert extension.task_info(bad)["resumes"] == 0  # a stop is never resumed
        assert (good.status, good.output) == (SubAgentTaskStatus.COMPLETED, REPORT)
        await client.close()


@pytest.mark.parametrize(
    "step", [1, 2], ids=["a-step-nobody-waits-for", "a-model-response-the-child-waits-for"]
)
async def test_a_journal_step_the_store_fails_to_write_stops_its_task(
    tmp_path: Path, step: int
) -> None:
    async with durable(tmp_path) as extension:
        client = await session(extension)
        # another connection makes the store's writes of that step fail from now on
        with contextlib.closing(sqlite3.connect(tmp_path / "tasks.sqlite")) as db:
            db.execute(
                f"CREATE TRIGGER full BEFORE INSERT ON journal WHEN NEW.step = {step} "
                "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
            )
            db.commit()
        task = await finished(extension, await start(extension, client))
        assert task.status is SubAgentTaskStatus.FAILED
        assert (task.error or "").startswith(
            "the task store could not write its journal, so it was stopped: task store "
        ), task.error
        assert "database or disk is full" in (task.error or "")
        assert extension.task_info(task)["resumes"] == 0  # a stop is never resumed
        # no model response was acknowledged after the failure, so no tool call ran
        assert Log.read(tmp_path).tool_steps() == []
        await client.close()


# -- suspended by close, resumed by the next extension --------------------------------------------


async def test_close_suspends_a_durable_task_and_the_next_extension_resumes_it(
    tmp_path: Path, beacons: Beacons, runner: str
) -> None:
    (tmp_path / "block-2").touch()
    blocked = definition(tmp_path, beacons=beacons.path)
    extension = durable(tmp_path, blocked, runner=make_runner(runner))
    async with extension:
        client = await session(extension)
        task = await start(extension, client)
        key = None
        await beacons.until("blocked")
        key = next(k for s, k, _ in Log.read(tmp_path).tool if s == 2)
    # closing ended it here (its child killed), and left it running in the store
    assert task.status is SubAgentTaskStatus.CANCELLED
    assert (task.error or "").startswith("suspended: the extension was closed")
    store = TaskStore(tmp_path / "tasks.sqlite")
    assert [t.status for t in store.tasks] == ["running"]
    store.close_now()

    again = durable(tmp_path, definition(tmp_path), runner=make_runner(runner))
    async with again:
        [resumed] = again.tasks("parent")
        assert resumed.status is SubAgentTaskStatus.RUNNING
        info = again.task_info(resumed)
        assert info["resumes"] == 1
        assert info["deaths"][-1]["reason"].startswith("the host stopped while the task ran")
        model = StepModel([final(), final()])
        parent = await create_agent(
            model, config=AgentRunConfig(session_id="parent"), extensions=[again]
        )
        async with asyncio.timeout(HANG_GUARD):
            await parent.run("back")
        notices = [m.content for m in model.requests[0].messages if isinstance(m, AgentMessage)]
        assert notices == [
            "Background task task-1 (worker: steps) resumed after a restart: it goes on from "
            "where it stopped (task_status shows its resumes)."
        ]
        await finished(again, resumed)
        assert (resumed.status, resumed.output) == (SubAgentTaskStatus.COMPLETED, REPORT)
        log = Log.read(tmp_path)
        # step 2's call had started, not finished: it ran again, under the same key
        assert_once_each(log, 4, again=(2,))
        assert {k for s, k, _ in log.tool if s == 2} == {key}
        async with asyncio.timeout(HANG_GUARD):
            await parent.run("once more")
        later = [m for m in model.requests[-1].messages if isinstance(m, AgentMessage)]
        assert [m.content.split(" (")[0] for m in later] == [
            "Background task task-1",  # the resume's notice, in the history
            "Background task task-1",  # the completion's, once
        ]
        await parent.close()


# -- resuming after the host's death --------------------------------------------------------------

HOST = textwrap.dedent(
    """
    import asyncio, sys
    sys.path[:0] = [{tests!r}]
    from support.durable_children import Steps, work_tool
    from support.calls import calls, final, task_start
    from support.parent import worker
    from support.scripted_models import StepModel
    from zett_agent.agent import AgentRunConfig
    from zett_agent.client import create_agent
    from zett_agent.extensions.async_subagent import AsyncSubAgentExtension

    async def main():
        steps = worker(
            Steps({directory!r}, 4, {beacons!r}), tools=[work_tool({directory!r})], max_turns=50
        )
        extension = AsyncSubAgentExtension(
            [steps], store={store!r}, durable=True
        )
        client = await create_agent(
            StepModel([calls(task_start("worker", "steps", "go")), final()]),
            config=AgentRunConfig(session_id="parent"), extensions=[extension],
        )
        await client.run("go")
        print("started", flush=True)
        await asyncio.Event().wait()  # until SIGKILLed

    asyncio.run(main())
    """
)


async def test_a_host_killed_by_sigkill_resumes_its_tasks_in_a_new_extension(
    tmp_path: Path, beacons: Beacons
) -> None:
    store = tmp_path / "tasks.sqlite"
    (tmp_path / "block-1").touch()
    program = HOST.format(
        tests=str(HERE.parent),
        directory=str(tmp_path),
        beacons=beacons.path,
        store=str(store),
    )
    host = await asyncio.create_subprocess_exec(sys.executable, "-c", program)
    try:
        await beacons.until("blocked")
    finally:
        host.send_signal(signal.SIGKILL)
        await host.wait()
    reap_adopted(within=HANG_GUARD)  # the host's pool and children die with it

    async with durable(tmp_path) as extension:
        [task] = extension.tasks("parent")
        assert (task.status, extension.task_info(task)["resumes"]) == (
            SubAgentTaskStatus.RUNNING,
            1,
        )
        client = await session(extension)  # its next request resumes it
        await finished(extension, task)
        assert (task.status, task.output) == (SubAgentTaskStatus.COMPLETED, REPORT)
        assert_once_each(Log.read(tmp_path), 4, again=(1,))
        await client.close()


# -- task_resume: a follow-up ---------------------------------------------------------------------


async def test_task_resume_continues_a_finished_task_with_its_conversation(
    tmp_path: Path, runner: str
) -> None:
    extension = durable(
        tmp_path, runner=make_runner(runner), extra_tools=("task_wait", "task_resume")
    )
    async with extension:

        def resume(request: ModelRequest) -> Any:
            [result] = json.loads(tool_results(request)[-1].text)["finished"]
            return call("task_resume", task_id=result["task_id"], prompt="and summarise it")

        def wait(request: ModelRequest) -> Any:
            task_id = json.loads(tool_results(request)[-1].text)["task_id"]
            return call("task_wait", task_ids=[task_id], wait_seconds=30)

        def check_running(request: ModelRequest) -> Any:
            info = json.loads(tool_results(request)[-1].text)
            assert (info["task_id"], info["status"]) == ("task-1", "pending")
            return call("task_wait", task_ids=["task-1"], wait_seconds=30)

        steps = [
            call("task_start", subagent_type="worker", description="steps", prompt="go"),
            wait,
            resume,
            check_running,
            final(),
        ]
        model = StepModel(steps)
        client = await create_agent(
            model, config=AgentRunConfig(session_id="parent"), extensions=[extension]
        )
        async with asyncio.timeout(HANG_GUARD):
            await client.run("go")
        [task] = extension.tasks("parent")
        assert task.output == f"{REPORT} | and summarise it"
        log = Log.read(tmp_path)
        assert log.model_steps() == [0, 1, 2, 3, 4, 4]  # the follow-up's one call
        assert sorted(log.tool_steps()) == [0, 1, 2, 3]  # nothing ran again
        finished_info = json.loads(tool_results(model.requests[-1])[-1].text)["finished"]
        assert [i["content"] for i in finished_info] == [task.output]
        # a running task, an unknown one: refused, saying why
        with pytest.raises(ValueError, match="is still running; task_resume continues a finished"):
            task.status = SubAgentTaskStatus.RUNNING
            try:
                await extension.resume(client.agent._new_context(client.config, None), task, "x")
            finally:
                task.status = SubAgentTaskStatus.COMPLETED
        await client.close()


# -- what a durable task needs --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["process", "in-process-uncopied"])
async def test_a_definition_that_cannot_be_pickled_is_refused_at_task_start(
    tmp_path: Path, kind: str
) -> None:
    # a local function holding a lock: neither importable (cloudpickle ships it by value)
    # nor picklable (the lock); an in-process runner that does not copy would not notice
    lock = threading.Lock()

    def locked() -> str:
        with lock:
            return "ok"

    holds_a_lock = worker(
        StepModel([final()]), tools=[AgentTool("locked", "L.", {"type": "object"}, locked)]
    )
    runner = make_runner("process") if kind == "process" else InProcessRunner(copy=False)
    extension = durable(tmp_path, holds_a_lock, runner=runner)
    async with extension:
        client = await session(extension)
        with pytest.raises(
            TypeError,
            match=r"cannot start a durable task of 'worker': tool .*must be picklable or "
            r"importable: keep locks, clients and connections out of it",
        ):
            await start(extension, client)
        assert extension.tasks("parent") == ()
        await client.close()


async def test_a_compacted_history_shrinks_the_journal_and_resumes_from_it(
    tmp_path: Path,
) -> None:
    compacting = definition(tmp_path, steps=8, extensions=(Compacts(after=3),))
    die_at(tmp_path, 6, BEFORE_EFFECT)
    async with durable(tmp_path, compacting) as extension:
        client = await session(extension)
        task = await finished(extension, await start(extension, client))
        assert task.status is SubAgentTaskStatus.COMPLETED, task.error
        assert task.output is not None and task.output.startswith("report: 8 steps")
        assert extension.task_info(task)["resumes"] == 1
        log = Log.read(tmp_path)
        assert log.model_steps() == list(range(9))
        assert sorted(log.tool_steps()) == list(range(8))
        assert task.durable is not None and task.durable.steps < 8
        await client.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "tasks.sqlite")) as db:
        [(rows, first)] = db.execute("SELECT count(*), min(step) FROM journal").fetchall()
    # the journal holds the steps since the last snapshot, the snapshot first
    assert task.durable is not None and rows == task.durable.steps and first > 1


# -- brokered model calls, in a sandbox or not ----------------------------------------------------

_ABI, _WHY = abi()


@pytest.mark.parametrize(
    "sandboxed",
    [
        False,
        pytest.param(
            True, marks=pytest.mark.skipif(_ABI < 6, reason=f"Landlock ABI {_ABI} < 6: {_WHY}")
        ),
    ],
    ids=["brokered", "sandboxed-and-brokered"],
)
async def test_a_brokered_childs_steps_resume_after_its_death(
    tmp_path: Path, sandboxed: bool
) -> None:
    die_at(tmp_path, 2, AFTER_EFFECT)
    sandbox = (
        Sandbox(write=[tmp_path], user=0 if os.geteuid() == 0 else None) if sandboxed else None
    )
    brokered = worker(
        BrokeredSteps(str(tmp_path), 4),
        tools=[work_tool(str(tmp_path))],
        max_turns=50,
        sandbox=sandbox,
    )
    # a sandboxed child is always brokered; the other asks its runner for it
    runner = ProcessRunner(broker=not sandboxed)
    async with runner, durable(tmp_path, brokered, runner=runner) as extension:
        client = await session(extension)
        task = await finished(extension, await start(extension, client))
        assert (task.status, task.output) == (SubAgentTaskStatus.COMPLETED, REPORT), task.error
        info = extension.task_info(task)
        assert info["resumes"] == 1
        assert info["deaths"] == [{"try": 1, "reason": "the child process was killed by SIGKILL"}]
        if sandboxed:
            assert info["sandbox"]["seccomp"] is True
        assert info["broker"]["calls"] == 2  # the second child's: steps 3 and 4
        log = Log.read(tmp_path)
        assert {pid for _, pid in log.model} == {os.getpid()}  # the parent made them all
        assert_once_each(log, 4, again=(2,))
        await client.close()
