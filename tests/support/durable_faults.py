"""Fault injection for durable tasks: a scripted 20-step task killed at random points.

Shared by ``tests/soak/test_durable_soak.py`` and ``benchmarks/bench_durable.py``. The task
(``definition``) asks a loopback model server (``ModelServer``, in the harness's process) for
each step; each step's answer calls the tool ``append``, which tells the server it runs, then
appends a line to a file of its task (its effect) and returns. After step ``STEPS - 1`` the
server answers with the report, made of every tool result the request holds.

The server counts, at the moment each call arrives, against what the task store holds
committed (read-only, beside the host that writes it):

- a model call for step ``k`` when the journal already holds the task's ``k + 1``-th model
  response: a model call repeated for a done step;
- a tool run for step ``k`` when the journal already holds its result: a done tool call run
  again;
- a tool run for a step that ran before but was not done: at-least-once, as documented.

``child_kills`` runs the tasks in this process's extension and SIGKILLs their children at
random moments; ``host_kills`` runs them in host processes it SIGKILLs at random moments,
each next host resuming them from the store. Both compare every report with an
uninterrupted run's. ``journal_cost`` measures what the journal adds per step: the time between
two model calls of a task, durable and not, alternating in one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import sqlite3
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from support.liveness import alive
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import (
    AsyncSubAgentExtension,
    SubAgentTask,
    SubAgentTaskStatus,
)
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from zett_agent.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from zett_agent.testing import ScriptedModel
from zett_agent.tools import AgentTool, tool_context

#: steps of the scripted task (a model call and a tool call each), then its report
STEPS = 20
#: hang guard of one task's whole run, kills and resumes included
GUARD = 120.0
HERE = Path(__file__).resolve().parent


def expected_report(steps: int = STEPS) -> str:
    """The report of an uninterrupted run."""
    return "report: " + ",".join(f"appended {k}" for k in range(steps))


# -- the child ------------------------------------------------------------------------------------


async def _ask(port: int, request: dict[str, Any]) -> dict[str, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(json.dumps(request).encode() + b"\n")
        line = await reader.readline()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    answer: dict[str, Any] = json.loads(line)
    return answer


class LoopbackModel:
    """Asks the harness's server for each step (its prompt names its task: ``label:<s>``)."""

    retry = RetryOptions(max_retries=0)

    def __init__(self, port: int) -> None:
        self.port = port

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        label = next(m.content for m in request.messages if isinstance(m, UserMessage))
        results = [m.text for m in request.messages if isinstance(m, ToolMessage)]
        answer = await _ask(
            self.port, {"op": "model", "session": label.split(":", 1)[1], "results": results}
        )
        if "call" in answer:
            call = ToolCall(answer["call"]["id"], "append", {"line": answer["call"]["line"]})
            message = AssistantMessage(tool_calls=(call,))
        else:
            message = AssistantMessage(answer["report"])
        yield ModelEvent.completed(ModelResponse(message, Usage(1, 1)))


