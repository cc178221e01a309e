"""The subagent contract, the way its users write it: subclasses with state, the
wake-up pattern, every admitted task running at once, an atomic ``max_concurrent``, a bounded
registry, children that start children, warm children, and the runners: each test taking
``runner`` holds for every kind of ``support.runners``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest
from _contract_children import Orchestrator, metrics

from support.beacons import Beacons
from support.calls import call, final, read_output, starts
from support.children import AnnounceAndBlock, BlockingModel, GateModel
from support.liveness import gone
from support.parent import run_parent, worker
from support.reaping import reap_adopted
from support.runners import make_runner, runner_params
from support.scripted_models import StepModel, last_json, tool_results
from support.scripted_models import ToolsThenAnswer as ChildModel
from support.scripts import run_python
from zett_agent.agent import Agent, AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.events import InternalMessageEvent
from zett_agent.extensions._async_subagent import task_registry
from zett_agent.extensions._subagent import child_core
from zett_agent.extensions.async_subagent import (
    AsyncSubAgentExtension,
    SubAgentTask,
    SubAgentTaskStatus,
)
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AgentMessage, AssistantMessage
from zett_agent.model import Model, ModelRequest
from zett_agent.process import ProcessLimits, ProcessPool
from zett_agent.runners import InProcessRunner, ProcessRunner
from zett_agent.tools import AgentTool

HANG_GUARD = 60


@pytest.fixture(params=runner_params())
def runner(request: pytest.FixtureRequest) -> str:
    """The contract holds whatever runs the children: each kind of ``support.runners``."""
    return str(request.param)


def notices(request: ModelRequest) -> list[str]:
    return [m.content for m in request.messages if isinstance(m, AgentMessage)]


# -- the extension object never travels: subclasses with real state ------------------------


class TerseNotices(AsyncSubAgentExtension):
    """A subclass as users write it: ``metrics`` is a module global with a lock."""

    def build_tools(self, context: Any, subagents: Any) -> tuple[AgentTool, ...]:
        # Drop cancellation for this deployment.
        return tuple(t for t in super().build_tools(context, subagents) if t.name != "task_cancel")

    def completion_notice(self, task: SubAgentTask) -> str | None:
        return f"{task.task_id} is {task.status.value}."

    async def task_finished(self, task: SubAgentTask) -> None:
        metrics.record(task.subagent_type, task.elapsed)


async def test_a_subclass_with_terse_notices_and_a_metrics_lock_keeps_its_state_in_the_parent(
    tmp_path: Path, runner: str
) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    before = len(metrics.records)
    extension = TerseNotices([worker(GateModel(str(gate)))], runner=make_runner(runner))
    extension.metrics = metrics  # state on self too: a lock the parent keeps  # type: ignore[attr-defined]
    model = StepModel([starts(1), final(), final()])
    async with extension:
        client = await create_agent(
            model, config=AgentRunConfig(session_id="parent"), extensions=[extension]
        )
        async with client, asyncio.timeout(HANG_GUARD):
            await client.run("first")
            [task] = extension.tasks("parent")
            await asyncio.to_thread(gate.write_bytes, b"go")
            assert task.watcher is not None
            await task.watcher  # settled, and task_finished ran
            await client.run("second")
    assert task.status is SubAgentTaskStatus.COMPLETED and task.output == "released"
    assert metrics.records[before:] == [("worker", task.elapsed)]
    assert notices(model.requests[2]) == ["task-1 is completed."]
    assert {spec.name for spec in model.requests[0].tools} == {
        "task_start",
        "task_list",
        "task_status",
        "task_output",
    }


class WakeParent(AsyncSubAgentExtension):
    """The API reference's wake-up: ``task_finished`` publishes an ``InternalMessageEvent``
    through a client kept on ``self``."""

    client: Any = None

    async def task_finished(self, task: SubAgentTask) -> None:
        await self.client.publish(
            InternalMessageEvent(task.parent_session_id, f"{task.task_id} finished", "tasks")
        )


async def test_task_finished_wakes_an_idle_parent_through_a_client_on_self(
    tmp_path: Path, runner: str
) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    model = StepModel([starts(1), final("started"), final("woken")])
    extension = WakeParent([worker(GateModel(str(gate), "report"))], runner=make_runner(runner))
    async with extension:
        client = await create_agent(
            model, config=AgentRunConfig(session_id="parent"), extensions=[extension]
        )
        extension.client = client  # an object holding futures, locks and the agent itself
        async with client, asyncio.timeout(HANG_GUARD):
            assert (await client.run("start it")).content == "started"
            [task] = extension.tasks("parent")
            await asyncio.to_thread(gate.write_bytes, b"go")
            assert task.watcher is not None
            await task.watcher  # task_finished published the event
            await client.wait_idle()  # the request it started
    assert task.status is SubAgentTaskStatus.COMPLETED
    woken = model.requests[-1]
    assert [m.content for m in woken.messages if isinstance(m, AgentMessage)][-1] == (
        "task-1 finished"
    )
    assert len(model.requests) == 3


MAIN_WAKE = textwrap.dedent(
    """
    import asyncio, os, sys, threading
    from zett_agent.agent import AgentRunConfig
    from zett_agent.client import create_agent
    from zett_agent.events import InternalMessageEvent
    from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
    from zett_agent.extensions.subagent import SubAgentDefinition
    from zett_agent.messages import AgentMessage, AssistantMessage, ToolCall, ToolMessage
    from zett_agent.testing import FunctionModel

    CLIENT = None                  # the wake-up client, a __main__ global
    LOCK = threading.Lock()        # and more unpicklable __main__ state
    woken = asyncio.Event()

    class Wake(AsyncSubAgentExtension):
        async def task_finished(self, task):
            with LOCK:
                text = "done: " + task.output
            await CLIENT.publish(InternalMessageEvent(task.parent_session_id, text))

    class Confined(AsyncSubAgentExtension):
        # overrides _create_child, so the class itself travels (by value: it lives in __main__);
        # the client it wakes the parent with is on self, which never travels
        def child_state(self):
            return {"tag": self.tag}

        def _create_child(self, definition, *, model, session_id):
            agent = super()._create_child(definition, model=model, session_id=session_id)
            agent._system_prompt = self.tag
            return agent

        async def task_finished(self, task):
            await self.client.publish(InternalMessageEvent(task.parent_session_id, "done"))

    class ConfinedWake(Wake):
        # overrides _create_child too, but its class uses __main__'s LOCK: it cannot travel
        def _create_child(self, definition, *, model, session_id):
            return super()._create_child(definition, model=model, session_id=session_id)

    def parent(request):
        last = request.messages[-1]
        if isinstance(last, AgentMessage):
            woken.set()
            return "woken by " + last.content
        if isinstance(last, ToolMessage) and last.failed:
            woken.set()
            return "refused: " + last.text
        if len(request.messages) == 1:
            args = {"subagent_type": "w", "description": "d", "prompt": "p"}
            return AssistantMessage(tool_calls=(ToolCall("1", "task_start", args),))
        return "started"

    async def main(cls):
        global CLIENT
        child = FunctionModel(lambda r: f"{r.system_prompt} {os.getpid()}")
        ext = cls([SubAgentDefinition("w", "child", "sys", model=child)])
        ext.tag = "confined"
        async with ext:
            config = AgentRunConfig(session_id="s")
            CLIENT = ext.client = await create_agent(
                FunctionModel(parent), config=config, extensions=[ext]
            )
            print((await CLIENT.run("go")).content, flush=True)
            await asyncio.wait_for(woken.wait(), 60)
            await CLIENT.wait_idle()
            for task in ext.tasks("s"):
                words = task.output.split()
                print(words[0], int(words[-1]) != os.getpid(), flush=True)
            await CLIENT.close()

    variants = {"wake": Wake, "confined": Confined, "confined_wake": ConfinedWake}
    asyncio.run(main(variants[sys.argv[1]]))
    """
)


@pytest.mark.parametrize("variant", ["wake", "confined", "confined_wake"])
def test_main_globals_with_locks_and_a_main_subclass_overriding_create_child(
    tmp_path: Path, variant: str
) -> None:
    script = tmp_path / "host.py"
    script.write_text(MAIN_WAKE)
    out = subprocess.run(
        [sys.executable, str(script), variant],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    if variant == "wake":  # the wake-up pattern: nothing of the subclass travels
        assert lines == ["started", "sys True"], out.stdout
    elif variant == "confined":  # the class travels by value; _create_child ran in the child
        assert lines == ["started", "confined True"], out.stdout
    else:  # the class must travel but cannot: task_start says exactly why
        [refused] = lines
        assert "TypeError: cannot start a child of 'w': the extension class" in refused
        assert "ConfinedWake (sent because it overrides _create_child)" in refused
        assert "through the global 'LOCK' used by Wake.task_finished" in refused
        assert "importable module" in refused


# -- where _create_child runs, and what self is there ---------------------------------------


class Tagged(AsyncSubAgentExtension):
    def __init__(self, *args: Any, tag: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tag = tag
        self.lock = threading.Lock()  # parent-only state: never needed, never shipped

    def child_state(self) -> dict[str, Any]:
        return {"tag": self.tag}

    def _create_child(
        self, definition: SubAgentDefinition, *, model: Model, session_id: str
    ) -> Agent:
        seen = sorted(vars(self))  # what self holds in the child
        prompt = f"{self.tag} pid={os.getpid()} attrs={','.join(seen)} session={session_id}"
        return Agent(model, system_prompt=prompt)


async def test_create_child_runs_in_the_child_on_an_instance_holding_only_child_state() -> None:
    async with Tagged([worker(ChildModel("{system}"))], tag="blue") as extension:
        await run_parent(
            extension,
            [
                starts(1),
                read_output,
                final(),
            ],
        )
        [task] = extension.tasks("parent")
    assert task.status is SubAgentTaskStatus.COMPLETED, task.error
    tag, pid, attrs, session = (task.output or "").split()
    assert tag == "blue" and int(pid.split("=")[1]) != os.getpid()
    assert attrs == "attrs=tag" and session == "session=parent/task-1"


async def test_an_unpicklable_definition_fails_task_start_naming_the_culprit(runner: str) -> None:
    class LockedModel(ChildModel):
        def __init__(self) -> None:
            super().__init__("never")
            self.lock = threading.Lock()

    async with AsyncSubAgentExtension(
        [worker(LockedModel(), name="locked")], runner=make_runner(runner)
    ) as extension:
        _, model = await run_parent(
            extension,
            [call("task_start", subagent_type="locked", description="d", prompt="p"), final()],
        )
        assert extension.tasks("parent") == ()
    [refused] = tool_results(model.requests[-1])
    assert refused.failed
    assert "the model of definition 'locked' (LockedModel) cannot be pickled" in refused.text
    assert "_thread.lock" in refused.text


# -- every admitted task runs at once; sessions never wait for each other --------------------


async def test_every_admitted_task_runs_at_once_whatever_the_core_count(
    beacons: Beacons, tmp_path: Path
) -> None:
    n = 2 * (os.cpu_count() or 2) + 2  # more than the cores, and than the old default pool
    labels = [f"c{i}" for i in range(n)]
    definitions = [worker(AnnounceAndBlock(beacons.path, label), name=label) for label in labels]
    async with AsyncSubAgentExtension(definitions, max_concurrent=n) as extension:
        steps = [
            AssistantMessage(
                tool_calls=tuple(
                    call(
                        "task_start", subagent_type=label, description=label, prompt="p"
                    ).tool_calls[0]
                    for label in labels
                )
            ),
            final(),
        ]
        await run_parent(extension, steps)
        pids = await beacons.until(*labels)  # all n children run at the same time
        assert len(set(pids.values())) == n
        assert not any(t.done() for t in extension.tasks("parent"))  # none ended to make room


async def test_a_third_sessions_short_task_is_not_delayed_by_two_long_ones(
    beacons: Beacons, tmp_path: Path
) -> None:
    long_runner = worker(AnnounceAndBlock(beacons.path, "long"), name="long")
    short = worker(ChildModel("short done"), name="short")
    async with AsyncSubAgentExtension([long_runner, short], max_concurrent=4) as extension:

        async def long_session(session: str) -> None:
            await run_parent(
                extension,
                [call("task_start", subagent_type="long", description="l", prompt="p"), final()],
                session_id=session,
            )

        await long_session("alice")
        await beacons.until("long")
        beacons.seen.clear()
        await long_session("bob")
        await beacons.until("long")
        # both long tasks still run (they block until killed); carol's task completes anyway
        await run_parent(
            extension,
            [
                call("task_start", subagent_type="short", description="s", prompt="p"),
                lambda r: call(
                    "task_output", task_id=last_json(r)["task_id"], wait_seconds=HANG_GUARD
                ),
                final(),
            ],
            session_id="carol",
        )
        [carol] = extension.tasks("carol")
        assert carol.status is SubAgentTaskStatus.COMPLETED and carol.output == "short done"
        for session in ("alice", "bob"):
            [long_task] = extension.tasks(session)
            assert long_task.status is SubAgentTaskStatus.RUNNING


async def test_a_task_waiting_for_a_process_says_so(beacons: Beacons) -> None:
    definition = worker(AnnounceAndBlock(beacons.path, "running"))

    async def until_running() -> str:
        await beacons.until("running")  # one child holds the only process
        return "running"

    waiter = AgentTool("until_running", "", {"type": "object", "properties": {}}, until_running)
    async with AsyncSubAgentExtension([definition], max_concurrent=2, max_children=1) as extension:
        _, model = await run_parent(
            extension,
            [starts(2), call("until_running"), call("task_list"), final()],
            tools=(waiter,),
        )
        [first, second] = json.loads(tool_results(model.requests[-1])[-1].text)["tasks"]
        assert (first["status"], second["status"]) == ("running", "pending")
        assert "waiting" not in first
        assert second["waiting"] == "waiting for a process: 1 of 1 in use"
        running, queued = extension.tasks("parent")
        beacons.seen.clear()
        await extension.cancel(running)  # the waiting one gets the process
        await beacons.until("running")
        assert "waiting" not in extension.task_info(queued)
        assert extension.task_info(queued)["status"] == "running"


# -- max_concurrent is atomic --------------------------------------------------------------


async def test_six_parallel_starts_on_a_cold_extension_start_exactly_max_concurrent(
    runner: str,
) -> None:
    async with AsyncSubAgentExtension(
        [worker(BlockingModel())], max_concurrent=2, runner=make_runner(runner)
    ) as extension:
        _, model = await run_parent(extension, [starts(6), final()])
        results = tool_results(model.requests[-1])
        started = [r for r in results if not r.failed]
        refused = [r for r in results if r.failed]
        assert len(started) == 2 and len(refused) == 4
        assert all("max_concurrent=2" in r.text for r in refused)
        assert len(extension.tasks("parent")) == 2


# -- max_retained is a bound at all times; notices never point at nothing -------------------


async def test_an_app_calling_start_directly_never_holds_more_than_max_retained(
    runner: str,
) -> None:
    retained = 3
    extension = AsyncSubAgentExtension(
        [worker(ChildModel("report " + "x" * 3000))],
        max_retained=retained,
        max_concurrent=1,
        runner=make_runner(runner),
    )
    model = StepModel([final("idle")])
    client = await create_agent(
        model, config=AgentRunConfig(session_id="app"), extensions=[extension]
    )
    async with extension, client, asyncio.timeout(HANG_GUARD):
        await client.run("once")  # gives the app a context; the session then stays idle
        context = _context_of(client)
        for _ in range(25):
            task = await extension.start(
                context, extension.definition("worker"), description="d", prompt="p"
            )
            await extension.wait(task)
            kept = extension.tasks("app")
            assert len(kept) <= retained and all(t.done() for t in kept)
        session = task_registry(extension).sessions["app"]
        assert len(session.due) <= retained + max(retained, 16)  # kept tasks + short notices
        await client.run("now announce")
    announced = notices(model.requests[-1])
    # 25 completions: the ones still kept point at task_output, the others carry their report
    # (cut short), and those beyond the bound on owed notices are counted, each exactly once
    counted = [n for n in announced if "earlier background tasks finished" in n]
    described = [n for n in announced if n.startswith("Background task")]
    dropped = int(counted[0].split()[0]) if counted else 0
    assert len(described) + dropped == 25
    readable = [n for n in described if n.endswith("Read its report with task_output.")]
    assert len(readable) == retained
    for notice in described:
        if notice not in readable:
            assert (
                "can no longer be read with task_output, cut to 2000 of 3007 characters" in notice
            )
            assert notice.endswith("x [...]")


def _context_of(client: Any) -> Any:
    """A context of the app's session (what an extension hook would hand the app)."""
    agent = client.agent
    return agent._new_context(client.config, None)


