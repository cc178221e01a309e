"""Build and run the demo: one parent, several children in their own processes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zett_agent._demo._models import DemoChildModel, DemoParentModel
from zett_agent._demo._work import (
    BLOCK_BYTES,
    CRASH_TOOL,
    HASH_TOOL,
    READ_TOOL,
    SPIN_TOOL,
    list_files,
)
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension, SubAgentTask
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.model import Model
from zett_agent.process import ProcessLimits, Sandbox
from zett_agent.runners import ProcessRunner
from zett_agent.tools import AgentTool

SESSION = "demo"


#: Most hashing children one demo may start (each is a process).
MAX_HASHERS = 128
#: Default of ``--timeout``: the whole run, from the first child started to the last report read.
DEFAULT_TIMEOUT = 300.0
#: An estimated wall time above this gets a warning before the run starts.
LARGE_RUN_SECONDS = 60.0


@dataclass
class DemoOptions:
    root: str
    hashers: int = 4
    rounds: int = 40000
    model: Model | None = None  # None: the offline scripted models
    timeout: float = DEFAULT_TIMEOUT
    #: where the children run: None for the default (a process each); ``--ray`` passes a
    #: ``zett_agent.runners.ray.RayRunner`` (see ``ray_runner``)
    runner: Any = None
    #: a file of the parent's, outside every sandbox, that the sandboxed child tries to read
    #: (``run_demo`` makes one when it is None)
    secret: str | None = None


@dataclass
class DemoResult:
    answer: str
    wall_seconds: float
    tasks: list[dict[str, Any]]
    cancel_seconds: float | None
    files: int
    parent_work: list[str] = field(default_factory=list)
    loop_stalls: list[float] = field(default_factory=list)
    timed_out: bool = False
    timeout: float | None = None

    @property
    def children_cpu_seconds(self) -> float:
        return float(sum(t.get("cpu_seconds", 0.0) for t in self.tasks))

    @property
    def files_hashed(self) -> int:
        return sum(
            int(t["progress"].get("done", 0))
            for t in self.tasks
            if t.get("subagent_type") == "hasher" and isinstance(t.get("progress"), dict)
        )

    def to_json(self) -> dict[str, Any]:
        stalls = sorted(self.loop_stalls)
        p99 = stalls[max(0, -(-len(stalls) * 99 // 100) - 1)] if stalls else 0.0
        return {
            "answer": self.answer,
            "timed_out": self.timed_out,
            "timeout_seconds": self.timeout,
            "wall_seconds": round(self.wall_seconds, 3),
            "children_cpu_seconds": round(self.children_cpu_seconds, 3),
            "parallel_speedup": round(self.children_cpu_seconds / self.wall_seconds, 2)
            if self.wall_seconds
            else None,
            "cancel_seconds": None
            if self.cancel_seconds is None
            else round(self.cancel_seconds, 4),
            "files": self.files,
            "files_hashed": self.files_hashed,
            "parent_work": self.parent_work,
            "parent_loop_max_stall_ms": round(max(self.loop_stalls, default=0.0) * 1000, 2),
            "parent_loop_p99_stall_ms": round(p99 * 1000, 2),
            "cpu_count": os.cpu_count(),
            "tasks": self.tasks,
        }


def definitions(model: Model | None) -> list[SubAgentDefinition]:
    child = model or DemoChildModel()
    common = "You are a worker. Your task is JSON: call the tool it names with its arguments, "
    return [
        SubAgentDefinition(
            "hasher",
            "hash one shard of a folder's files (CPU-heavy)",
            common + "then report the files, bytes and digest in one line.",
            model=child,
            tools=(HASH_TOOL,),
            limits=ProcessLimits(timeout=300, memory_bytes=2 * 1024**3),
        ),
        SubAgentDefinition(
            "spinner",
            "a task that never finishes (to show a hard cancel)",
            common + "and wait for it.",
            model=child,
            tools=(SPIN_TOOL,),
        ),
        SubAgentDefinition(
            "crasher",
            "a task whose process segfaults (to show a clean failure)",
            common + "and report what happened.",
            model=child,
            tools=(CRASH_TOOL,),
        ),
        SubAgentDefinition(
            "snooper",
            "a sandboxed task that tries to read a file of the parent's (to show the sandbox)",
            common + "and report what happened.",
            model=child,
            tools=(READ_TOOL,),
            # not required: where the kernel cannot confine it, the demo still runs and says so;
            # on a remote model (--model) the child needs the network to reach it
            sandbox=Sandbox(network="none" if model is None else "all", required=False),
        ),
    ]


def start_calls(options: DemoOptions) -> list[dict[str, Any]]:
    def start(kind: str, description: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        prompt = json.dumps({"tool": tool, "arguments": arguments})
        return {"subagent_type": kind, "description": description, "prompt": prompt}

    calls = [
        start(
            "hasher",
            f"hash shard {i + 1}/{options.hashers}",
            "hash_files",
            {"root": options.root, "shard": i, "shards": options.hashers, "rounds": options.rounds},
        )
        for i in range(options.hashers)
    ]
    calls.append(start("spinner", "spin forever", "spin_forever", {}))
    calls.append(start("crasher", "segfault on purpose", "crash", {}))
    if options.secret is not None:
        calls.append(
            start("snooper", "read the parent's file", "read_outside", {"path": options.secret})
        )
    return calls


#: Scheduling priority of the children (``nice``): their CPU-bound work is background work, so
#: the parent, whose loop supervises them, gets a core first when it wakes up.
CHILD_NICE = 10


class DemoExtension(AsyncSubAgentExtension):
    """The extension, with the cancel latency timed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cancel_seconds: list[float] = []

    async def cancel(self, task: SubAgentTask) -> SubAgentTask:
        begin = time.perf_counter()
        settled = await super().cancel(task)
        self.cancel_seconds.append(time.perf_counter() - begin)
        return settled

    def task_info(self, task: SubAgentTask, *, include_output: bool = False) -> Any:
        info = super().task_info(task, include_output=include_output)
        node = task.job.info().get("node_id") if task.job is not None else None
        if node:  # on Ray: which node ran it, also once it finished (the final table)
            info.setdefault("node_id", node)  # type: ignore[typeddict-item]
        return info


