"""The soak: several parent sessions share one ``AsyncSubAgentExtension`` and start a seeded
random mix of children that complete, fail, crash (segfault, ``os._exit``), exceed limits
(memory, CPU time, wall time) or are cancelled at chosen moments (before they start, while they
stream progress, while they write their result).

At the end it checks that every task reached exactly one terminal status matching what
happened to it, that every completion notice was delivered exactly once (none for a task the
model read through a tool first), that no process, zombie, thread or file descriptor leaked
(also the suite's autouse guard), and that the parent's memory stayed within a small bound of
what it was after a warm-up (the first third of the children). It prints the seed and the counts.

``uv run pytest`` runs the short soak (``--soak-size``, default 60 children); run a long one with
``uv run pytest -m soak --soak-size 2000 -s tests/soak``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import random
import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from _soak_children import TOOLS, ScriptedChild, SoakExtension, big_report

from support.beacons import bound_socket
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import SubAgentTask, SubAgentTaskStatus
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AgentMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions
from zett_agent.process import ProcessLimits
from zett_agent.tools import AgentTool

SESSIONS = 4
MAX_CONCURRENT = 4  # per session
MAX_CHILDREN = 4  # the global process cap: most tasks wait as pending, "waiting for a process"
MAX_RETAINED = 2  # small, so finished tasks are evicted all the time
BIG_REPORT = 512 * 1024  # characters of a cancel_writing child's report
#: the parent's RSS after the run may exceed its RSS after the warm-up by this much
RSS_BOUND = 16 << 20

GUARD_PER_CALL = 120.0  # hang guard of each wait inside the run (none comes close)

#: kind -> (definition, weight in the random mix)
KINDS: dict[str, tuple[str, int]] = {
    "complete": ("plain", 26),
    "fail": ("plain", 9),
    "segfault": ("plain", 7),
    "exit": ("plain", 7),
    "memory": ("mem", 7),
    "cpu": ("cpu", 3),
    "timeout": ("slow", 7),
    "cancel_before": ("plain", 10),
    "cancel_streaming": ("plain", 12),
    "cancel_writing": ("plain", 12),
}
CANCELLED_KINDS = ("cancel_before", "cancel_streaming", "cancel_writing")
#: the failure reason each failing kind must report
REASONS = {
    "fail": "raised RuntimeError: boom",
    "segfault": "killed by SIGSEGV",
    "exit": "exited with code 7",
    "memory": "memory_bytes limit",
    "cpu": "cpu_seconds limit",
    "timeout": "ran out of time",
}

DEFINITIONS = [
    SubAgentDefinition(
        name,
        f"soak children ({name})",
        "You act out your script.",
        model=ScriptedChild(),
        tools=TOOLS,
        limits=limits,
    )
    for name, limits in [
        # every definition has a wall-time limit as a hang guard
        ("plain", ProcessLimits(timeout=GUARD_PER_CALL)),
        ("mem", ProcessLimits(memory_bytes=512 << 20, timeout=GUARD_PER_CALL)),
        ("cpu", ProcessLimits(cpu_seconds=1, timeout=GUARD_PER_CALL)),
        ("slow", ProcessLimits(timeout=0.3)),
    ]
]


# ------------------------------------------------------------------------------ the ledger


@dataclass
class Planned:
    """One child the soak started, what it was told to do, and what became of it."""

    token: str
    kind: str
    session: str
    task_id: str | None = None
    task: SubAgentTask | None = None
    started: int = 0
    finished: int = 0
    status: SubAgentTaskStatus | None = None
    error: str | None = None
    output_ok: bool | None = None
    status_at_cancel: SubAgentTaskStatus | None = None
    read: bool = False  # the model read its outcome through task_output / task_cancel
    notices: int = 0
    notice_after_read: bool = False


@dataclass
class Ledger:
    by_token: dict[str, Planned] = field(default_factory=dict)
    by_id: dict[str, Planned] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def plan(self, token: str, kind: str, session: str) -> Planned:
        planned = self.by_token[token] = Planned(token, kind, session)
        return planned

    def _find(self, task: SubAgentTask) -> Planned:
        planned = self.by_id.get(task.task_id)
        if planned is None:
            token = json.loads(task.prompt)["token"]
            planned = self.by_token[token]
            planned.task_id = task.task_id
            self.by_id[task.task_id] = planned
        return planned

    def started(self, task: SubAgentTask) -> None:
        planned = self._find(task)
        planned.started += 1
        planned.task = task

    def finished(self, task: SubAgentTask) -> None:
        planned = self._find(task)
        planned.finished += 1
        planned.status, planned.error = task.status, task.error
        if task.status is SubAgentTaskStatus.COMPLETED:
            expected = (
                big_report(planned.token, BIG_REPORT)
                if planned.kind == "cancel_writing"
                else f"ok:{planned.token}"
            )
            planned.output_ok = task.output == expected
        planned.task = None  # keep no finished task (or its report) alive

    def cancel_requested(self, task: SubAgentTask, status: SubAgentTaskStatus) -> None:
        planned = self._find(task)
        if planned.status_at_cancel is None:
            planned.status_at_cancel = status


# ------------------------------------------------------------------------------ beacons


class Beacons:
    """Children announce moments ("<token> streaming") to one datagram socket of the test."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = bound_socket(path)
        self._seen: dict[str, asyncio.Future[str]] = {}
        self._reader: asyncio.Task[None] | None = None

    def _future(self, token: str) -> asyncio.Future[str]:
        if token not in self._seen:
            self._seen[token] = asyncio.get_running_loop().create_future()
        return self._seen[token]

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await loop.sock_recv(self.sock, 256)
            token, moment = data.decode().split()
            future = self._future(token)
            if not future.done():
                future.set_result(moment)

    async def wait(self, token: str) -> str:
        async with asyncio.timeout(GUARD_PER_CALL):
            return await self._future(token)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Beacons]:
        self._reader = asyncio.get_running_loop().create_task(self._read())
        try:
            yield self
        finally:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self.sock.close()


