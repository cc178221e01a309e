"""Talking to running children: ``task_wait``, ``task_message`` (and ``interrupt``),
stall notices, token budgets, and a ``TaskStore`` that survives its host's SIGKILL.

Children are offline models (``support.children``, ``_talk_children``); they say what they do
through a datagram socket (``Beacons``) and wait on FIFOs, so every test waits on what
happened, never on time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from _talk_children import BrokeredCostly, Costly, SpawnThenSpend

from support.beacons import Beacons
from support.calls import calls, final, task_start
from support.children import (
    GATE,
    HANG,
    MARK,
    GatedAnswer,
    HoldFirstCall,
    Listener,
    TwoMarksThenReport,
)
from support.liveness import alive
from support.parent import worker
from support.reaping import reap_adopted
from support.runners import make_runner, runner_params
from support.scripted_models import StepModel, tool_results
from support.scripted_models import ToolsThenAnswer as ChildModel
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import (
    AsyncSubAgentExtension,
    SubAgentTask,
    SubAgentTaskStatus,
)
from zett_agent.messages import AgentMessage, AssistantMessage, ToolMessage
from zett_agent.model import ModelRequest
from zett_agent.runners import ProcessRunner

HANG_GUARD = 60
TALK = ("task_wait", "task_message")
HERE = Path(__file__).resolve().parent


@pytest.fixture(params=runner_params("process", "in-process"))
def runner(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def results(request: ModelRequest, last: int) -> list[ToolMessage]:
    return tool_results(request)[-last:]


def notices(request: ModelRequest) -> list[str]:
    return [m.content for m in request.messages if isinstance(m, AgentMessage)]


def fifo(tmp_path: Path, name: str = "gate") -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


async def release(gate: Path) -> None:
    await asyncio.to_thread(gate.write_bytes, b"go")


async def drive(
    extension: AsyncSubAgentExtension, model: StepModel, session_id: str = "parent"
) -> Any:
    client = await create_agent(
        model, config=AgentRunConfig(session_id=session_id), extensions=[extension]
    )
    # the client stays open: closing it releases the session's tasks (the tests read them)
    async with asyncio.timeout(HANG_GUARD):
        await client.run("go")
    return client


# -- construction -----------------------------------------------------------------------------


def test_extra_tools_are_checked_and_come_after_the_five() -> None:
    with pytest.raises(
        ValueError, match=r"unknown extra tool 'task_steer'.*'task_wait', 'task_message'"
    ):
        AsyncSubAgentExtension(extra_tools=("task_steer",))
    with pytest.raises(TypeError, match="not a str"):
        AsyncSubAgentExtension(extra_tools="task_wait")  # type: ignore[arg-type]
    assert AsyncSubAgentExtension().extra_tools == ()


async def test_the_extra_tools_follow_the_five_in_the_order_given() -> None:
    model = StepModel([final()])
    async with AsyncSubAgentExtension([worker(ChildModel())], extra_tools=TALK[::-1]) as extension:
        await drive(extension, model)
    assert [t.name for t in model.requests[0].tools] == [
        "task_start", "task_list", "task_status", "task_output", "task_cancel",
        "task_message", "task_wait",
    ]  # fmt: skip


# -- task_wait --------------------------------------------------------------------------------


async def test_task_wait_any_all_with_a_timeout_and_ids_of_another_session(
    tmp_path: Path, beacons: Beacons, runner: str
) -> None:
    gate = fifo(tmp_path)
    seen: dict[str, Any] = {}

    def wait(mode: str, ids: list[str], seconds: float) -> AssistantMessage:
        return calls(("task_wait", {"task_ids": ids, "mode": mode, "wait_seconds": seconds}))

    def any_of_both(request: ModelRequest) -> AssistantMessage:
        seen["ids"] = [json.loads(m.text)["task_id"] for m in results(request, 2)]
        return wait("any", seen["ids"], 30)

    def all_at_once(request: ModelRequest) -> AssistantMessage:
        seen["any"] = json.loads(results(request, 1)[0].text)
        return wait("all", seen["ids"], 0)

    async def all_after_release(request: ModelRequest) -> AssistantMessage:
        seen["timed_out"] = json.loads(results(request, 1)[0].text)
        await release(gate)
        return wait("all", seen["ids"], 30)

    def done(request: ModelRequest) -> AssistantMessage:
        seen["all"] = json.loads(results(request, 1)[0].text)
        return final()

    extension = AsyncSubAgentExtension(
        [
            worker(ChildModel(answer="quick report"), name="quick"),
            worker(GatedAnswer(beacons.path, "gated", str(gate)), name="gated"),
        ],
        extra_tools=TALK,
        runner=make_runner(runner),
    )
    async with extension:
        model = StepModel(
            [
                calls(task_start("quick"), task_start("gated")),
                any_of_both,
                all_at_once,
                all_after_release,
                done,
            ]
        )
        client = await drive(extension, model)
        quick, gated = seen["ids"]
        assert [e["task_id"] for e in seen["any"]["finished"]] == [quick]
        assert seen["any"]["finished"][0]["content"] == "quick report"
        [waiting] = seen["any"]["running"]
        assert waiting["task_id"] == gated and waiting["status"] in ("pending", "running")
        assert "content" not in seen["any"]["running"][0]
        assert seen["any"]["timed_out"] is False
        assert seen["timed_out"]["timed_out"] is True
        assert [e["task_id"] for e in seen["timed_out"]["running"]] == [gated]
        assert [e["task_id"] for e in seen["all"]["finished"]] == [quick, gated]
        assert seen["all"]["finished"][1]["content"] == "gated answer"
        assert seen["all"] == {**seen["all"], "running": [], "timed_out": False}
        # the reports task_wait returned count as read: no notice follows
        async with asyncio.timeout(HANG_GUARD):
            await client.run("again")
        assert not any(gated in n for n in notices(model.requests[-1]))

        other = StepModel([calls(("task_wait", {"task_ids": [quick, "task-99"]})), final()])
        await drive(extension, other, session_id="other")
        [error] = tool_results(other.requests[1])
        assert "2 task_ids are not tasks of this session" in error.text
        assert "this session's tasks are: none" in error.text
        await client.close()


async def test_wait_any_and_wait_all_from_python_cancel_no_task(
    tmp_path: Path, beacons: Beacons
) -> None:
    gate = fifo(tmp_path)
    extension = AsyncSubAgentExtension(
        [
            worker(ChildModel(answer="quick"), name="quick"),
            worker(GatedAnswer(beacons.path, "g", str(gate)), name="gated"),
        ]
    )
    async with extension:
        client = await drive(
            extension, StepModel([calls(task_start("quick"), task_start("gated")), final()])
        )
        quick, gated = extension.tasks("parent")
        assert await extension.wait_any([quick, gated]) == [quick]
        assert await extension.wait_all([quick, gated], timeout=0) == [quick]
        waiter = asyncio.create_task(extension.wait_all([gated]))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert not gated.done()  # cancelling the waiter cancelled no task
        await release(gate)
        assert await extension.wait_all([quick, gated], timeout=HANG_GUARD) == [quick, gated]
        await client.close()


# -- task_message -----------------------------------------------------------------------------


async def test_a_message_is_in_the_childs_next_request_and_counted_delivered(
    tmp_path: Path, beacons: Beacons, runner: str
) -> None:
    gate = fifo(tmp_path)
    seen: dict[str, Any] = {}
    extension = AsyncSubAgentExtension(
        [worker(Listener(beacons.path, "listening", str(gate)), tools=(GATE,))],
        extra_tools=TALK,
        runner=make_runner(runner),
    )

    async def message(request: ModelRequest) -> AssistantMessage:
        seen["task_id"] = json.loads(results(request, 1)[0].text)["task_id"]
        await beacons.until("listening")  # the child waits in its gate tool
        return calls(("task_message", {"task_id": seen["task_id"], "message": "use the blue one"}))

    async def output(request: ModelRequest) -> AssistantMessage:
        seen["queued"] = json.loads(results(request, 1)[0].text)
        task = extension.get_task("parent", seen["task_id"])
        assert task.messages is not None
        seen["before"] = extension.task_info(task)["messages"]
        await task.messages.records["msg-1"].received.wait()  # in the child, not yet read
        await release(gate)
        return calls(("task_output", {"task_id": seen["task_id"], "wait_seconds": 30}))

    async with extension:
        model = StepModel(
            [
                calls(task_start()),
                message,
                output,
                lambda r: final(json.loads(results(r, 1)[0].text)["content"]),
            ]
        )
        client = await drive(extension, model)
        [task] = extension.tasks("parent")
        assert seen["queued"] == {
            "task_id": task.task_id,
            "message_id": "msg-1",
            "status": "queued",
        }
        assert seen["before"] == {"sent": 1, "delivered": 0}
        assert task.status is SubAgentTaskStatus.COMPLETED
        # the child's second model call had the message, after its prompt
        assert json.loads(task.output or "")["users"] == ["p", "use the blue one"]
        assert extension.task_info(task)["messages"] == {"sent": 1, "delivered": 1}
        assert "never delivered" not in extension.completion_notice(task)
        await client.close()


async def test_send_returns_once_delivered_and_messages_are_bounded(
    tmp_path: Path, beacons: Beacons, runner: str
) -> None:
    gate = fifo(tmp_path)
    extension = AsyncSubAgentExtension(
        [worker(Listener(beacons.path, "listening", str(gate)), tools=(GATE,))],
        runner=make_runner(runner),
    )
    async with extension:
        client = await drive(extension, StepModel([calls(task_start()), final()]))
        [task] = extension.tasks("parent")
        await beacons.until("listening")
        with pytest.raises(ValueError, match="has 20001 characters, more than the 20000"):
            await extension.send(task, "x" * 20_001)
        senders = [asyncio.create_task(extension.send(task, f"note {i}")) for i in range(100)]
        await asyncio.sleep(0)  # each sender queued its message
        with pytest.raises(ValueError, match="already sent 100 messages, the most one task"):
            await extension.send(task, "one too many")
        assert task.messages is not None
        async with asyncio.timeout(HANG_GUARD):
            await task.messages.records["msg-100"].received.wait()  # all 100 in the child
        assert not any(s.done() for s in senders)  # none was read by the child's model yet
        await release(gate)
        async with asyncio.timeout(HANG_GUARD):
            ids = await asyncio.gather(*senders)
        assert ids == [f"msg-{i}" for i in range(1, 101)]
        await extension.wait_all([task], timeout=HANG_GUARD)
        assert json.loads(task.output or "")["users"] == ["p", *(f"note {i}" for i in range(100))]
        assert extension.task_info(task)["messages"] == {"sent": 100, "delivered": 100}
        await client.close()


async def test_interrupt_steers_the_child_and_skips_its_pending_calls(
    beacons: Beacons, runner: str
) -> None:
    definition = worker(
        TwoMarksThenReport(beacons.path),
        tools=(MARK,),
        extensions=(HoldFirstCall(beacons.path, "holding"),),
    )
    extension = AsyncSubAgentExtension([definition], extra_tools=TALK, runner=make_runner(runner))
    async with extension:
        sent: dict[str, Any] = {}

        async def steer(request: ModelRequest) -> AssistantMessage:
            task_id = sent["task_id"] = json.loads(results(request, 1)[0].text)["task_id"]
            await beacons.until("holding")  # the child's first model call is in flight
            return calls(
                (
                    "task_message",
                    {"task_id": task_id, "message": "stop: wrong file", "interrupt": True},
                )
            )

        def output(request: ModelRequest) -> AssistantMessage:
            sent["reply"] = json.loads(results(request, 1)[0].text)
            return calls(("task_output", {"task_id": sent["task_id"], "wait_seconds": 30}))

        client = await drive(extension, StepModel([calls(task_start()), steer, output, final()]))
        [task] = extension.tasks("parent")
        assert sent["reply"]["status"] == "queued"
        assert task.status is SubAgentTaskStatus.COMPLETED, task.error
        report = json.loads(task.output or "")
        # both calls of the batch the model answered were skipped, and the message came after
        assert report["tools"] == [["skipped", "skipped: interrupted by a steering message"]] * 2
        assert report["users"] == ["p", "stop: wrong file"]
        assert not any(label.startswith("mark-") for label in beacons.drain())
        assert extension.task_info(task)["messages"] == {"sent": 1, "delivered": 1}
        await client.close()


async def test_a_message_the_task_ends_before_reading_is_reported_undelivered(
    tmp_path: Path, beacons: Beacons, runner: str
) -> None:
    gate = fifo(tmp_path)
    extension = AsyncSubAgentExtension(
        [worker(GatedAnswer(beacons.path, "answering", str(gate)))],
        extra_tools=TALK,
        runner=make_runner(runner),
    )
    async with extension:
        client = await drive(extension, StepModel([calls(task_start()), final()]))
        [task] = extension.tasks("parent")
        await beacons.until("answering")  # in its only model call: it will never make another
        sending = asyncio.create_task(extension.send(task, "one more thing"))
        await asyncio.sleep(0)  # the sender queued the message and waits for its delivery
        assert task.messages is not None
        async with asyncio.timeout(HANG_GUARD):
            await task.messages.records["msg-1"].received.wait()
        await release(gate)
        with pytest.raises(
            ValueError, match=r"ended .*before it read message msg-1; it was never delivered"
        ):
            await sending
        assert task.status is SubAgentTaskStatus.COMPLETED
        assert extension.task_info(task)["messages"] == {
            "sent": 1,
            "delivered": 0,
            "undelivered": ["msg-1"],
        }
        assert "before it read the message msg-1: never delivered" in extension.completion_notice(
            task
        )
        # a finished task takes no message, from the tool or from code
        model = StepModel(
            [calls(("task_message", {"task_id": task.task_id, "message": "late"})), final()]
        )
        async with asyncio.timeout(HANG_GUARD):
            client2 = await create_agent(
                model, config=AgentRunConfig(session_id="parent"), extensions=[extension]
            )
            await client2.run("late")
        assert (
            "has already completed, so it can take no message"
            in tool_results(model.requests[1])[0].text
        )
        with pytest.raises(ValueError, match="has already completed"):
            await extension.send(task, "later")
        await client2.close()
        await client.close()


# -- stalls -----------------------------------------------------------------------------------


class StallWatch(AsyncSubAgentExtension):
    stalled: asyncio.Event

    async def task_stalled(self, task: SubAgentTask) -> None:
        self.stalled.set()


async def test_a_stall_is_noticed_once(tmp_path: Path, beacons: Beacons, runner: str) -> None:
    gate = fifo(tmp_path)
    # the model call of this child blocks without a sign of work: the stall under test
    extension = StallWatch(
        [worker(GatedAnswer(beacons.path, "silent", str(gate)))],
        stall_seconds=0.2,
        runner=make_runner(runner),
    )
    extension.stalled = asyncio.Event()
    seen: dict[str, Any] = {}

    async def status(request: ModelRequest) -> AssistantMessage:
        task_id = seen["task_id"] = json.loads(results(request, 1)[0].text)["task_id"]
        async with asyncio.timeout(HANG_GUARD):
            await extension.stalled.wait()
        return calls(("task_status", {"task_id": task_id}))

    async with extension:
        model = StepModel([calls(task_start()), status, final(), final()])
        client = await drive(extension, model)
        [task] = extension.tasks("parent")
        info = json.loads(tool_results(model.requests[2])[-1].text)
        assert info["needs_attention"] is True and info["idle_seconds"] >= 0.2
        assert info["status"] == "running"
        async with asyncio.timeout(HANG_GUARD):
            await client.run("again")  # still stalled: no second notice
        stall = [n for n in notices(model.requests[-1]) if "shown no sign of work" in n]
        assert len(stall) == 1 and task.task_id in stall[0]
        await release(gate)
        await extension.wait_all([task], timeout=HANG_GUARD)
        assert "needs_attention" not in extension.task_info(task)
        await client.close()


# -- token budgets ----------------------------------------------------------------------------


async def test_a_response_past_the_token_budget_kills_the_childs_tree(beacons: Beacons) -> None:
    definition = worker(
        SpawnThenSpend(beacons.path, "spender", (60, 50)), tools=(HANG,), token_budget=100
    )
    async with AsyncSubAgentExtension([definition]) as extension:
        client = await drive(extension, StepModel([calls(task_start()), final()]))
        [task] = extension.tasks("parent")
        await extension.wait_all([task], timeout=HANG_GUARD)
        [label] = [label for label in beacons.drain() if label.startswith("spender-")]
        child, grandchild = beacons.seen[label], int(label.removeprefix("spender-"))
        assert task.status is SubAgentTaskStatus.FAILED
        assert task.error == "token budget exceeded (used 110 of 100 tokens)"
        info = extension.task_info(task)
        assert (info["total_tokens"], info["token_budget"]) == (110, 100)
        assert not alive(child) and not alive(grandchild)
        await client.close()


async def test_a_brokered_childs_budget_counts_the_usage_the_parent_relayed() -> None:
    # the parent made the call, so its count is what the budget trusts (not the child's word)
    definition = worker(BrokeredCostly((70, 40)), tools=(HANG,), token_budget=100)
    async with AsyncSubAgentExtension([definition], runner=ProcessRunner(broker=True)) as extension:
        client = await drive(extension, StepModel([calls(task_start()), final()]))
        [task] = extension.tasks("parent")
        await extension.wait_all([task], timeout=HANG_GUARD)
        assert task.status is SubAgentTaskStatus.FAILED
        assert task.error == "token budget exceeded (used 110 of 100 tokens)"
        assert (task.input_tokens, task.output_tokens) == (70, 40)
        await client.close()


async def test_a_spent_session_budget_stops_its_tasks_and_refuses_the_next_start(
    runner: str,
) -> None:
    extension = AsyncSubAgentExtension(
        [worker(Costly((10, 10)))], session_token_budget=15, runner=make_runner(runner)
    )

    async def second(request: ModelRequest) -> AssistantMessage:
        task_id = json.loads(results(request, 1)[0].text)["task_id"]
        await extension.wait_all([extension.get_task("parent", task_id)], timeout=HANG_GUARD)
        return calls(task_start(description="second"))

    async with extension:
        model = StepModel([calls(task_start()), second, final()])
        client = await drive(extension, model)
        [task] = extension.tasks("parent")
        assert task.status is SubAgentTaskStatus.FAILED
        assert task.error == "session token budget exceeded (used 20 of 15 tokens)"
        refused = tool_results(model.requests[2])[-1].text
        assert "this session's token budget is spent: its tasks used 20 of 15 tokens" in refused
        await client.close()


# -- the store --------------------------------------------------------------------------------

HOST = textwrap.dedent(
    """
    import asyncio, os, sys
    sys.path[:0] = [{tests!r}]
    from support.calls import calls, final, task_start
    from support.children import AnnounceAndBlock, GatedAnswer
    from support.parent import worker
    from support.scripted_models import StepModel
    from zett_agent.agent import AgentRunConfig
    from zett_agent.client import create_agent
    from zett_agent.extensions.async_subagent import AsyncSubAgentExtension

    async def main():
        extension = AsyncSubAgentExtension(
            [worker(GatedAnswer({beacons!r}, "quick", {gate!r}, "stored report"), name="quick"),
             worker(AnnounceAndBlock({beacons!r}, "blocked"), name="blocked")],
            store={store!r},
        )
        client = await create_agent(
            StepModel([calls(task_start("quick", "q"), task_start("blocked", "b")), final()]),
            config=AgentRunConfig(session_id="parent"), extensions=[extension],
        )
        await client.run("go")  # its notices are owed from here on
        quick, blocked = extension.tasks("parent")
        def release():
            with open({gate!r}, "wb") as gate:  # blocks until the child opened it
                gate.write(b"go")

        await asyncio.to_thread(release)
        await quick.watcher  # finished and stored, its notice owed
        await blocked.running.wait()  # running, and that queued for the store
        await extension.store.flush()
        print(blocked.pid, flush=True)
        await asyncio.Event().wait()  # until SIGKILLed

    asyncio.run(main())
    """
)


async def test_a_restarted_host_shows_finished_and_lost_tasks_and_delivers_the_notice_once(
    tmp_path: Path, beacons: Beacons
) -> None:
    store = tmp_path / "tasks.sqlite"
    program = HOST.format(
        tests=str(HERE.parent),
        beacons=beacons.path,
        store=str(store),
        gate=str(fifo(tmp_path)),
    )
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    host = await asyncio.create_subprocess_exec(
        sys.executable, "-c", program, stdout=subprocess.PIPE, env=env
    )
    try:
        assert host.stdout is not None
        async with asyncio.timeout(HANG_GUARD):
            line = await host.stdout.readline()
        assert line.strip(), "the host ended before its tasks ran"
        await beacons.until("blocked")
    finally:
        host.send_signal(signal.SIGKILL)
        await host.wait()
    reap_adopted(within=HANG_GUARD)  # the host's pool and children die with it

    extension = AsyncSubAgentExtension(store=store)
    async with extension:
        quick, blocked = extension.tasks("parent")
        assert (quick.status, quick.output) == (SubAgentTaskStatus.COMPLETED, "stored report")
        assert blocked.status is SubAgentTaskStatus.FAILED and blocked.lost
        assert (blocked.error or "").startswith("lost: the host stopped while the task was running")
        assert extension.task_info(blocked)["lost"] is True
        model = StepModel([final(), final()])
        client = await drive(extension, model)
        first = notices(model.requests[0])
        assert [n.split(" (")[0] for n in first] == [
            f"Background task {quick.task_id}",
            f"Background task {blocked.task_id}",
        ]
        async with asyncio.timeout(HANG_GUARD):
            await client.run("again")
        assert notices(model.requests[-1]) == first  # once: only the history holds them
        report = StepModel([calls(("task_output", {"task_id": quick.task_id})), final()])
        await drive(extension, report)
        assert json.loads(tool_results(report.requests[1])[0].text)["content"] == "stored report"
        await client.close()

    again = AsyncSubAgentExtension(store=store)  # a third host: the notices were delivered
    async with again:
        model = StepModel([final()])
        client = await drive(again, model)
        assert notices(model.requests[0]) == []
        assert [t.task_id for t in again.tasks("parent")] == [quick.task_id, blocked.task_id]
        await client.close()


# -- task_cancel ------------------------------------------------------------------------------


class SeesOutputRequests(AsyncSubAgentExtension):
    def task_info(self, task: SubAgentTask, *, include_output: bool = False) -> Any:
        if include_output:
            self.with_output.append(task.task_id)
        return super().task_info(task, include_output=include_output)


async def test_task_cancel_of_a_finished_task_points_to_task_output(runner: str) -> None:
    extension = SeesOutputRequests(
        [worker(ChildModel(answer="done early"))], runner=make_runner(runner)
    )
    extension.with_output = []  # type: ignore[attr-defined]

    async def cancel(request: ModelRequest) -> AssistantMessage:
        task_id = json.loads(results(request, 1)[0].text)["task_id"]
        await extension.wait_all([extension.get_task("parent", task_id)], timeout=HANG_GUARD)
        return calls(("task_cancel", {"task_id": task_id}))

    async with extension:
        model = StepModel([calls(task_start()), cancel, final()])
        client = await drive(extension, model)
        info = json.loads(tool_results(model.requests[2])[-1].text)
        assert info["status"] == "completed" and "content" not in info
        assert "it had already completed before task_cancel" in info["hint"]
        assert "task_output" in info["hint"]
        assert extension.with_output == []  # type: ignore[attr-defined]
        await client.close()


async def test_the_store_forgets_what_max_retained_forgets(tmp_path: Path, runner: str) -> None:
    store = tmp_path / "tasks.sqlite"
    first = AsyncSubAgentExtension(
        [worker(ChildModel(answer="kept"))], store=store, max_retained=1, runner=make_runner(runner)
    )
    async with first:
        client = await drive(
            first, StepModel([calls(task_start(), task_start(), task_start()), final()])
        )
        await first.wait_all(first.tasks("parent"), timeout=HANG_GUARD)
        [kept] = first.tasks("parent")
        await client.close()
    again = AsyncSubAgentExtension(
        [worker(ChildModel(answer="new"))], store=store, max_retained=1, runner=make_runner(runner)
    )
    async with again:
        assert [(t.task_id, t.output) for t in again.tasks("parent")] == [(kept.task_id, "kept")]
        # the numbering goes on after what the store held
        client = await drive(again, StepModel([calls(task_start()), final()]), session_id="other")
        [task] = again.tasks("other")
        assert task.task_id == "task-4"
        await client.close()