def append_tool(port: int, lines: str) -> AgentTool:
    """``append(line)``: tells the server it runs, then appends ``line`` to its task's file."""

    async def append(line: int) -> str:
        context = tool_context()
        session = context.session_id.split("/", 1)[0]
        key = context.idempotency_key
        await _ask(port, {"op": "tool", "session": session, "step": line, "key": key})
        fd = os.open(os.path.join(lines, session), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{line} {key}\n".encode())
        finally:
            os.close(fd)
        return f"appended {line}"

    return AgentTool(
        "append",
        "Append one line to the file.",
        {"type": "object", "properties": {"line": {"type": "integer"}}, "required": ["line"]},
        append,
    )


def definition(port: int, lines: str) -> SubAgentDefinition:
    """The scripted task's profile (``worker``)."""
    return SubAgentDefinition(
        "worker",
        "appends lines",
        "You append lines.",
        LoopbackModel(port),
        tools=[append_tool(port, lines)],
        max_turns=STEPS + 5,
    )


# -- the server -----------------------------------------------------------------------------------


@dataclass
class Counts:
    """What the server saw, and what the harness did."""

    model_calls: int = 0
    tool_runs: int = 0
    repeated_done_model: int = 0
    repeated_done_tool: int = 0
    rerun_not_done_tool: int = 0
    child_kills: int = 0
    #: children killed once their last report was on its way: their task ended unkilled
    late_child_kills: int = 0
    host_kills: int = 0
    resumes: int = 0
    tasks: int = 0
    identical_reports: int = 0
    other_reports: list[str] = field(default_factory=list)
    duplicate_lines: int = 0

    def clean(self) -> bool:
        """No done step repeated, and every report the uninterrupted run's."""
        return (
            self.repeated_done_model == 0
            and self.repeated_done_tool == 0
            and self.identical_reports == self.tasks
            and not self.other_reports
        )

    def table(self) -> list[tuple[str, int | str]]:
        return [
            ("tasks (20 steps each)", self.tasks),
            ("children killed (SIGKILL)", self.child_kills),
            ("  and once their report was sent (not counted)", self.late_child_kills),
            ("hosts killed (SIGKILL)", self.host_kills),
            ("resumes (task_status)", self.resumes),
            ("model calls", self.model_calls),
            ("model calls repeated for done steps", self.repeated_done_model),
            ("tool runs", self.tool_runs),
            ("done tool calls run again", self.repeated_done_tool),
            ("tool calls run again, not done (at-least-once)", self.rerun_not_done_tool),
            ("lines appended twice (those same calls)", self.duplicate_lines),
            (
                "reports identical to an uninterrupted run's",
                f"{self.identical_reports}/{self.tasks}",
            ),
        ]


class ModelServer:
    """The loopback model server of the harness (see the module docstring).

    ``store``: the task store to check calls against (``None``: count only, as for
    ``journal_cost``). ``arrivals`` keeps when each model call of a session arrived.
    """

    def __init__(self, store: Path | None, steps: int = STEPS) -> None:
        self.store = store
        self.steps = steps
        self.counts = Counts()
        self.arrivals: dict[str, list[float]] = {}
        self._ran: set[tuple[str, int]] = set()
        self._db: sqlite3.Connection | None = None
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> ModelServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        if self._db is not None:
            self._db.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            if line:  # nothing: the child was killed while it asked
                writer.write(json.dumps(self.answer(json.loads(line))).encode() + b"\n")
                await writer.drain()
        except ConnectionError:  # the child was killed while it read the answer
            pass
        finally:
            writer.close()

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        session = request["session"]
        counts = self.counts
        if request["op"] == "model":
            self.arrivals.setdefault(session, []).append(time.perf_counter())
            step = len(request["results"])
            counts.model_calls += 1
            responses, _ = self._committed(session)
            if responses > step:
                counts.repeated_done_model += 1
            if step < self.steps:
                return {"call": {"id": f"call-{step}-{os.urandom(4).hex()}", "line": step}}
            return {"report": "report: " + ",".join(request["results"])}
        step = request["step"]
        counts.tool_runs += 1
        _, results = self._committed(session)
        if f"appended {step}" in results:
            counts.repeated_done_tool += 1
        elif (session, step) in self._ran:
            counts.rerun_not_done_tool += 1
        self._ran.add((session, step))
        return {}

    def _committed(self, session: str) -> tuple[int, set[str]]:
        """The model responses and tool results a session's task has committed."""
        if self.store is None or not self.store.exists():
            return 0, set()
        if self._db is None:
            self._db = sqlite3.connect(f"file:{self.store}?mode=ro", uri=True)
        responses, results = 0, set()
        try:
            rows = self._db.execute(
                "SELECT entry FROM journal WHERE parent_session_id = ?", (session,)
            ).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise  # a count the harness could not make must not pass for 0
            return 0, set()  # no journal table yet (a store being made)
        for (text,) in rows:
            message = json.loads(text).get("m", {})
            if message.get("role") == "assistant":
                responses += 1
            elif message.get("role") == "tool":
                results.add(message["text"])
        return responses, results


def check_lines(lines: Path, counts: Counts) -> None:
    """Every task's file holds each step's line; count the lines written twice."""
    for path in lines.iterdir():
        steps = Counter(int(line.split()[0]) for line in path.read_text().splitlines())
        assert set(steps) == set(range(STEPS)), f"{path.name}: lines {sorted(steps)}"
        counts.duplicate_lines += sum(n - 1 for n in steps.values())


# -- children killed ------------------------------------------------------------------------------


async def _session_context(extension: AsyncSubAgentExtension, session: str) -> Any:
    client = await create_agent(
        ScriptedModel(["ok"] * 1000),
        config=AgentRunConfig(session_id=session),
        extensions=[extension],
    )
    await client.run("hello")
    return client, client.agent._new_context(client.config, None)


async def _kill_children(
    extension: AsyncSubAgentExtension,
    task: SubAgentTask,
    kills: int,
    within: float,
    rng: random.Random,
    counts: Counts,
) -> None:
    """Kill ``task``'s child ``kills`` times, each at a random moment of its run."""
    seen: set[int] = set()
    for _ in range(kills):
        # wait for the next child (a resume makes a new one), then a random moment of its run
        async with asyncio.timeout(GUARD):
            while not task.done() and (task.job is None or task.job.pid in (None, *seen)):  # noqa: ASYNC110 - no event for a new child's pid
                await asyncio.sleep(0.0005)
        if task.done():
            return
        job = task.job
        assert job is not None
        pid = job.pid
        assert pid is not None
        seen.add(pid)
        await asyncio.sleep(rng.uniform(0, within))
        if task.done() or task.job is None or task.job.pid != pid:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        # a child whose last report was already on its way ends its task unkilled (the host
        # takes the report), so only a kill its task resumed from counts: a next job proves it
        async with asyncio.timeout(GUARD):
            while not task.done() and task.job is job:  # noqa: ASYNC110 - no event for a new job
                await asyncio.sleep(0.0005)
        if task.job is not job:
            counts.child_kills += 1
        else:
            counts.late_child_kills += 1


async def child_kills(
    directory: Path, kills: int, *, seed: int, parallel: int = 4, per_task: int = 4
) -> Counts:
    """Run tasks in this process and SIGKILL their children ``kills`` times, at random points.

    Each task's child is killed up to ``per_task`` times (at a uniformly random moment of the
    run a child makes, 0 to the duration of an uninterrupted run), ``parallel`` tasks at once.
    """
    rng = random.Random(seed)
    store = directory / "children.sqlite"
    lines = directory / "children-lines"
    lines.mkdir()
    async with ModelServer(store) as server:
        extension = AsyncSubAgentExtension(
            [definition(server.port, str(lines))],
            store=store,
            durable=True,
            max_resumes=100,
            max_concurrent=parallel,
        )
        async with extension:
            within = await _uninterrupted(extension, server.counts)
            number = 0
            while server.counts.child_kills < kills:
                batch = []
                for _ in range(parallel):
                    number += 1
                    batch.append(
                        _one_killed(extension, f"c{number}", rng, within, per_task, server.counts)
                    )
                await asyncio.gather(*batch)
    check_lines(lines, server.counts)
    return server.counts


async def _uninterrupted(extension: AsyncSubAgentExtension, counts: Counts) -> float:
    """Run one task without faults; return how long it took (the span kills fall in)."""
    client, context = await _session_context(extension, "c0")
    began = time.monotonic()
    task = await extension.start(
        context, extension.subagents[0], description="steps", prompt="label:c0"
    )
    await extension.wait(task, GUARD)
    took = time.monotonic() - began
    _judge(extension, task, counts)
    await client.close()
    return took


async def _one_killed(
    extension: AsyncSubAgentExtension,
    session: str,
    rng: random.Random,
    within: float,
    per_task: int,
    counts: Counts,
) -> None:
    client, context = await _session_context(extension, session)
    task = await extension.start(
        context, extension.subagents[0], description="steps", prompt=f"label:{session}"
    )
    await _kill_children(extension, task, rng.randint(1, per_task), within, rng, counts)
    await extension.wait(task, GUARD)
    _judge(extension, task, counts)
    await client.close()


def _judge(extension: AsyncSubAgentExtension, task: SubAgentTask, counts: Counts) -> None:
    counts.tasks += 1
    counts.resumes += int(extension.task_info(task).get("resumes", 0))
    if task.status is SubAgentTaskStatus.COMPLETED and task.output == expected_report():
        counts.identical_reports += 1
    else:
        counts.other_reports.append(f"{task.task_id}: {task.status.value} {task.error or ''}")


# -- hosts killed ---------------------------------------------------------------------------------

HOST = """
import sys
sys.path[:0] = [{tests!r}]
from support.durable_faults import host_main
host_main({store!r}, {port}, {lines!r}, {sessions!r})
"""


def host_main(store: str, port: int, lines: str, sessions: list[str]) -> None:
    """A host: open the store, resume or start each session's task, report when all ended."""

    async def main() -> None:
        extension = AsyncSubAgentExtension(
            [definition(port, lines)], store=store, durable=True, max_resumes=100
        )
        clients, tasks = [], []
        async with extension:
            for session in sessions:
                client, context = await _session_context(extension, session)  # resumes it
                clients.append(client)
                existing = extension.tasks(session)
                if existing:
                    tasks.append(existing[-1])
                else:
                    tasks.append(
                        await extension.start(
                            context,
                            extension.subagents[0],
                            description="steps",
                            prompt=f"label:{session}",
                        )
                    )
            print("ready", flush=True)
            await extension.wait_all(tasks, GUARD)
            report = {
                t.parent_session_id: [
                    t.status.value,
                    t.output or t.error,
                    extension.task_info(t).get("resumes", 0),
                ]
                for t in tasks
            }
            print(json.dumps(report), flush=True)
            for client in clients:
                await client.close()

    asyncio.run(main())


def _reap_descendants(within: float = 10.0) -> None:
    """Wait until every process this (subreaper) process adopted is gone, and reap them."""
    deadline = time.monotonic() + within
    while True:
        running = [p for p in psutil.Process().children(recursive=True) if alive(p.pid)]
        if not running:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of a killed host still alive: {running}")
        time.sleep(0.005)
    for child in psutil.Process().children():
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child.pid, 0)