async def test_a_forgotten_task_is_announced_once_and_never_as_readable(
    tmp_path: Path, runner: str
) -> None:
    gates = [tmp_path / f"gate{i}" for i in range(3)]
    for gate in gates:
        os.mkfifo(gate)
    definitions = [worker(GateModel(str(g), "ok"), name=f"g{i}") for i, g in enumerate(gates)]
    extension = AsyncSubAgentExtension(definitions, max_retained=1, runner=make_runner(runner))

    async def release_all() -> str:
        # all three finish within this one tool call: two are forgotten before any notice
        for gate in gates:
            await asyncio.to_thread(gate.write_bytes, b"go")
        await asyncio.gather(*(t.settled.wait() for t in extension.tasks("parent")))
        return "all finished"

    three = AssistantMessage(
        tool_calls=tuple(
            call("task_start", subagent_type=f"g{i}", description=f"t{i}", prompt="p").tool_calls[0]
            for i in range(3)
        )
    )
    model = StepModel([three, call("release_all"), call("task_output", task_id="task-1"), final()])
    async with extension:
        client = await create_agent(
            model,
            config=AgentRunConfig(session_id="parent"),
            extensions=[extension],
            tools=(
                AgentTool("release_all", "", {"type": "object", "properties": {}}, release_all),
            ),
        )
        async with client, asyncio.timeout(HANG_GUARD):
            await client.run("go")
            kept = {t.task_id for t in extension.tasks("parent")}
    announced = notices(model.requests[-1])
    assert sorted(n.split()[2] for n in announced) == ["task-1", "task-2", "task-3"]
    assert notices(model.requests[2]) == announced  # all three arrived at once, each once
    assert len(kept) == 1
    for text in announced:
        if text.split()[2] in kept:  # still readable: the notice points at task_output
            assert text.endswith("Read its report with task_output.")
        else:  # forgotten before it was announced: the notice carries the report instead
            assert "can no longer be read with task_output" in text and text.endswith(":\nok")
    read = tool_results(model.requests[-1])[-1]  # task_output of task-1
    if "task-1" in kept:
        assert not read.failed
    else:  # a forgotten task is reported as evicted, not unknown
        assert read.failed and "evicted" in read.text


