"""The runners' own behaviour: what the process runner preloads, failure reasons that keep
their cause, and the runner interface both built-in runners implement."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import types
from collections.abc import Iterable, Iterator
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import pytest

from support.calls import call
from support.children import LOADED, PRIORITY, WHOAMI, AnnounceAndBlock
from support.reaping import reap_adopted
from support.scripted_models import StepModel
from support.scripted_models import ToolsThenAnswer as ChildModel
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions._preload import child_modules
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension, SubAgentTaskStatus
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.extensions.tool_guidelines import ToolGuidelinesExtension
from zett_agent.messages import AssistantMessage
from zett_agent.models.openai import OpenAIChatModel
from zett_agent.process import JobFailed, JobTimeout, LimitExceeded, ProcessError, WorkerCrashed
from zett_agent.process._host._pool import engine_of
from zett_agent.runners import DEFAULT_NICE, ChildJob, ChildRunner, InProcessRunner, ProcessRunner
from zett_agent.runners._preload import RUNTIME_MODULES
from zett_agent.runners._process import _BROKER_MODULES, warming
from zett_agent.runners._report import failure_reason
from zett_agent.tools import tool

HANG_GUARD = 60


def definition(model: Any, name: str = "w", **fields: Any) -> SubAgentDefinition:
    return SubAgentDefinition(name, "test profile", "child", model, **fields)


@tool
def shout(text: str) -> str:
    """Shout.

    Args:
        text: what to shout.
    """
    return text.upper()


# -- preloading the children's modules ------------------------------------------------------


def test_child_modules_are_found_in_models_tools_extensions_and_nested_definitions() -> None:
    class MainModel(ChildModel):
        pass

    MainModel.__module__ = "__main__"  # defined in a script: never preloaded
    nested = AsyncSubAgentExtension([definition(ChildModel("deep"), name="deep")])
    definitions = [
        definition(ChildModel("x"), tools=[WHOAMI, shout]),
        definition(None, name="inherits", extensions=[ToolGuidelinesExtension(), nested]),
        definition(MainModel("y"), name="main"),
    ]
    parent_model = OpenAIChatModel("gpt-4o-mini", api_key="unused")
    found = child_modules(definitions, parent_model, AsyncSubAgentExtension)
    assert "support.scripted_models" in found  # ChildModel's module (a model)
    assert "support.children" in found  # WHOAMI's handler (a tool)
    assert __name__ in found  # shout, through the tool decorator's wrapper
    assert "zett_agent.extensions._tool_guidelines" in found  # an extension's class
    assert "zett_agent.models._openai" in found  # the parent's model, for model=None
    assert "zett_agent.models._openai_preload" in found  # what OpenAIChatModel declares
    assert "zett_agent.extensions._async_subagent" in found  # the nested extension's class
    assert "__main__" not in found and not any(name.startswith("__main__") for name in found)


@pytest.fixture
def ghost_module() -> Iterator[str]:
    """A module the parent has (sys.modules) but no other process can import."""
    name = "zett_test_ghost_module"
    module = types.ModuleType(name)
    module.__spec__ = ModuleSpec(name, None)
    sys.modules[name] = module
    yield name
    del sys.modules[name]


async def test_the_launcher_preloads_them_except_those_excluded(
    ghost_module: str, caplog: pytest.LogCaptureFixture
) -> None:
    model = ChildModel("x")
    runner = ProcessRunner(preload_exclude=["support.children"])
    async with AsyncSubAgentExtension([definition(model, tools=[WHOAMI])], runner=runner) as ext:
        await _one_request(ext)
        assert warming(runner) is not None
        await warming(runner)
        assert runner.pool is not None
        preload = runner.pool.preload
    assert preload[: len(RUNTIME_MODULES)] == RUNTIME_MODULES
    assert "support.scripted_models" in preload
    assert "support.children" not in preload  # excluded: its import stays in the children


async def test_a_module_that_fails_in_the_launcher_falls_back_to_no_automatic_preload(
    ghost_module: str, caplog: pytest.LogCaptureFixture
) -> None:
    class Ghostly(ChildModel):
        pass

    Ghostly.__module__ = ghost_module
    runner = ProcessRunner()
    async with AsyncSubAgentExtension([definition(Ghostly("x"))], runner=runner) as extension:
        with caplog.at_level(logging.WARNING, logger="zett_agent.runners._process"):
            await _one_request(extension)
            assert warming(runner) is not None
            await warming(runner)
        assert runner.pool is not None
        assert runner.pool.preload == RUNTIME_MODULES
    [record] = [r for r in caplog.records if "preloading" in r.getMessage()]
    assert ghost_module in record.getMessage() and "preload_exclude" in record.getMessage()


@pytest.mark.parametrize("broker", [True, False], ids=["brokered-default", "unbrokered"])
async def test_an_explicit_preload_replaces_the_automatic_one(broker: bool) -> None:
    """The runner's own modules stay: the stand-in a brokered child runs on (by default)."""
    runner = ProcessRunner(preload=["json"], broker=broker)
    async with AsyncSubAgentExtension([definition(ChildModel("x"))], runner=runner) as extension:
        await _one_request(extension)
        assert warming(runner) is not None
        await warming(runner)
        assert runner.pool is not None
        own = _BROKER_MODULES if broker else ()
        assert runner.pool.preload == (*RUNTIME_MODULES, "json", *own)