# ------------------------------------------------------------------------------ the parent


NOTICE = re.compile(r"Background task (task-\d+) ")


class Driver:
    """The parent model of one session: plays rounds of task tools, counting what it sees.

    A round starts up to ``MAX_CONCURRENT`` children in one batch, cancels the
    ``cancel_before`` ones at once, then handles the others one by one in start order (so the
    oldest blocked child is always the one some session is about to cancel: no deadlock with
    more blocked children than processes): wait for a beacon then cancel, read the report with
    ``task_output``, or wait (outside the model's view) until the task settles by itself.
    """

    retry = RetryOptions(max_retries=0)

    def __init__(self, session: str, ledger: Ledger, rng: random.Random, beacon: str) -> None:
        self.session = session
        self.ledger = ledger
        self.rng = rng
        self.beacon = beacon
        self.seen = 0
        self.calls = 0
        self.pending: dict[str, tuple[str, Planned]] = {}  # call id -> (tool, planned)
        self.queue: list[AssistantMessage] = []
        self.round: list[Planned] = []
        self.kinds: list[str] = []

    def new_round(self, kinds: list[str]) -> None:
        self.kinds = kinds

    def _call(self, name: str, planned: Planned | None, **arguments: Any) -> ToolCall:
        self.calls += 1
        call = ToolCall(f"{self.session}-{self.calls}", name, arguments)
        if planned is not None:
            self.pending[call.id] = (name, planned)
        return call

    def _observe(self, messages: tuple[Any, ...]) -> None:
        new, self.seen = messages[self.seen :], len(messages)
        for message in new:
            if isinstance(message, AgentMessage):
                match = NOTICE.match(message.content)
                if match is None:
                    self.ledger.problems.append(f"unexpected agent message {message.content!r}")
                    continue
                planned = self.ledger.by_id[match.group(1)]
                planned.notices += 1
                planned.notice_after_read |= planned.read
            elif isinstance(message, ToolMessage) and message.call_id in self.pending:
                tool, planned = self.pending.pop(message.call_id)
                self._tool_result(tool, planned, message)

    def _tool_result(self, tool: str, planned: Planned, message: ToolMessage) -> None:
        if tool in ("await_beacon", "await_settled"):
            if not message.ok:
                self.ledger.problems.append(f"{tool} for {planned.token}: {message.text}")
            return
        if not message.ok:
            # a task already evicted cannot be read; it still gets its notice
            if "evicted" not in message.text:
                self.ledger.problems.append(f"{tool} {planned.kind}: {message.text[:300]}")
            return
        info = json.loads(message.text)
        if tool == "task_start":
            planned.task_id = info["task_id"]
            self.ledger.by_id[planned.task_id] = planned
        elif info["status"] in ("completed", "failed", "cancelled"):
            planned.read = True  # task_output of a finished task, or task_cancel

    def _plan_round(self) -> None:
        batch = [self.ledger.plan(os.urandom(6).hex(), kind, self.session) for kind in self.kinds]
        self.round = batch
        starts = []
        for planned in batch:
            script: dict[str, Any] = {"token": planned.token, "kind": planned.kind}
            if planned.kind in ("complete", "cancel_streaming"):
                script["steps"] = self.rng.randint(0, 3) + (planned.kind == "cancel_streaming")
            if planned.kind in ("cancel_streaming", "cancel_writing"):
                script["beacon"] = self.beacon
            if planned.kind == "cancel_writing":
                script["big"] = BIG_REPORT
            starts.append(
                self._call(
                    "task_start",
                    planned,
                    subagent_type=KINDS[planned.kind][0],
                    description=f"{planned.kind} {planned.token}",
                    prompt=json.dumps(script),
                )
            )
        self.queue = [AssistantMessage(tool_calls=tuple(starts))]

    def _plan_handling(self) -> None:
        first = [p for p in self.round if p.kind == "cancel_before" and p.task_id]
        if first:
            calls = [self._call("task_cancel", p, task_id=p.task_id) for p in first]
            if self.rng.random() < 0.3:
                calls.append(self._call("task_list", None))
            self.queue.append(AssistantMessage(tool_calls=tuple(calls)))
        for planned in self.round:
            if planned.kind == "cancel_before" or planned.task_id is None:
                continue
            if planned.kind in ("cancel_streaming", "cancel_writing"):
                steps = [
                    self._call("await_beacon", planned, token=planned.token),
                    self._call("task_cancel", planned, task_id=planned.task_id),
                ]
            elif self.rng.random() < 0.5:
                steps = [
                    self._call(
                        "task_output", planned, task_id=planned.task_id, wait_seconds=GUARD_PER_CALL
                    )
                ]
            else:
                steps = [self._call("await_settled", planned, task_id=planned.task_id)]
            self.queue += [AssistantMessage(tool_calls=(c,)) for c in steps]
        self.queue.append(AssistantMessage("round done"))

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self._observe(request.messages)
        last = request.messages[-1]
        if isinstance(last, UserMessage) and last.content == "sweep":
            message = AssistantMessage("swept")
        elif isinstance(last, UserMessage):
            self._plan_round()
            message = self.queue.pop(0)
        else:
            if not self.queue:
                self._plan_handling()
            message = self.queue.pop(0)
        yield ModelEvent.completed(ModelResponse(message))