# -- children that start children -----------------------------------------------------------


async def test_an_extension_pickles_with_its_configuration_and_none_of_its_runtime() -> None:
    import cloudpickle

    extension = Tagged(
        [worker(ChildModel("x"))],
        tag="red",
        max_concurrent=3,
        max_children=7,
        limits=ProcessLimits(timeout=5),
    )
    async with extension:
        await run_parent(extension, [starts(1), final()])  # a task, a started pool
        assert extension.runner.pool is not None  # type: ignore[attr-defined]
        del extension.lock  # the subclass's own unpicklable state is its business
        copy = cloudpickle.loads(cloudpickle.dumps(extension))
    assert copy.tasks("parent") == () and child_core(copy).counter == 0
    assert (copy.max_concurrent, copy.limits, copy.tag) == (3, ProcessLimits(timeout=5), "red")
    assert isinstance(copy.runner, ProcessRunner) and copy.runner.pool is None
    assert copy.runner.max_children == 7 and copy.runner.owner == "Tagged"


def _tree(pids: dict[str, int]) -> set[int]:
    """Every pid of the agent tree under the outer child: the children, their pools'
    launchers and workers, and anything those started."""
    found = set(pids.values())
    with contextlib.suppress(psutil.NoSuchProcess):
        found |= {p.pid for p in psutil.Process(pids["a"]).children(recursive=True)}
    return found