async def test_entering_the_extension_boots_the_pool_before_any_request() -> None:
    runner = ProcessRunner()
    async with AsyncSubAgentExtension([definition(ChildModel("x"))], runner=runner):
        booting = warming(runner)
        assert booting is not None  # started by ``async with``, no agent yet
        await booting
        assert runner.pool is not None and runner.pool.preload[: len(RUNTIME_MODULES)] == (
            RUNTIME_MODULES
        )


async def test_a_definition_without_a_model_waits_for_the_parents_model() -> None:
    runner = ProcessRunner()
    async with AsyncSubAgentExtension([definition(None)], runner=runner):
        assert warming(runner) is None  # what the children import depends on it


# -- warming up the models a brokering runner calls in the parent ---------------------------


@pytest.mark.parametrize("broker", [True, False], ids=["brokered-default", "unbrokered"])
async def test_a_brokering_runner_warms_up_its_childrens_models_in_the_parent_once_per_class(
    broker: bool,
) -> None:
    """What a model's first call does once (an SDK's import) is done as the extension opens,
    in the process that will make the calls: the parent, only when it brokers them."""

    class Warmed(ChildModel):
        brokerable = True
        warmed_in: list[int] = []

        async def warm_up(self) -> None:
            self.warmed_in.append(os.getpid())

    runner = ProcessRunner(broker=broker)
    definitions = [definition(Warmed("a")), definition(Warmed("b"), name="v")]
    async with AsyncSubAgentExtension(definitions, runner=runner) as extension:
        booting = warming(runner)
        assert booting is not None
        await booting  # the pool's start and the models' warm-up
        assert Warmed.warmed_in == ([os.getpid()] if broker else [])
        await _one_request(extension, start=True)  # each start tells the runner again
    assert Warmed.warmed_in == ([os.getpid()] if broker else [])


async def test_the_parents_own_model_is_warmed_up_at_its_first_request() -> None:
    """A definition with ``model=None`` uses the parent's model, known at its first request."""

    class WarmedParent(StepModel):
        brokerable = True
        warmed = 0

        async def warm_up(self) -> None:
            type(self).warmed += 1

    runner = ProcessRunner()
    async with AsyncSubAgentExtension([definition(None)], runner=runner) as extension:
        assert warming(runner) is None
        client = await create_agent(
            WarmedParent([AssistantMessage("idle")]),
            config=AgentRunConfig(session_id="s"),
            extensions=[extension],
        )
        async with client, asyncio.timeout(HANG_GUARD):
            await client.run("go")
        booting = warming(runner)
        assert booting is not None
        await booting
        assert WarmedParent.warmed == 1


async def test_a_subclass_that_overrides_warm_up_is_called_as_any_runner() -> None:
    """``warm_up(modules)``, the ``ChildRunner`` signature: no ``models=`` it does not take."""

    class Counting(ProcessRunner):
        calls: list[tuple[str, ...]] = []

        def warm_up(self, modules: Iterable[str] = ()) -> None:
            self.calls.append(tuple(modules))
            super().warm_up(modules)

    class Warmed(ChildModel):
        brokerable = True
        warmed = 0

        async def warm_up(self) -> None:
            type(self).warmed += 1

    runner = Counting()
    async with AsyncSubAgentExtension([definition(Warmed("fine"))], runner=runner) as ext:
        [task] = await _one_request(ext, start=True)
    assert task.status is SubAgentTaskStatus.COMPLETED, task.error
    # brokered: the children import the stand-in, not the model's module
    assert Counting.calls and all(
        "zett_agent.runners._broker._standin" in m for m in Counting.calls
    )
    assert Warmed.warmed == 0  # its own warm_up does not take models: none are warmed


async def test_a_model_whose_warm_up_hangs_does_not_hold_the_close() -> None:
    """A warm-up is only ahead of time: closing cancels one still under way."""
    started = asyncio.Event()
    cancelled = asyncio.Event()

    class Hanging(ChildModel):
        brokerable = True

        async def warm_up(self) -> None:
            started.set()
            try:
                await asyncio.Event().wait()  # never set
            except asyncio.CancelledError:
                cancelled.set()
                raise

    async with asyncio.timeout(HANG_GUARD):
        async with AsyncSubAgentExtension([definition(Hanging("x"))], runner=ProcessRunner()):
            await started.wait()
    assert cancelled.is_set()


