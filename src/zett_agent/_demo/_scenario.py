"""Build and run the demo: one parent, several children in their own processes."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zett_agent._demo._models import DemoChildModel, DemoParentModel
from zett_agent._demo._work import CRASH_TOOL, HASH_TOOL, SPIN_TOOL, list_files
from zett_agent.agent import AgentRunConfig
from zett_agent.client import create_agent
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension, SubAgentTask
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.model import Model
from zett_agent.process import ProcessLimits
from zett_agent.tools import AgentTool

SESSION = "demo"


@dataclass
class DemoOptions:
    root: str
    hashers: int = 4
    rounds: int = 40000
    model: Model | None = None  # None: the offline scripted models
    timeout: float = 120.0


@dataclass
class DemoResult:
    answer: str
    wall_seconds: float
    tasks: list[dict[str, Any]]
    cancel_seconds: float | None
    files: int
    parent_work: list[str] = field(default_factory=list)
    loop_stalls: list[float] = field(default_factory=list)

    @property
    def children_cpu_seconds(self) -> float:
        return float(sum(t.get("cpu_seconds", 0.0) for t in self.tasks))

    def to_json(self) -> dict[str, Any]:
        return {
            "answer": self.answer,
            "wall_seconds": round(self.wall_seconds, 3),
            "children_cpu_seconds": round(self.children_cpu_seconds, 3),
            "parallel_speedup": round(self.children_cpu_seconds / self.wall_seconds, 2)
            if self.wall_seconds
            else None,
            "cancel_seconds": None
            if self.cancel_seconds is None
            else round(self.cancel_seconds, 4),
            "files": self.files,
            "parent_work": self.parent_work,
            "parent_loop_max_stall_ms": round(max(self.loop_stalls, default=0.0) * 1000, 2),
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
    return calls


PARENT_PROMPT = (
    "Start every task below at once with task_start (one call each), keep working with the "
    "survey tool while they run, cancel the spinner with task_cancel once task_status shows it "
    "running spin_forever, then read every other report with task_output and summarize.\n"
)


async def run_demo(
    options: DemoOptions,
    on_progress: Callable[[AsyncSubAgentExtension], None] | None = None,
) -> DemoResult:
    """Run the scenario; ``on_progress`` is called with the extension whenever it is useful
    to redraw (the caller decides how often to look at ``extension.tasks``)."""
    files = list_files(options.root)
    starts = start_calls(options)
    parent_model = options.model or DemoParentModel(starts)
    parent_work: list[str] = []
    cancel_seconds: list[float] = []

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

    class TimedCancel(AsyncSubAgentExtension):
        async def cancel(self, task: SubAgentTask) -> SubAgentTask:
            begin = time.perf_counter()
            settled = await super().cancel(task)
            cancel_seconds.append(time.perf_counter() - begin)
            return settled

    extension = TimedCancel(
        definitions(options.model), max_concurrent=len(starts), max_children=len(starts)
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

    begin = time.perf_counter()
    watch = asyncio.ensure_future(ticker())
    async with extension:
        client = await create_agent(
            parent_model,
            config=AgentRunConfig(session_id=SESSION, max_turns=200),
            extensions=[extension],
            tools=tools,
        )
        async with client:
            run = asyncio.ensure_future(client.run(prompt))
            try:
                async with asyncio.timeout(options.timeout):
                    while not run.done():
                        if on_progress is not None:
                            on_progress(extension)
                        await asyncio.wait([run], timeout=0.1)
                    answer = (await run).content
            finally:
                run.cancel()
            if on_progress is not None:
                on_progress(extension)
        wall = time.perf_counter() - begin
        watch.cancel()
        await asyncio.wait([watch])
        tasks = [
            dict(extension.task_info(t, include_output=True)) for t in extension.tasks(SESSION)
        ]
    return DemoResult(
        answer=answer,
        wall_seconds=wall,
        tasks=tasks,
        cancel_seconds=cancel_seconds[0] if cancel_seconds else None,
        files=len(files),
        parent_work=parent_work,
        loop_stalls=stalls,
    )


def default_root() -> str:
    """The package's own source folder."""
    return str(Path(__file__).resolve().parent.parent)