def three_levels(path: str) -> SubAgentDefinition:
    level_c = worker(AnnounceAndBlock(path, "c"), name="c")
    level_b = worker(
        Orchestrator(path, "b", "c"), name="b", extensions=[AsyncSubAgentExtension([level_c])]
    )
    return worker(
        Orchestrator(path, "a", "b"), name="a", extensions=[AsyncSubAgentExtension([level_b])]
    )


@pytest.mark.parametrize("stop", ["cancel", "close", "timeout"])
async def test_three_levels_of_children_and_stopping_the_outer_task_kills_the_tree(
    beacons: Beacons, stop: str
) -> None:
    outer = three_levels(beacons.path)
    if stop == "timeout":  # long enough for three levels to boot; ends the test otherwise
        outer = worker(
            outer.model, name="a", extensions=outer.extensions, limits=ProcessLimits(timeout=10)
        )
    extension = AsyncSubAgentExtension([outer])
    async with extension:
        await run_parent(
            extension, [call("task_start", subagent_type="a", description="d", prompt="p"), final()]
        )
        pids = await beacons.until("a", "b", "c")
        assert len(set(pids.values())) == 3 and os.getpid() not in pids.values()
        # each level runs in its own process, inside the tree of the level above
        assert pids["c"] in {p.pid for p in psutil.Process(pids["b"]).children(recursive=True)}
        assert pids["b"] in {p.pid for p in psutil.Process(pids["a"]).children(recursive=True)}
        tree = _tree(pids)
        assert len(tree) >= 5  # a, b, c and the launchers of a's and b's own pools
        [task] = extension.tasks("parent")
        if stop == "cancel":
            await extension.cancel(task)
            assert task.status is SubAgentTaskStatus.CANCELLED
        elif stop == "timeout":
            await extension.wait(task, HANG_GUARD)
            assert task.status is SubAgentTaskStatus.FAILED and "ran out of time" in (
                task.error or ""
            )
    # close() (the "close" variant) or the settled task: every process of the tree is gone
    assert task.done()
    assert [pid for pid in tree if not gone(pid)] == []