async def test_a_model_whose_warm_up_fails_still_serves_the_first_child() -> None:
    """The warm-up is ahead of time only: its failure is left for the first call to report
    (here that call does not need what failed, so it succeeds)."""

    class Unwarmable(ChildModel):
        brokerable = True

        async def warm_up(self) -> None:
            raise OSError("no CA bundle here")

    runner = ProcessRunner()
    async with AsyncSubAgentExtension([definition(Unwarmable("fine"))], runner=runner) as ext:
        booting = warming(runner)
        assert booting is not None
        await booting  # raises nothing
        [task] = await _one_request(ext, start=True)
    assert task.status is SubAgentTaskStatus.COMPLETED, task.error
    assert task.output == "fine"


#: modules of the parent's side that a child never needs
HOST_SIDE = (
    "zett_agent.runners._process",
    "zett_agent.process._host._pool",
    "zett_agent.extensions._tasks._store",
    "zett_agent.extensions._async_subagent",
    "psutil",
    "sqlite3",
)


async def test_a_child_imports_none_of_the_parents_side() -> None:
    """A child (and its launcher, which it was forked from) holds the runtime, not the
    runners', the engine's or the task store's host sides."""
    model = ChildModel("{last}", [("loaded", {"names": ",".join(HOST_SIDE)})])
    async with AsyncSubAgentExtension([definition(model, tools=[LOADED])]) as extension:
        [task] = await _one_request(extension, start=True)
        assert task.status is SubAgentTaskStatus.COMPLETED, task.error
        assert task.output == ""


@pytest.mark.parametrize("nice", [None, 0, 3])
async def test_children_run_behind_the_parent_unless_told_otherwise(nice: int | None) -> None:
    """A process child and its session run at ``DEFAULT_NICE`` (10) above the parent by
    default: where they want the parent's core, its event loop goes first. ``nice=`` sets
    both; 0 keeps them the parent's equals."""
    model = ChildModel("{last}", [("priority", {})])
    runner = ProcessRunner() if nice is None else ProcessRunner(nice=nice)
    async with AsyncSubAgentExtension([definition(model, tools=[PRIORITY])], runner=runner) as ext:
        [task] = await _one_request(ext, start=True)
    assert task.status is SubAgentTaskStatus.COMPLETED, task.error
    want = DEFAULT_NICE if nice is None else nice
    assert json.loads(task.output) == [min(19, os.nice(0) + want), want]


async def _one_request(extension: AsyncSubAgentExtension, *, start: bool = False) -> list[Any]:
    """One request of a parent; with ``start``, it starts a child of ``w`` and reads its
    report. Returns the session's tasks (as they were before its agent closed)."""
    steps: list[Any] = [AssistantMessage("idle")]
    if start:
        steps = [
            call("task_start", subagent_type="w", description="d", prompt="p"),
            call("task_output", task_id="task-1", wait_seconds=HANG_GUARD),
            *steps,
        ]
    client = await create_agent(
        StepModel(steps),
        config=AgentRunConfig(session_id="s"),
        extensions=[extension],
    )
    async with client, asyncio.timeout(HANG_GUARD):
        await client.run("go")
        return list(extension.tasks("s"))


# -- failure reasons keep their cause ----------------------------------------------------------


def test_a_crash_whose_cause_is_the_launcher_names_the_cause_in_one_line() -> None:
    crashed = WorkerCrashed(None, None)
    crashed.__cause__ = ProcessError(
        "the pool's launcher process died unexpectedly (exit status -9); create a new ProcessPool"
    )
    reason = failure_reason(crashed)
    assert "exited with code None" not in reason and "\n" not in reason
    assert reason == (
        "the child process was lost before reporting (its exit status is unknown): the pool's "
        "launcher process died unexpectedly (exit status -9); create a new ProcessPool"
    )


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (WorkerCrashed(7, None), "the child process exited with code 7 before reporting"),
        (WorkerCrashed(None, "SIGSEGV"), "the child process was killed by SIGSEGV"),
        (JobFailed("ValueError", "bad\nthing"), "the child agent raised ValueError: bad thing"),
        (JobTimeout(2.5), "the child ran out of time (timeout=2.5s)"),
        (
            LimitExceeded("memory_bytes", 512 * 2**20, 18_180_000),
            "the child hit its memory_bytes limit of 512 MiB (address space, which counts more "
            "than resident memory; peak resident memory 17.3 MiB)",
        ),
        (
            LimitExceeded("cpu_seconds", 1, 1.02),
            "the child hit its cpu_seconds limit of 1 s of CPU time, used 1.02 s",
        ),
    ],
)
def test_failure_reasons_are_one_actionable_line(error: BaseException, reason: str) -> None:
    assert failure_reason(error) == reason