def ray_runner(address: str | None, hashers: int) -> Any:
    """The demo's ``RayRunner`` (``--ray``).

    A local Ray (``address=None``) gets as many CPUs as there are hashers, so every child runs at
    once as with processes (the OS shares the cores); the spinner and the crasher ask Ray for no
    CPU, so they start even when hashers fill a cluster. Not connected yet: call ``connect()``.
    """
    from zett_agent.runners.ray import RayRunner

    cpus = max(os.cpu_count() or 1, hashers)
    return RayRunner(
        address,
        placement={
            "spinner": {"num_cpus": 0},
            "crasher": {"num_cpus": 0},
            "snooper": {"num_cpus": 0},
        },
        init_kwargs={"num_cpus": cpus} if address is None else None,
    )


PARENT_PROMPT = (
    "Start every task below at once with task_start (one call each), keep working with the "
    "survey tool while they run, cancel the spinner with task_cancel once task_status shows it "
    "running spin_forever, then read every other report with task_output and summarize.\n"
)


async def run_demo(
    options: DemoOptions,
    *,
    files: Sequence[Path] | None = None,
    on_start: Callable[[AsyncSubAgentExtension], None] | None = None,
    on_tick: Callable[[AsyncSubAgentExtension], None] | None = None,
    tick_seconds: float = 2.0,
) -> DemoResult:
    """Run the scenario and return what happened.

    ``files`` is the folder's listing if the caller already made it. ``on_start`` gets the
    extension before the parent starts; ``on_tick`` is called with it every ``tick_seconds``
    from the event loop (keep it cheap: it runs on the loop the demo measures). When
    ``options.timeout`` passes, the parent's request is cancelled, every child's process tree
    is killed, and the result says ``timed_out`` with what finished until then.

    Raises what the parent's request raises (``ModelError`` from a real model, for example).
    """
    files = list_files(options.root) if files is None else files
    secret = None
    if options.secret is None:
        # a private file of the parent's, outside the sandboxed child's reach
        descriptor, secret = tempfile.mkstemp(prefix="zett-demo-secret-")
        with os.fdopen(descriptor, "w") as handle:
            handle.write("the parent's secret\n")
        options = dataclasses.replace(options, secret=secret)
    try:
        return await _run_demo(options, files, on_start, on_tick, tick_seconds)
    finally:
        if secret is not None:
            os.unlink(secret)