# -- runners ----------------------------------------------------------------------------------


def test_runner_options_are_checked_where_they_are_given() -> None:
    with pytest.raises(ValueError, match="with runner=, pass them to the runner"):
        AsyncSubAgentExtension([worker(ChildModel())], runner=InProcessRunner(), max_children=3)
    with pytest.raises(TypeError, match=r"runner must implement zett_agent\.runners\.ChildRunner"):
        AsyncSubAgentExtension([worker(ChildModel())], runner=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"ProcessRunner\(max_children=...\) must be at least 1"):
        ProcessRunner(max_children=0)
    with pytest.raises(ValueError, match="set them on the ProcessPool itself"):
        ProcessRunner(ProcessPool(), max_children=3)
    with pytest.raises(
        TypeError, match=r"AsyncSubAgentExtension\(subagents=\.\.\.\) must be a list"
    ):
        AsyncSubAgentExtension(worker(ChildModel()))  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"\(limits=\.\.\.\) must be a zett_agent.process.ProcessLimits"
    ):
        AsyncSubAgentExtension([worker(ChildModel())], limits={"timeout": 1})  # type: ignore[arg-type]
    assert isinstance(AsyncSubAgentExtension([worker(ChildModel())]).runner, ProcessRunner)


async def test_in_process_runner_honours_the_timeout_limit() -> None:
    definition = worker(BlockingModel(), limits=ProcessLimits(timeout=0.2))
    async with AsyncSubAgentExtension([definition], runner=InProcessRunner()) as extension:
        await run_parent(extension, [starts(1), final()])
        [task] = extension.tasks("parent")
        await extension.wait(task, HANG_GUARD)
    assert task.status is SubAgentTaskStatus.FAILED
    assert task.error == "the child ran out of time (timeout=0.2s)"


