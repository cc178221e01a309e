"""The subagent extensions end to end on the Ray cluster: ``runner=RayRunner(...)``, offline
scripted models, the real five tools. The registry, notices, task info and failures behave as
with processes; ``task_info`` adds the Ray node id next to the pid."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import _ray_children as kids
import pytest
from _ray_testing import BOUND, Beacons, gone

from _scripted_models import StepModel, ToolsThenAnswer, tool_results
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension, SubAgentTaskStatus
from zett_agent.extensions.subagent import SubAgentDefinition, SubAgentExtension
from zett_agent.messages import AssistantMessage, ToolCall
from zett_agent.runners.ray import RayRunner
from zett_agent.tools import AgentTool

pytestmark = pytest.mark.ray


def child(name: str, *tools: tuple[AgentTool, dict[str, Any]], answer: str = "{last}") -> Any:
    """A definition whose child calls ``tools`` in order, then answers."""
    return SubAgentDefinition(
        name,
        f"{name} profile for tests",
        "You are a test child.",
        model=ToolsThenAnswer(answer, [(tool.name, args) for tool, args in tools]),
        tools=tuple(tool for tool, _ in tools),
    )


def call(name: str, **arguments: Any) -> AssistantMessage:
    return AssistantMessage(
        tool_calls=(ToolCall(f"{name}-{os.urandom(3).hex()}", name, arguments),)
    )


def start(*types: str) -> AssistantMessage:
    """One assistant message starting a task of each type."""
    return AssistantMessage(
        tool_calls=tuple(
            ToolCall(f"s{i}", "task_start", {"subagent_type": t, "description": t, "prompt": "go"})
            for i, t in enumerate(types)
        )
    )


def final(text: str = "finished") -> AssistantMessage:
    return AssistantMessage(content=text)


async def run_parent(
    extension: Any, steps: list[Any], *, tools: tuple[AgentTool, ...] = ()
) -> tuple[str, StepModel]:
    model = StepModel(steps)
    client = await create_agent(
        model, config=AgentRunConfig(session_id="parent"), extensions=[extension], tools=tools
    )
    async with asyncio.timeout(BOUND):
        result = await client.run("go")
    # the client stays open: closing it would release the session's tasks (the tests go on
    # with them); the extension's close() ends whatever still runs
    return result.content, model


def on(node: str) -> dict[str, Any]:
    return {"num_cpus": 1, "resources": {node: 1}}


@pytest.fixture
def beacons(tmp_path: Path) -> Any:
    b = Beacons(str(tmp_path / "beacons"))
    yield b
    b.close()


async def test_task_cancel_kills_a_never_yielding_child_and_task_info_names_its_node(
    ray_cluster: dict[str, Any], beacons: Beacons
) -> None:
    spinner = child("spinner", (kids.SPIN_TREE, {"beacon_path": beacons.path}))
    runner = RayRunner(placement={"spinner": on("w1")})
    tree: dict[str, int] = {}

    async def until_spinning() -> str:
        tree.update(await beacons.next())
        # the child's beacon can overtake Ray's stream, which tells the host where it runs;
        # the job has no event for that, so it is looked at every few milliseconds
        [task] = extension.tasks("parent")
        async with asyncio.timeout(BOUND):
            while task.job is None or task.job.pid is None:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        return "spinning"

    async with AsyncSubAgentExtension([spinner], runner=runner) as extension:
        content, model = await run_parent(
            extension,
            [
                start("spinner"),
                call("until_spinning"),
                call("task_status", task_id="task-1"),
                call("task_cancel", task_id="task-1"),
                # computed right after task_cancel returned
                lambda r: final(json.dumps([pid for pid in tree.values() if not gone(pid)])),
            ],
            tools=(AgentTool("until_spinning", "", {"type": "object"}, until_spinning),),
        )
    status, cancelled = (json.loads(m.text) for m in tool_results(model.requests[-1])[-2:])
    assert status["status"] == "running" and status["pid"] == tree["worker"]
    assert status["node_id"] == ray_cluster["nodes"]["w1"]
    assert cancelled["status"] == "cancelled" and cancelled["error"] == "cancelled"
    assert json.loads(content) == []  # the worker and every process it started: gone


async def test_a_segfault_fails_cleanly_beside_a_sibling_that_completes(
    ray_cluster: dict[str, Any],
) -> None:
    """The sibling also reports progress from its own tool with ``zett_agent.process.emit``,
    as child code written for processes does."""
    definitions = [
        child("crasher", (kids.SEGFAULT, {})),
        child("sibling", (kids.PROGRESS, {}), answer="sibling done"),
    ]
    runner = RayRunner(placement={"crasher": on("w1"), "sibling": on("w2")})
    async with AsyncSubAgentExtension(definitions, runner=runner) as extension:
        await run_parent(extension, [start("crasher", "sibling"), final()])
        tasks = {t.subagent_type: await extension.wait(t, BOUND) for t in extension.tasks("parent")}
    assert tasks["crasher"].status is SubAgentTaskStatus.FAILED
    assert tasks["crasher"].error == "the child process was killed by SIGSEGV"
    assert tasks["sibling"].status is SubAgentTaskStatus.COMPLETED
    assert tasks["sibling"].output == "sibling done"
    assert tasks["sibling"].progress == {"done": 2, "total": 3}


async def test_cpu_bound_children_run_in_parallel(ray_cluster: dict[str, Any]) -> None:
    seconds = 1.5
    definitions = [
        child(f"burn_{node}", (kids.BURN, {"seconds": seconds})) for node in ("w1", "w2")
    ]
    placement = {f"burn_{node}": on(node) for node in ("w1", "w2")}

    async def run_children(*types: str) -> tuple[float, float, list[list[float]]]:
        runner = RayRunner(placement=placement)
        async with AsyncSubAgentExtension(definitions, runner=runner) as extension:
            begin = time.monotonic()
            await run_parent(extension, [start(*types), final()])
            tasks = [await extension.wait(t, BOUND) for t in extension.tasks("parent")]
            wall = time.monotonic() - begin
        assert [t.status for t in tasks] == [SubAgentTaskStatus.COMPLETED] * len(types)
        spans = [[float(x) for x in (t.output or "").split()] for t in tasks]
        return wall, sum(t.cpu_seconds for t in tasks), spans

    await run_children("burn_w1", "burn_w2")  # both nodes' workers import the child runtime
    ratios = []
    for _attempt in range(3):
        # The reference is measured in the same test, right before, so a machine slowed by
        # other work slows both. Children run one at a time could never reach the bound: the
        # best of three attempts shows parallelism on a machine other engineers share.
        one_wall, one_cpu, _ = await run_children("burn_w1")
        two_wall, two_cpu, spans = await run_children("burn_w1", "burn_w2")
        assert one_cpu >= seconds * 0.9 and two_cpu >= 2 * seconds * 0.9, (one_cpu, two_cpu)
        # The two burned at the same time: most of one's span overlaps the other's.
        overlap = min(end for _, end in spans) - max(begin for begin, _ in spans)
        assert overlap >= 0.5 * min(end - begin for begin, end in spans), spans
        ratios.append(two_wall / (2 * one_wall))  # against running them one after the other
        if ratios[-1] <= 0.8:
            break
    # On 2 cores, on two nodes' workers, the pair takes well under the sequential time (Ray's
    # own daemons share the two cores, so not quite half).
    assert min(ratios) <= 0.8, ratios


async def test_the_blocking_subagent_tool_runs_its_child_on_ray(
    ray_cluster: dict[str, Any],
) -> None:
    reporter = child("reporter", answer="report from a Ray worker")
    async with SubAgentExtension([reporter], runner=RayRunner()) as extension:
        content, _ = await run_parent(
            extension,
            [
                call("subagent", subagent_type="reporter", description="r", prompt="go"),
                lambda r: final(tool_results(r)[-1].text),
            ],
        )
    assert content == "report from a Ray worker"


async def test_a_lost_node_fails_its_task_as_node_lost_while_a_sibling_finishes(
    ray_cluster: dict[str, Any], beacons: Beacons, tmp_path: Path
) -> None:
    host = ray_cluster["host"]
    doomed_id = host.call("add_node", name="doomed", num_cpus=1, resources={"doomed": 4})["id"]
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    definitions = [
        child("doomed", (kids.ANNOUNCE, {"beacon_path": beacons.path, "label": "doomed"})),
        child("survivor", (kids.GATE, {"gate": str(gate)}), answer="survived: {last}"),
    ]
    runner = RayRunner(placement={"doomed": on("doomed"), "survivor": on("w1")})
    async with AsyncSubAgentExtension(definitions, runner=runner) as extension:
        await run_parent(extension, [start("doomed", "survivor"), final()])
        tasks = {t.subagent_type: t for t in extension.tasks("parent")}
        assert (await beacons.next())["label"] == "doomed"
        assert extension.task_info(tasks["doomed"])["node_id"] == doomed_id
        lost_at = time.monotonic()
        host.call("remove_node", name="doomed")
        await extension.wait(tasks["doomed"], BOUND)
        took = time.monotonic() - lost_at
        await asyncio.to_thread(gate.write_bytes, b"the gate")  # the sibling ran throughout
        await extension.wait(tasks["survivor"], BOUND)
    doomed, survivor = tasks["doomed"], tasks["survivor"]
    assert doomed.status is SubAgentTaskStatus.FAILED, (doomed.error, took)
    assert f"the Ray node {doomed_id[:12]} died or left the cluster" in (doomed.error or "")
    assert survivor.status is SubAgentTaskStatus.COMPLETED
    assert survivor.output == "survived: the gate"