async def test_a_child_lost_with_its_launcher_says_so(tmp_path: Path) -> None:
    """A real crash: the pool's launcher is SIGKILLed while a child runs. The task fails naming
    that cause in one line; the next task still gets a process."""
    path = str(tmp_path / "beacons")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as beacons:
        beacons.bind(path)
        beacons.setblocking(False)
        extension = AsyncSubAgentExtension([definition(AnnounceAndBlock(path, "up"))])
        async with extension:
            client = await create_agent(
                StepModel(
                    [
                        call("task_start", subagent_type="w", description="d", prompt="p"),
                        AssistantMessage("started"),
                        call("task_start", subagent_type="w", description="d", prompt="p"),
                        AssistantMessage("started again"),
                    ]
                ),
                config=AgentRunConfig(session_id="s"),
                extensions=[extension],
            )
            async with client, asyncio.timeout(HANG_GUARD):
                await client.run("go")
                await asyncio.get_running_loop().sock_recv(beacons, 64)  # the child runs
                pool = extension.runner.pool  # type: ignore[attr-defined]
                os.kill(engine_of(pool).launcher.pid, signal.SIGKILL)
                [task] = extension.tasks("s")
                await extension.wait(task)
                # the extension goes on: the next task gets a process (a new pool, or a new
                # launcher of the same pool, whichever the engine does)
                await client.run("again")
                await asyncio.get_running_loop().sock_recv(beacons, 64)
                second = extension.tasks("s")[-1]
                assert second is not task and not second.done()
    assert second.status is SubAgentTaskStatus.CANCELLED  # by close()
    reap_adopted()  # the killed launcher's worker, killed in turn, was reparented here
    assert task.status is SubAgentTaskStatus.FAILED
    assert task.error is not None and "\n" not in task.error
    assert task.error.startswith("the child process was lost before reporting")
    assert "launcher process" in task.error and "code None" not in task.error


# -- the runner interface ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "runner", [ProcessRunner(), InProcessRunner()], ids=["process", "in-process"]
)
def test_both_runners_implement_the_interface(runner: Any) -> None:
    assert isinstance(runner, ChildRunner)


async def test_jobs_of_both_runners_implement_the_interface() -> None:
    from zett_agent.runners import ChildSpec

    spec = ChildSpec(definition(ChildModel("hi")), ChildModel("hi"), "s/t", "p")
    for runner in (ProcessRunner(), InProcessRunner()):
        async with runner:
            job = await runner.submit(spec)
            assert isinstance(job, ChildJob)
            events = [event async for event in job.events()]
            await job.wait()
            assert job.done() and job.exception() is None
            assert job.result()["content"] == "hi"
            assert events[0] == {"kind": "started"} and job.info() == {}
            assert job.usage().elapsed >= 0


async def test_the_foreground_extension_takes_a_runner_too() -> None:
    from zett_agent.extensions.subagent import SubAgentExtension

    model = StepModel(
        [call("subagent", subagent_type="w", description="d", prompt="p"), AssistantMessage("ok")]
    )
    async with SubAgentExtension(
        [definition(ChildModel("in pid {pid}"))], runner=InProcessRunner()
    ) as extension:
        client = await create_agent(
            model, config=AgentRunConfig(session_id="s"), extensions=[extension]
        )
        async with client, asyncio.timeout(HANG_GUARD):
            await client.run("go")
    [result] = [m for m in model.requests[-1].messages if getattr(m, "call_id", None)]
    assert result.text == f"in pid {os.getpid()}"  # ran as a task of this very process


def test_the_extensions_module_a_shipped_subclass_makes_a_child_import_is_light() -> None:
    """A definition built by a subclass's ``_create_child`` ships the class by reference: the
    child imports its module, and with it ``extensions._subagent``, which must not bring the
    process runner's host side, the engine's pool or psutil."""
    heavy = ("zett_agent.runners._process", "zett_agent.process._host._pool", "psutil")
    probe = (
        "import sys, zett_agent.extensions._subagent\n"
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_counts_tokens_agrees_with_the_protocol_for_each_kind_of_job() -> None:
    from zett_agent.runners._base import CountsTokens, counts_tokens
    from zett_agent.runners._inprocess import InProcessJob
    from zett_agent.runners._process import ProcessChildJob
    from zett_agent.runners._refused import RefusedJob

    for kind in (ProcessChildJob, InProcessJob, RefusedJob):
        job = object.__new__(kind)  # the class decides: no job needs to run
        assert counts_tokens(job) is isinstance(job, CountsTokens)
        assert counts_tokens(job) is isinstance(job, CountsTokens)  # and again, remembered
    assert counts_tokens(object.__new__(ProcessChildJob))
    assert not counts_tokens(object.__new__(InProcessJob))