# ------------------------------------------------------------------------------ the run


def _rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def _parents(processes: list[psutil.Process]) -> dict[int, int]:
    """pid -> parent pid of the processes still alive (a worker may exit meanwhile)."""
    parents = {}
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            parents[process.pid] = process.ppid()
    return parents


def _harness_tools(extension: SoakExtension, ledger: Ledger, beacons: Beacons) -> tuple[Any, ...]:
    async def await_beacon(token: str) -> str:
        return await beacons.wait(token)

    async def await_settled(task_id: str) -> str:
        # test-side waiting: unlike task_output it does not count as the model reading
        task = ledger.by_id[task_id].task
        if task is not None:
            async with asyncio.timeout(GUARD_PER_CALL):
                await task.settled.wait()
        return "settled"

    schema = {"type": "object", "properties": {}}
    return (
        AgentTool("await_beacon", "", {**schema, "properties": {"token": {}}}, await_beacon),
        AgentTool("await_settled", "", {**schema, "properties": {"task_id": {}}}, await_settled),
    )


def _mix(rng: random.Random, size: int) -> list[str]:
    """Every kind once (they open the warm-up), then a weighted random mix."""
    warm_up = list(KINDS)
    rest = rng.choices(list(KINDS), weights=[w for _, w in KINDS.values()], k=size - len(warm_up))
    return warm_up + rest


async def _run_rounds(
    clients: list[Any], drivers: list[Driver], kinds: list[str], rng: random.Random
) -> None:
    """Split ``kinds`` over the sessions in rounds of up to MAX_CONCURRENT; run them."""
    per_session: list[list[str]] = [[] for _ in clients]
    for index, kind in enumerate(kinds):
        per_session[index % len(clients)].append(kind)

    async def session(client: Any, driver: Driver, todo: list[str]) -> None:
        while todo:
            size = rng.randint(1, MAX_CONCURRENT)
            batch, todo[:] = todo[:size], todo[size:]
            driver.new_round(batch)
            answer = await client.run(f"round of {len(batch)}")
            assert answer.content == "round done", answer.content

    await asyncio.gather(
        *(session(c, d, t) for c, d, t in zip(clients, drivers, per_session, strict=True))
    )