UNCLOSED = textwrap.dedent(
    """
    import asyncio, gc, warnings
    from zett_agent.agent import AgentRunConfig
    from zett_agent.client import create_agent
    from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
    from zett_agent.extensions.subagent import SubAgentDefinition
    from zett_agent.runners._process import warming
    from zett_agent.testing import ScriptedModel

    class MyTasks(AsyncSubAgentExtension):
        pass

    async def main():
        ext = MyTasks([SubAgentDefinition("w", "d", "p", model=ScriptedModel(["x"]))])
        client = await create_agent(ScriptedModel(["hi"]), config=AgentRunConfig(session_id="s"),
                                    extensions=[ext])
        await client.run("go")                     # boots the extension's pool
        await warming(ext.runner)
        assert ext.runner.pool is not None
        # returns without close(): the pool is garbage once the loop is gone

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(main())
        gc.collect()
    for w in caught:
        print(w.category.__name__, w.message, flush=True)
    """
)


def test_an_unclosed_extension_warns_naming_the_extension(tmp_path: Path) -> None:
    script = tmp_path / "leaky.py"
    script.write_text(UNCLOSED)
    out = run_python(str(script), timeout=HANG_GUARD)
    assert out.returncode == 0, out.stderr
    # the launcher, orphaned with the host, killed everything and exited
    reap_adopted()
    [line] = [w for w in out.stdout.splitlines() if "unclosed" in w]
    assert line.startswith("ResourceWarning unclosed MyTasks:")
    assert "await extension.close()" in line and "async with MyTasks(...)" in line
    assert "ProcessPool" not in line