async def host_kills(directory: Path, kills: int, *, seed: int, sessions: int = 4) -> Counts:
    """Run tasks in host processes, SIGKILLing the host ``kills`` times at random points.

    A round runs ``sessions`` tasks to completion: its host is killed 1 to 3 times, each at a
    uniformly random moment from when it resumed or started its tasks up to the duration of
    the first round's uninterrupted run (a host whose tasks ended before that moment is not
    killed), the next host resuming them. The caller must be a child subreaper (the killed
    host's children are reaped here before the next host starts).
    """
    rng = random.Random(seed)
    counts = Counts()
    round_number = 0
    within = 0.0
    while counts.host_kills < kills or round_number == 0:
        round_number += 1
        store = directory / f"hosts-{round_number}.sqlite"
        lines = directory / f"hosts-lines-{round_number}"
        lines.mkdir()
        names = [f"h{round_number}-{n}" for n in range(sessions)]
        async with ModelServer(store) as server:
            server.counts = counts
            kill_here = 0 if round_number == 1 else rng.randint(1, 3)
            while True:
                program = HOST.format(
                    tests=str(HERE.parent), store=str(store), port=server.port,
                    lines=str(lines), sessions=names,
                )  # fmt: skip
                host = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", program, stdout=asyncio.subprocess.PIPE
                )
                assert host.stdout is not None
                async with asyncio.timeout(GUARD):
                    ready = await host.stdout.readline()
                assert ready == b"ready\n", f"the host did not start: {ready!r}"
                began = time.monotonic()
                result = asyncio.ensure_future(host.stdout.readline())
                if kill_here:
                    # a random moment of the tasks' run; if they all ended first, no kill
                    done, _ = await asyncio.wait({result}, timeout=rng.uniform(0, within))
                    if not done:
                        kill_here -= 1
                        host.send_signal(signal.SIGKILL)
                        counts.host_kills += 1
                        await host.wait()
                        result.cancel()
                        await asyncio.wait({result})
                        await asyncio.to_thread(_reap_descendants)
                        continue
                async with asyncio.timeout(GUARD):
                    line = await result
                    await host.wait()
                if round_number == 1:
                    within = time.monotonic() - began
                for session, (status, report, resumes) in json.loads(line).items():
                    counts.tasks += 1
                    counts.resumes += resumes
                    if status == "completed" and report == expected_report():
                        counts.identical_reports += 1
                    else:
                        counts.other_reports.append(f"{session}: {status} {report}")
                await asyncio.to_thread(_reap_descendants)
                break
        check_lines(lines, counts)
    return counts