async def _run_demo(
    options: DemoOptions,
    files: Sequence[Path],
    on_start: Callable[[AsyncSubAgentExtension], None] | None,
    on_tick: Callable[[AsyncSubAgentExtension], None] | None,
    tick_seconds: float,
) -> DemoResult:
    starts = start_calls(options)
    parent_model = options.model or DemoParentModel(starts)
    parent_work: list[str] = []

    async def survey() -> str:
        """Count lines per file suffix (the parent keeps working while children run)."""
        counts: dict[str, int] = {}
        for path in files:
            try:
                with path.open("rb") as handle:
                    counts[path.suffix or "(none)"] = counts.get(path.suffix or "(none)", 0) + sum(
                        1 for _ in handle
                    )
            except OSError:
                continue
            await asyncio.sleep(0)  # stay responsive: the loop also supervises the children
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:5]
        summary = ", ".join(f"{suffix}: {n} lines" for suffix, n in top)
        parent_work.append(summary)
        return summary

    async def pause(seconds: float) -> str:
        """Wait a moment before looking again."""
        await asyncio.sleep(min(max(seconds, 0.0), 2.0))
        return "ok"

    # One process per task, all at once (max_children). The launcher preloads the demo's own
    # modules (its extension, models and tools are found automatically), so each child starts
    # warm. Every task is kept until the end (max_retained), so each report can still be read.
    extension = DemoExtension(
        definitions(options.model),
        max_concurrent=len(starts),
        max_retained=len(starts),
        # children at a lower CPU priority from their fork on: the parent, whose loop
        # supervises them, gets a core first when it wakes up (a Ray child runs on a Ray worker)
        runner=(
            options.runner
            if options.runner is not None
            else ProcessRunner(max_children=len(starts), nice=CHILD_NICE)
        ),
    )
    tools = (
        AgentTool(
            "survey", "Survey the folder yourself.", {"type": "object", "properties": {}}, survey
        ),
        AgentTool(
            "pause",
            "Wait a moment.",
            {"type": "object", "properties": {"seconds": {"type": "number"}}},
            pause,
        ),
    )
    prompt = PARENT_PROMPT + json.dumps(starts, indent=1)
    stalls: list[float] = []

    async def ticker() -> None:
        # How late the parent's loop wakes a 10 ms sleeper while children burn CPU.
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.01)
            stalls.append(max(0.0, time.perf_counter() - before - 0.01))

    answer = ""
    timed_out = False
    begin = time.perf_counter()
    watch = asyncio.ensure_future(ticker())
    try:
        async with extension:
            if on_start is not None:
                on_start(extension)
            client = await create_agent(
                parent_model,
                config=AgentRunConfig(session_id=SESSION, max_turns=1000),
                extensions=[extension],
                tools=tools,
            )
            async with client:
                run = asyncio.ensure_future(client.run(prompt))
                try:
                    async with asyncio.timeout(options.timeout):
                        while not run.done():
                            if on_tick is not None:
                                on_tick(extension)
                            await asyncio.wait([run], timeout=tick_seconds)
                        answer = (await run).content
                except TimeoutError:
                    timed_out = True
                finally:
                    run.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait([run])
                if on_tick is not None:
                    on_tick(extension)
                # stop what still runs (a timeout), so every task reads how it ended; read them
                # before the client closes, which releases the session's tasks
                running = [t for t in extension.tasks(SESSION) if not t.done()]
                await asyncio.gather(*(extension.cancel(t) for t in running))
                tasks = [
                    dict(extension.task_info(t, include_output=True))
                    for t in extension.tasks(SESSION)
                ]
            wall = time.perf_counter() - begin
    finally:
        watch.cancel()
        await asyncio.wait([watch])
    return DemoResult(
        answer=answer,
        wall_seconds=wall,
        tasks=tasks,
        cancel_seconds=extension.cancel_seconds[0] if extension.cancel_seconds else None,
        files=len(files),
        parent_work=parent_work,
        loop_stalls=stalls,
        timed_out=timed_out,
        timeout=options.timeout,
    )


@dataclass(frozen=True)
class Estimate:
    """What a run will cost, measured on this machine before it starts."""

    files: int
    bytes: int
    cpu_seconds: float
    wall_seconds: float

    def rounds_for(self, rounds: int, wall_seconds: float) -> int:
        """The ``--rounds`` that would make the hashing take about ``wall_seconds``."""
        if self.wall_seconds <= 0:
            return rounds
        return max(1, int(rounds * wall_seconds / self.wall_seconds))


def estimate(files: Sequence[Path], options: DemoOptions) -> Estimate:
    """Estimate the hashing's CPU and wall time from a few thousand rounds timed here (~10 ms)."""
    blocks = 0
    size = 0
    for path in files:
        with contextlib.suppress(OSError):
            length = path.stat().st_size
            size += length
            blocks += min(length, BLOCK_BYTES)
    per_round = {n: _round_seconds(n) for n in (0, BLOCK_BYTES)}
    slope = (per_round[BLOCK_BYTES] - per_round[0]) / BLOCK_BYTES
    cpu = options.rounds * (len(files) * per_round[0] + blocks * max(slope, 0.0))
    parallel = max(1, min(options.hashers, len(files), os.cpu_count() or 1))
    return Estimate(len(files), size, cpu, cpu / parallel)


def _round_seconds(block: int, rounds: int = 2000) -> float:
    data = b"x" * block
    digest = b"\0" * 32
    begin = time.perf_counter()
    for _ in range(rounds):
        digest = hashlib.sha256(digest + data).digest()
    return (time.perf_counter() - begin) / rounds


def default_root() -> str:
    """The package's own source folder."""
    return str(Path(__file__).resolve().parent.parent)