def _check(ledger: Ledger) -> tuple[Counter[str], list[str]]:
    problems = list(ledger.problems)
    counts: Counter[str] = Counter()
    for planned in ledger.by_token.values():
        where = f"{planned.kind} {planned.task_id} ({planned.token})"
        if planned.started != 1 or planned.finished != 1:
            problems.append(f"{where}: started {planned.started}x, finished {planned.finished}x")
            continue
        status, error = planned.status, planned.error or ""
        assert status is not None
        if planned.kind == "complete":
            ok = status is SubAgentTaskStatus.COMPLETED and planned.output_ok
        elif planned.kind in REASONS:
            ok = status is SubAgentTaskStatus.FAILED and REASONS[planned.kind] in error
        elif planned.kind == "cancel_writing":
            # the cancel races the result: either outcome is right, if it is whole
            ok = status is SubAgentTaskStatus.CANCELLED or (
                status is SubAgentTaskStatus.COMPLETED and bool(planned.output_ok)
            )
        else:
            ok = status is SubAgentTaskStatus.CANCELLED
        if not ok:
            problems.append(f"{where}: ended {status.value} ({error!r})")
        # the notice: exactly once unless the model read the outcome first; never after
        if planned.notice_after_read or planned.notices > 1:
            problems.append(f"{where}: {planned.notices} notices (read={planned.read})")
        elif not planned.read and planned.notices != 1:
            problems.append(f"{where}: unread but {planned.notices} notices")
        outcome = status.value
        if planned.kind in CANCELLED_KINDS:
            at_cancel = planned.status_at_cancel
            if at_cancel is None:  # task_cancel came after it finished and was evicted
                outcome += ", evicted before task_cancel"
            elif at_cancel.terminal:
                outcome += " before task_cancel"
            elif status is SubAgentTaskStatus.CANCELLED:
                outcome += f" while {at_cancel.value}"
            else:  # the cancel arrived while it ran, but its result was already in
                outcome += ", result beat task_cancel"
        counts[f"{planned.kind:<17} {outcome}"] += 1
        counts["notices delivered"] += planned.notices
        counts["read through a tool"] += planned.read
    return counts, problems


@pytest.mark.soak
async def test_soak(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    size = max(int(request.config.getoption("--soak-size")), len(KINDS) * 2)
    seed = request.config.getoption("--soak-seed")
    seed = int(seed) if seed is not None else random.randrange(2**32)
    print(f"\nsoak: {size} children, seed {seed} (rerun with --soak-seed {seed})")
    rng = random.Random(seed)
    kinds = _mix(rng, size)
    ledger = Ledger()
    extension = SoakExtension(
        DEFINITIONS,
        ledger=ledger,
        max_concurrent=MAX_CONCURRENT,
        max_retained=MAX_RETAINED,
        max_children=MAX_CHILDREN,
    )
    started = time.monotonic()
    async with Beacons(str(tmp_path / "beacons")).running() as beacons, extension:
        tools = _harness_tools(extension, ledger, beacons)
        drivers = [
            Driver(f"s{i}", ledger, random.Random(rng.random()), beacons.path)
            for i in range(SESSIONS)
        ]
        clients = [
            await create_agent(
                driver,
                config=AgentRunConfig(session_id=driver.session, max_turns=100),
                extensions=[extension],
                tools=tools,
            )
            for driver in drivers
        ]
        # warm-up: every kind once, then the first third of the mix, so that every code path
        # ran and the allocator's high-water mark (big reports, many at once) is reached
        # before the baseline; a leak grows with the two thirds after it
        warm_up = max(len(KINDS), size // 3)
        await _run_rounds(clients, drivers, kinds[:warm_up], rng)
        rss_before = _rss()
        await _run_rounds(clients, drivers, kinds[warm_up:], rng)
        for client in clients:  # anything still unannounced arrives at a session's next request
            assert (await client.run("sweep")).content == "swept"
        elapsed = time.monotonic() - started
        # the pool is still open: the launcher and its workers (spares, and workers exiting
        # after their last result) may exist, but nothing a job started
        parents = _parents(psutil.Process().children(recursive=True))
        launchers = {pid for pid, ppid in parents.items() if ppid == os.getpid()}
        strays = [pid for pid, ppid in parents.items() if launchers.isdisjoint((pid, ppid))]
        assert len(launchers) == 1 and not strays, parents
        rss_with_history = _rss()  # the sessions' histories legitimately grow with the run
        for client in clients:
            await client.close()
        del clients, drivers, client
        rss_after = _rss()
    assert psutil.Process().children(recursive=True) == []

    counts, problems = _check(ledger)
    growth = rss_after - rss_before
    print(f"soak: {len(ledger.by_token)} children in {elapsed:.1f} s, seed {seed}")
    for key in sorted(counts):
        print(f"  {key:<50} {counts[key]:>6}")
    print(
        f"  parent RSS after the warm-up ({warm_up} children) {rss_before / 2**20:.1f} MiB, "
        f"after the other {len(kinds) - warm_up} "
        f"{rss_after / 2**20:.1f} MiB ({growth / 2**20:+.1f} MiB; "
        f"{rss_with_history / 2**20:.1f} MiB before the sessions' histories were dropped)"
    )
    assert len(ledger.by_token) == len(kinds)
    assert not problems, f"seed {seed}: {len(problems)} problems:\n" + "\n".join(problems[:40])
    assert growth < RSS_BOUND, f"parent RSS grew by {growth / 2**20:.1f} MiB"