# -- what the journal costs -----------------------------------------------------------------------


async def journal_cost(directory: Path, runs: int) -> tuple[float, float]:
    """p50 milliseconds per step, durable and not, over ``runs`` tasks each, alternating."""
    lines = directory / "cost-lines"
    lines.mkdir()
    async with ModelServer(None) as server:
        profile = definition(server.port, str(lines))
        durable = AsyncSubAgentExtension([profile], store=directory / "cost.sqlite", durable=True)
        # the same store, durable=False: what the journal adds, not what a store costs
        plain = AsyncSubAgentExtension([profile], store=directory / "plain.sqlite")
        steps: dict[bool, list[float]] = {True: [], False: []}
        async with durable, plain:
            for run in range(runs):
                for is_durable, extension in ((True, durable), (False, plain)):
                    session = f"{'d' if is_durable else 'p'}{run}"
                    client, context = await _session_context(extension, session)
                    task = await extension.start(
                        context, profile, description="steps", prompt=f"label:{session}"
                    )
                    await extension.wait(task, GUARD)
                    assert task.output == expected_report(), task.error
                    arrivals = server.arrivals[session]
                    steps[is_durable] += [b - a for a, b in itertools.pairwise(arrivals)]
                    await client.close()
    return (
        statistics.median(steps[True]) * 1000,
        statistics.median(steps[False]) * 1000,
    )
