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
from _ray_testing import BOUND, child, on

from support.beacons import Beacons
from support.calls import call, final, start
from support.children import (
    GATE,
    MARK,
    SEGFAULT,
    GatedAnswer,
    HoldFirstCall,
    Listener,
    TwoMarksThenReport,
)
from support.liveness import gone
from support.parent import run_parent, until_running
from support.scripted_models import ToolsThenAnswer, tool_results
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension, SubAgentTaskStatus
from zett_agent.extensions.subagent import SubAgentDefinition, SubAgentExtension
from zett_agent.messages import AssistantMessage
from zett_agent.runners.ray import RayRunner
from zett_agent.tools import AgentTool

pytestmark = pytest.mark.ray


async def test_task_cancel_kills_a_never_yielding_child_and_task_info_names_its_node(
    ray_cluster: dict[str, Any], beacons: Beacons
) -> None:
    spinner = child("spinner", (kids.SPIN_TREE, {"beacon_path": beacons.path}))
    runner = RayRunner(placement={"spinner": on("w1")})
    tree: dict[str, int] = {}

    async def until_spinning() -> str:
        tree.update(await beacons.next())
        # the child's beacon can overtake Ray's stream, which tells the parent where it runs
        # and then brings the child's first event (the task reads running from then on)
        [task] = extension.tasks("parent")
        await until_running(task, guard=BOUND)
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
        child("crasher", (SEGFAULT, {})),
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
        # the beacon can overtake Ray's stream, which tells the host where the child runs; the
        # job has no event for that, so it is looked at every few milliseconds
        async with asyncio.timeout(BOUND):
            while "node_id" not in extension.task_info(tasks["doomed"]):  # noqa: ASYNC110
                await asyncio.sleep(0.005)
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


async def test_task_wait_and_a_token_budget_work_on_ray(ray_cluster: dict[str, Any]) -> None:
    """``task_wait`` and token budgets on Ray: they live in the parent, and work as with
    processes."""
    spender = SubAgentDefinition(
        "spender",
        "spends more than its budget",
        "You are a test child.",
        model=ToolsThenAnswer("spent"),  # one response reporting 7 + 3 tokens
        token_budget=5,
    )
    definitions = [spender, child("reporter", answer="report from Ray")]
    extension = AsyncSubAgentExtension(
        definitions, runner=RayRunner(), extra_tools=("task_wait", "task_message")
    )
    async with extension:
        wait = {"task_ids": ["task-1", "task-2"], "mode": "all", "wait_seconds": BOUND}
        _, model = await run_parent(
            extension, [start("spender", "reporter"), call("task_wait", **wait), final()]
        )
        waited = json.loads(tool_results(model.requests[-1])[-1].text)
    assert waited["timed_out"] is False and waited["running"] == []
    spent, reported = waited["finished"]
    assert spent["status"] == "failed"
    assert spent["error"] == "token budget exceeded (used 10 of 5 tokens)"
    assert reported["content"] == "report from Ray"


@pytest.mark.parametrize("direct", [True, False], ids=["from-the-driver", "through-the-reaper"])
async def test_a_message_reaches_a_ray_child_before_its_next_model_call(
    ray_cluster: dict[str, Any], beacons: Beacons, tmp_path: Path, direct: bool
) -> None:
    """``task_message`` on Ray: the message goes to the child's inbox on its node (from this
    process, or through the node's reaper with ``kill_from_host=False``), is in the child's
    next model request, and counts delivered on the child's confirmation only."""
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    listener = SubAgentDefinition(
        "listener",
        "waits in its gate, then reports its user messages",
        "You are a test child.",
        model=Listener(beacons.path, "listening", str(gate)),
        tools=(GATE,),
    )
    runner = RayRunner(kill_from_host=direct)
    extension = AsyncSubAgentExtension([listener], runner=runner, extra_tools=("task_message",))
    async with extension:
        seen: dict[str, Any] = {}

        async def until_listening() -> str:
            assert (await beacons.next())["label"] == "listening"  # in its gate tool
            return "listening"

        def output(request: Any) -> AssistantMessage:
            seen["queued"] = json.loads(tool_results(request)[-1].text)
            return final()

        await run_parent(
            extension,
            [
                start("listener"),
                call("until_listening"),
                call("task_message", task_id="task-1", message="use the blue one"),
                output,
            ],
            tools=(AgentTool("until_listening", "", {"type": "object"}, until_listening),),
        )
        [task] = extension.tasks("parent")
        assert seen["queued"] == {"task_id": "task-1", "message_id": "msg-1", "status": "queued"}
        assert task.messages is not None
        async with asyncio.timeout(BOUND):
            await task.messages.records["msg-1"].received.wait()  # in the child, not yet read
        assert extension.task_info(task)["messages"] == {"sent": 1, "delivered": 0}
        sending = asyncio.create_task(extension.send(task, "and paint it twice"))
        await asyncio.sleep(0)  # the sender queued the message and waits for its delivery
        async with asyncio.timeout(BOUND):
            await task.messages.records["msg-2"].received.wait()
        assert not sending.done()  # returns once the child's model had it, not before
        await asyncio.to_thread(gate.write_bytes, b"open")
        assert await asyncio.wait_for(sending, BOUND) == "msg-2"
        await extension.wait(task, BOUND)
        assert task.status is SubAgentTaskStatus.COMPLETED, task.error
        # the child's second model call had both, after its prompt
        assert json.loads(task.output or "")["users"] == [
            "go",
            "use the blue one",
            "and paint it twice",
        ]
        assert extension.task_info(task)["messages"] == {"sent": 2, "delivered": 2}
        assert "never delivered" not in extension.completion_notice(task)


async def test_an_interrupting_message_skips_a_ray_childs_pending_calls(
    ray_cluster: dict[str, Any], beacons: Beacons
) -> None:
    definition = SubAgentDefinition(
        "steered",
        "asks for two marks, then reports",
        "You are a test child.",
        model=TwoMarksThenReport(beacons.path),
        tools=(MARK,),
        extensions=(HoldFirstCall(beacons.path, "holding"),),
    )
    extension = AsyncSubAgentExtension([definition], runner=RayRunner())
    async with extension:
        await run_parent(extension, [start("steered"), final()])
        [task] = extension.tasks("parent")
        assert (await beacons.next())["label"] == "holding"  # its first model call is in flight
        async with asyncio.timeout(BOUND):
            assert await extension.send(task, "stop: wrong file", interrupt=True) == "msg-1"
        await extension.wait(task, BOUND)
        assert task.status is SubAgentTaskStatus.COMPLETED, task.error
        report = json.loads(task.output or "")
        # both calls of the batch the model answered were skipped, and the message came after
        assert report["tools"] == [["skipped", "skipped: interrupted by a steering message"]] * 2
        assert report["users"] == ["go", "stop: wrong file"]
        assert extension.task_info(task)["messages"] == {"sent": 1, "delivered": 1}
    beacons.sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        beacons.sock.recv(65536)  # no mark ran


async def test_a_message_a_ray_child_ends_before_reading_is_reported_undelivered(
    ray_cluster: dict[str, Any], beacons: Beacons, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    definition = SubAgentDefinition(
        "last",
        "in its last model call",
        "You are a test child.",
        model=GatedAnswer(beacons.path, "answering", str(gate)),
    )
    extension = AsyncSubAgentExtension([definition], runner=RayRunner())
    async with extension:
        await run_parent(extension, [start("last"), final()])
        [task] = extension.tasks("parent")
        assert (await beacons.next())["label"] == "answering"  # it makes no other model call
        sending = asyncio.create_task(extension.send(task, "one more thing"))
        await asyncio.sleep(0)  # the sender queued the message and waits for its delivery
        assert task.messages is not None
        async with asyncio.timeout(BOUND):
            await task.messages.records["msg-1"].received.wait()
        await asyncio.to_thread(gate.write_bytes, b"open")
        with pytest.raises(ValueError, match=r"before it read message msg-1; it was never deliv"):
            await asyncio.wait_for(sending, BOUND)
        assert task.status is SubAgentTaskStatus.COMPLETED, task.error
        assert extension.task_info(task)["messages"] == {
            "sent": 1,
            "delivered": 0,
            "undelivered": ["msg-1"],
        }
